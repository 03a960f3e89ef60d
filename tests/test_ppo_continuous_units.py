"""Unit tests of ppo_continuous.py's helpers, imported from the script itself (no copies)."""

import math
import pickle
from pathlib import Path
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch

import ppo_continuous as ppo
import tests.fake_envs  # noqa: F401  (registers Counting-v0 and friends)


# ---------------------------------------------------------------------------------------------------------------
# GAE: a hand-computed rollout with a termination and a truncation
# ---------------------------------------------------------------------------------------------------------------
def test_gae_termination_and_truncation_hand_computed():
    gamma, lam = 0.9, 0.8
    # env 0: t=1 is a time-limit truncation (V(final obs) = 2.0), t=3 a termination (its next value must be ignored)
    # env 1: no episode end; bootstraps from next_values at the end of the rollout
    rewards = np.array([[1.0, 1.0], [2.0, 1.0], [3.0, 1.0], [4.0, 1.0]], np.float32)
    values = np.array([[0.5, 0.0], [0.6, 0.0], [0.7, 0.0], [0.8, 0.0]], np.float32)
    next_values = np.array([[0.6, 0.0], [2.0, 0.0], [0.8, 0.0], [5.0, 10.0]], np.float32)
    terminations = np.array([[0, 0], [0, 0], [0, 0], [1, 0]], bool)
    truncations = np.array([[0, 0], [1, 0], [0, 0], [0, 0]], bool)
    adv = ppo.compute_gae(rewards, values, next_values, terminations, truncations, gamma, lam)

    a3 = 4.0 - 0.8  # terminal: no bootstrap
    a2 = (3.0 + 0.9 * 0.8 - 0.7) + 0.9 * 0.8 * a3
    a1 = 2.0 + 0.9 * 2.0 - 0.6  # truncated: bootstrap V(final obs), and the recursion stops here
    a0 = (1.0 + 0.9 * 0.6 - 0.5) + 0.9 * 0.8 * a1
    np.testing.assert_allclose(adv[:, 0], [a0, a1, a2, a3], rtol=1e-6)
    assert a1 == pytest.approx(3.2) and a0 == pytest.approx(3.344) and a2 == pytest.approx(5.324)

    # env 1: delta_t = 1 for t < 3 and 1 + 0.9 * 10 at t = 3; A_t = sum_k (gamma*lam)^k delta_{t+k}
    deltas = np.array([1.0, 1.0, 1.0, 10.0])
    expected = [sum((gamma * lam) ** k * deltas[t + k] for k in range(4 - t)) for t in range(4)]
    np.testing.assert_allclose(adv[:, 1], expected, rtol=1e-6)


def test_gae_truncation_is_not_termination():
    """The classic bug (done = terminated | truncated in the value mask) would give a different advantage."""
    rewards, values = np.array([[1.0]], np.float32), np.array([[0.0]], np.float32)
    next_values = np.array([[3.0]], np.float32)
    trunc = ppo.compute_gae(rewards, values, next_values, np.array([[False]]), np.array([[True]]), 0.99, 0.95)
    term = ppo.compute_gae(rewards, values, next_values, np.array([[True]]), np.array([[False]]), 0.99, 0.95)
    assert trunc[0, 0] == pytest.approx(1.0 + 0.99 * 3.0)
    assert term[0, 0] == pytest.approx(1.0)


# ---------------------------------------------------------------------------------------------------------------
# Episode boundaries on gymnasium 1.x vector envs
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("env_id, ends_at, by_truncation", [("Counting-v0", 7, True), ("CountingTerminates-v0", 5, False)])
def test_true_next_obs_never_crosses_an_autoreset(env_id, ends_at, by_truncation):
    envs = gym.vector.SyncVectorEnv([lambda: gym.make(env_id)] * 2, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    obs, _ = envs.reset(seed=0)
    for t in range(1, 2 * ends_at + 1):
        raw_obs, _, terminations, truncations, infos = envs.step(np.zeros((2, 1), np.float32))
        ended = terminations | truncations
        real_next = ppo.true_next_obs(raw_obs, ended, infos)
        step_in_episode = (t - 1) % ends_at + 1
        episode = (t - 1) // ends_at
        # the transition's next obs is always the step after obs, in the same episode
        np.testing.assert_array_equal(real_next[:, 0], obs[:, 0] + 1)
        np.testing.assert_array_equal(real_next[:, 1], obs[:, 1])
        np.testing.assert_array_equal(real_next, [[step_in_episode, episode]] * 2)
        if step_in_episode == ends_at:
            assert ended.all() and truncations.all() == by_truncation and terminations.all() != by_truncation
            np.testing.assert_array_equal(raw_obs, [[0, episode + 1]] * 2)  # already the next episode's first obs
        else:
            assert not ended.any()
        obs = raw_obs


# ---------------------------------------------------------------------------------------------------------------
# Normalization
# ---------------------------------------------------------------------------------------------------------------
def test_running_mean_std_matches_numpy(rng):
    rms = ppo.RunningMeanStd(shape=(3,), epsilon=1e-12)
    batches = [rng.normal(2.0, 3.0, size=(n, 3)) for n in (1, 5, 2, 40)]
    for b in batches:
        rms.update(b)
    data = np.concatenate(batches)
    np.testing.assert_allclose(rms.mean, data.mean(0), rtol=1e-9)
    np.testing.assert_allclose(rms.var, data.var(0), rtol=1e-9)
    restored = ppo.RunningMeanStd(shape=(3,))  # checkpointed as plain attributes (the Run's to_plain / load_plain)
    saved = ppo.to_plain(rms)
    assert isinstance(saved["mean"], torch.Tensor) and isinstance(saved["count"], float)
    ppo.load_plain(restored, saved, "obs_rms")
    np.testing.assert_array_equal(restored.mean, rms.mean)
    np.testing.assert_array_equal(restored.var, rms.var)
    assert restored.count == rms.count and restored.mean.dtype == np.float64
    scalar = ppo.RunningMeanStd(shape=())  # a 0-d statistic becomes a numpy scalar after arithmetic: saved all the same
    scalar.update(np.array([1.0, 3.0]))
    assert isinstance(ppo.to_plain(scalar)["mean"], torch.Tensor)


def test_normalize_obs_clips():
    rms = ppo.RunningMeanStd(shape=(2,))
    rms.mean, rms.var = np.array([1.0, 0.0]), np.array([4.0, 1e-6])
    out = ppo.normalize_obs(np.array([[3.0, 1.0]]), rms, clip=10.0)
    np.testing.assert_allclose(out, [[1.0, 10.0]], rtol=1e-6)
    assert out.dtype == np.float32


def test_scale_rewards_divides_by_return_std_and_restarts_at_any_episode_end():
    """Hand-computed (gamma 0.5): the running variance is that of every discounted return G seen so far (the
    RunningMeanStd's initial count of 1e-4 moves it by < 1e-3 relative). Break-it check: with `rms.update(...)`
    deleted from scale_rewards (in a copy of the script), var stays 1 and the scaled rewards are [1, 2]: this fails."""
    rms = ppo.RunningMeanStd(shape=())
    rewards = np.array([1.0, 2.0])
    # step 1: G = [1, 2]; var{1, 2} = 0.25, std 0.5 -> scaled [2, 4], and 4 is clipped to clip = 3
    scaled, g = ppo.scale_rewards(rewards, np.zeros(2), np.array([False, False]), rms, gamma=0.5, clip=3.0)
    np.testing.assert_allclose(g, [1.0, 2.0])
    np.testing.assert_allclose(rms.var, 0.25, rtol=1e-3)
    np.testing.assert_allclose(scaled, [2.0, 3.0], rtol=1e-3)
    # step 2, env 1 truncated: G = 0.5 * [1, 2] + [1, 2] = [1.5, 3]; var{1, 2, 1.5, 3}: mean 1.875,
    # (0.875^2 + 0.125^2 + 0.375^2 + 1.125^2) / 4 = 0.546875; the returned G restarts at 0 for env 1
    scaled, g = ppo.scale_rewards(rewards, g, np.array([False, True]), rms, gamma=0.5, clip=10.0)
    np.testing.assert_allclose(g, [1.5, 0.0])
    np.testing.assert_allclose(rms.var, 0.546875, rtol=1e-3)
    np.testing.assert_allclose(scaled, [1.0 / math.sqrt(0.546875), 2.0 / math.sqrt(0.546875)], rtol=1e-3)
    assert (scaled > 0).all(), "scaling must keep the reward's sign (no mean subtraction)"


# ---------------------------------------------------------------------------------------------------------------
# Policy math and losses
# ---------------------------------------------------------------------------------------------------------------
def test_agent_distribution_is_the_gaussian_with_state_independent_std():
    """pi(.|x) = N(mu(x), exp(log_std)^2), independent over action dims: one log-prob and one entropy per observation."""
    torch.manual_seed(0)
    agent = ppo.Agent(4, 3)
    with torch.no_grad():
        agent.actor_logstd.copy_(torch.tensor([[-0.5, 0.0, 0.7]]))
    x, action = torch.randn(5, 4), torch.randn(5, 3)
    normal = torch.distributions.Normal(agent.actor_mean(x), agent.actor_logstd.exp())
    dist = agent.distribution(x)
    torch.testing.assert_close(dist.log_prob(action), normal.log_prob(action).sum(-1))
    torch.testing.assert_close(dist.entropy(), normal.entropy().sum(-1))
    _, log_prob, entropy, value = agent.get_action_and_value(x, action)
    torch.testing.assert_close(log_prob, normal.log_prob(action).sum(-1))
    assert entropy.shape == (5,) and value.shape == (5,)
    # sampling: the empirical std of many samples is exp(log_std), the mean mu(x)
    samples = agent.distribution(x[:1].expand(20_000, 4)).sample()
    np.testing.assert_allclose(samples.std(0).numpy(), np.exp([-0.5, 0.0, 0.7]), rtol=0.05)
    np.testing.assert_allclose(samples.mean(0).numpy(), agent.actor_mean(x[:1])[0].detach().numpy(), atol=0.05)


def test_policy_acts_with_the_distribution_mean_frozen_normalization_and_bounds():
    torch.manual_seed(0)
    agent = trained_like(ppo.Agent(3, 1))
    rms = ppo.RunningMeanStd(shape=(3,))
    rms.update(np.random.default_rng(0).normal(2.0, 3.0, size=(100, 3)))
    policy = ppo.Policy(agent, rms, 10.0, np.array([-2.0]), np.array([2.0]))
    obs = np.random.default_rng(1).normal(2.0, 3.0, size=(8, 3)).astype(np.float32)
    with torch.no_grad():
        expected = agent.actor_mean(torch.from_numpy(ppo.normalize_obs(obs, rms, 10.0))).clamp(-2, 2)
        torch.testing.assert_close(policy(torch.from_numpy(obs)), expected)
    # a tanh-squashed Gaussian (a student's edit): the deterministic action is the squashed mean
    squashed = torch.distributions.TransformedDistribution(
        agent.distribution(torch.zeros(2, 3)), [torch.distributions.TanhTransform(), torch.distributions.AffineTransform(0, 2)]
    )
    torch.testing.assert_close(ppo.deterministic_action(squashed), 2 * torch.tanh(agent.actor_mean(torch.zeros(2, 3))))


def test_ppo_losses_hand_computed():
    # sample 0: A=+1, ratio 1.5 -> clipped to 1.2; sample 1: A=-1, ratio 0.5 -> clipped to 0.8 (the pessimistic side)
    new_lp = torch.tensor([math.log(1.5), math.log(0.5)])
    old_lp = torch.zeros(2)
    adv = torch.tensor([1.0, -1.0])
    new_v, old_v, ret = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 0.0]), torch.tensor([2.0, 0.0])
    pg, v, log_ratio = ppo.ppo_losses(new_lp, old_lp, adv, new_v, old_v, ret, clip_coef=0.2, clip_vloss=True)
    assert pg.item() == pytest.approx((-1.2 + 0.8) / 2)
    # value: sample 0 unclipped (1-2)^2 = 1, clipped (0.2-2)^2 = 3.24 -> max 3.24; sample 1: 0
    assert v.item() == pytest.approx(0.5 * (3.24 + 0.0) / 2)
    _, v_plain, _ = ppo.ppo_losses(new_lp, old_lp, adv, new_v, old_v, ret, clip_coef=0.2, clip_vloss=False)
    assert v_plain.item() == pytest.approx(0.5 * (1.0 + 0.0) / 2)
    kl = ppo.kl_diagnostics(log_ratio, clip_coef=0.2)
    r = np.array([1.5, 0.5])
    np.testing.assert_allclose(kl.numpy(), [np.mean(-np.log(r)), np.mean(r - 1 - np.log(r)), 1.0], rtol=1e-6)


def test_policy_gradient_raises_probability_of_advantaged_actions():
    """Sign check: one gradient step on L^CLIP makes a positive-advantage action more likely."""
    mean = torch.zeros(1, 1, requires_grad=True)
    log_std = torch.zeros(1, 1)
    action = torch.tensor([[0.5]])
    dist = torch.distributions.Independent(torch.distributions.Normal(mean, log_std.exp()), 1)
    old_lp = dist.log_prob(action).detach()
    new_lp = dist.log_prob(action)
    pg, _, _ = ppo.ppo_losses(new_lp, old_lp, torch.tensor([1.0]), torch.zeros(1), torch.zeros(1), torch.zeros(1), 0.2, True)
    pg.backward()
    assert mean.grad.item() < 0  # gradient descent moves the mean towards the action


def test_explained_variance_and_annealed():
    y = np.array([1.0, 2.0, 3.0])
    assert ppo.explained_variance(y, y) == 1.0
    assert ppo.explained_variance(np.full(3, 2.0), y) == pytest.approx(0.0)
    assert math.isnan(ppo.explained_variance(y, np.ones(3)))
    assert ppo.annealed(1, 10, 1e-3) == pytest.approx(1e-3)
    assert ppo.annealed(10, 10, 1e-3) == pytest.approx(1e-4)


def trained_like(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """`module` with every parameter perturbed (non-zero biases, a non-tiny output layer), as after some training."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return module


def module_output(module: torch.nn.Module, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return module(torch.from_numpy(x)).numpy()


OBS = np.random.default_rng(0).normal(size=(64, 17)).astype(np.float32) * 3


@pytest.mark.parametrize("env_id, warmup", [("HalfCheetah-v4", 40), ("HalfCheetah-v5", 40), ("Pendulum-v1", 190)])
def test_env_state_roundtrip_is_exact(env_id, warmup):
    ppo.quiet_mujoco_warnings()
    rng = np.random.default_rng(1)
    actions = [rng.uniform(-1, 1, size=gym.make(env_id).action_space.shape).astype(np.float32) for _ in range(warmup + 30)]
    a = gym.make(env_id)
    a.reset(seed=3)
    for act in actions[:warmup]:
        a.step(act)
    (state,) = ppo.EnvStates(SimpleNamespace(envs=[a])).state_dict()  # a SyncVectorEnv's part, for one env
    assert state["exact"]
    state = pickle.loads(pickle.dumps(state))  # survives serialization as plain data
    b = gym.make(env_id)
    b.reset(seed=99)  # a different episode entirely
    ppo.EnvStates(SimpleNamespace(envs=[b])).load_state_dict([state])
    for act in actions[warmup:]:
        out_a, out_b = a.step(act), b.step(act)
        np.testing.assert_array_equal(out_a[0], out_b[0])
        assert out_a[1:4] == out_b[1:4]  # reward, terminated, truncated (Pendulum truncates at 200 within the window)
        if out_a[3]:
            np.testing.assert_array_equal(a.reset()[0], b.reset()[0])  # the env RNG was restored too


# ---------------------------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------------------------
class ArbitraryObject:
    """Stands for any pickled object that is not plain data (unpickling such objects can run code)."""


def minimal_checkpoint() -> dict:
    return {
        "format": 1,
        "script": "ppo_continuous",
        "args": {"env_id": "Pendulum-v1"},
        "model": {"w": torch.ones(2)},
        "global_step": 5,
        "iteration": 1,
        "run_name": "x",
        "run_state": {"recent_returns": [], "best_score": -math.inf},
        "rng_states": {"torch": torch.get_rng_state()},
    }


def test_save_checkpoint_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "ckpt" / "step_0000000005.pt"
    ppo.save_checkpoint(minimal_checkpoint(), path)
    before = path.read_bytes()

    def crash_mid_write(obj, f):
        f.write(b"half a checkpoint")
        raise KeyboardInterrupt  # Ctrl-C (or a crash) in the middle of writing

    monkeypatch.setattr(ppo.torch, "save", crash_mid_write)
    with pytest.raises(KeyboardInterrupt):
        ppo.save_checkpoint({**minimal_checkpoint(), "global_step": 6}, path)
    assert path.read_bytes() == before  # the existing checkpoint is intact
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # and no temporary file is left behind


def test_load_checkpoint_rejects_bad_files(tmp_path):
    good = tmp_path / "good.pt"
    ppo.save_checkpoint(minimal_checkpoint(), good)
    assert ppo.load_checkpoint(str(good))["global_step"] == 5
    with pytest.raises(ppo.UserError, match="does not exist"):
        ppo.load_checkpoint(str(tmp_path / "missing.pt"))
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(good.read_bytes()[:100])
    with pytest.raises(ppo.UserError, match="corrupt"):
        ppo.load_checkpoint(str(corrupt))
    not_ours = tmp_path / "weights.pt"
    torch.save({"w": torch.ones(1)}, not_ours)
    with pytest.raises(ppo.UserError, match="not a checkpoint"):
        ppo.load_checkpoint(str(not_ours))
    # weights_only=True: an arbitrary pickled object is refused, not unpickled
    evil = tmp_path / "evil.pt"
    torch.save({"format": 1, "args": {}, "payload": ArbitraryObject()}, evil)
    with pytest.raises(ppo.UserError, match="corrupt or not a checkpoint"):
        ppo.load_checkpoint(str(evil))


def test_a_save_prunes_the_oldest_periodic_checkpoints_and_nothing_else(tmp_path):
    """By step number, and only the names runs write: a user's step_mine.pt or step_0000000001.pt.bak survives."""
    args = ppo.Args(env_id="Pendulum-v1", total_timesteps=100, num_steps=64, runs_dir=str(tmp_path), keep_checkpoints=2)
    run = ppo.Run(args, "ppo_continuous", None, {"obs_shape": [3], "act_shape": [1]}, log_every=10)
    run.attach(ppo.LoopState(np.zeros((1, 3)), np.zeros(1), np.zeros(1, np.int64), np.zeros(1), global_step=2000), None)
    run.ckpt_dir.mkdir()
    for step in (100, 300, 40):
        (run.ckpt_dir / f"step_{step:010d}.pt").write_bytes(b"x")
    for name in ("final_0000003000.pt", "step_mine.pt", "step_0000000001.pt.bak", "step_00000000010.pt"):
        (run.ckpt_dir / name).write_bytes(b"x")
    run.save("step")
    run.writer.close()
    assert sorted(p.name for p in run.ckpt_dir.iterdir()) == [
        "final_0000003000.pt",
        "step_0000000001.pt.bak",
        "step_00000000010.pt",
        "step_0000000300.pt",
        "step_0000002000.pt",
        "step_mine.pt",
    ]


def test_resume_takes_the_checkpoint_args_as_defaults_and_refuses_conflicts(tmp_path, monkeypatch):
    """tyro.cli(Args, default=saved): a flag left out keeps the checkpoint's value; total_timesteps and the run flags
    may change; a fixed flag given with the checkpoint's own value is fine, with another value it is refused."""
    saved = ppo.Args(env_id="Pendulum-v1", learning_rate=1e-3, total_timesteps=10_000)
    ckpt = {**minimal_checkpoint(), "args": ppo.dataclasses.asdict(saved)}
    ppo.save_checkpoint(ckpt, tmp_path / "x.pt")

    def parse(*flags):
        monkeypatch.setattr(ppo.sys, "argv", ["ppo_continuous.py", "--resume", str(tmp_path / "x.pt"), *flags])
        return ppo.parse_command_line(ppo.Args)[0]

    merged = parse("--total-timesteps=20000")
    assert merged.env_id == "Pendulum-v1" and merged.learning_rate == 1e-3  # the checkpoint wins...
    assert merged.total_timesteps == 20_000 and merged.num_iterations == 20_000 // 2048  # ...derived sizes follow
    assert parse("--learning-rate", "1e-3").learning_rate == 1e-3
    with pytest.raises(
        ppo.UserError, match=r"--learning-rate 0.0005 conflicts with the checkpoint, which was trained with 0.001"
    ):
        parse("--learning-rate", "5e-4")
    with pytest.raises(ppo.UserError, match="--norm-obs False"):
        parse("--no-norm-obs")
    assert parse().norm_obs is True


def test_logged_losses_are_the_mean_over_all_minibatches(tmp_path, monkeypatch):
    """main() on a tiny Pendulum run (1 update: 2 epochs x 4 minibatches), with ppo_losses wrapped to record every
    minibatch's losses: the logged policy / value losses are their mean over all 8, not the last minibatch's.
    Break-it check: main logging the last minibatch's losses instead (a copy of the script) fails this test."""
    from tests.conftest import only_run_dir, scalars
    from tests.student_copy import import_copy, main_in_process

    module = import_copy(Path(ppo.__file__))
    recorded = []
    real_losses = module.ppo_losses

    def recording_losses(*args, **kwargs):
        pg_loss, v_loss, log_ratio = real_losses(*args, **kwargs)
        recorded.append((pg_loss.item(), v_loss.item()))
        return pg_loss, v_loss, log_ratio

    monkeypatch.setattr(module, "ppo_losses", recording_losses)
    main_in_process(
        module,
        [
            "--env-id",
            "Pendulum-v1",
            "--num-envs",
            2,
            "--num-steps",
            32,
            "--num-minibatches",
            4,
            "--update-epochs",
            2,
            "--total-timesteps",
            64,
            "--torch-threads",
            1,
            "--runs-dir",
            tmp_path,
        ],
        monkeypatch,
    )
    assert len(recorded) == 8, recorded
    run_dir = only_run_dir(tmp_path)
    for i, tag in enumerate(("losses/policy_loss", "losses/value_loss")):
        logged = list(scalars(run_dir, tag).values())
        assert len(logged) == 1, logged
        per_minibatch = np.array([r[i] for r in recorded])
        np.testing.assert_allclose(logged[0], per_minibatch.mean(), rtol=1e-5, atol=1e-7)
        assert not np.isclose(logged[0], per_minibatch[-1], rtol=1e-5, atol=1e-7), f"{tag}: last minibatch's value"
