"""The edges of a run, end to end with the real libraries: wandb (offline) sees each scalar once and each video, with
one event file and short paths; --capture-video on classic control and Atari; one boundary for what a user's env
module raises; signals while the libraries import, before the first iteration ends, repeated, and during the final
evaluation; checkpoints as untrusted input (a path for run_name, fields of the wrong kind, NaN weights, a stale
temporary file of a killed save).

Signals are sent when the run is where the test wants it, never after a hopeful sleep: a user env module (ENV_MODULE)
writes a marker file holding its pid where it then waits, or the test waits for a file the run writes."""

import collections
import contextlib
import hashlib
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import BASE_ENV, ROOT, assert_clean_error, kill_run, only_run_dir, output_after_ctrl_c, run_script
from tests.conftest import scalars, wait_until
from tests.fork_runner import run_python

SCRIPT = "ppo_continuous.py"
TOOL = "tools/agent.py"
# One env x 32 steps a batch, 2 minibatches, 1 epoch: an iteration takes a fraction of a second.
SMALL = ["--num-envs", "1", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "1", "--torch-threads", "1"]
OFFLINE = {"WANDB_MODE": "offline", "WANDB_API_KEY": None}
# The tests that share a module-scoped run stay on one xdist worker (--dist loadgroup), so that run is made once.
TRACKED, VIDEO, TRAINED = (pytest.mark.xdist_group(f"test_edges_{run}") for run in ("tracked", "video", "trained"))

# ---- a user's env module, mymod.py: what it does is chosen by $MYMOD ----
ENV_MODULE = '''"""A user's env module (tests/test_edges.py); $MYMOD chooses how it misbehaves."""
import os
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

MODE = os.environ.get("MYMOD", "")
if MODE == "import":
    raise RuntimeError("mymod cannot start")


def wait_here(name):
    """Say that this process (the marker holds its pid) has reached this point, then wait for the test's signal (once)."""
    marker = Path(__file__).parent / name
    if marker.exists():
        return
    marker.with_suffix(".tmp").write_text(str(os.getpid()))
    marker.with_suffix(".tmp").rename(marker)  # whole or not at all: the test reads the pid
    time.sleep(30)


class Bad(gym.Env):
    def __init__(self):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.steps = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if MODE == "slow-eval" and seed is not None and seed >= 10_000:  # the evaluation's episodes: seed + 10,000
            wait_here("evaluating")
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.steps += 1
        if MODE == "exception":
            raise Exception("the simulator broke")
        if MODE == "keyerror":
            return {}["missing"]
        if MODE == "slow-first-step" and self.steps == 1:
            wait_here("stepping")
        return np.zeros(3, np.float32), 0.0, False, False, {}


gym.register("Bad-v0", entry_point=Bad, max_episode_steps=20)
'''


def line_of(text: str, source: str = ENV_MODULE) -> int:
    """The line number of the line of `source` that contains `text`."""
    (number,) = [i for i, line in enumerate(source.splitlines(), 1) if text in line]
    return number


def user_folder(tmp_path: Path, script: str = SCRIPT) -> Path:
    """A user's folder: mymod.py beside their copy of the script (`python ppo_continuous.py --env-id mymod:Bad-v0`
    finds mymod there, on a forked run as on a fresh one)."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "mymod.py").write_text(ENV_MODULE)
    shutil.copy(ROOT / script, folder / script)
    return folder


def run_user(folder: Path, mode: str, *args, script: str = SCRIPT, stop_when=None, timeout: float = 300):
    """Run the user's copy of the script in their folder (cwd), mymod misbehaving as `mode`."""
    env = {**os.environ, **BASE_ENV, "MYMOD": mode}
    return run_python(folder / script, args, folder, env, timeout, stop_when=stop_when)


def signal_at(marker: Path, sig: int):
    """A stop_when that sends `sig` (once) to the process whose pid `marker` holds, as soon as it exists."""
    sent = []

    def stop_when() -> bool:
        if not sent and marker.exists():
            os.kill(int(marker.read_text()), sig)
            sent.append(sig)
        return False  # the signal is sent here: the runner sends no Ctrl-C of its own

    return stop_when


def tree(folder: Path) -> dict:
    """Every path under folder, with a hash of each file's bytes: equal trees are the same files with the same content."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(folder.rglob("*"))
    }


# ---- wandb's offline record log (run-*.wandb) ----
def wandb_records(path: Path) -> list:
    """The records of wandb's offline log: a 7-byte header (":W&B", magic, version), then LevelDB-log records in 32 KiB
    blocks: crc32 (4), length (2, little-endian), type (1 full, 2 first, 3 middle, 4 last), a wandb Record's bytes."""
    from wandb.proto import wandb_internal_pb2

    data, block, records, payload = path.read_bytes(), 32 * 1024, [], b""
    assert data[:4] == b":W&B", data[:7]
    pos = 7
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:  # zeroed padding
            pos += block - pos % block
            continue
        payload, pos = payload + data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # a whole record, or its last fragment
            records.append(wandb_internal_pb2.Record.FromString(payload))
            payload = b""
    return records


def history(records: list) -> list:
    """wandb's history rows, one per wandb.log call (a TensorBoard point is one): {key: value}, a media item's value a
    dict of its fields (wandb records each field as an item under the nested key [key, field])."""
    rows = []
    for record in (r for r in records if r.WhichOneof("record_type") == "history"):
        rows.append({})
        for item in record.history.item:
            key, *field = list(item.nested_key) or [item.key]
            value = json.loads(item.value_json)
            rows[-1][key] = {**rows[-1].get(key, {}), field[0]: value} if field else value
    return rows


# ---- wandb: one run of 100 log windows, tracked, with videos ----
@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory) -> Path:
    """Pendulum-v1, 100 iterations of 32 steps (100 log windows), --track (offline) and --capture-video: the run folder."""
    home = tmp_path_factory.mktemp("home")
    proc = run_script(
        SCRIPT,
        "--track",
        "--capture-video",
        "--env-id",
        "Pendulum-v1",
        *SMALL,
        "--total-timesteps",
        "3200",
        "--runs-dir",
        home / "runs",
        env={**OFFLINE, "HOME": str(home)},
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    return only_run_dir(home / "runs")


def tracked_records(run_dir: Path) -> list:
    (log,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    return wandb_records(log)


@TRACKED
@pytest.mark.slow
def test_wandb_has_each_scalar_point_once_and_the_run_one_event_file(tracked_run):
    records = tracked_records(tracked_run)
    counts = collections.Counter(key for row in history(records) for key in row)
    (events,) = tracked_run.rglob("events.out.tfevents.*")  # one event file in the whole run folder: no copies in wandb's
    assert events.parent == tracked_run
    tags = [key for key in counts if "/" in key and key != "videos"]  # the TensorBoard tags (charts/..., losses/...)
    assert len(tags) >= 14 and "charts/episodic_return" in tags, tags
    for tag in tags:
        assert counts[tag] == len(scalars(tracked_run, tag)) > 0, (tag, counts[tag], len(scalars(tracked_run, tag)))
    assert counts["losses/value_loss"] == 100  # one point per log window
    # wandb reads the event files where they are, and is told not to copy them into its folder (save=False)
    (tb,) = [r.tbrecord for r in records if r.WhichOneof("record_type") == "tbrecord"]
    assert not tb.save and Path(tb.log_dir) == tracked_run, tb


@TRACKED
@pytest.mark.slow
def test_a_run_of_100_log_windows_keeps_every_path_short(tracked_run):
    longest = max((str(p) for p in tracked_run.rglob("*")), key=len)
    assert len(longest) < 300, longest
    assert len(str(tracked_run)) + 150 > len(longest), longest  # nothing nested within wandb's folder


@TRACKED
@pytest.mark.slow
def test_track_with_capture_video_logs_each_video_to_wandb(tracked_run):
    videos = sorted(p.name for p in (tracked_run / "videos").glob("*.mp4"))
    assert videos[:2] == ["rl-video-episode-0.mp4", "rl-video-episode-1.mp4"], videos  # env 0's first two episodes
    logged = [row["videos"] for row in history(tracked_records(tracked_run)) if "videos" in row]
    assert len(logged) == len(videos), logged  # each once
    sha256 = sorted(hashlib.sha256(p.read_bytes()).hexdigest() for p in (tracked_run / "videos").glob("*.mp4"))
    assert sorted(item["sha256"] for item in logged) == sha256, logged  # and each of the run's videos
    assert all(item["_type"] == "video-file" for item in logged), logged
    (files,) = tracked_run.glob("wandb/offline-run-*/files")  # wandb's copies of the videos, synced with the run
    media = sorted(str(p.relative_to(files)) for p in files.glob("media/videos/*.mp4") if p.stat().st_size > 1000)
    assert media == sorted(item["path"] for item in logged), (media, logged)


# ---- --capture-video: classic control (pygame), Atari; MuJoCo: tests/test_ppo_continuous_e2e.py ----
@pytest.fixture(scope="module")
def pendulum_video_run(tmp_path_factory):
    """sac_continuous.py on Pendulum-v1 with --capture-video, headless (no display, no XDG_RUNTIME_DIR): (proc, run folder)."""
    runs = tmp_path_factory.mktemp("runs")
    proc = run_script(
        "sac_continuous.py",
        "--env-id",
        "Pendulum-v1",
        "--learning-starts",
        "32",
        "--batch-size",
        "32",
        "--torch-threads",
        "1",
        "--total-timesteps",
        "64",
        "--capture-video",
        "--runs-dir",
        runs,
        env={"DISPLAY": None, "XDG_RUNTIME_DIR": None},
    )
    return proc, runs


@VIDEO
def test_capture_video_on_classic_control_writes_an_mp4(pendulum_video_run):
    proc, runs = pendulum_video_run
    assert proc.returncode == 0, proc.stderr
    video = only_run_dir(runs) / "videos" / "rl-video-episode-0.mp4"  # the first episode, unfinished: written at close
    assert video.stat().st_size > 1000


@VIDEO
def test_a_classic_control_video_run_prints_no_error_line(pendulum_video_run):
    proc, _ = pendulum_video_run
    assert proc.returncode == 0, proc.stderr
    assert not [line for line in proc.stderr.splitlines() if line.startswith("error")], proc.stderr


def test_capture_video_on_atari_writes_an_mp4(tmp_path):
    pytest.importorskip("ale_py")
    proc = run_script(
        "ppo_atari.py",
        "--env-id",
        "BreakoutNoFrameskip-v4",
        "--num-envs",
        "2",
        "--num-steps",
        "32",
        "--num-minibatches",
        "2",
        "--update-epochs",
        "1",
        "--torch-threads",
        "1",
        "--total-timesteps",
        "64",
        "--capture-video",
        "--runs-dir",
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    (video,) = (only_run_dir(tmp_path) / "videos").glob("*.mp4")  # env 0's game, unfinished: written at close
    assert video.stat().st_size > 1000


# ---- one boundary: whatever the user's env module raises ----
@pytest.mark.parametrize(
    "mode, needles",
    [
        ("exception", ["error: the simulator broke (Exception at line {}", 'raise Exception("the simulator broke")']),
        ("keyerror", ["error: 'missing' (KeyError at line {}", 'return {{}}["missing"]']),
        ("import", ["error: mymod cannot start (RuntimeError at line {}", 'raise RuntimeError("mymod cannot start")']),
    ],
)
def test_what_a_user_env_raises_is_one_paragraph_naming_its_line_and_the_run_leaves_nothing(tmp_path, mode, needles):
    folder = user_folder(tmp_path)
    before = tree(folder)
    proc = run_user(folder, mode, "--env-id", "mymod:Bad-v0", *SMALL, "--total-timesteps", "64", "--runs-dir", "new/runs")
    code = needles[1].replace("{{}}", "{}")
    assert_clean_error(proc, needles[0].format(line_of(code)) + " of mymod.py: `" + code + "`)")
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert ("run: " in proc.stdout) == (mode != "import"), proc.stdout  # the step's errors: a run folder had been made
    assert tree(folder) == before  # no run folder, and no new/ nor new/runs/ (the run made both)


# ---- signals ----
SLOW_IMPORT = '''"""sitecustomize: hold ppo_continuous.py at its `import gymnasium` (after its first lines)."""
import os
import sys
import time
from pathlib import Path


class HoldGymnasium:
    def find_spec(self, name, path=None, target=None):
        main = getattr(sys.modules.get("__main__"), "__file__", None) or ""
        if name == "gymnasium" and main.endswith("ppo_continuous.py"):
            sys.meta_path.remove(self)
            marker = Path(os.environ["IMPORT_MARKER"])
            marker.with_suffix(".tmp").write_text(str(os.getpid()))
            marker.with_suffix(".tmp").rename(marker)
            time.sleep(30)
        return None


sys.meta_path.insert(0, HoldGymnasium())
'''


def test_ctrl_c_while_the_libraries_import_exits_130_silently_writing_nothing(tmp_path):
    """A fresh interpreter (the fork runner has imported them already), held at `import gymnasium`."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SLOW_IMPORT)
    marker = tmp_path / "importing"
    env = {**os.environ, **BASE_ENV, "PYTHONPATH": str(hook), "IMPORT_MARKER": str(marker)}
    cmd = [sys.executable, str(ROOT / SCRIPT), "--env-id", "Pendulum-v1", "--runs-dir", str(tmp_path / "runs")]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(marker.exists, 120, "its `import gymnasium`", proc)
        proc.send_signal(signal.SIGINT)
        out, err = output_after_ctrl_c(proc, 60)
    finally:
        kill_run(proc)
    assert proc.returncode == 130, err
    assert out == "" and err == "", (out, err)  # no traceback, nothing said: nothing had started
    assert not (tmp_path / "runs").exists()


def test_ctrl_c_before_the_first_iteration_ends_exits_130_and_leaves_nothing(tmp_path):
    folder = user_folder(tmp_path)
    before = tree(folder)
    proc = run_user(
        folder,
        "slow-first-step",
        "--env-id",
        "mymod:Bad-v0",
        *SMALL,
        "--total-timesteps",
        "64",
        "--runs-dir",
        "new/runs",
        stop_when=lambda: (folder / "stepping").exists(),  # then a Ctrl-C: the first iteration's first step waits
    )
    (folder / "stepping").unlink()
    assert proc.stopped and proc.returncode == 0, proc.stderr  # the runner reads the Ctrl-C's exit code 130 as 0
    assert "run: " in proc.stdout and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == "interrupted before the first iteration ended: the run left nothing behind.", proc.stderr
    assert tree(folder) == before  # the run folder and the --runs-dir the run made are gone


def start_pendulum_until_its_first_checkpoint(runs_dir: Path) -> subprocess.Popen:
    """A fresh interpreter training Pendulum-v1 for ever, a checkpoint every iteration; returned once the first exists
    (the first iteration has ended: a signal now stops the run after its iteration, and saves)."""
    cmd = [sys.executable, str(ROOT / SCRIPT), "--env-id", "Pendulum-v1", *SMALL, "--total-timesteps", "10000000"]
    cmd += ["--checkpoint-interval", "32", "--keep-checkpoints", "1", "--no-progress", "--runs-dir", str(runs_dir)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **BASE_ENV}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_until(lambda: list(runs_dir.glob("*/checkpoints/step_*.pt")), 300, "its first checkpoint", proc)
    return proc


@pytest.mark.slow
def test_four_ctrl_c_in_a_row_never_lose_the_save_which_resumes(tmp_path):
    """Four SIGINTs 20 ms apart, once the first periodic checkpoint exists: an interrupted_ checkpoint that resumes."""
    proc = start_pendulum_until_its_first_checkpoint(tmp_path)  # (killed by wait_until if it stalls)
    try:
        for _ in range(4):
            proc.send_signal(signal.SIGINT)
            time.sleep(0.02)
        out, err = (text.decode() for text in output_after_ctrl_c(proc, 120))
    finally:
        kill_run(proc)
    assert proc.returncode == 130, err  # not -2: a later SIGINT reaching the interpreter's exit is ignored there
    assert "Traceback" not in err and "interrupted: saved step" in err, err
    (interrupted,) = (only_run_dir(tmp_path) / "checkpoints").glob("interrupted_*.pt")
    state = torch.load(interrupted, weights_only=True)
    assert state["global_step"] == 32 * state["iteration"] >= 32
    resumed = run_script(SCRIPT, "--resume", interrupted, "--total-timesteps", state["global_step"] + 32)
    assert resumed.returncode == 0, resumed.stderr
    assert max(scalars(only_run_dir(tmp_path), "losses/value_loss")) == state["global_step"] + 32


@pytest.mark.slow
def test_ctrl_c_repeated_while_the_run_exits_still_exits_130(tmp_path):
    """SIGINT every millisecond from the first checkpoint until the process is gone: one reaches its exit."""
    proc = start_pendulum_until_its_first_checkpoint(tmp_path)  # (killed by wait_until if it stalls)
    try:
        while proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGINT)
            time.sleep(0.001)
        output_after_ctrl_c(proc, 120)
    finally:
        kill_run(proc)
    assert proc.returncode == 130


def test_sigterm_during_the_final_evaluation_saves_the_final_checkpoint_and_exits_130(tmp_path):
    folder = user_folder(tmp_path)
    proc = run_user(
        folder,
        "slow-eval",
        "--env-id",
        "mymod:Bad-v0",
        *SMALL,
        "--total-timesteps",
        "64",
        "--save-model",
        "--eval-episodes",
        "50",
        "--runs-dir",
        "runs",
        stop_when=signal_at(folder / "evaluating", signal.SIGTERM),  # the first evaluation episode's reset waits
    )
    assert (folder / "evaluating").exists(), "the final evaluation never started"
    assert proc.returncode == 130, proc.stderr
    assert "Traceback" not in proc.stderr and "eval:" not in proc.stdout, proc.stderr
    assert "interrupted during the final evaluation: the final checkpoint is saved, unevaluated." in proc.stderr
    (final,) = (only_run_dir(folder / "runs") / "checkpoints").glob("final_*.pt")
    assert torch.load(final, weights_only=True)["global_step"] == 64


# ---- checkpoints are input ----
@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A finished Pendulum-v1 run (2 iterations of 32 steps, --save-model): its run folder, copied by each test."""
    runs = tmp_path_factory.mktemp("runs")
    proc = run_script(
        SCRIPT,
        "--env-id",
        "Pendulum-v1",
        *SMALL,
        "--total-timesteps",
        "64",
        "--checkpoint-interval",
        "0",
        "--save-model",
        "--eval-episodes",
        "1",
        "--runs-dir",
        runs,
    )
    assert proc.returncode == 0, proc.stderr
    return only_run_dir(runs)


def copied(trained: Path, tmp_path: Path, edit=None) -> tuple:
    """A copy of the trained run under tmp_path/runs, its final checkpoint edited in place: (run folder, checkpoint)."""
    run_dir = tmp_path / "runs" / trained.name
    shutil.copytree(trained, run_dir)
    (ckpt_path,) = (run_dir / "checkpoints").glob("final_*.pt")
    if edit is not None:
        ckpt = torch.load(ckpt_path, weights_only=True)
        edit(ckpt)
        torch.save(ckpt, ckpt_path)
    return run_dir, ckpt_path


def set_field(ckpt: dict, dotted: str, value) -> None:
    *parents, key = dotted.split(".")
    for part in parents:
        ckpt = ckpt[part]
    ckpt[key] = value


@TRAINED
@pytest.mark.parametrize("run_name", ["../../x", "/abs/x"])
def test_resume_refuses_a_run_name_that_is_a_path(trained, tmp_path, run_name):
    """A checkpoint outside a run folder resumes into a new folder named run_name under --runs-dir: never elsewhere."""
    run_name = str(tmp_path / "abs" / "x") if run_name.startswith("/") else run_name
    loose = tmp_path / "loose" / "edited.pt"
    loose.parent.mkdir()
    ckpt = torch.load(next((trained / "checkpoints").glob("final_*.pt")), weights_only=True)
    torch.save({**ckpt, "run_name": run_name}, loose)
    before = tree(tmp_path)
    proc = run_script(SCRIPT, "--resume", loose, "--total-timesteps", "128", "--runs-dir", tmp_path / "a" / "b" / "runs")
    assert_clean_error(proc, f"run_name ({run_name!r} is not a plain folder name)")
    assert tree(tmp_path) == before  # no tmp_path/a/x, no tmp_path/abs/x, no runs folder


@pytest.mark.parametrize(
    "field, value, needle",
    [
        ("rng_states.torch", "a string", "rng_states.torch (Tensor)"),
        ("run_state.recent_returns", 5, "run_state.recent_returns (list)"),
        ("run_state.best_score", "high", "run_state.best_score (float)"),
        ("args.num_envs", "1", "args.num_envs (int)"),
        ("args.learning_rate", "fast", "args.learning_rate (float)"),
        ("run_state.global_step", "64", "checkpoint field run_state.global_step (str ())"),
        ("run_state.raw_obs", torch.zeros(5), "checkpoint field run_state.raw_obs (Tensor (5,))"),
        ("obs_rms.mean", torch.zeros(7), "checkpoint field obs_rms.mean (Tensor (7,))"),
    ],
)
@TRAINED
def test_resume_refuses_a_checkpoint_field_of_the_wrong_kind_changing_nothing(trained, tmp_path, field, value, needle):
    run_dir, ckpt = copied(trained, tmp_path, lambda c: set_field(c, field, value))
    before = tree(tmp_path)
    proc = run_script(SCRIPT, "--resume", ckpt, "--total-timesteps", "128", "--runs-dir", tmp_path / "runs")
    assert_clean_error(proc, needle)
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert tree(tmp_path) == before


@TRAINED
@pytest.mark.parametrize("command", ["--resume", "eval", "export"])
def test_nan_weights_are_refused_with_exit_3_writing_nothing(trained, tmp_path, command):
    def poison(ckpt: dict) -> None:
        name = next(k for k, t in ckpt["model"].items() if t.is_floating_point())
        ckpt["model"][name][0] = float("nan")

    run_dir, ckpt = copied(trained, tmp_path, poison)
    before = tree(tmp_path)
    if command == "--resume":
        proc = run_script(SCRIPT, "--resume", ckpt, "--total-timesteps", "128", "--runs-dir", tmp_path / "runs")
    else:
        proc = run_script(TOOL, command, ckpt, "--episodes", "1")
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.startswith(f"error: non-finite value (NaN or Inf) in checkpoint '{ckpt}' (model)"), proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert tree(tmp_path) == before  # no events, no eval folder, no export


@TRAINED
def test_a_stale_temporary_file_of_a_killed_save_is_removed_by_the_next_save(trained, tmp_path):
    run_dir, ckpt = copied(trained, tmp_path)
    stale = run_dir / "checkpoints" / ".step_0000000096.pt.4242.tmp"  # a save killed mid-write (pid 4242)
    stale.write_bytes(b"half a checkpoint")
    proc = run_script(SCRIPT, "--resume", ckpt, "--total-timesteps", "96", "--checkpoint-interval", "32", "--no-save-model")
    assert proc.returncode == 0, proc.stderr
    assert "resumed from" in proc.stdout and str(run_dir) in proc.stdout  # in its own folder
    names = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert names == ["final_0000000064.pt", "step_0000000096.pt"], names  # the resumed run's first checkpoint; no .tmp
