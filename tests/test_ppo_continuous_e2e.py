"""ppo_continuous.py run as a user runs it (subprocess): tags, checkpoints, resume, evaluation, errors, Ctrl-C."""

import os
import pty
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import BASE_ENV, ROOT, assert_clean_error, episode_lines, only_run_dir, run_script, scalars
from tests.conftest import needs_mujoco_rendering, output_after_ctrl_c, wait_until

SCRIPT = "ppo_continuous.py"
TOOL = "tools/agent.py"
# Small but complete iterations: 2 envs x 128 steps, 4 minibatches, 2 epochs. One torch thread: tests may run beside
# other work on 2 cores.
SMALL = ["--num-envs", "2", "--num-steps", "128", "--num-minibatches", "4", "--update-epochs", "2", "--torch-threads", "1"]
LOSS_TAGS = [
    "losses/value_loss",
    "losses/policy_loss",
    "losses/entropy",
    "losses/old_approx_kl",
    "losses/approx_kl",
    "losses/clipfrac",
    "losses/explained_variance",
    "losses/grad_norm",
]
CHART_TAGS = ["charts/episodic_return", "charts/episodic_length", "charts/learning_rate", "charts/SPS"]


def test_short_run_logs_every_tag_and_writes_complete_checkpoints(tmp_path):
    proc = run_script(
        SCRIPT,
        "--env-id",
        "HalfCheetah-v4",
        *SMALL,
        "--total-timesteps",
        "2560",
        "--checkpoint-interval",
        "512",
        "--keep-checkpoints",
        "2",
        "--save-model",
        "--eval-episodes",
        "1",
        "--runs-dir",
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    # MuJoCo 4's deprecation warning about the -v4 model files stays out of the user's way; no traceback
    assert "settotalmass" not in proc.stderr + proc.stdout and "out of date" not in proc.stderr
    assert "eval:" in proc.stdout
    run_dir = only_run_dir(tmp_path)
    for tag in LOSS_TAGS + CHART_TAGS + ["eval/episodic_return"]:
        assert scalars(run_dir, tag), f"tag {tag} missing"
    assert sorted(scalars(run_dir, "losses/value_loss")) == [256 * i for i in range(1, 11)]
    assert scalars(run_dir, "charts/episodic_length") == {2000: 1000.0}  # both envs' time limits, at step 1000 each
    lrs = scalars(run_dir, "charts/learning_rate")
    assert lrs[256] == pytest.approx(3e-4) and lrs[2560] == pytest.approx(3e-5)  # annealed linearly

    ckpts = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert ckpts == ["final_0000002560.pt", "step_0000002048.pt", "step_0000002560.pt"]  # newest 2 + final
    ckpt = torch.load(run_dir / "checkpoints" / "final_0000002560.pt", weights_only=True, map_location="cpu")
    assert ckpt["global_step"] == 2560 and ckpt["iteration"] == 10
    assert {"model", "optimizer", "obs_rms", "return_rms", "env_states", "run_state", "rng_states", "args"} <= ckpt.keys()
    assert ckpt["args"]["env_id"] == "HalfCheetah-v4" and ckpt["args"]["num_envs"] == 2
    assert ckpt["obs_rms"]["mean"].shape == (17,) and ckpt["obs_rms"]["count"] > 2560
    assert len(ckpt["env_states"]) == 2 and all(s["exact"] and "mujoco" in s for s in ckpt["env_states"])
    assert (run_dir / "args.json").is_file()


def test_episodic_return_is_the_true_return(tmp_path):
    """Counting-v0 pays 1 per step and truncates at 7: with reward scaling on, the logged return must still be 7."""
    proc = run_script(
        SCRIPT, "--env-id", "tests.fake_envs:Counting-v0", *SMALL, "--total-timesteps", "512", "--runs-dir", tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    run_dir = only_run_dir(tmp_path)
    steps, values = zip(*scalars(run_dir, "charts/episodic_return").items())
    assert set(values) == {7.0} and set(scalars(run_dir, "charts/episodic_length").values()) == {7.0}
    assert steps[0] == 14  # both envs finish their first episode at their 7th step (global step 2 * 7)


def test_resume_continues_exactly_like_an_uninterrupted_run(tmp_path):
    """Stop after iteration 2, resume: iterations 3-4 log the same losses as the uninterrupted run. The envs cross
    their 1000-step time limit during iteration 4, so the MuJoCo state, RNGs and time-limit counters must be right."""
    args = [
        "--env-id",
        "HalfCheetah-v5",
        "--num-envs",
        "2",
        "--num-steps",
        "256",
        "--num-minibatches",
        "4",
        "--update-epochs",
        "2",
        "--torch-threads",
        "1",
        "--total-timesteps",
        "2048",
        "--checkpoint-interval",
        "512",
        "--keep-checkpoints",
        "10",
    ]
    proc = run_script(SCRIPT, *args, "--runs-dir", tmp_path / "a")
    assert proc.returncode == 0, proc.stderr
    full = only_run_dir(tmp_path / "a")
    expected = {tag: scalars(full, tag) for tag in LOSS_TAGS + ["charts/episodic_return", "charts/learning_rate"]}
    assert sorted(expected["losses/value_loss"]) == [512, 1024, 1536, 2048]

    resumed = tmp_path / "b" / full.name
    shutil.copytree(full, resumed)  # the resumed run appends to its own folder: work on a copy
    for later in ("step_0000001536.pt", "step_0000002048.pt"):  # as if the run had died after step 1024's checkpoint
        (resumed / "checkpoints" / later).unlink()  # (with later ones there, it would start a new folder instead)
    proc = run_script(
        SCRIPT, "--resume", resumed / "checkpoints" / "step_0000001024.pt", "--total-timesteps", "2048", "--torch-threads", "1"
    )
    assert proc.returncode == 0, proc.stderr
    assert "resumed from" in proc.stdout
    events = sorted(resumed.glob("events.out.tfevents.*"))
    assert len(events) == 2, "the resumed run appends a new event file to the same run folder"
    new_only = {tag: scalars(events[-1], tag) for tag in expected}
    for tag, values in expected.items():
        later = {s: v for s, v in values.items() if s > 1024}
        assert new_only[tag] == pytest.approx(later, rel=1e-6, abs=1e-9), tag  # logged by the resumed process
        assert scalars(resumed, tag) == pytest.approx(values, rel=1e-6, abs=1e-9), tag  # one curve, no duplicates
    assert expected["charts/episodic_return"], "the window must contain an episode end (time limit)"
    assert all(s > 1024 for s in new_only["charts/episodic_return"])


def test_eval_checkpoint_is_deterministic_and_logged(tmp_path):
    proc = run_script(
        SCRIPT,
        "--env-id",
        "Pendulum-v1",
        *SMALL,
        "--total-timesteps",
        "512",
        "--save-model",
        "--eval-episodes",
        "1",
        "--runs-dir",
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    ckpt = next((only_run_dir(tmp_path) / "checkpoints").glob("final_*.pt"))
    outs = [run_script(TOOL, "eval", ckpt, "--episodes", "3") for _ in range(2)]
    for out in outs:
        assert out.returncode == 0, out.stderr
        assert "+-" in out.stdout and "over 3 episodes" in out.stdout
        episode_lines(out.stdout, 3)  # progress: a line per episode
    assert outs[0].stdout == outs[1].stdout  # deterministic actions, frozen statistics, seeded episodes
    eval_dir = only_run_dir(tmp_path) / "eval" / ckpt.stem
    logged = scalars(eval_dir, "eval/episodic_return")
    assert list(logged) == [512]
    assert logged[512] == pytest.approx(np.mean(episode_lines(outs[0].stdout, 3)), abs=0.01)


@pytest.fixture(scope="module")
def pendulum_checkpoint(tmp_path_factory) -> Path:
    runs = tmp_path_factory.mktemp("runs")
    proc = run_script(
        SCRIPT,
        "--env-id",
        "Pendulum-v1",
        *SMALL,
        "--total-timesteps",
        "256",
        "--save-model",
        "--eval-episodes",
        "1",
        "--runs-dir",
        runs,
    )
    assert proc.returncode == 0, proc.stderr
    return next((only_run_dir(runs) / "checkpoints").glob("final_*.pt"))


@pytest.mark.parametrize(
    "flags, needles",
    [
        (["--env-id", "CartPole-v1"], ["CartPole-v1", "Discrete(2)", "continuous", "a2c_atari.py, take Atari games only"]),
        (["--env-id", "NoSuchEnv-v0"], ["unknown environment id", "NoSuchEnv-v0"]),
        (["--num-minibatches", "3"], ["num_minibatches (3)", "2048"]),
        (["--total-timesteps", "1000"], ["below one batch", "2048"]),
        (["--num-steps", "4", "--num-minibatches", "4"], ["--norm-adv divides", "minibatch of 1", "--no-norm-adv"]),
        (["--resume", "does/not/exist.pt"], ["does not exist"]),
        (["--learning-rate", "0"], ["--learning-rate must be > 0, not 0.0"]),
        (["--gae-lambda", "1.5"], ["--gae-lambda must be in [0, 1], not 1.5"]),
        (["--keep-checkpoints", "0"], ["--keep-checkpoints must be >= 1, not 0"]),
    ],
)
def test_bad_input_gets_a_short_message(tmp_path, flags, needles):
    proc = run_script(SCRIPT, *flags, "--runs-dir", tmp_path, timeout=120)
    assert_clean_error(proc, *needles)
    assert not any(tmp_path.iterdir()), "nothing is written for a rejected run"


@pytest.mark.parametrize("mode", [["--resume"], ["eval"], ["export"]])
def test_corrupt_or_mismatched_checkpoint_is_refused_and_left_untouched(tmp_path, pendulum_checkpoint, mode):
    """The script's --resume and the tool's eval / export refuse the same bad checkpoints, touching nothing."""
    run = (
        (lambda path: run_script(SCRIPT, *mode, path, "--total-timesteps", "100000", timeout=120))
        if mode == ["--resume"]
        else (lambda path: run_script(TOOL, *mode, path, timeout=120))
    )
    corrupt = tmp_path / "run" / "checkpoints" / "corrupt.pt"
    corrupt.parent.mkdir(parents=True)
    corrupt.write_bytes(pendulum_checkpoint.read_bytes()[:-200])
    before = corrupt.read_bytes()
    assert_clean_error(run(corrupt), "corrupt")
    assert corrupt.read_bytes() == before
    assert sorted(p.name for p in (tmp_path / "run").rglob("*")) == ["checkpoints", "corrupt.pt"]

    # a checkpoint whose network does not fit its env (here: relabelled as HalfCheetah, 17-d observations)
    ckpt = torch.load(pendulum_checkpoint, weights_only=True)
    ckpt["args"]["env_id"] = "HalfCheetah-v4"
    other = tmp_path / "run" / "checkpoints" / "other_env.pt"
    torch.save(ckpt, other)
    assert_clean_error(run(other), "does not fit", "(17,)")

    # a checkpoint written by another script of the project
    ckpt = torch.load(pendulum_checkpoint, weights_only=True)
    ckpt["script"] = "sac_continuous"
    foreign = tmp_path / "run" / "checkpoints" / "foreign.pt"
    torch.save(ckpt, foreign)
    assert_clean_error(run(foreign), "sac_continuous.py")


def test_resume_refuses_a_fixed_flag_with_another_value(tmp_path, pendulum_checkpoint):
    """--resume keeps the checkpoint's algorithm flags: one typed with a different value is an error naming both."""
    before = sorted(pendulum_checkpoint.parent.parent.rglob("*"))
    proc = run_script(
        SCRIPT, "--resume", pendulum_checkpoint, "--learning-rate", "0.001", "--total-timesteps", "100000", timeout=120
    )
    assert_clean_error(proc, "--learning-rate 0.001", "0.0003")
    assert sorted(pendulum_checkpoint.parent.parent.rglob("*")) == before  # nothing written


def test_ctrl_c_saves_the_last_completed_iteration_and_resumes(tmp_path):
    cmd = [
        sys.executable,
        str(ROOT / SCRIPT),
        "--env-id",
        "Pendulum-v1",
        *SMALL,
        "--total-timesteps",
        "10000000",
        "--checkpoint-interval",
        "0",
        "--runs-dir",
        str(tmp_path),
    ]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env={**os.environ, **BASE_ENV}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )

    def logged_three() -> bool:
        runs = list(tmp_path.glob("*/events.out.tfevents.*"))
        return bool(runs) and len(scalars(runs[0].parent, "losses/value_loss")) >= 3

    try:
        wait_until(logged_three, 300, "3 logged iterations (losses/value_loss)", proc)
        proc.send_signal(signal.SIGINT)
        out, err = output_after_ctrl_c(proc, 120)
    finally:  # a run that ignored the signal must not outlive the test
        proc.kill()
    assert proc.returncode == 130, err
    ckpts = list((only_run_dir(tmp_path) / "checkpoints").glob("interrupted_*.pt"))
    assert len(ckpts) == 1, err
    state = torch.load(ckpts[0], weights_only=True)
    assert state["iteration"] >= 3 and state["global_step"] == state["iteration"] * 256
    (hint,) = [line.removeprefix("resume with: ") for line in err.splitlines() if line.startswith("resume with: ")]
    # the hint, pasted into a shell in the project folder (under `uv run`, as the README runs things, it says uv run)
    uv_folder = [os.path.dirname(os.environ["UV"])] if "UV" in os.environ else []  # outside uv: no uv folder to add
    path = os.pathsep.join(uv_folder + [os.environ["PATH"]])
    resumed = subprocess.run(
        f"{hint} --total-timesteps {state['global_step'] + 512} --torch-threads 1 --save-model --eval-episodes 1",
        shell=True,
        cwd=ROOT,
        env={**os.environ, **BASE_ENV, "PATH": path},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert max(scalars(only_run_dir(tmp_path), "losses/value_loss")) == state["global_step"] + 512
    names = [p.name for p in (only_run_dir(tmp_path) / "checkpoints").iterdir()]
    assert names == [f"final_{state['global_step'] + 512:010d}.pt"]  # the interrupted one is superseded: pruned


def test_progress_display_only_on_a_terminal(tmp_path):
    args = [sys.executable, str(ROOT / SCRIPT), "--env-id", "Pendulum-v1", *SMALL, "--total-timesteps", "512"]
    piped = run_script(SCRIPT, *args[2:], "--runs-dir", tmp_path / "piped")
    # not a terminal (Slurm, nohup, CI): plain lines, no carriage returns; at least the closing one
    assert piped.returncode == 0 and "\r" not in piped.stdout
    plain = [line for line in piped.stdout.splitlines() if "SPS" in line]
    assert plain and "512/512" in plain[-1].replace(",", "") and "ETA" in plain[-1], piped.stdout
    quiet = run_script(SCRIPT, *args[2:], "--no-progress", "--runs-dir", tmp_path / "quiet")
    assert quiet.returncode == 0 and "SPS" not in quiet.stdout

    main_fd, child_fd = pty.openpty()
    proc = subprocess.Popen(
        [*args, "--runs-dir", str(tmp_path / "tty")],
        cwd=ROOT,
        env={**os.environ, **BASE_ENV},
        stdin=subprocess.DEVNULL,
        stdout=child_fd,
        stderr=child_fd,
    )
    os.close(child_fd)
    output = b""
    while True:
        try:
            chunk = os.read(main_fd, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        output += chunk
    assert proc.wait(timeout=60) == 0
    text = output.decode(errors="replace")
    assert "SPS" in text and "512/512" in text.replace(",", "") and "\r" in text and "ETA" in text, text


def test_track_without_credentials_stops_at_once(tmp_path):
    """At once: before the run starts (no run folder, no `run:` line), never at wandb's login prompt. Checked as that,
    not in seconds: run_script's timeout only stops a run that hangs."""
    env = {"WANDB_MODE": "", "WANDB_API_KEY": "", "HOME": str(tmp_path), "NETRC": str(tmp_path / "no-netrc")}
    proc = run_script(SCRIPT, "--track", "--env-id", "Pendulum-v1", "--runs-dir", tmp_path / "runs", env=env, timeout=300)
    assert_clean_error(proc, "WANDB_MODE=offline", "wandb login")
    assert not (tmp_path / "runs").exists() and "run:" not in proc.stdout, proc.stdout


def test_capture_video_headless_in_training_and_eval(tmp_path):
    """InvertedPendulum's random-policy episodes last a few steps, so software EGL renders them quickly."""
    needs_mujoco_rendering()
    env = {"MUJOCO_GL": None, "DISPLAY": None}  # the script picks EGL by itself on a headless machine
    proc = run_script(
        SCRIPT,
        "--env-id",
        "InvertedPendulum-v5",
        *SMALL,
        "--total-timesteps",
        "256",
        "--capture-video",
        "--save-model",
        "--eval-episodes",
        "1",
        "--runs-dir",
        tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    run_dir = only_run_dir(tmp_path)
    assert list((run_dir / "videos").glob("rl-video-episode-0.mp4"))
    ckpt = next((run_dir / "checkpoints").glob("final_*.pt"))
    proc = run_script(TOOL, "eval", ckpt, "--episodes", "1", "--capture-video", env=env)
    assert proc.returncode == 0, proc.stderr
    assert list((run_dir / "eval" / ckpt.stem / "videos").glob("*.mp4"))


def test_track_offline_records_the_scalars_locally(tmp_path):
    env = {"WANDB_MODE": "offline", "WANDB_API_KEY": None, "HOME": str(tmp_path)}
    proc = run_script(
        SCRIPT,
        "--track",
        "--env-id",
        "Pendulum-v1",
        *SMALL,
        "--total-timesteps",
        "512",
        "--runs-dir",
        tmp_path / "runs",
        env=env,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    records = list(only_run_dir(tmp_path / "runs").glob("wandb/offline-run-*/run-*.wandb"))
    assert len(records) == 1
    data = records[0].read_bytes()  # wandb's binary record log: the scalar names appear as protobuf strings
    for tag in LOSS_TAGS + CHART_TAGS:
        assert data.count(tag.encode()) >= 2, f"{tag} not recorded by wandb"  # one record per logged point


# Why by hand: what a GPU server without libEGL does (seen on one): PyOpenGL finds no EGL and MuJoCo, told to render
# through it, fails at import. Here libEGL is hidden from the run's process by refusing to load it.
HIDE_EGL = """import ctypes, runpy, sys
real = ctypes.CDLL.__init__
def init(self, name, *args, **kwargs):
    if name and "EGL" in str(name):
        raise OSError(f"{name}: cannot open shared object file")
    real(self, name, *args, **kwargs)
ctypes.CDLL.__init__ = init
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_a_run_without_video_trains_headless_where_libegl_is_missing(tmp_path):
    env = {k: v for k, v in {**os.environ, **BASE_ENV}.items() if k not in ("MUJOCO_GL", "DISPLAY")}
    cmd = [
        sys.executable,
        "-c",
        HIDE_EGL,
        str(ROOT / SCRIPT),
        "--env-id",
        "HalfCheetah-v4",
        "--total-timesteps",
        "256",
        *SMALL,
        "--checkpoint-interval",
        "256",
        "--no-progress",
        "--runs-dir",
        str(tmp_path),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert max(scalars(only_run_dir(tmp_path), "losses/value_loss")) == 256
    # --capture-video needs EGL here: one paragraph naming it, before any run folder (before: a PyOpenGL traceback)
    videos = subprocess.run(
        [*cmd[:-1], str(tmp_path / "v"), "--capture-video"], env=env, capture_output=True, text=True, timeout=300
    )
    assert_clean_error(videos, "needs libEGL", "libegl1", "--capture-video")
    assert not (tmp_path / "v").exists()
    # MUJOCO_GL=egl exported by the user (common on GPU servers) and no video: the message names the variable (before:
    # "drop --capture-video", a flag the command did not have)
    exported = subprocess.run(
        [*cmd[:-1], str(tmp_path / "e")], env={**env, "MUJOCO_GL": "egl"}, capture_output=True, text=True, timeout=300
    )
    assert_clean_error(exported, "needs libEGL", "unset MUJOCO_GL")
    assert not (tmp_path / "e").exists()
    # tools/agent.py asked for a video of a checkpoint: the same paragraph (before: "the networks changed shape")
    (checkpoint,) = only_run_dir(tmp_path).glob("checkpoints/*.pt")
    tool = subprocess.run(
        [sys.executable, "-c", HIDE_EGL, str(ROOT / TOOL), "eval", str(checkpoint), "--episodes", "1", "--capture-video"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert tool.returncode != 0 and "needs libEGL" in tool.stderr, tool.stderr[-3000:]
