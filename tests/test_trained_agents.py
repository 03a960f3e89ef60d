"""Trained agents, for every script: --keep-best keeps checkpoints/best.pt (the agent with the best score so far,
resumable, never the replay buffer); `tools/agent.py export` writes a folder that runs with plain torch (policy.pt2
in a process that imports none of the scripts) or with the script's Policy (model.pt, plain tensors), with a model
card, never over what is there; `tools/agent.py eval|export --capture-video` replays the agent on video."""

import hashlib
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

import a2c_atari
import ppo_atari
import ppo_continuous as ppo
import sac_continuous as sac
import sac_continuous_ray as sac_ray
from tests.conftest import BASE_ENV, ROOT, needs_mujoco_rendering, only_run_dir, run_script, scalars
from tests.test_sac_continuous_ray_e2e import run_ray

FALLING = "tests.fake_envs:FallingReturn-v0"  # return 7 for its first 6 episodes (7 steps each), then 0
MUJOCO = "InvertedPendulum-v5"  # renders headless (EGL): the continuous scripts' video env
SCRIPTS = ("ppo_continuous", "ppo_atari", "a2c_atari", "sac_continuous", "sac_continuous_ray")
CHILD = """
import sys
import torch

policy = torch.export.load(sys.argv[1]).module()
torch.save(policy(torch.load(sys.argv[2])), sys.argv[3])
print("IMPORTED", sorted(sys.modules))
"""


def needs_video_encoder():
    pytest.importorskip("moviepy", reason="gymnasium's RecordVideo writes mp4 through moviepy")


def running_max(curve: dict) -> dict:
    best, out = -np.inf, {}
    for step in sorted(curve):
        best = max(best, curve[step])
        out[step] = best
    return out


def check_best_of_evaluations(run_dir, ckpt_name: str = "best.pt") -> dict:
    """eval/best_return is the running maximum of eval/episodic_return, and best.pt is the agent of the first
    evaluation that reached the maximum."""
    returns, best = scalars(run_dir, "eval/episodic_return"), scalars(run_dir, "eval/best_return")
    assert len(returns) >= 2 and best == pytest.approx(running_max(returns))
    top = max(returns.values())
    first_top = min(step for step, value in returns.items() if value == top)
    state = torch.load(run_dir / "checkpoints" / ckpt_name, weights_only=True, map_location="cpu")
    assert state["global_step"] == first_top and state["run_state"]["best_score"] == pytest.approx(top)
    return state


def policy_pt2_actions(export_dir, obs: torch.Tensor, tmp_path) -> torch.Tensor:
    """policy.pt2 run in a new process, from an empty folder, with no path to this repository: plain torch only."""
    fresh = tmp_path / "fresh"
    fresh.mkdir(exist_ok=True)
    torch.save(obs, fresh / "obs.pt")
    env = {k: v for k, v in {**os.environ, **BASE_ENV}.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(export_dir / "policy.pt2"), "obs.pt", "actions.pt"],
        cwd=fresh,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    imported = proc.stdout.split("IMPORTED", 1)[1]
    assert not [name for name in SCRIPTS if f"'{name}'" in imported], "policy.pt2 must not need the scripts"
    return torch.load(fresh / "actions.pt", weights_only=True)


TOOL = "tools/agent.py"


def check_export_folder(export_dir, script: str, ckpt: dict, episodes: int, video: bool) -> dict:
    names = {"policy.pt2", "model.pt", "config.json", "README.md"} | ({"replay.mp4"} if video else set())
    assert {p.name for p in export_dir.iterdir()} == names
    if video:
        assert (export_dir / "replay.mp4").stat().st_size > 1000
    config = json.loads((export_dir / "config.json").read_text())
    assert config["script"] == f"{script}.py" and config["env_id"] == ckpt["args"]["env_id"]
    assert config["global_step"] == ckpt["global_step"]
    card = (export_dir / "README.md").read_text()
    assert ckpt["args"]["env_id"] in card and f"{ckpt['global_step']:,} env steps" in card
    assert f"over {episodes} deterministic episodes" in card and "±" in card and 'torch.export.load("policy.pt2")' in card
    assert hashlib.sha256((ROOT / f"{script}.py").read_bytes()).hexdigest() in card
    command = next(line for line in card.splitlines() if line.startswith(f"python {script}.py "))  # flags off defaults
    assert f"--total-timesteps {ckpt['args']['total_timesteps']}" in command and "--keep-best" not in command
    return config


def model_pt_policy(module, export_dir, ckpt: dict):
    """model.pt into the script's own Policy (built from the checkpoint, then given model.pt's tensors)."""
    policy = module.policy_from_checkpoint(ckpt)
    policy.load_state_dict(torch.load(export_dir / "model.pt", weights_only=True))
    return policy


def same_tensors(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k].cpu(), b[k].cpu()) for k in a)


def env_observations(make_env, env_id: str, n: int = 12) -> np.ndarray:
    """Observations a real episode visits (random actions), as a batch."""
    env = make_env(env_id, 0, False, "")()
    obs, _ = env.reset(seed=3)
    batch = [obs]
    env.action_space.seed(3)
    while len(batch) < n:
        obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
        batch.append(obs)
        if terminated or truncated:
            obs, _ = env.reset()
    env.close()
    return np.stack(batch)


# ---- keep-best: the mechanics, in-process ----
class FakeBuffer:
    holds_replay_buffer = True

    def state_dict(self) -> dict:
        return {"obs": torch.ones(4)}

    def load_state_dict(self, state) -> None:
        pass


def test_run_keeps_the_best_evaluated_agent_and_its_score_on_resume(tmp_path):
    args = ppo.Args(env_id="Pendulum-v1", runs_dir=str(tmp_path), keep_best=True, eval_interval=10, progress=False)
    args.num_iterations = 10
    shapes = {"obs_shape": [3], "act_shape": [1]}
    run = ppo.Run(args, "ppo_continuous", None, shapes, 10)
    net = torch.nn.Linear(2, 1)
    s = ppo.LoopState(
        raw_obs=np.zeros((1, 3)),
        episode_return=np.zeros(1),
        episode_length=np.zeros(1, np.int64),
        discounted_return=np.zeros(1),
    )
    run.attach(s, None, model=net, replay_buffer=FakeBuffer())

    def at(step: int, weight: float) -> None:
        s.global_step, s.iteration = step, step // 10
        torch.nn.init.constant_(net.weight, weight)

    best_pt = run.ckpt_dir / "best.pt"
    at(10, 1.0)
    run.evaluated([5.0, 7.0])  # 6: the first score is the best so far
    at(20, 2.0)
    run.evaluated([1.0])  # the score falls: best.pt keeps the agent of step 10
    best = torch.load(best_pt, weights_only=True)
    assert best["global_step"] == 10 and best["run_state"]["best_score"] == 6.0
    assert torch.all(best["model"]["weight"] == 1.0) and best["replay_buffer"] is None  # never the buffer
    at(30, 3.0)
    run.evaluated([9.0])  # a better score: best.pt now holds the agent of step 30
    at(40, 4.0)
    best = torch.load(best_pt, weights_only=True)
    assert best["global_step"] == 30 and torch.all(best["model"]["weight"] == 3.0) and best["run_state"]["best_score"] == 9
    step_ckpt = run.save("step")  # every checkpoint holds the best score (and a periodic one the buffer)
    run.save("final")
    run.writer.flush()
    assert scalars(run.dir, "eval/best_return") == {10: 6.0, 20: 6.0, 30: 9.0}
    run.close()
    final = run.ckpt_dir / "final_0000000040.pt"
    ckpt = torch.load(final, weights_only=True)
    assert ckpt["run_state"]["best_score"] == 9.0 and torch.equal(ckpt["replay_buffer"]["obs"], torch.ones(4))
    args.resume, args.num_iterations = str(final), 20
    resumed = ppo.Run(args, "ppo_continuous", ckpt, shapes, 10)
    assert resumed.best_score == 9.0  # a resumed run keeps best.pt unless it beats 9
    resumed.writer.close()
    run.args.keep_checkpoints = 1
    at(50, 5.0)
    run.save("step")  # --keep-checkpoints 1: the older periodic checkpoint goes, best.pt never
    assert best_pt.is_file() and not step_ckpt.exists()


# ---- keep-best in real runs whose training return falls (no evaluation: the recent training returns) ----
def test_ppo_keep_best_keeps_the_agent_before_the_return_fell_and_a_resumed_run_keeps_it(tmp_path):
    common = ["--torch-threads", 1, "--runs-dir", tmp_path, "--no-progress"]
    proc = run_script(
        "ppo_continuous.py",
        "--env-id",
        FALLING,
        "--num-steps",
        16,
        "--num-minibatches",
        2,
        "--update-epochs",
        1,
        "--total-timesteps",
        96,
        "--checkpoint-interval",
        16,
        "--keep-checkpoints",
        10,
        "--keep-best",
        *common,
    )
    assert proc.returncode == 0, proc.stderr
    run_dir = only_run_dir(tmp_path)
    ckpts = run_dir / "checkpoints"
    # returns of the last 10 episodes at each checkpoint: 7 (16, 32, 48), then 4.7, 3.8, 2.1 as returns of 0 come in
    assert scalars(run_dir, "charts/best_training_return") == {step: 7.0 for step in range(16, 97, 16)}
    best = torch.load(ckpts / "best.pt", weights_only=True)
    assert best["global_step"] == 16 and best["iteration"] == 1 and best["run_state"]["best_score"] == 7.0
    assert same_tensors(best["model"], torch.load(ckpts / "step_0000000016.pt", weights_only=True)["model"])
    last = torch.load(ckpts / "step_0000000096.pt", weights_only=True)
    assert not same_tensors(best["model"], last["model"]) and last["run_state"]["best_score"] == 7.0
    # resumed from its last checkpoint: the env restarts (its returns are 7 again), never above the stored best 7
    before = (ckpts / "best.pt").read_bytes()
    resumed = run_script(
        "ppo_continuous.py",
        "--resume",
        ckpts / "step_0000000096.pt",
        "--env-id",
        FALLING,
        "--total-timesteps",
        128,
        "--checkpoint-interval",
        16,
        "--keep-checkpoints",
        10,
        "--keep-best",
        *common,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert (ckpts / "best.pt").read_bytes() == before
    assert torch.load(ckpts / "step_0000000128.pt", weights_only=True)["run_state"]["best_score"] == 7.0


def test_sac_keep_best_keeps_the_agent_before_the_return_fell_without_the_buffer(tmp_path):
    proc = run_script(
        "sac_continuous.py",
        "--env-id",
        FALLING,
        "--total-timesteps",
        96,
        "--learning-starts",
        24,
        "--batch-size",
        8,
        "--buffer-size",
        100,
        "--checkpoint-interval",
        16,
        "--keep-checkpoints",
        10,
        "--keep-best",
        "--save-buffer",
        "--torch-threads",
        1,
        "--runs-dir",
        tmp_path,
        "--no-progress",
    )
    assert proc.returncode == 0, proc.stderr
    run_dir = only_run_dir(tmp_path)
    ckpts = run_dir / "checkpoints"
    assert scalars(run_dir, "charts/best_training_return") == {step: 7.0 for step in range(16, 97, 16)}
    best = torch.load(ckpts / "best.pt", weights_only=True)
    step16 = torch.load(ckpts / "step_0000000016.pt", weights_only=True)
    assert best["global_step"] == 16 and best["run_state"]["best_score"] == 7.0
    assert best["replay_buffer"] is None and step16["replay_buffer"] is not None  # --save-buffer: not into best.pt
    assert same_tensors(best["learner"]["actor"], step16["learner"]["actor"])
    last = torch.load(ckpts / "step_0000000096.pt", weights_only=True)
    assert not same_tensors(best["learner"]["actor"], last["learner"]["actor"])


# ---- keep-best by evaluation, the export round trip and replay, per script ----
@pytest.mark.slow  # about 21 s
def test_ppo_continuous_keep_best_export_and_replay(tmp_path):
    needs_video_encoder()
    needs_mujoco_rendering()
    proc = run_script(
        "ppo_continuous.py",
        "--env-id",
        MUJOCO,
        "--num-steps",
        256,
        "--num-minibatches",
        4,
        "--update-epochs",
        2,
        "--total-timesteps",
        1024,
        "--eval-interval",
        256,
        "--eval-episodes",
        2,
        "--keep-best",
        "--checkpoint-interval",
        0,
        "--torch-threads",
        1,
        "--runs-dir",
        tmp_path,
        "--no-progress",
    )
    assert proc.returncode == 0, proc.stderr
    run_dir = only_run_dir(tmp_path)
    ckpt = check_best_of_evaluations(run_dir)
    export_dir = tmp_path / "export"
    proc = run_script(
        TOOL, "export", run_dir / "checkpoints" / "best.pt", "--out", export_dir, "--capture-video", "--episodes", 2
    )
    assert proc.returncode == 0, proc.stderr
    assert "Overwriting existing videos" not in proc.stderr  # no warning about the tool's own folders
    # progress: a line per evaluation episode as it ends, then one for the replay recorded on video
    assert re.findall(r"^episode (\d)/(\d): return", proc.stdout, flags=re.M) == [("1", "2"), ("2", "2"), ("1", "1")]
    check_export_folder(export_dir, "ppo_continuous", ckpt, 2, video=True)
    # policy.pt2 acts as evaluate() does: normalized obs (frozen statistics), the mean action, clipped to the bounds
    obs = env_observations(ppo.make_env, MUJOCO).astype(np.float32)
    policy = model_pt_policy(ppo, export_dir, ckpt)
    assert same_tensors(policy.agent.state_dict(), ckpt["model"])
    agent = ppo.Agent(obs.shape[1], 1)
    agent.load_state_dict(ckpt["model"])
    rms = ppo.RunningMeanStd(shape=(obs.shape[1],))
    ppo.load_plain(rms, ckpt["obs_rms"], "obs_rms")
    with torch.no_grad():
        mean = agent.actor_mean(torch.from_numpy(ppo.normalize_obs(obs, rms, ckpt["args"]["obs_clip"]))).numpy()
    expected = np.clip(mean, -3.0, 3.0)  # InvertedPendulum's bounds
    actions = policy_pt2_actions(export_dir, torch.from_numpy(obs), tmp_path)
    assert actions.shape == expected.shape and np.abs(expected).max() > 0
    np.testing.assert_allclose(actions.numpy(), expected, rtol=1e-5, atol=1e-6)
    # replay: eval --capture-video records the evaluation episode
    proc = run_script(TOOL, "eval", run_dir / "checkpoints" / "best.pt", "--capture-video", "--episodes", 1)
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in (run_dir / "eval" / "best" / "videos").glob("*.mp4")] == ["rl-video-episode-0.mp4"]


def test_export_never_overwrites_and_a_failed_export_leaves_nothing(tmp_path, monkeypatch, capsys):
    """An existing non-empty folder is refused, with --force too when the tool did not export it; an export that fails
    half-way leaves no folder and no temporary files."""
    from tools import agent as tool

    proc = run_script(
        "ppo_continuous.py",
        "--env-id",
        "Pendulum-v1",
        "--num-steps",
        64,
        "--num-minibatches",
        2,
        "--total-timesteps",
        64,
        "--save-model",
        "--eval-episodes",
        1,
        "--runs-dir",
        tmp_path / "runs",
    )
    assert proc.returncode == 0, proc.stderr
    ckpt = next((tmp_path / "runs").rglob("final_*.pt"))
    project = tmp_path / "project"
    project.mkdir()
    (project / "README.md").write_text("mine")
    with pytest.raises(SystemExit) as code:
        tool.main(["export", str(ckpt), "--out", str(project), "--episodes", "1"])
    assert code.value.code == 2 and "--force" in capsys.readouterr().err
    assert [p.name for p in project.iterdir()] == ["README.md"] and (project / "README.md").read_text() == "mine"

    with pytest.raises(SystemExit) as code:  # --force replaces only an earlier export (tests/test_agent_tool.py)
        tool.main(["export", str(ckpt), "--out", str(project), "--episodes", "1", "--force"])
    assert code.value.code == 2 and "not a folder this tool exported" in capsys.readouterr().err
    assert [p.name for p in project.iterdir()] == ["README.md"] and (project / "README.md").read_text() == "mine"

    monkeypatch.setattr(tool.torch, "save", lambda *a, **k: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(SystemExit) as code:
        tool.main(["export", str(ckpt), "--out", str(tmp_path / "new"), "--episodes", "1"])
    assert code.value.code == 2 and "disk full" in capsys.readouterr().err  # one paragraph
    assert sorted(p.name for p in tmp_path.iterdir()) == ["project", "runs"]  # no folder, no temporary leftovers


@pytest.mark.parametrize(
    "script", ["sac_continuous", pytest.param("sac_continuous_ray", marks=[pytest.mark.ray, pytest.mark.slow])]
)
@pytest.mark.slow  # about 22 s each
def test_sac_keep_best_export_and_replay(tmp_path, script):
    needs_video_encoder()
    needs_mujoco_rendering()
    module = {"sac_continuous": sac, "sac_continuous_ray": sac_ray}[script]
    common = [
        "--env-id",
        MUJOCO,
        "--learning-starts",
        100,
        "--batch-size",
        32,
        "--eval-episodes",
        2,
        "--keep-best",
        "--save-buffer",
        "--torch-threads",
        1,
        "--runs-dir",
        tmp_path,
        "--no-progress",
    ]
    if script == "sac_continuous":
        proc = run_script(
            "sac_continuous.py",
            *common,
            "--total-timesteps",
            400,
            "--eval-interval",
            100,
            "--checkpoint-interval",
            0,
            "--save-model",
        )
    else:  # the evaluator runs beside training: best.pt is the snapshot taken when its weights were sent. It skips an
        # evaluation while the previous one runs, so a loaded machine gets fewer: 8 chances for the 2 checked below
        proc = run_ray(
            *common,
            "--total-timesteps",
            1200,
            "--eval-interval",
            150,
            "--checkpoint-interval",
            300,
            "--num-rollout-workers",
            1,
            "--worker-batch-steps",
            50,
            script="sac_continuous_ray.py",
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = only_run_dir(tmp_path)
    ckpt = check_best_of_evaluations(run_dir)
    buffer_part = "replay_buffer" if script == "sac_continuous" else "replay_buffers"
    last = sorted(p for p in (run_dir / "checkpoints").glob("*.pt") if p.name != "best.pt")[-1]
    assert ckpt[buffer_part] is None and torch.load(last, weights_only=True)[buffer_part] is not None
    export_dir = tmp_path / "export"
    proc = run_script(
        TOOL, "export", run_dir / "checkpoints" / "best.pt", "--out", export_dir, "--capture-video", "--episodes", 2
    )
    assert proc.returncode == 0, proc.stderr
    check_export_folder(export_dir, script, ckpt, 2, video=True)
    policy = model_pt_policy(module, export_dir, ckpt)
    assert same_tensors(policy.actor.state_dict(), ckpt["learner"]["actor"])
    # policy.pt2 acts as evaluate() does: tanh of the Gaussian's mean, scaled to the bounds (InvertedPendulum: +-3)
    obs = env_observations(module.make_env, MUJOCO).astype(np.float32)
    with torch.no_grad():
        expected = module.Policy(policy.actor, np.array([-3.0]), np.array([3.0]))(torch.from_numpy(obs)).numpy()
    actions = policy_pt2_actions(export_dir, torch.from_numpy(obs), tmp_path)
    np.testing.assert_allclose(actions.numpy(), expected, rtol=1e-5, atol=1e-5)
    proc = run_script(TOOL, "eval", run_dir / "checkpoints" / "best.pt", "--capture-video", "--episodes", 1)
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in (run_dir / "eval" / "best" / "videos").glob("*.mp4")] == ["rl-video-episode-0.mp4"]


@pytest.mark.slow  # about 40 s each
@pytest.mark.parametrize("script", ["ppo_atari", "a2c_atari"])
def test_atari_keep_best_export_and_replay(tmp_path, script):
    needs_video_encoder()
    module = {"ppo_atari": ppo_atari, "a2c_atari": a2c_atari}[script]
    small = ["--num-minibatches", 2, "--update-epochs", 1] if script == "ppo_atari" else []
    proc = run_script(
        f"{script}.py",
        "--env-id",
        "BreakoutNoFrameskip-v4",
        "--num-envs",
        2,
        "--num-steps",
        32,
        *small,
        "--total-timesteps",
        384,
        "--eval-interval",
        128,
        "--eval-episodes",
        1,
        "--keep-best",
        "--checkpoint-interval",
        0,
        "--torch-threads",
        1,
        "--runs-dir",
        tmp_path,
        "--no-progress",
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    run_dir = only_run_dir(tmp_path)
    ckpt = check_best_of_evaluations(run_dir)
    export_dir = tmp_path / "export"
    proc = run_script(
        TOOL,
        "export",
        run_dir / "checkpoints" / "best.pt",
        "--out",
        export_dir,
        "--capture-video",
        "--episodes",
        1,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    check_export_folder(export_dir, script, ckpt, 1, video=True)
    agent = model_pt_policy(module, export_dir, ckpt).agent
    assert same_tensors(agent.state_dict(), ckpt["model"])
    # policy.pt2: the most likely action of the Nature CNN for the stacked uint8 frames
    frames = torch.from_numpy(env_observations(module.make_env, "BreakoutNoFrameskip-v4"))
    with torch.no_grad():
        logits, _ = agent(frames)
    actions = policy_pt2_actions(export_dir, frames, tmp_path)
    assert actions.dtype == torch.int64 and torch.equal(actions, logits.argmax(-1))
    proc = run_script(TOOL, "eval", run_dir / "checkpoints" / "best.pt", "--capture-video", "--episodes", 1, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in (run_dir / "eval" / "best" / "videos").glob("*.mp4")] == ["rl-video-episode-0.mp4"]


@pytest.mark.parametrize("script", ["ppo_continuous", "a2c_atari"])
def test_evaluating_every_eval_interval_leaves_the_training_run_unchanged(tmp_path, script):
    """The on-policy scripts' periodic evaluation uses no RNG of the training run (and gives a --bf16 trunk back):
    the same seed logs the same losses with and without it."""
    if script == "ppo_continuous":
        flags = [
            "--env-id",
            "Pendulum-v1",
            "--num-steps",
            128,
            "--num-minibatches",
            2,
            "--update-epochs",
            1,
            "--total-timesteps",
            512,
        ]
    else:
        flags = ["--env-id", "BreakoutNoFrameskip-v4", "--num-envs", 2, "--num-steps", 5, "--total-timesteps", 200]
    curves = []
    for name, extra in (("plain", []), ("evaluated", ["--eval-interval", 100, "--eval-episodes", 1])):
        runs = tmp_path / name
        proc = run_script(
            f"{script}.py", *flags, *extra, "--torch-threads", 1, "--runs-dir", runs, "--no-progress", timeout=600
        )
        assert proc.returncode == 0, proc.stderr
        curves.append(scalars(only_run_dir(runs), "losses/policy_loss"))
        if extra:
            assert len(scalars(only_run_dir(runs), "eval/episodic_return")) >= 2
    assert curves[0] and curves[0] == curves[1]
