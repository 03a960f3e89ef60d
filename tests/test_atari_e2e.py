"""ppo_atari.py and a2c_atari.py run as a user runs them (subprocess): both reach an update and write the
tags and checkpoints (every --checkpoint-interval env steps); resume restores networks, optimizer, counters,
schedules and RNG, and refuses a conflicting flag; bad input gets a short message; Ctrl-C saves."""

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import BASE_ENV, ROOT, assert_clean_error, episode_lines, only_run_dir, output_after_ctrl_c, run_script
from tests.conftest import scalars, wait_until

pytest.importorskip("ale_py")
GAME = "BreakoutNoFrameskip-v4"
# Small iterations: PPO 2 envs x 32 steps, 2 minibatches, 1 epoch; A2C 4 envs x 5 steps, logged every 2 iterations
# (40 env steps). One torch thread.
PPO_SMALL = ["--num-envs", "2", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "1", "--torch-threads", "1"]
TOOL = "tools/agent.py"
A2C_SMALL = ["--num-envs", "4", "--num-steps", "5", "--log-interval", "2", "--torch-threads", "1"]
COMMON_TAGS = [
    "losses/value_loss",
    "losses/policy_loss",
    "losses/entropy",
    "losses/explained_variance",
    "losses/grad_norm",
    "charts/learning_rate",
    "charts/SPS",
    "charts/rollout_us_per_step",
    "charts/update_us_per_step",
]
PPO_TAGS = COMMON_TAGS + ["losses/old_approx_kl", "losses/approx_kl", "losses/clipfrac", "charts/clip_coef"]


def test_ppo_atari_reaches_the_update(tmp_path):
    # 1,024 steps: 16 iterations; a random policy's Breakout game lasts about 170 agent steps, so games finish
    proc = run_script(
        "ppo_atari.py",
        "--env-id",
        GAME,
        *PPO_SMALL,
        "--total-timesteps",
        "1024",
        "--checkpoint-interval",
        "512",
        "--save-model",
        "--eval-episodes",
        "1",
        "--anneal-clip",
        "--runs-dir",
        tmp_path,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    assert "A.L.E" not in proc.stderr  # no emulator banner
    # not a terminal: plain progress lines (no carriage returns), the last one at the end with an ETA
    plain = [line for line in proc.stdout.splitlines() if "SPS" in line]
    assert "\r" not in proc.stdout and plain and "1024/1024" in plain[-1].replace(",", "") and "ETA" in plain[-1]
    run_dir = only_run_dir(tmp_path)
    for tag in PPO_TAGS + ["charts/episodic_return", "charts/episodic_length", "eval/episodic_return"]:
        assert scalars(run_dir, tag), f"tag {tag} missing"
    assert sorted(scalars(run_dir, "losses/value_loss")) == [64 * i for i in range(1, 17)]
    clip = scalars(run_dir, "charts/clip_coef")
    assert clip[64] == pytest.approx(0.1) and clip[1024] == pytest.approx(0.1 / 16)  # --anneal-clip
    # full games of Breakout: scores are whole points, lengths far beyond one life
    returns = scalars(run_dir, "charts/episodic_return")
    assert all(float(r).is_integer() and r >= 0 for r in returns.values())
    assert min(scalars(run_dir, "charts/episodic_length").values()) > 50
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert ckpts == ["final_0000001024.pt", "step_0000000512.pt", "step_0000001024.pt"]
    state = torch.load(run_dir / "checkpoints" / "final_0000001024.pt", weights_only=True)
    assert state["script"] == "ppo_atari" and state["iteration"] == 16 and state["num_actions"] == 4
    assert {"model", "optimizer", "rng_states", "args", "run_state"} <= state.keys()


def test_a2c_atari_reaches_the_update(tmp_path):
    proc = run_script(
        "a2c_atari.py",
        "--env-id",
        GAME,
        *A2C_SMALL,
        "--total-timesteps",
        "1000",
        "--checkpoint-interval",
        "500",
        "--save-model",
        "--eval-episodes",
        "1",
        "--runs-dir",
        tmp_path,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    run_dir = only_run_dir(tmp_path)
    for tag in COMMON_TAGS + ["charts/episodic_return", "charts/episodic_length", "eval/episodic_return"]:
        assert scalars(run_dir, tag), f"tag {tag} missing"
    for tag in ("losses/approx_kl", "losses/clipfrac"):
        assert not scalars(run_dir, tag)
    assert sorted(scalars(run_dir, "losses/value_loss")) == [40 * i for i in range(1, 26)]  # every 2 iterations of 20
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert ckpts == ["final_0000001000.pt", "step_0000000500.pt", "step_0000001000.pt"]
    state = torch.load(run_dir / "checkpoints" / "final_0000001000.pt", weights_only=True)
    assert state["script"] == "a2c_atari" and state["iteration"] == 50
    assert set(state["optimizer"]["state"][0]) >= {"square_avg", "step"}  # RMSprop
    assert state["optimizer"]["param_groups"][0]["alpha"] == 0.99 and state["optimizer"]["param_groups"][0]["eps"] == 1e-5


def test_resume_restores_network_optimizer_counters_schedule_and_rng(tmp_path):
    """The environments restart from a reset on resume (README); everything else continues. Shown on a2c_atari
    with --anneal-lr: the resumed run logs the same learning-rate schedule at the same steps, its optimizer continues
    the step count, its first update starts from the saved weights, and its RNG streams continue the saved ones."""
    # torch's RMSprop: each of its first steps moves every weight by about the learning rate, so the distances the
    # two runs' weights move compare (TensorFlow's moves them by ~lr * |g|, which depends on the games played)
    flags = [
        "--env-id",
        GAME,
        *A2C_SMALL,
        "--anneal-lr",
        "--no-async-envs",
        "--checkpoint-interval",
        "200",
        "--optimizer",
        "rmsprop-torch",
    ]
    full = run_script("a2c_atari.py", *flags, "--total-timesteps", "800", "--runs-dir", tmp_path / "full", timeout=600)
    assert full.returncode == 0, full.stderr
    full_dir = only_run_dir(tmp_path / "full")
    ckpt_path = full_dir / "checkpoints" / "step_0000000400.pt"
    saved = torch.load(ckpt_path, weights_only=True, map_location="cpu")
    assert saved["global_step"] == 400 and saved["iteration"] == 20

    resumed_root = tmp_path / "resumed"
    resumed_root.mkdir()
    copy = resumed_root / full_dir.name
    (copy / "checkpoints").mkdir(parents=True)
    (copy / "checkpoints" / ckpt_path.name).write_bytes(ckpt_path.read_bytes())
    (copy / "args.json").write_bytes((full_dir / "args.json").read_bytes())  # a run folder, the checkpoint its newest
    # a flag the checkpoint fixes, typed with another value, is refused (naming both values); nothing is written
    conflict = run_script(
        "a2c_atari.py",
        "--resume",
        copy / "checkpoints" / ckpt_path.name,
        "--total-timesteps",
        "800",
        "--learning-rate",
        "1e-3",
        "--torch-threads",
        "1",
    )
    assert_clean_error(conflict, "--learning-rate 0.001", "0.0007")
    assert sorted(p.name for p in copy.rglob("*") if p.is_file()) == ["args.json", ckpt_path.name]
    # --log-interval is a run flag (how often to log), taken from the command line like --checkpoint-interval
    resumed = run_script(
        "a2c_atari.py",
        "--resume",
        copy / "checkpoints" / ckpt_path.name,
        "--total-timesteps",
        "800",
        "--checkpoint-interval",
        "200",
        "--log-interval",
        "2",
        "--torch-threads",
        "1",
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr
    lr_full, lr_resumed = scalars(full_dir, "charts/learning_rate"), scalars(copy, "charts/learning_rate")
    assert sorted(lr_resumed) == [s for s in sorted(lr_full) if s > 400]  # counters continue
    assert all(lr_resumed[s] == pytest.approx(lr_full[s]) for s in lr_resumed)  # the schedule continues
    end_full = torch.load(full_dir / "checkpoints" / "step_0000000800.pt", weights_only=True, map_location="cpu")
    end_resumed = torch.load(copy / "checkpoints" / "step_0000000800.pt", weights_only=True, map_location="cpu")
    assert end_resumed["iteration"] == 40 and end_resumed["global_step"] == 800
    # RMSprop's step count continues from the checkpoint's (a fresh optimizer would be at 20)
    assert end_resumed["optimizer"]["state"][0]["step"].item() == end_full["optimizer"]["state"][0]["step"].item() == 40
    # the weights continue from the saved ones: the resumed run's 20 updates move them about as far as the
    # uninterrupted run's did, and a fresh network would be far away
    key = "network.7.weight"  # the 3136x512 layer
    moved_resumed = (end_resumed["model"][key] - saved["model"][key]).norm().item()
    moved_full = (end_full["model"][key] - saved["model"][key]).norm().item()
    fresh = (__import__("a2c_atari").Agent(4).state_dict()[key] - saved["model"][key]).norm().item()
    print(f"moved: resumed {moved_resumed:.3f}, uninterrupted {moved_full:.3f}; fresh init at {fresh:.3f}")
    assert 0.5 * moved_full < moved_resumed < 2.0 * moved_full < 0.5 * fresh
    # the torch RNG continues the saved stream: the resumed run's end state equals the uninterrupted run's only if
    # both drew the same number of samples from the same restored state (same actions count, same minibatches)
    assert torch.equal(end_resumed["rng_states"]["torch"], end_full["rng_states"]["torch"])


@pytest.mark.parametrize(
    "script, flags, needles",
    [
        ("ppo_atari.py", ["--env-id", "HalfCheetah-v4"], ["not an Atari id", "ppo_continuous.py"]),
        ("a2c_atari.py", ["--env-id", "Pendulum-v1"], ["not an Atari id"]),
        ("ppo_atari.py", ["--env-id", "NoSuchGameNoFrameskip-v4"], ["unknown Atari game"]),
        ("a2c_atari.py", ["--env-id", "ALE/NoSuchGame-v5"], ["unknown Atari game"]),
        ("ppo_atari.py", ["--num-envs", "3", "--num-steps", "5", "--num-minibatches", "4"], ["must divide the batch size"]),
        ("a2c_atari.py", ["--optimizer", "adam"], ["--optimizer must be 'rmsprop-tf' or 'rmsprop-torch'"]),
        ("ppo_atari.py", ["--total-timesteps", "100"], ["below one batch"]),
        ("ppo_atari.py", ["--num-envs", "1", "--num-steps", "4", "--num-minibatches", "4"], ["--norm-adv divides"]),
        ("a2c_atari.py", ["--num-envs", "1", "--num-steps", "1", "--norm-adv"], ["--norm-adv divides", "minibatch of 1"]),
        ("a2c_atari.py", ["--resume", "does/not/exist.pt"], ["does not exist"]),
    ],
)
def test_bad_input_gets_a_short_message(tmp_path, script, flags, needles):
    proc = run_script(script, *flags, "--runs-dir", tmp_path)
    assert_clean_error(proc, *needles)
    assert not any(tmp_path.iterdir())  # nothing written


def test_optimizer_flag_runs_torchs_or_tensorflows_rmsprop_and_eval_logs_it(tmp_path):
    """--optimizer rmsprop-torch runs torch's RMSprop (its first step is ~10x the learning rate per weight, TensorFlow's
    ~|g| times it); a resume refuses the other one typed; evaluating a checkpoint logs the optimizer it trained with."""
    flags = ["--env-id", GAME, *A2C_SMALL, "--checkpoint-interval", "100", "--total-timesteps", "100"]
    moved = {}
    for optimizer in ("rmsprop-torch", "rmsprop-tf"):
        proc = run_script("a2c_atari.py", *flags, "--optimizer", optimizer, "--runs-dir", tmp_path / optimizer, timeout=300)
        assert proc.returncode == 0, proc.stderr
        ckpt = torch.load(only_run_dir(tmp_path / optimizer) / "checkpoints" / "step_0000000100.pt", weights_only=True)
        assert ckpt["args"]["optimizer"] == optimizer and ckpt["optimizer"]["state"][0]["step"].item() == 5
        moved[optimizer] = ckpt["optimizer"]["state"][0]["square_avg"]
    # 5 updates from v_0 = 0 (torch) or v_0 = 1 (TensorFlow): alpha^5 = 0.951 of the start is left
    assert moved["rmsprop-torch"].max() < 0.05 < 0.95 < moved["rmsprop-tf"].min()
    old = only_run_dir(tmp_path / "rmsprop-torch") / "checkpoints" / "step_0000000100.pt"
    refused = run_script("a2c_atari.py", "--resume", old, "--optimizer", "rmsprop-tf", "--total-timesteps", "200")
    assert_clean_error(refused, "--optimizer rmsprop-tf conflicts with the checkpoint", "rmsprop-torch")
    proc = run_script(TOOL, "eval", old, "--episodes", "1", timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "|optimizer|rmsprop-torch|" in hparams_table(old.parent.parent / "eval" / old.stem)


def hparams_table(log_dir: Path) -> str:
    """The hyperparameter table a run logged (TensorBoard's text summary)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"tensors": 0}).Reload()
    return events.Tensors("hyperparameters/text_summary")[0].tensor_proto.string_val[0].decode()


def test_eval_logs_the_checkpoints_args(tmp_path):
    proc = run_script(
        "a2c_atari.py",
        "--env-id",
        GAME,
        *A2C_SMALL,
        "--total-timesteps",
        "40",
        "--learning-rate",
        "3e-4",
        "--save-model",
        "--eval-episodes",
        "1",
        "--runs-dir",
        tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    final = only_run_dir(tmp_path) / "checkpoints" / "final_0000000040.pt"
    proc = run_script(TOOL, "eval", final, "--episodes", "1", timeout=300)
    assert proc.returncode == 0, proc.stderr
    episode_lines(proc.stdout, 1)  # progress: a line per game
    table = hparams_table(only_run_dir(tmp_path) / "eval" / final.stem)
    assert "|learning_rate|0.0003|" in table and "|seed|1|" in table


def test_corrupt_checkpoint_and_other_scripts_checkpoint_are_refused(tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    assert_clean_error(run_script(TOOL, "eval", bad), "corrupt")
    assert_clean_error(run_script("ppo_atari.py", "--resume", bad, "--runs-dir", tmp_path / "runs"), "corrupt")
    other = tmp_path / "other.pt"
    torch.save(
        {
            "format": 1,
            "args": {"env_id": GAME, "seed": 1},
            "script": "a2c_atari",
            "num_actions": 4,
            "iteration": 1,
            "global_step": 1,
            "run_name": "x",
            "run_state": {},
            "rng_states": {},
        },
        other,
    )
    assert_clean_error(run_script("ppo_atari.py", "--resume", other), "a2c_atari.py, not ppo_atari.py")
    assert_clean_error(run_script(TOOL, "eval", other), "a2c_atari.py")  # no network in it
    assert bad.read_bytes() == b"not a checkpoint"


def test_ctrl_c_with_worker_processes_saves_and_resumes(tmp_path):
    """Ctrl-C in a terminal reaches the whole process group, env workers included: the run must still finish its
    iteration, save it and exit 130."""
    cmd = [
        sys.executable,
        str(ROOT / "ppo_atari.py"),
        "--env-id",
        GAME,
        *PPO_SMALL,
        "--async-envs",
        "--total-timesteps",
        "10000000",
        "--checkpoint-interval",
        "0",
        "--runs-dir",
        str(tmp_path),
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env={**os.environ, **BASE_ENV},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )

    def logged_two() -> bool:
        runs = list(tmp_path.glob("*/events.out.tfevents.*"))
        return bool(runs) and len(scalars(runs[0].parent, "losses/value_loss")) >= 2

    try:
        wait_until(logged_two, 300, "2 logged iterations (losses/value_loss)", proc)
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C does
        out, err = output_after_ctrl_c(proc, 120)
    finally:  # a run that ignored the signal must not outlive the test (nor its workers)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    ckpts = list((only_run_dir(tmp_path) / "checkpoints").glob("interrupted_*.pt"))
    assert len(ckpts) == 1, err
    state = torch.load(ckpts[0], weights_only=True)
    assert state["iteration"] >= 2 and state["global_step"] == state["iteration"] * 64
    assert "resume with" in err and "Traceback" not in err
    resumed = run_script(
        "ppo_atari.py",
        "--resume",
        ckpts[0],
        "--total-timesteps",
        state["global_step"] + 128,
        "--torch-threads",
        "1",
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert max(scalars(only_run_dir(tmp_path), "losses/value_loss")) == state["global_step"] + 128


def test_capture_video_records_training_and_evaluation_games(tmp_path):
    proc = run_script(
        "a2c_atari.py",
        "--env-id",
        GAME,
        *A2C_SMALL,
        "--no-async-envs",
        "--total-timesteps",
        "400",
        "--capture-video",
        "--save-model",
        "--eval-episodes",
        "1",
        "--runs-dir",
        tmp_path,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    videos = only_run_dir(tmp_path) / "videos"
    assert [p.name for p in videos.glob("*.mp4")] == ["rl-video-episode-0.mp4"]  # env 0's first game
    assert [p.name for p in (videos / "eval").glob("*.mp4")] == ["rl-video-episode-0.mp4"]  # the one evaluation game
    assert all(p.stat().st_size > 1000 for p in videos.rglob("*.mp4"))
