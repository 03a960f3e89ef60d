"""A run never goes on on broken numbers: fault injection per script family.

An environment that returns NaN at a chosen step (tests/fake_envs.py NanReward-v0 / NanObservation-v0: the 300th
step of the process; tests/pixel_envs.py for the Atari scripts), and a loss made non-finite at a chosen update (a copy
of the script with one line changed). Each time the run stops with one paragraph naming the quantity, the env step and
iteration, the likely cause and the newest checkpoint from before it; it exits 3; it writes no checkpoint of the
broken state (no interrupted_, final_ or later step_ file, and --keep-best keeps no broken agent); and that newest
checkpoint resumes, with the unedited script, to the end."""

import math
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import ppo_continuous as ppo
from tests import pixel_envs
from tests.conftest import ROOT, only_run_dir, run_script
from tests.student_copy import copy_alone, import_copy, run_copy

# One line of each loss, made NaN at a chosen update (PPO, A2C: iteration 3; SAC: gradient step 150).
PG_LOSS_LINE = "loss = pg_loss - args.ent_coef * entropy + args.vf_coef * v_loss"
NAN_AT_ITERATION_3 = (PG_LOSS_LINE, PG_LOSS_LINE.replace("= ", "= (", 1) + ") * (math.nan if iteration == 3 else 1.0)")
SAC_CRITIC_LINE = "critic_metrics, actor_metrics = critic_update(learner, batch, args.gamma), None"
NAN_REWARDS = '{**batch, "rewards": batch["rewards"] * (math.nan if step == 150 else 1.0)}'
NAN_AT_GRAD_STEP_150 = (SAC_CRITIC_LINE, SAC_CRITIC_LINE.replace("(learner, batch,", f"(learner, {NAN_REWARDS},"))
MESSAGE = re.compile(
    r"error: non-finite value \(NaN or Inf\) in (.+?) at env step (\d+) \(iteration (\d+)\): the run "
    r"stopped and saved nothing of this state\. Likely cause: (.+?)\. The newest checkpoint from "
    r"before it, (\S+), is untouched: resume it with `.+ --resume \S+`\."
)
PPO_SMALL = [
    "--num-steps",
    "64",
    "--num-minibatches",
    "2",
    "--total-timesteps",
    "512",
    "--checkpoint-interval",
    "128",
    "--torch-threads",
    "1",
    "--keep-best",
    "--eval-interval",
    "0",
]
SAC_SMALL = [
    "--learning-starts",
    "100",
    "--batch-size",
    "32",
    "--total-timesteps",
    "512",
    "--checkpoint-interval",
    "128",
    "--torch-threads",
    "1",
    "--keep-best",
    "--eval-interval",
    "0",
    "--save-buffer",
]


def stopped(proc, quantity: str, cause: str) -> tuple:
    """The stop's paragraph, checked: (env step, iteration, the newest checkpoint it names)."""
    assert proc.returncode == 3, f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr
    match = MESSAGE.search(proc.stderr)
    assert match, proc.stderr
    assert quantity in match.group(1) and cause in match.group(4), proc.stderr
    return int(match.group(2)), int(match.group(3)), Path(match.group(5))


def assert_nothing_broken_saved(run_dir: Path, newest: Path, stop_step: int) -> None:
    """The checkpoints are the periodic ones from before the stop, the newest is the one named; best.pt (if any) is
    from before the stop and finite."""
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").glob("*.pt") if p.name != "best.pt")
    assert ckpts and all(name.startswith("step_") for name in ckpts), ckpts  # no interrupted_, no final_
    assert all(int(name[5:15]) <= stop_step for name in ckpts) and newest.name == ckpts[-1], (ckpts, newest)
    best = run_dir / "checkpoints" / "best.pt"
    if best.exists():
        saved = torch.load(best, weights_only=True)
        assert saved["global_step"] <= stop_step
        assert all(torch.isfinite(t).all() for t in saved_tensors(saved))


def saved_tensors(obj) -> list:
    if isinstance(obj, torch.Tensor):
        return [obj] if obj.is_floating_point() else []
    values = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()
    return [t for value in values for t in saved_tensors(value)]


def test_ppo_stops_on_a_nan_reward_from_the_env_and_resumes_from_the_newest_checkpoint(tmp_path):
    proc = run_script("ppo_continuous.py", "--env-id", "tests.fake_envs:NanReward-v0", *PPO_SMALL, "--runs-dir", tmp_path)
    step, iteration, newest = stopped(proc, "", "the environment (tests.fake_envs:NanReward-v0)")
    assert 300 <= step <= 320 and iteration == 5  # the 300th env step's NaN, seen by the loop's check in that rollout
    run_dir = only_run_dir(tmp_path)
    assert_nothing_broken_saved(run_dir, newest, step)
    assert newest.name == "step_0000000256.pt"
    # a checkpoint's "module:Env" id imports a module: the resume names it again to allow that
    resumed = run_script(
        "ppo_continuous.py", "--resume", newest, "--env-id", "tests.fake_envs:NanReward-v0", "--total-timesteps", 512
    )  # the env's NaN: at 256 + 300
    assert resumed.returncode == 0, resumed.stderr
    assert "512/512" in resumed.stdout


def test_ppo_stops_on_a_nan_loss_before_the_broken_weights_are_saved(tmp_path):
    copy = copy_alone("ppo_continuous.py", tmp_path / "copy", [NAN_AT_ITERATION_3])
    runs = tmp_path / "runs"
    proc = run_copy(copy, "--env-id", "Pendulum-v1", *PPO_SMALL, "--runs-dir", runs)
    step, iteration, newest = stopped(proc, "losses/", "--learning-rate 0.0003")
    assert (step, iteration) == (192, 3)
    assert_nothing_broken_saved(only_run_dir(runs), newest, step)
    assert newest.name == "step_0000000128.pt"
    resumed = run_script("ppo_continuous.py", "--resume", newest, "--total-timesteps", 256)  # the unedited script
    assert resumed.returncode == 0, resumed.stderr


def test_sac_stops_on_a_nan_observation_from_the_env_and_resumes_with_its_buffer(tmp_path):
    proc = run_script("sac_continuous.py", "--env-id", "tests.fake_envs:NanObservation-v0", *SAC_SMALL, "--runs-dir", tmp_path)
    step, _, newest = stopped(proc, "", "the environment")
    assert 299 <= step <= 384  # the 300th step's NaN, seen where the loop logs or at the next save, which it stops
    run_dir = only_run_dir(tmp_path)
    assert_nothing_broken_saved(run_dir, newest, step)
    assert newest.name == "step_0000000256.pt" and (run_dir / "checkpoints" / "best.pt").exists()
    resumed = run_script(
        "sac_continuous.py", "--resume", newest, "--env-id", "tests.fake_envs:NanObservation-v0", "--total-timesteps", 512
    )
    assert resumed.returncode == 0, resumed.stderr


def test_sac_stops_on_a_nan_critic_loss_when_the_policy_acts_on_it(tmp_path):
    """The NaN loss at update 150 (env step 249) reaches the actor's weights at once: the actions it chooses next are
    NaN, and the run stops there, naming the training as the cause, before the env is blamed or the window logged."""
    copy = copy_alone("sac_continuous.py", tmp_path / "copy", [NAN_AT_GRAD_STEP_150])
    runs = tmp_path / "runs"
    proc = run_copy(copy, "--env-id", "Pendulum-v1", *SAC_SMALL, "--log-interval", "50", "--runs-dir", runs)
    step, _, newest = stopped(proc, "losses/", "--q-lr")
    assert step == 250  # the first log after it (--log-interval 50)
    assert_nothing_broken_saved(only_run_dir(runs), newest, step)
    assert newest.name == "step_0000000128.pt"
    resumed = run_script("sac_continuous.py", "--resume", newest, "--total-timesteps", 300)
    assert resumed.returncode == 0, resumed.stderr


@pytest.mark.parametrize(
    "keep_best, refused",
    [(False, "the step checkpoint about to be written"), (True, "the agent --keep-best was about to keep")],
)
def test_a_checkpoint_is_never_written_from_nan_weights(tmp_path, keep_best, refused):
    """Weights the rollout does not act with (the target critics, and from them the critics) go NaN at env step 256,
    inside a log window: the periodic checkpoint due at 256 (and before it --keep-best's look at the training returns)
    checks what it would write, and stops the run instead."""
    line = "state.global_step += args.num_envs"
    edit = (line, line + "; learner.qf_target[0][0].weight.data.mul_(math.nan if state.global_step == 256 else 1.0)")
    copy = copy_alone("sac_continuous.py", tmp_path / "copy", [edit])
    runs = tmp_path / "runs"
    flags = [flag for flag in SAC_SMALL if keep_best or flag != "--keep-best"]  # --keep-best looks first, then the save
    proc = run_copy(copy, "--env-id", "Pendulum-v1", *flags, "--log-interval", "1000", "--runs-dir", runs)
    step, _, newest = stopped(proc, "learner's weights, about to be saved", "--q-lr")
    assert step == 256 and newest.name == "step_0000000128.pt"
    assert_nothing_broken_saved(only_run_dir(runs), newest, step)


@pytest.mark.parametrize("script", ["ppo_atari.py", "a2c_atari.py"])
@pytest.mark.parametrize("fault", ["env reward", "loss"])
def test_atari_scripts_stop_on_a_nan_and_resume(script, fault, tmp_path, monkeypatch, capsys):
    """In this process, on PixelTarget (tests/pixel_envs.py; uint8 frames cannot hold a NaN, the reward can)."""
    path = copy_alone(script, tmp_path / "copy", [NAN_AT_ITERATION_3] if fault == "loss" else [])
    runs = tmp_path / "runs"
    flags = [
        "--num-envs",
        4,
        "--num-steps",
        16,
        "--total-timesteps",
        512,
        "--checkpoint-interval",
        128,
        "--torch-threads",
        1,
        "--no-progress",
        "--runs-dir",
        runs,
    ]
    flags += ["--log-interval", 1] if script == "a2c_atari.py" else []  # A2C logs (and checks) every update here
    bad_env = NanRewardPixelTarget if fault == "env reward" else pixel_envs.PixelTarget
    with pytest.raises(SystemExit) as stop:
        run_main(path, flags, bad_env, monkeypatch)
    assert stop.value.code == 3
    err = capsys.readouterr().err
    match = MESSAGE.search(err)
    assert match, err
    step, iteration, newest = int(match.group(2)), int(match.group(3)), Path(match.group(5))
    if fault == "loss":
        assert "losses/" in match.group(1) and (step, iteration) == (192, 3)
    else:
        assert 200 <= step <= 256  # env step 200's NaN, seen where the loop logs or at the next save, which it stops
    assert_nothing_broken_saved(only_run_dir(runs), newest, step)
    assert newest.name == "step_0000000128.pt"
    run_main(
        ROOT / script,
        ["--resume", newest, "--total-timesteps", 256, "--checkpoint-interval", 128],
        pixel_envs.PixelTarget,
        monkeypatch,
    )
    assert (only_run_dir(runs) / "checkpoints" / "step_0000000256.pt").exists()


class NanRewardPixelTarget(pixel_envs.PixelTarget):
    """PixelTarget whose 50th step returns a NaN reward (in each of the 4 envs: at env step 200)."""

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        self.calls = getattr(self, "calls", 0) + 1
        return obs, math.nan if self.calls == 50 else reward, terminated, truncated, info


def run_main(path: Path, flags: list, env_class, monkeypatch) -> None:
    module = import_copy(path)
    num_actions = int(pixel_envs.PixelTarget().action_space.n)
    monkeypatch.setattr(module, "probe_env", lambda env_id: (pixel_envs.PixelTarget().observation_space.shape, num_actions))
    monkeypatch.setattr(
        module, "make_vector_env", lambda args, video_dir: pixel_envs.make_vector_env(args.num_envs, env_class=env_class)
    )
    monkeypatch.setattr(sys, "argv", [str(path), *map(str, flags)])
    module.main()


@pytest.mark.slow  # two Ray runs in the serial Ray group: the default tier stays under 10 minutes
@pytest.mark.ray
def test_ray_learner_stops_on_a_nan_loss_shuts_ray_down_and_resumes(tmp_path):
    """sac_continuous_ray.py: the learner's log window (every 50 env steps here) finds the NaN losses; the driver
    stops, Ray with it (nothing left in the run's session), and the newest checkpoint (the learner trails collection:
    from before update 150) resumes with the unedited script."""
    pytest.importorskip("ray")
    from tests.test_sac_continuous_ray_e2e import lingering, run_ray, start_ray_run, stop_session

    copy = copy_alone("sac_continuous_ray.py", tmp_path / "copy", [NAN_AT_GRAD_STEP_150])
    runs = tmp_path / "runs"
    run = start_ray_run(
        "--env-id",
        "Pendulum-v1",
        "--learning-starts",
        "100",
        "--batch-size",
        "32",
        "--torch-threads",
        "1",
        "--worker-batch-steps",
        "50",
        "--total-timesteps",
        "1000",
        "--checkpoint-interval",
        "100",
        "--log-interval",
        "50",
        "--runs-dir",
        runs,
        script=str(copy),
    )
    try:
        out, err = run.communicate(timeout=300)
        leftovers = lingering(run.pid)  # Ray's processes included: they stay in the run's session
    finally:
        stop_session(run.pid)
    assert not leftovers, f"processes left in the run's session: {leftovers}"
    step, _, newest = stopped(subprocess.CompletedProcess(run.args, run.returncode, out, err), "losses/", "--q-lr")
    assert 250 <= step < 1000
    assert_nothing_broken_saved(only_run_dir(runs), newest, step)
    assert torch.load(newest, weights_only=True)["run_state"]["grad_steps"] < 150
    resumed = run_ray("--resume", newest, "--total-timesteps", int(newest.stem[-10:]) + 200, "--torch-threads", "1")
    assert resumed.returncode == 0, resumed.stderr


def test_a_metric_undefined_by_definition_does_not_stop_the_run_and_a_nan_loss_does():
    """Run.log: the explained variance of returns that are all equal is NaN by definition (not a broken run); a
    NaN loss stops the run."""
    logged, stops = [], []
    run = SimpleNamespace(
        writer=SimpleNamespace(add_scalar=lambda tag, value, step: logged.append(tag)),
        parts={},
        non_finite=lambda quantity: stops.append(quantity),
    )
    ppo.Run.log(run, 5, {"losses/explained_variance": math.nan, "losses/value_loss": 1.0})
    assert logged == ["losses/explained_variance", "losses/value_loss"] and stops == []
    ppo.Run.log(run, 6, {"losses/value_loss": math.inf})
    assert stops == ["losses/value_loss (inf)"]
