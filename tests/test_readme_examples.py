"""Every example the README shows runs as written, in the README's order, after the ones before it: each line of a
```bash block, each ```python block and each inline `uv run ...` command. They run in a copy of the scripts in an
empty folder (the README's "project folder", with tools/agent.py and tools/plot.py), with `uv run` meaning this
interpreter, a small budget appended to each training command, and `<run>` / `<step>` replaced by the run the quick
start made and its newest checkpoint.
LEFT_OUT names the examples that are not run, each with its reason; the test fails when one of them is no longer in
the README, so the list stays true."""

import inspect
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import BASE_ENV, ROOT, episode_lines
from tests.fork_runner import run_fresh, run_python
from tests.test_sac_continuous_ray_e2e import stop_session

README = ROOT / "README.md"
SCRIPTS = ["ppo_continuous.py", "ppo_atari.py", "a2c_atari.py", "sac_continuous.py", "sac_continuous_ray.py"]

LEFT_OUT = {
    "python3 -m pip install -q uv && python3 -m uv run --all-extras pytest": "the test suite, which this test is part of",
    "uv run --all-extras pytest": "the test suite, which this test is part of",
    "uv run --all-extras pytest -m slow": "the slow tier of the test suite (learning runs), which .ci/run runs",
    "uv run --all-extras python -m tests.mutants --jobs 2": "the mutant run (about 20 min), .ci/run's last step",
    "uv run ppo_continuous.py --env-id HalfCheetah-v4": "the quick start's first command again, for a machine with uv "
    "on its PATH (run above as `python3 -m uv run ...`)",
    "uv export --frozen --no-dev --no-hashes --no-emit-project --extra atari | grep -vE '^(nvidia-|triton|cuda-)' > "
    "requirements-cpu.txt": "the CPU-only install: the next line downloads torch from PyTorch's index (no network here)",
    "uv venv .venv-cpu && uv pip install --python .venv-cpu --torch-backend cpu -r requirements-cpu.txt": "downloads "
    "torch's CPU build from PyTorch's index (no network here)",
    ".venv-cpu/bin/python ppo_continuous.py --env-id HalfCheetah-v4": "needs the CPU-only environment of the two lines above",
    "uv run tensorboard --logdir runs": "a server that runs until stopped; tests/test_docs.py starts it on a real run "
    "and reads the tags the README names",
    "python -c \"import huggingface_hub as hub; hub.create_repo('<you>/ppo-halfcheetah', exist_ok=True)\n"
    "hub.upload_folder(repo_id='<you>/ppo-halfcheetah', folder_path='runs/<run>/export/step_<step>')\"": "uploads to "
    "the Hugging Face Hub: needs an account, huggingface_hub and the network",
    "uv run sac_continuous.py --seed $SLURM_ARRAY_TASK_ID": "a Slurm array task's command (needs Slurm)",
    "uv run --extra ray ray start --head": "starts a Ray cluster's head node, which outlives the command; "
    "tests/test_sac_continuous_ray_cluster.py starts a two-node cluster itself",
    "uv run --extra ray ray start --address HEAD:6379": "joins a cluster's head node that is not there (HEAD)",
    "uv run --extra ray sac_continuous_ray.py --ray-address auto --num-rollout-workers 16": "needs a Ray cluster "
    "started with `ray start`; tests/test_sac_continuous_ray_cluster.py runs the script on a two-node one",
}

# Appended to each training command (the last value of a flag wins): a few seconds each, a step checkpoint every 128
# steps for ppo_continuous.py (the README's resume, evaluation and export use them). Resume extends the run by one
# iteration (its output flags, --checkpoint-interval among them, come from the command line); tools/agent.py's
# evaluation and export play one episode.
BUDGETS = {
    "ppo_continuous.py": "--total-timesteps 256 --num-envs 1 --num-steps 128 --checkpoint-interval 128",
    "sac_continuous.py": "--total-timesteps 300 --learning-starts 100 --batch-size 32",
    "ppo_atari.py": "--total-timesteps 256 --num-envs 2 --num-steps 32 --num-minibatches 2 --update-epochs 1",
    "a2c_atari.py": "--total-timesteps 250 --num-envs 2 --num-steps 5",
    "sac_continuous_ray.py": "--total-timesteps 400 --learning-starts 100 --batch-size 32 --worker-batch-steps 50",
}


def budget(args: list) -> list:
    """The flags appended to `uv run SCRIPT.py ARGS` (args: SCRIPT.py ARGS)."""
    if "--resume" in args:
        return ["--total-timesteps", "384", "--checkpoint-interval", "128"]
    if args[0].endswith("agent.py"):  # tools/agent.py eval|export CHECKPOINT
        return ["--episodes", "1"]
    return BUDGETS.get(args[0], "").split()


# bash's budget() runs budget() above (one source for both ways an example runs)
BUDGET_CODE = f"import sys\nBUDGETS = {BUDGETS!r}\n{inspect.getsource(budget)}\nprint(*budget(sys.argv[1:]))"
SHIMS = r"""
python3() {  # the quick start's `python3 -m pip install -q uv && python3 -m uv ...`: uv is installed here already
  if [ "$1" = -m ] && [ "$2" = pip ]; then return 0; fi
  if [ "$1" = -m ] && [ "$2" = uv ]; then shift 2; uv "$@"; return; fi
  "$PYTHON" "$@"
}
budget() { "$PYTHON" -S -c "$BUDGET_CODE" "$@"; }
uv() {  # `uv run [--extra X | --all-extras] SCRIPT.py ARGS`: this interpreter, the script's small budget appended
  [ "$1" = run ] || { echo "this test's uv knows only 'uv run'" >&2; return 2; }
  shift
  while :; do case "$1" in --extra) shift 2;; --all-extras) shift;; *) break;; esac; done
  "$PYTHON" "$@" $(budget "$@")
}
set -e
"""
# One `uv run SCRIPT.py ARGS` and nothing else of the shell: it runs on the fork server (tests/fork_runner.py), as
# `python SCRIPT.py ARGS` does, without importing torch again. Ray's runs and shell lines go through bash.
PLAIN_UV_RUN = re.compile(r"uv run(?: --extra \S+| --all-extras)* ((?!sac_continuous_ray)[\w]+\.py)(?: [^&;|$<>`]*)?")


def run_example(kind: str, code: str, project: Path, env: dict) -> subprocess.CompletedProcess:
    """One example, in the project folder: on the fork server where it is one plain command or a python block (both
    as `python X` would run them), else in bash with the shims above, in a session of its own (Ray's processes)."""
    if kind == "python" or PLAIN_UV_RUN.fullmatch(code):
        if kind == "python":
            script, args = project / "readme_example.py", []
            script.write_text(code)
        else:
            words = shlex.split(code)[2:]
            while words[0].startswith("--"):
                words = words[2:] if words[0] == "--extra" else words[1:]
            script, args = project / words[0], [*words[1:], *budget(words)]
        return run_python(script, args, project, env, timeout=300, hidden=[ROOT])
    started = []
    try:
        return run_fresh(
            ["bash", "-c", SHIMS + code],
            project,
            {**env, "BUDGET_CODE": BUDGET_CODE},
            300,
            None,
            started,
            start_new_session=True,
        )
    finally:
        if started:
            stop_session(started[0].pid)  # whatever it left (Ray's processes), and nothing else


def examples(text: str) -> list:
    """(kind, text) in the README's order: "bash" for each command of a ```bash block (a line, or lines joined while
    a quote is open) and each inline `uv run ...`, "python" for each ```python block."""
    found = []
    for match in re.finditer(r"```(\w*)\n(.*?)```|`(uv run [^`]+)`", text, flags=re.S):
        language, block, inline = match.groups()
        if inline is not None:
            found.append(("bash", " ".join(inline.split())))
        elif language == "python":
            found.append(("python", block))
        else:
            assert language == "bash", f"a README block in {language!r}: teach this test to run it"
            command = ""
            for line in block.splitlines():
                command = f"{command}\n{line}" if command else line
                try:
                    shlex.split(command)
                except ValueError:  # an open quote: the command goes on on the next line
                    continue
                found.append(("bash", command))
                command = ""
    return found


def newest_step(run_dir: Path) -> str:
    steps = sorted(run_dir.glob("checkpoints/step_*.pt"))
    assert steps, f"no step checkpoint in {run_dir}"
    return steps[-1].stem.removeprefix("step_")


def test_every_left_out_example_is_in_the_readme_and_the_rest_is_runnable():
    texts = [text for _, text in examples(README.read_text())]
    for text in LEFT_OUT:
        assert text in texts, f"LEFT_OUT names an example the README no longer shows: {text!r}"
    run = [text for text in texts if text not in LEFT_OUT]
    assert any(text.startswith("python3 -m pip install -q uv && python3 -m uv run ppo_continuous.py") for text in run)
    assert len(run) >= 10, run


def uses_ray(text: str) -> bool:
    return "sac_continuous_ray" in text


def run_examples_in_order(tmp_path: Path, select) -> tuple:
    """Run the README's examples for which select(text) holds, in order, in a project folder of copies of the scripts:
    (project folder, the first run made, {example: stdout})."""
    project = tmp_path / "project"
    project.mkdir()
    for script in SCRIPTS:
        shutil.copy(ROOT / script, project / script)
    (project / "tools").mkdir()
    shutil.copy(ROOT / "tools" / "agent.py", project / "tools" / "agent.py")  # it loads the scripts beside its folder
    shutil.copy(ROOT / "tools" / "plot.py", project / "tools" / "plot.py")
    env = {k: v for k, v in {**os.environ, **BASE_ENV, "PYTHON": sys.executable}.items() if k != "PYTHONPATH"}
    run_dir, ran, left_out = None, [], []
    for kind, text in examples(README.read_text()):
        if text in LEFT_OUT:
            left_out.append(text)
            continue
        if not select(text):
            continue
        code = text
        if "<run>" in code or "<step>" in code or "<global_step>" in code:
            assert run_dir is not None, f"an example uses <run> before any command made a run: {text!r}"
            step = newest_step(run_dir)
            code = code.replace("<run>", run_dir.name).replace("<global_step>", step).replace("<step>", step)
        assert not re.search(r"<\w+>", code), f"a placeholder this test does not fill: {code!r}"
        start = time.monotonic()
        proc = run_example(kind, code, project, env)
        assert proc.returncode == 0, f"README example failed ({proc.returncode}): {text}\n{proc.stderr[-3000:]}"
        ran.append((text, proc.stdout))
        print(f"{time.monotonic() - start:5.1f} s  {text[:100]!r}")
        if run_dir is None and (project / "runs").is_dir():
            (run_dir,) = (project / "runs").iterdir()  # the first run made: <run> in the examples below
    print("left out:\n" + "\n".join(f"- {text!r}: {LEFT_OUT[text]}" for text in dict.fromkeys(left_out)))
    return project, run_dir, dict(ran)


@pytest.mark.slow  # Ray start-up and two short trainings: about 50 s of the serial Ray group
@pytest.mark.ray
def test_the_readme_ray_examples_run(tmp_path):
    """The README's sac_continuous_ray.py examples (they start Ray: one test at a time, tests/conftest.py); none of
    them uses a run that another example made."""
    project, _, outputs = run_examples_in_order(tmp_path, uses_ray)
    assert outputs, "the README shows no sac_continuous_ray.py example this test runs"
    made = {tuple(path.name.split("__")[:3]) for path in (project / "runs").iterdir()}
    assert ("HalfCheetah-v4", "sac_continuous_ray", "1") in made, made


@pytest.mark.slow  # about 95 s: the slow tier keeps the default one within 10 minutes
def test_the_readme_examples_run_in_order(tmp_path):
    """Every other example, in the README's order (the Ray ones: the test above)."""
    project, run_dir, outputs = run_examples_in_order(tmp_path, lambda text: not uses_ray(text))
    # what the examples made, as the README says
    assert run_dir.name.startswith("HalfCheetah-v4__ppo_continuous__1__")
    resume = next(text for text in outputs if "--resume" in text)
    assert "resumed from" in outputs[resume] and (run_dir / "checkpoints" / "step_0000000384.pt").exists()
    evaluate = next(text for text in outputs if "tools/agent.py eval" in text)
    episode_lines(outputs[evaluate], 1)
    assert list((run_dir / "eval" / "step_0000000384").glob("events.out.tfevents.*")), "eval logs in <run>/eval/"
    export = next(text for text in outputs if "tools/agent.py export" in text)
    folder = run_dir / "export" / "step_0000000384"
    assert "episode 1/1: return" in outputs[export]
    assert {"policy.pt2", "model.pt", "config.json", "README.md"} <= {path.name for path in folder.iterdir()}
    plot = next(text for text in outputs if "tools/plot.py" in text)
    assert "Hopper-v4 ppo_continuous (seeds [1])" in outputs[plot]  # the runs with a finished episode at these budgets
    assert (project / "curves.png").read_bytes().startswith(b"\x89PNG")
    plain_torch = next(text for text in outputs if "torch.export.load" in text)
    assert re.fullmatch(r"return: -?\d+\.\d\n", outputs[plain_torch]), outputs[plain_torch]
    # every training command made its run (the seeds loop's `wait` does not report a failed run: check its checkpoints)
    made = {tuple(path.name.split("__")[:3]): path for path in (project / "runs").iterdir()}
    for seed in "123":
        assert (made["HalfCheetah-v4", "ppo_continuous", seed] / "checkpoints" / "step_0000000256.pt").exists()
    for key in [
        ("Hopper-v4", "ppo_continuous", "1"),
        ("HalfCheetah-v4", "sac_continuous", "1"),
        ("BreakoutNoFrameskip-v4", "ppo_atari", "1"),
    ]:
        assert key in made, f"no run {key} among {sorted(made)}"
