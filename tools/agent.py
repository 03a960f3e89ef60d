"""Act on a finished run: evaluate a checkpoint, or export its agent as a folder that runs with plain torch.

    python tools/agent.py eval runs/<run>/checkpoints/best.pt [--episodes 10] [--capture-video]
    python tools/agent.py export runs/<run>/checkpoints/best.pt [--out DIR] [--force] [--capture-video]

Works for the checkpoint of any script of this project: it imports the script that wrote it (the `script` the
checkpoint names, from this project's folder) and uses its own `load_checkpoint`, `Policy` (the agent as it acts when
evaluated) and `evaluate`. The scripts never import this tool. Eval logs and exports go into the checkpoint's run
folder (<run>/eval/<name>, <run>/export/<name>), or, for a checkpoint not in a run's checkpoints/ folder, beside it.
--force replaces only an earlier export (its config.json says so), never a folder with anything else in it.

The export folder holds
  policy.pt2   the acting policy (normalization, network, deterministic action, clipping) as a torch.export program:
               `torch.export.load("policy.pt2").module()(obs)` is the action. Loading a program unpickles parts of
               it: load only programs from people you trust; model.pt is the safe alternative;
  model.pt     the Policy's state_dict, loadable with `torch.load(path, weights_only=True)`, with config.json;
  README.md    a model card: the env, the training, the evaluation, use, how to reproduce;
  replay.mp4   one evaluation episode, with --capture-video.
"""

import argparse
import dataclasses
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ("ppo_continuous", "ppo_atari", "a2c_atari", "sac_continuous", "sac_continuous_ray")
# Flags that say nothing about how the agent was trained: the model card's command leaves them out.
NOT_TRAINING_FLAGS = (
    "exp_name",
    "cuda",
    "track",
    "wandb_project_name",
    "wandb_entity",
    "capture_video",
    "save_model",
    "runs_dir",
    "keep_checkpoints",
    "save_buffer",
    "resume",
    "log_interval",
    "progress",
    "torch_threads",
    "checkpoint_interval",
    "eval_interval",
    "eval_episodes",
    "keep_best",
    "ray_address",
)
EXPORTED_BY = "onefile-rl tools/agent.py"  # in config.json: the mark of a folder --force may replace
EXPORT_FILES = ("policy.pt2", "model.pt", "config.json", "README.md", "replay.mp4")
# The parts of a checkpoint this tool reads itself (the script's policy_from_checkpoint reads the networks).
FIELDS = (("args.env_id", str), ("args.seed", int))  # beside the top-level keys the scripts' load_checkpoint checks
USAGE = """import gymnasium as gym
import torch

policy = torch.export.load("policy.pt2").module()
env = {make_env}
obs, _ = env.reset(seed=0)
done, total = False, 0.0
while not done:
    action = policy(torch.as_tensor(obs, dtype=torch.{dtype}).unsqueeze(0))[0].numpy()
    obs, reward, terminated, truncated, _ = env.step(action)
    total, done = total + float(reward), terminated or truncated
print(total)"""


# What this tool calls in a script: a --script without them is not one of this project's (or an edited copy).
SCRIPT_API = ("UserError", "Args", "load_checkpoint", "policy_from_checkpoint", "eval_env", "evaluate")


class ToolError(Exception):
    """Bad input (a flag, a path, a checkpoint): one paragraph, exit code 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's errors: one paragraph too (it would print its usage block first)
        raise ToolError(f"{message} (see {self.prog} --help)")


def import_script(file: Path):
    """A script (this project's, or an edited copy) as a module; one that does not import, or lacks what this tool
    calls, is a ToolError."""
    spec = importlib.util.spec_from_file_location(f"onefile_{file.stem}", file)
    if spec is None or file.suffix != ".py":
        raise ToolError(f"--script '{file}' is not a Python file (.py).")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # a syntax error, an import it lacks, its own code failing: any of them, the same paragraph
        first = f"{type(e).__name__}: {e}".splitlines()[0]
        raise ToolError(
            f"--script '{file}' could not be imported ({first}): give the script that wrote the checkpoint."
        ) from None
    if missing := [name for name in SCRIPT_API if not hasattr(module, name)]:
        raise ToolError(f"--script '{file}' is not a script of this project: it has no {', '.join(missing)}.")
    return module


def malformed(ckpt: dict) -> list:
    """The fields this tool reads that are missing or of another type, as 'name (type)'."""
    wrong = []
    for name, kind in FIELDS:
        value = ckpt
        for key in name.split("."):
            value = value.get(key) if isinstance(value, dict) else None
        if not isinstance(value, kind):
            wrong.append(f"{name} ({kind.__name__})")
    return wrong


def load(path: str, script_path=None):
    """(script module, checkpoint, its Policy on the CPU), or a ToolError naming what is wrong."""
    if script_path and not Path(script_path).is_file():
        raise ToolError(f"--script '{script_path}' does not exist (or is not a file).")
    # the script's own loader reads the checkpoint (any script's: it is part of the plumbing each script carries)
    reader = import_script(Path(script_path) if script_path else ROOT / f"{SCRIPTS[0]}.py")
    try:
        ckpt = reader.load_checkpoint(path)
    except reader.UserError as e:
        raise ToolError(str(e)) from None
    if wrong := malformed(ckpt):
        raise ToolError(f"checkpoint '{path}' is malformed: {', '.join(wrong)} missing or of another type.")
    file = Path(script_path) if script_path else ROOT / f"{ckpt['script']}.py"
    if ckpt["script"] not in SCRIPTS or not file.is_file():
        raise ToolError(
            f"checkpoint '{path}' was written by '{ckpt['script']}', and {file} is not there: give the script "
            f"that wrote it with --script (this project's are {', '.join(SCRIPTS)})."
        )
    script, ckpt["path"] = reader if file == Path(reader.__file__) else import_script(file), path
    env_id = ckpt["args"]["env_id"]
    if ":" in env_id:  # why: "module:Env" would import any module on sys.path; a checkpoint is data, not code
        raise ToolError(
            f"checkpoint '{path}' names the env '{env_id}', which imports a module; register the env "
            "and store its plain id, or run the evaluation from your own code."
        )
    try:  # the script checks the env id against gymnasium's registry and the checkpoint against the env
        policy = script.policy_from_checkpoint(ckpt).eval()
    except script.UserError as e:
        raise ToolError(str(e)) from None
    except (RuntimeError, KeyError, AttributeError, TypeError, ValueError, IndexError) as e:  # a size mismatch, a bad part
        raise ToolError(
            f"checkpoint '{path}' does not fit {Path(script.__file__).name} as it is now (the networks changed shape "
            f"since it was written) or is malformed ({f'{type(e).__name__}: {e}'.splitlines()[0]}). Evaluate it with "
            "the script that wrote it (--script)."
        ) from None
    return script, ckpt, policy.requires_grad_(False)


def play(script, ckpt: dict, policy, episodes: int, video_dir=None) -> list:
    seed = ckpt["args"]["seed"] + 10_000  # the training run's evaluation seed
    report = lambda i, r: print(f"episode {i + 1}/{episodes}: return {r:.2f}", flush=True)  # noqa: E731
    return script.evaluate(policy, script.eval_env(ckpt["args"]["env_id"], video_dir), episodes, seed, report)


def beside(checkpoint: str, what: str) -> Path:
    """<run>/<what>/<name> for a checkpoint in a run's checkpoints/ folder; <its folder>/<what>/<name> for any other."""
    source = Path(checkpoint).resolve()
    in_run = source.parent.name == "checkpoints" and (source.parents[1] / "args.json").is_file()
    return (source.parents[1] if in_run else source.parent) / what / source.stem


def evaluate_command(opts) -> None:
    """Deterministic episodes; the mean is printed and logged as eval/episodic_return in <run>/eval/<checkpoint>."""
    script, ckpt, policy = load(opts.checkpoint, opts.script)
    out = beside(opts.checkpoint, "eval")
    videos, n = out / "videos", 1
    while videos.exists():  # an earlier eval's videos stay: RecordVideo writes over the files of its folder
        n += 1
        videos = out / f"videos-{n}"
    returns = play(script, ckpt, policy, opts.episodes, str(videos) if opts.capture_video else None)
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(str(out)) as writer:  # the checkpoint's flags beside its score, as the training run logs them
        writer.add_text("hyperparameters", "|param|value|\n|-|-|\n" + "\n".join(f"|{k}|{v}|" for k, v in ckpt["args"].items()))
        writer.add_scalar("eval/episodic_return", float(np.mean(returns)), ckpt["global_step"])
    print(
        f"eval {ckpt['args']['env_id']} at step {ckpt['global_step']}: {np.mean(returns):.2f} +- "
        f"{np.std(returns):.2f} over {len(returns)} episodes"
    )


def check_out(out: Path, source: Path, force: bool) -> None:
    """Refuse an --out the export may not take: a link or a file; a folder with files, unless --force; and even with
    --force, a folder this tool did not export (a run's checkpoints, event files, args.json, anyone's own files)."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise ToolError(f"--out '{out}' is a link or a file, not a folder: nothing was written. Give a folder's path.")
    if any(folder.exists() and not folder.is_dir() for folder in out.parents):  # (mkdir's words: "File exists")
        raise ToolError(f"--out '{out}' goes through a file, not a folder: nothing was written. Give a folder's path.")
    if not out.exists() or not any(out.iterdir()):
        return
    if not force:
        raise ToolError(
            f"--out '{out}' exists and is not empty: nothing was written. Give --force to replace an earlier export, "
            "or another --out."
        )
    try:
        ours = json.loads((out / "config.json").read_text()).get("exported_by") == EXPORTED_BY
    except (OSError, ValueError, AttributeError):  # no config.json, not JSON, not a JSON object
        ours = False
    held = sorted(p.name for p in out.iterdir() if p.name not in EXPORT_FILES or p.is_dir())  # checkpoints, args.json, ...
    held += ["the checkpoint itself"] if source.is_relative_to(out.resolve()) else []
    if held or not ours:
        raise ToolError(
            f"--out '{out}' is not a folder this tool exported ("
            + (f"it holds {', '.join(held)}" if held else "its config.json does not say so")
            + "): --force replaces only an earlier export. Nothing was written; give another --out."
        )


def export_command(opts) -> Path:
    """The export folder, written whole in a temporary folder beside it, then renamed into place: never half an export,
    and never over a folder with files unless --force and that folder is an earlier export (replaced as a whole)."""
    script, ckpt, policy = load(opts.checkpoint, opts.script)
    source = Path(opts.checkpoint).resolve()
    out = Path(opts.out) if opts.out else beside(opts.checkpoint, "export")
    check_out(out, source, opts.force)
    out.parent.mkdir(parents=True, exist_ok=True)
    args = ckpt["args"]
    env = script.eval_env(args["env_id"])
    dtype = "uint8" if env.observation_space.dtype == np.uint8 else "float32"  # Atari frames, or float observations
    obs = torch.as_tensor(np.stack([env.observation_space.sample() for _ in range(2)]).astype(dtype))
    env.close()
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as temp:
        tmp = Path(temp) / "export"
        tmp.mkdir()
        # the batch dimension stays free: any number of observations in, as many actions out
        program = torch.export.export(policy, (obs,), dynamic_shapes=({0: torch.export.Dim("batch")},))
        torch.export.save(program, tmp / "policy.pt2")
        torch.save(policy.state_dict(), tmp / "model.pt")
        config = {
            "exported_by": EXPORTED_BY,
            "script": f"{ckpt['script']}.py",
            "env_id": args["env_id"],
            "global_step": ckpt["global_step"],
            "run_name": ckpt["run_name"],
            "obs_shape": list(obs.shape[1:]),
            "obs_dtype": dtype,
            "policy": f"{ckpt['script']}.policy_from_checkpoint(checkpoint)",
            "args": args,
        }
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        returns = play(script, ckpt, policy, opts.episodes)
        if opts.capture_video:
            play(script, ckpt, policy, 1, str(Path(temp) / "video"))
            videos = sorted((Path(temp) / "video").glob("*.mp4"))
            if videos:
                shutil.move(videos[0], tmp / "replay.mp4")
        card = model_card(script, ckpt, opts.checkpoint, returns, (tmp / "replay.mp4").exists(), dtype)
        (tmp / "README.md").write_text(card)
        folder = os.open(out.parent, os.O_RDONLY)
        try:  # one export at a time checks --out again and moves in: another may have written it meanwhile
            fcntl.flock(folder, fcntl.LOCK_EX)
            check_out(out, source, opts.force)
            if out.exists():  # an empty folder, or an earlier export (--force): it goes with the temporary folder
                os.rename(out, Path(temp) / "old")
            os.rename(tmp, out)  # fails if anything took --out since the check
        finally:
            os.close(folder)
    print(
        f"exported {opts.checkpoint} (step {ckpt['global_step']}) to {out}: eval {np.mean(returns):.2f} +- "
        f"{np.std(returns):.2f} over {len(returns)} episodes"
    )
    return out


def reproduce_command(script, saved: dict) -> str:
    """The command that trains this agent again: the flags whose saved value differs from the default."""
    defaults, words = dataclasses.asdict(script.Args()), [f"python {script.__name__[8:]}.py"]
    for name, default in defaults.items():
        value = saved.get(name, default)
        if name in NOT_TRAINING_FLAGS or value == default or value is None or name not in script.Args.__annotations__:
            continue
        if not next(f for f in dataclasses.fields(script.Args) if f.name == name).init:
            continue  # a derived size (Args.__post_init__ sets it), not a flag
        flag = name.replace("_", "-")
        words.append(f"--{flag}" if value is True else f"--no-{flag}" if value is False else f"--{flag} {value}")
    return " ".join(words)


def model_card(script, ckpt: dict, path: str, returns: list, video: bool, dtype: str) -> str:
    """The export's README.md."""
    file, saved = Path(script.__file__), ckpt["args"]
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    make_env = (
        ("gym.make(...) with the wrappers of make_env in " + file.name)
        if "atari" in file.name
        else f'gym.make("{saved["env_id"]}")'
    )
    return "\n".join(
        [
            f"# {script.__doc__.splitlines()[0].split(' (')[0].split(',')[0]} on {saved['env_id']}",
            "",
            f"Trained by `{file.name}` (onefile-rl) for {ckpt['global_step']:,} env steps (checkpoint "
            f"`{Path(path).name}` of run `{ckpt['run_name']}`).",
            "",
            "## Evaluation",
            "",
            f"Return **{np.mean(returns):.2f} ± {np.std(returns):.2f}** (mean ± std) over {len(returns)} deterministic "
            f"episodes (seeds from {saved['seed'] + 10_000}).",
            "",
            "## Use",
            "",
            "```python",
            USAGE.format(make_env=make_env, dtype=dtype),
            "```",
            "",
            "`policy.pt2` is a program: load only programs from people you trust. `model.pt` holds plain tensors "
            f"(`torch.load(path, weights_only=True)`), the state_dict of `{file.name}`'s `Policy`.",
            "",
            "## Files",
            "",
            "- `policy.pt2`, `model.pt`, `config.json`, `README.md`" + (", `replay.mp4`" if video else ""),
            "",
            "## Reproduce",
            "",
            "```",
            reproduce_command(script, saved),
            "```",
            "",
            f"Script `{file.name}`, SHA-256 `{hashlib.sha256(file.read_bytes()).hexdigest()}`"
            + (f", git commit `{commit}`" if commit else "")
            + f"; torch {torch.__version__}.",
            "",
        ]
    )


def main(argv=None) -> None:
    parser = Parser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for name, text in (
        ("eval", "play deterministic episodes, print and log their mean"),
        ("export", "write a folder that runs the agent with plain torch"),
    ):
        command = commands.add_parser(name, help=text)
        command.add_argument("checkpoint", help="a checkpoint written by one of the scripts (runs/<run>/checkpoints/*.pt)")
        command.add_argument("--episodes", type=int, default=10, help="evaluation episodes (default 10)")
        command.add_argument("--capture-video", action="store_true", help="record a video of the evaluation")
        command.add_argument("--script", help="the script that wrote the checkpoint, if not this project's (a copy)")
        if name == "export":
            command.add_argument("--out", help="the export folder (default <run>/export/<checkpoint name>)")
            command.add_argument(
                "--force", action="store_true", help="replace an earlier export in --out (never any other folder)"
            )
    try:
        opts = parser.parse_args(argv)
        if opts.episodes < 1:
            raise ToolError(f"--episodes {opts.episodes}: give 1 or more.")
        if opts.capture_video and not os.environ.get("DISPLAY"):
            os.environ.setdefault("MUJOCO_GL", "egl")  # headless MuJoCo renders through EGL; set before mujoco loads
            os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # and pygame (classic control) off-screen
        (evaluate_command if opts.command == "eval" else export_command)(opts)
    except (ToolError, OSError, KeyboardInterrupt) as e:  # bad input, a path, the disk; Ctrl-C: one paragraph
        print(f"error: {str(e) or 'stopped (Ctrl-C); an export is written whole or not at all'}", file=sys.stderr)
        sys.exit(130 if isinstance(e, KeyboardInterrupt) else 2)


if __name__ == "__main__":
    main()
