"""sac_continuous.py run as a user runs it (subprocess): tags, checkpoints, resume, evaluation, errors, Ctrl-C."""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import BASE_ENV, ROOT, assert_clean_error, episode_lines, only_run_dir, run_script, scalars
from tests.conftest import output_after_ctrl_c, wait_for_updates

SCRIPT = "sac_continuous.py"
# Short runs that reach the update: a small batch and an early learning_starts keep them fast. One torch thread:
# tests may run beside other work on 2 cores.
SMALL = ["--learning-starts", "100", "--batch-size", "32", "--torch-threads", "1"]
LOSS_TAGS = [
    "losses/qf1_values",
    "losses/qf2_values",
    "losses/qf1_loss",
    "losses/qf2_loss",
    "losses/qf_loss",
    "losses/actor_loss",
    "losses/alpha",
    "losses/alpha_loss",
]
CHART_TAGS = [
    "charts/episodic_return",
    "charts/episodic_length",
    "charts/SPS",
    "charts/rollout_us_per_step",
    "charts/update_us_per_step",
]


def test_short_run_reaches_the_update_logs_every_tag_and_writes_complete_checkpoints(tmp_path):
    proc = run_script(
        SCRIPT,
        "--env-id",
        "Pendulum-v1",
        *SMALL,
        "--total-timesteps",
        "600",
        "--checkpoint-interval",
        "200",
        "--keep-checkpoints",
        "2",
        "--eval-interval",
        "300",
        "--eval-episodes",
        "1",
        "--save-model",
        "--runs-dir",
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "replay buffer: 1,000,000 transitions, 36.0 MB" in proc.stdout  # (3 + 3 + 1 + 1 + 1) * 4 bytes each
    assert "eval:" in proc.stdout
    assert "leaked" not in proc.stderr, "objects frozen out of the collector must be handed back at exit"
    run_dir = only_run_dir(tmp_path)
    assert "bf16" not in json.loads((run_dir / "args.json").read_text())  # float32 only: there is no --bf16
    for tag in LOSS_TAGS + CHART_TAGS + ["eval/episodic_return"]:
        assert scalars(run_dir, tag), f"tag {tag} missing"
    # every 100 steps (--log-interval), from the first update on
    assert sorted(scalars(run_dir, "losses/qf1_loss")) == [100, 200, 300, 400, 500, 600]
    assert sorted(scalars(run_dir, "eval/episodic_return")) == [300, 600]  # --eval-interval, then the final evaluation
    assert scalars(run_dir, "charts/episodic_length") == {200: 200.0, 400: 200.0, 600: 200.0}  # Pendulum's time limit
    assert all(np.isfinite(list(scalars(run_dir, tag).values())).all() for tag in LOSS_TAGS)

    ckpts = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert ckpts == ["final_0000000600.pt", "step_0000000400.pt", "step_0000000600.pt"]  # newest 2 + final
    ckpt = torch.load(run_dir / "checkpoints" / "final_0000000600.pt", weights_only=True, map_location="cpu")
    assert ckpt["global_step"] == 600 and ckpt["script"] == "sac_continuous"
    assert ckpt["obs_shape"] == [3] and ckpt["act_shape"] == [1]
    assert {"learner", "env_states", "run_state", "rng_states", "args", "replay_buffer"} <= ckpt.keys()
    learner = ckpt["learner"]
    assert {"actor", "qf", "qf_target", "actor_optimizer", "q_optimizer", "log_alpha", "alpha_optimizer"} <= learner.keys()
    assert ckpt["replay_buffer"] is None  # without --save-buffer
    assert ckpt["run_state"]["grad_steps"] == 501 and ckpt["run_state"]["actor_updates"] == 500
    # the critics: two q_network instances (nn.Sequential: Linear, ReLU, Linear, ReLU, Linear), as the module names them
    assert learner["qf"]["0.0.weight"].shape == (256, 4) and learner["qf"]["1.4.weight"].shape == (1, 256)
    assert learner["log_alpha"].item() < 0  # alpha tuned down from 1
    assert not torch.equal(learner["qf"]["0.0.weight"], learner["qf_target"]["0.0.weight"])
    assert learner["alpha_optimizer"]["state"], "the temperature's optimizer state is saved"
    assert len(ckpt["env_states"]) == 1 and ckpt["env_states"][0]["exact"]
    assert (run_dir / "args.json").is_file()


def test_halfcheetah_run_reaches_the_update(tmp_path):
    """The default env (MuJoCo, float64 observations, 6-d actions) through the update, with the default batch."""
    proc = run_script(
        SCRIPT,
        "--env-id",
        "HalfCheetah-v4",
        "--learning-starts",
        "250",
        "--torch-threads",
        "1",
        "--total-timesteps",
        "300",
        "--buffer-size",
        "1000",
        "--runs-dir",
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "settotalmass" not in proc.stderr + proc.stdout and "out of date" not in proc.stderr
    assert "1,000 transitions, 0.2 MB" in proc.stdout  # (17 + 17 + 6 + 1 + 1) * 4 = 168 bytes each
    assert sorted(scalars(only_run_dir(tmp_path), "losses/qf_loss")) == [300]


@pytest.mark.parametrize(
    "env_id, terminal", [("tests.fake_envs:Counting-v0", False), ("tests.fake_envs:CountingTerminates-v0", True)]
)
def test_buffer_stores_termination_not_truncation_and_the_true_final_obs(tmp_path, env_id, terminal):
    """Counting-v0 truncates at 7 steps, CountingTerminates-v0 terminates at 5; obs = [t, episode]."""
    proc = run_script(
        SCRIPT,
        "--env-id",
        env_id,
        "--learning-starts",
        "10",
        "--batch-size",
        "8",
        "--torch-threads",
        "1",
        "--total-timesteps",
        "40",
        "--save-model",
        "--save-buffer",
        "--eval-episodes",
        "1",
        "--runs-dir",
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    ckpt = torch.load(next((only_run_dir(tmp_path) / "checkpoints").glob("final_*.pt")), weights_only=True)
    buf = ckpt["replay_buffer"]
    assert buf["size"] == 40 and buf["obs"].shape == (40, 2)
    obs, next_obs, done = buf["obs"].numpy(), buf["next_obs"].numpy(), buf["terminated"].numpy()
    np.testing.assert_array_equal(next_obs[:, 0], obs[:, 0] + 1)  # never the next episode's first obs
    np.testing.assert_array_equal(next_obs[:, 1], obs[:, 1])
    ends = next_obs[:, 0] == (7 if not terminal else 5)
    assert ends.sum() == (5 if not terminal else 8)
    np.testing.assert_array_equal(done, ends if terminal else np.zeros(40, bool))
    assert set(scalars(only_run_dir(tmp_path), "charts/episodic_return").values()) == {7.0 if not terminal else 5.0}


RESUME_ARGS = [
    "--env-id",
    "Pendulum-v1",
    *SMALL,
    "--total-timesteps",
    "600",
    "--checkpoint-interval",
    "300",
    "--keep-checkpoints",
    "5",
]


@pytest.fixture(scope="module")
def uninterrupted_run(tmp_path_factory) -> Path:
    runs = tmp_path_factory.mktemp("runs")
    proc = run_script(SCRIPT, *RESUME_ARGS, "--save-buffer", "--runs-dir", runs)
    assert proc.returncode == 0, proc.stderr
    return only_run_dir(runs)


def test_resume_with_buffer_continues_exactly_like_an_uninterrupted_run(tmp_path, uninterrupted_run):
    """Stop at step 300, resume: steps 301-600 log the same losses as the uninterrupted run (an episode ends at 400
    and 600: the env state, RNGs and time-limit counter must be right, and so must the buffer)."""
    full = uninterrupted_run
    tags = LOSS_TAGS + ["charts/episodic_return"]
    expected = {tag: scalars(full, tag) for tag in tags}
    resumed = tmp_path / full.name
    shutil.copytree(full, resumed)  # the resumed run appends to its own folder: work on a copy
    (resumed / "checkpoints" / "step_0000000600.pt").unlink()  # as if it died after step 300 (else: a new folder)
    proc = run_script(
        SCRIPT, "--resume", resumed / "checkpoints" / "step_0000000300.pt", "--total-timesteps", "600", "--torch-threads", "1"
    )
    assert proc.returncode == 0, proc.stderr
    assert "resumed from" in proc.stdout and "buffer starts empty" not in proc.stderr
    events = sorted(resumed.glob("events.out.tfevents.*"))
    assert len(events) == 2, "the resumed run appends a new event file to the same run folder"
    new_only = {tag: scalars(events[-1], tag) for tag in tags}
    for tag, values in expected.items():
        later = {s: v for s, v in values.items() if s > 300}
        assert later, tag
        assert new_only[tag] == pytest.approx(later, rel=1e-6, abs=1e-9), tag  # logged by the resumed process
        assert scalars(resumed, tag) == pytest.approx(values, rel=1e-6, abs=1e-9), tag  # one curve, no duplicates


def test_resume_without_buffer_warns_and_refills_before_updating(tmp_path, uninterrupted_run):
    run_dir = tmp_path / uninterrupted_run.name
    shutil.copytree(uninterrupted_run, run_dir)
    ckpt = torch.load(run_dir / "checkpoints" / "step_0000000300.pt", weights_only=True)
    ckpt["replay_buffer"] = None  # as saved without --save-buffer
    torch.save(ckpt, run_dir / "checkpoints" / "step_0000000300.pt")
    (run_dir / "checkpoints" / "step_0000000600.pt").unlink()  # as if it died after step 300 (else: a new folder)
    proc = run_script(
        SCRIPT, "--resume", run_dir / "checkpoints" / "step_0000000300.pt", "--total-timesteps", "600", "--torch-threads", "1"
    )
    assert proc.returncode == 0, proc.stderr
    assert "buffer starts empty" in proc.stderr and "step 400" in proc.stderr
    new = scalars(sorted(run_dir.glob("events.out.tfevents.*"))[-1], "losses/qf1_loss")
    assert sorted(new) == [400, 500, 600]  # updates resume once learning_starts (100) new transitions are stored


def test_eval_checkpoint_is_deterministic_and_logged(tmp_path, uninterrupted_run):
    ckpt = uninterrupted_run / "checkpoints" / "step_0000000600.pt"
    outs = [run_script("tools/agent.py", "eval", ckpt, "--episodes", "2") for _ in range(2)]
    for out in outs:
        assert out.returncode == 0, out.stderr
        assert "+-" in out.stdout and "over 2 episodes" in out.stdout
        episode_lines(out.stdout, 2)  # progress: a line per episode
    assert outs[0].stdout == outs[1].stdout  # deterministic actions, seeded episodes
    logged = scalars(uninterrupted_run / "eval" / ckpt.stem, "eval/episodic_return")
    assert list(logged) == [600]


@pytest.mark.parametrize(
    "flags, needles",
    [
        (["--env-id", "tests.fake_envs:DiscreteCounting-v0"], ["Discrete(2)", "continuous"]),
        (["--env-id", "NoSuchEnv-v0"], ["unknown environment id", "NoSuchEnv-v0"]),
        (["--total-timesteps", "1000", "--learning-starts", "2000"], ["learning_starts (2000)", "total_timesteps (1000)"]),
        (["--tau", "0"], ["--tau must be in (0, 1]", "0"]),
        (["--policy-frequency", "0"], ["--policy-frequency must be >= 1"]),
        (["--log-interval", "0"], ["--log-interval must be >= 1"]),
        (["--batch-size", "512", "--buffer-size", "100"], ["batch_size (512)", "buffer_size (100)"]),
        (["--resume", "does/not/exist.pt"], ["does not exist"]),
    ],
)
def test_bad_input_gets_a_short_message(tmp_path, flags, needles):
    proc = run_script(SCRIPT, *flags, "--runs-dir", tmp_path, timeout=120)
    assert_clean_error(proc, *needles)
    assert not any(tmp_path.iterdir()), "nothing is written for a rejected run"


def test_resume_refuses_a_fixed_flag_with_another_value(tmp_path, uninterrupted_run):
    """--resume keeps the checkpoint's algorithm flags: one typed with a different value is an error naming both."""
    before = sorted(uninterrupted_run.rglob("*"))
    proc = run_script(
        SCRIPT,
        "--resume",
        uninterrupted_run / "checkpoints" / "step_0000000300.pt",
        "--q-lr",
        "0.005",
        "--total-timesteps",
        "900",
        timeout=120,
    )
    assert_clean_error(proc, "--q-lr 0.005", "0.001")
    assert sorted(uninterrupted_run.rglob("*")) == before  # nothing written


def test_progress_off_a_terminal_prints_plain_lines(tmp_path):
    """Not a terminal (Slurm, nohup, CI): plain lines, no carriage returns, the last one with the step and an ETA."""
    proc = run_script(SCRIPT, "--env-id", "Pendulum-v1", *SMALL, "--total-timesteps", "300", "--runs-dir", tmp_path)
    assert proc.returncode == 0 and "\r" not in proc.stdout
    plain = [line for line in proc.stdout.splitlines() if "SPS" in line]
    assert plain and "300/300" in plain[-1].replace(",", "") and "ETA" in plain[-1], proc.stdout
    quiet = run_script(
        SCRIPT,
        "--env-id",
        "Pendulum-v1",
        *SMALL,
        "--total-timesteps",
        "300",
        "--no-progress",
        "--runs-dir",
        tmp_path / "quiet",
    )
    assert quiet.returncode == 0 and "SPS" not in quiet.stdout


def test_a_run_starts_without_the_linux_only_modules(tmp_path):
    """A short run through the update with os.sched_getaffinity and `resource` taken away (macOS / Windows)."""
    code = (
        "import os, sys, runpy; del os.sched_getaffinity; sys.modules['resource'] = None\n"
        f"sys.argv = ['sac_continuous'] + sys.argv[1:]; runpy.run_path({str(ROOT / SCRIPT)!r}, run_name='__main__')"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "--env-id",
            "Pendulum-v1",
            *SMALL,
            "--total-timesteps",
            "200",
            "--runs-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, **BASE_ENV},
    )
    assert proc.returncode == 0, proc.stderr
    assert "peak RSS" not in proc.stdout  # nothing to report without `resource`
    assert sorted(scalars(only_run_dir(tmp_path), "losses/qf1_loss")) == [100, 200]


def test_a_checkpoint_of_another_script_is_refused(tmp_path, uninterrupted_run):
    ckpt = torch.load(uninterrupted_run / "checkpoints" / "step_0000000300.pt", weights_only=True)
    ckpt["script"] = "ppo_continuous"
    other = tmp_path / "run" / "checkpoints" / "ppo.pt"
    other.parent.mkdir(parents=True)
    torch.save(ckpt, other)
    assert_clean_error(run_script(SCRIPT, "--resume", other, "--total-timesteps", "1000", timeout=120), "ppo_continuous.py")


def test_a_checkpoint_whose_networks_do_not_fit_is_refused_in_one_paragraph(tmp_path, uninterrupted_run):
    """A checkpoint whose critics are one TwinQ of stacked weights w1..b3, or of an edited copy: --resume
    names the mismatch and what to do, no traceback."""
    ckpt = torch.load(uninterrupted_run / "checkpoints" / "step_0000000300.pt", weights_only=True)
    for part in ("qf", "qf_target"):
        ckpt["learner"][part] = {f"{kind}{i}": torch.zeros(2, 1, 1) for i in (1, 2, 3) for kind in "wb"}
    old = tmp_path / "run" / "checkpoints" / "old.pt"
    old.parent.mkdir(parents=True)
    torch.save(ckpt, old)
    proc = run_script(SCRIPT, "--resume", old, "--total-timesteps", "600", "--runs-dir", tmp_path / "runs", timeout=120)
    assert_clean_error(proc, "the checkpoint's qf does not fit", "Missing key(s)", "q_network")


def test_ctrl_c_saves_a_consistent_state_and_resumes(tmp_path):
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
        "--save-buffer",
        "--runs-dir",
        str(tmp_path),
    ]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env={**os.environ, **BASE_ENV}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_for_updates(tmp_path, n=2, timeout=300, proc=proc)
        proc.send_signal(signal.SIGINT)
        out, err = output_after_ctrl_c(proc, 120)
    finally:  # a run that ignored the signal must not outlive the test
        proc.kill()
    assert proc.returncode == 130, err
    ckpts = list((only_run_dir(tmp_path) / "checkpoints").glob("interrupted_*.pt"))
    assert len(ckpts) == 1, err
    state = torch.load(ckpts[0], weights_only=True)
    step = state["global_step"]
    assert step >= 200 and state["replay_buffer"]["size"] == step  # every step taken is in the buffer
    assert state["run_state"]["grad_steps"] == step - 100 + 1  # and every update that followed it was made
    assert "resume with" in err
    resumed = run_script(SCRIPT, "--resume", ckpts[0], "--total-timesteps", step + 200, "--torch-threads", "1")
    assert resumed.returncode == 0, resumed.stderr
    assert max(scalars(only_run_dir(tmp_path), "losses/qf1_loss")) // 100 == (step + 200) // 100
