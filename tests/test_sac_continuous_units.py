"""Unit tests of sac_continuous.py's parts (networks, Policy, replay buffer, learner, rollout), imported from the
script itself (no copies)."""

import copy
import math
import shutil

import gymnasium as gym
import numpy as np
import pytest
import torch

import sac_continuous as sac
import tests.fake_envs  # noqa: F401  (registers Counting-v0 and friends)
from tests.conftest import run_script


def make_learner(obs_dim=3, act_dim=2, low=-2.0, high=2.0, **overrides) -> sac.Learner:
    torch.manual_seed(0)
    return sac.Learner(
        obs_dim,
        act_dim,
        np.full(act_dim, low, np.float32),
        np.full(act_dim, high, np.float32),
        sac.Args(**overrides),
        torch.device("cpu"),
    )


def flat(module) -> torch.Tensor:
    """All of a network's weights as one vector."""
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()])


def no_grad_in(module) -> bool:
    return all(p.grad is None or p.grad.abs().sum() == 0 for p in module.parameters())


# ---------------------------------------------------------------------------------------------------------------
# The tanh-squashed Gaussian
# ---------------------------------------------------------------------------------------------------------------
def test_squashed_log_prob_matches_a_numerical_change_of_variables():
    """p_A(a) ~ P(a - d < A < a + d) / 2d, with P computed from the Gaussian CDF of u = atanh((a - bias) / scale):
    a density obtained from probabilities alone, without the Jacobian formula under test."""
    torch.manual_seed(0)
    mean = torch.tensor([[0.3, -1.2, 2.5]], dtype=torch.float64)
    log_std = torch.tensor([[-0.5, 0.2, -1.0]], dtype=torch.float64)
    scale = torch.tensor([2.0, 0.5, 1.0], dtype=torch.float64)
    bias = torch.tensor([1.0, 0.0, -0.25], dtype=torch.float64)
    for deterministic in (True, False):  # u = mean, and u drawn (seeded above)
        action, log_prob = sac.squashed_gaussian(mean, log_std, scale, bias, deterministic)
        normal = torch.distributions.Normal(mean, log_std.exp())
        d = 1e-6 * scale
        lo = torch.atanh((action - d - bias) / scale)
        hi = torch.atanh((action + d - bias) / scale)
        density = (normal.cdf(hi) - normal.cdf(lo)) / (2 * d)  # per dimension: the dimensions are independent
        torch.testing.assert_close(log_prob, density.log().sum(-1), rtol=1e-6, atol=1e-6)


def test_squashed_sample_is_inside_the_bounds_and_stable_at_saturation():
    mean = torch.tensor([[40.0, -40.0, 0.0]])  # tanh rounds to +-1 in float32
    log_std = torch.zeros(1, 3)
    scale, bias = torch.tensor([2.0, 2.0, 2.0]), torch.tensor([1.0, 1.0, 1.0])
    action, log_prob = sac.squashed_gaussian(mean, log_std, scale, bias, deterministic=True)
    assert ((action >= -1.0) & (action <= 3.0)).all()
    assert torch.isfinite(log_prob).all()
    # log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)): for u = 40 that is about -78.6, not log(1e-6) = -13.8
    expected_log_det = 2 * (math.log(2) - 40.0) + math.log(2.0)
    unsquashed = -math.log(math.sqrt(2 * math.pi))
    assert log_prob.item() == pytest.approx(3 * unsquashed - 2 * expected_log_det - math.log(2.0), rel=1e-4)


def test_actor_log_std_is_bounded_smoothly():
    """The Actor's log-std is tanh-squashed into [LOG_STD_MIN, LOG_STD_MAX], not clipped: the raw outputs -100, 0 and
    100 give the bounds and their midpoint."""
    actor = sac.Actor(2, 3)
    with torch.no_grad():
        actor.net[-1].weight.zero_()
        actor.net[-1].bias.copy_(torch.tensor([0.0, 0.0, 0.0, -100.0, 0.0, 100.0]))  # 3 means, then 3 raw log-stds
    mean, log_std = actor(torch.zeros(1, 2))
    assert mean.abs().max() == 0
    torch.testing.assert_close(
        log_std[0], torch.tensor([sac.LOG_STD_MIN, (sac.LOG_STD_MIN + sac.LOG_STD_MAX) / 2, sac.LOG_STD_MAX])
    )


# ---------------------------------------------------------------------------------------------------------------
# Networks
# ---------------------------------------------------------------------------------------------------------------
def test_the_critics_are_two_independent_q_networks_called_one_by_one():
    """The learner's critics are two q_network instances (nn.Linear's own initialization, drawn independently), and
    q_values, which every loss reads them through, is each of them called on its own."""
    learner = make_learner(obs_dim=5, act_dim=2)
    assert len(learner.qf) == 2 and all(isinstance(q, torch.nn.Sequential) for q in learner.qf)
    obs, act = torch.randn(7, 5), torch.randn(7, 2)
    out = sac.q_values(learner.qf, obs, act)
    assert out.shape == (2, 7)
    for i, critic in enumerate(learner.qf):
        torch.testing.assert_close(out[i], critic(torch.cat([obs, act], -1)).squeeze(-1), rtol=0, atol=0)
    assert not torch.allclose(out[0], out[1]), "the two critics are initialized independently"
    first, hidden = learner.qf[0][0].weight, learner.qf[0][2].weight
    assert first.abs().max() <= 1 / math.sqrt(7) and hidden.abs().max() <= 1 / math.sqrt(256)  # nn.Linear's init
    torch.testing.assert_close(flat(learner.qf_target), flat(learner.qf), rtol=0, atol=0)  # the targets start equal
    assert not any(p.requires_grad for p in learner.qf_target.parameters())  # moved by soft_update only


def test_acting_runs_the_actor_module_and_the_squashed_gaussian():
    """Policy.act, the rollout's acting, is the Actor module itself and squashed_gaussian (no second copy of the
    network's math): the same actions as the training path's sample; with noise 0 (evaluation) tanh(mean) scaled."""
    torch.manual_seed(0)
    actor = sac.Actor(17, 6)
    with torch.no_grad():  # weights as after some training: non-zero biases, a non-tiny output layer
        for p in actor.parameters():
            p.add_(0.3 * torch.randn_like(p))
    obs = np.random.default_rng(0).normal(size=(64, 17)) * 3  # float64, as MuJoCo returns them
    scale, bias = torch.full((6,), 2.0), torch.full((6,), 0.5)
    torch.manual_seed(1)
    with torch.no_grad():
        mean, log_std = actor(torch.from_numpy(obs).float())
        expected, _ = sac.squashed_gaussian(mean, log_std, scale, bias)
    torch.manual_seed(1)  # the same noise
    actions = sac.Policy(actor, bias - scale, bias + scale).act(obs)  # the bounds: scale 2, bias 0.5
    assert actions.dtype == np.float32
    np.testing.assert_allclose(actions, expected.numpy(), rtol=1e-6, atol=1e-6)
    deterministic = np.tanh(mean.numpy()) * scale.numpy() + bias.numpy()
    with torch.no_grad():  # Policy takes the bounds: scale 2 and bias 0.5 are [-1.5, 2.5]
        evaluated = sac.Policy(actor, bias - scale, bias + scale)(torch.from_numpy(obs)).numpy()
    np.testing.assert_allclose(evaluated, deterministic, rtol=1e-5, atol=1e-5)


def test_a_learner_checkpoint_holds_every_network_and_optimizer_a_student_adds():
    """LearnerPart saves what the Learner holds, not a list of names: a network and optimizer added to the Learner (as a
    student's edit of __init__ would) are saved and restored with the rest; the Policy, which holds the actor, is not."""
    learner = make_learner()
    learner.value = torch.nn.Linear(3, 1)
    learner.value_optimizer = torch.optim.Adam(learner.value.parameters(), lr=1e-3)
    learner.value(torch.ones(4, 3)).sum().backward()
    learner.value_optimizer.step()
    state = sac.LearnerPart(learner).state_dict()
    names = ["actor", "qf", "qf_target", "actor_optimizer", "q_optimizer", "alpha_optimizer", "value", "value_optimizer"]
    assert list(state) == [*names, "log_alpha"]  # the order __init__ made them in; no "policy"
    fresh = make_learner()
    fresh.value = torch.nn.Linear(3, 1)
    fresh.value_optimizer = torch.optim.Adam(fresh.value.parameters(), lr=1e-3)
    sac.LearnerPart(fresh).load_state_dict(copy.deepcopy(state))
    torch.testing.assert_close(fresh.value.weight, learner.value.weight)
    assert fresh.value_optimizer.state_dict()["state"][0]["step"] == 1  # Adam's moments came back too


def test_policy_from_a_checkpoint_is_the_saved_actor_and_evaluates_deterministically():
    """policy_from_checkpoint (what tools/agent.py loads) rebuilds the learner's actor with the env's bounds, and
    evaluate plays the same returns with it as with the learner's own actor: seeded, deterministic episodes."""
    learner = make_learner(obs_dim=3, act_dim=1)
    ckpt = {
        "script": sac.SCRIPT_NAME,
        "args": {"env_id": "Pendulum-v1"},
        "obs_shape": [3],
        "act_shape": [1],
        "learner": sac.LearnerPart(learner).state_dict(),
    }
    policy = sac.policy_from_checkpoint(ckpt)
    assert set(policy.state_dict()) == {f"actor.{k}" for k in learner.actor.state_dict()} | {"scale", "bias"}
    live = sac.Policy(learner.actor, np.full(1, -2.0, np.float32), np.full(1, 2.0, np.float32))  # Pendulum's bounds
    returns = [sac.evaluate(p, sac.eval_env("Pendulum-v1"), 2, seed=5) for p in (policy, live, policy)]
    assert returns[0] == returns[1] == returns[2] and len(returns[0]) == 2
    with pytest.raises(sac.UserError, match="was made for"):
        sac.policy_from_checkpoint({**ckpt, "obs_shape": [4]})


# ---------------------------------------------------------------------------------------------------------------
# Learner: target, soft update, which weights each step moves
# ---------------------------------------------------------------------------------------------------------------
def test_soft_q_target_termination_vs_truncation():
    rewards = torch.tensor([1.0, 1.0])
    next_q = torch.tensor([[5.0, 5.0], [3.0, 7.0]])  # (2 critics, batch): min is 3 and 5
    next_log_prob = torch.tensor([-1.0, 2.0])
    y = sac.soft_q_target(rewards, torch.tensor([0.0, 1.0]), next_q, next_log_prob, torch.tensor(0.5), 0.9)
    # sample 0 (truncated or mid-episode): 1 + 0.9 * (3 - 0.5 * -1) = 4.15; sample 1 (terminated): just the reward
    torch.testing.assert_close(y, torch.tensor([1.0 + 0.9 * 3.5, 1.0]))


def test_soft_update_is_polyak_averaging():
    learner = make_learner()
    torch.testing.assert_close(flat(learner.qf_target), flat(learner.qf))  # targets start equal
    with torch.no_grad():
        for p in learner.qf.parameters():
            p.add_(torch.randn_like(p))
    before = flat(learner.qf_target)
    sac.soft_update(learner.qf_target, learner.qf, 0.005)
    # read through the target network's own (per-layer) parameters: they see the new values
    torch.testing.assert_close(flat(learner.qf_target), 0.005 * flat(learner.qf) + 0.995 * before)
    sac.soft_update(learner.qf_target, learner.qf, 1.0)
    torch.testing.assert_close(flat(learner.qf_target), flat(learner.qf))


def random_batch(n=16, obs_dim=3, act_dim=2) -> dict:
    g = torch.Generator().manual_seed(1)
    return {
        "obs": torch.randn(n, obs_dim, generator=g),
        "next_obs": torch.randn(n, obs_dim, generator=g),
        "actions": torch.rand(n, act_dim, generator=g) * 4 - 2,
        "rewards": torch.randn(n, generator=g),
        "terminated": (torch.rand(n, generator=g) < 0.3).float(),
    }


def test_critic_update_regresses_on_the_soft_bellman_target():
    """The losses critic_update returns are those against y = r + gamma (1 - d) (min Q'(s', a') - alpha log pi(a'|s')),
    recomputed here from the helpers."""
    batch, learner = random_batch(), make_learner()
    torch.manual_seed(5)
    with torch.no_grad():
        mean, log_std = learner.actor(batch["next_obs"])
        scale, bias = learner.policy.scale, learner.policy.bias
        next_actions, next_log_prob = sac.squashed_gaussian(mean, log_std, scale, bias)
        next_q = sac.q_values(learner.qf_target, batch["next_obs"], next_actions)
        y = sac.soft_q_target(batch["rewards"], batch["terminated"], next_q, next_log_prob, learner.alpha(), 0.99)
        expected = (sac.q_values(learner.qf, batch["obs"], batch["actions"]) - y).pow(2).mean(1)
    torch.manual_seed(5)
    torch.testing.assert_close(sac.critic_update(learner, batch, 0.99)[1], expected)  # [[mean Q_i], [L_i]]


def test_critic_update_moves_only_the_critics_and_lowers_their_loss():
    learner = make_learner()
    batch = random_batch()
    actor_before, target_before = flat(learner.actor), flat(learner.qf_target)
    first = sac.critic_update(learner, batch, 0.99)
    for _ in range(50):
        last = sac.critic_update(learner, batch, 0.99)
    assert first.shape == (2, 2) and (last[1] < first[1]).all()  # [[mean Q_i], [L_i]], one column per critic
    torch.testing.assert_close(flat(learner.actor), actor_before)
    torch.testing.assert_close(flat(learner.qf_target), target_before)  # targets move only by soft_update


def test_actor_update_does_not_touch_the_critics_and_tunes_alpha():
    learner = make_learner()
    obs = random_batch()["obs"]
    critic_before, actor_before = flat(learner.qf), flat(learner.actor)
    out = sac.actor_update(learner, obs, autotune=True)
    assert out.shape == (3,) and out[1].item() == pytest.approx(1.0)  # alpha = exp(0) before the first step
    torch.testing.assert_close(flat(learner.qf), critic_before)
    assert no_grad_in(learner.qf), "the actor's loss must not leave gradients in the critics"
    assert not torch.equal(flat(learner.actor), actor_before)
    # the initial policy's entropy (std ~ e^-1.5 on [-2, 2]^2) is far above the target -|A| = -2: alpha goes down
    assert learner.alpha().item() < 1.0

    fixed = make_learner(autotune=False, alpha=0.2)
    out = sac.actor_update(fixed, obs, autotune=False)
    assert out[1].item() == pytest.approx(0.2) and out[2].item() == 0.0 and fixed.alpha().item() == pytest.approx(0.2)
    none = make_learner(autotune=False, alpha=0.0)  # --alpha 0 (allowed: >= 0) is plain actor-critic, not a log(0) error
    out = sac.actor_update(none, obs, autotune=False)
    assert out[1].item() == 0.0 and torch.isfinite(out).all()
    assert torch.isfinite(none.log_alpha).all()  # no log(0) = -inf for the non-finite guard to stop on


# ---------------------------------------------------------------------------------------------------------------
# Replay buffer
# ---------------------------------------------------------------------------------------------------------------
def transitions(start: int, n: int) -> tuple:
    """n distinguishable transitions numbered start, start+1, ...: every field encodes the number."""
    k = np.arange(start, start + n, dtype=np.float32)
    return (np.stack([k, -k], 1), np.stack([k + 0.5, -k], 1), k[:, None] * 0.01, k * 10, k % 2 == 0)


def test_buffer_wraps_around_and_overwrites_the_oldest():
    buf = sac.ReplayBuffer(capacity=5, obs_dim=2, act_dim=1)
    assert buf.nbytes == 5 * (2 * 2 * 4 + 4 + 4 + 4)  # one float32 row per transition
    buf.add(*transitions(0, 2))
    buf.add(*transitions(2, 2))
    assert (buf.pos, buf.size) == (4, 4)
    buf.add(*transitions(4, 3))  # 4 -> slot 4, 5 -> slot 0, 6 -> slot 1: crosses the end of the arrays
    assert (buf.pos, buf.size) == (2, 5)
    np.testing.assert_array_equal(buf.arrays["rewards"], [50, 60, 20, 30, 40])
    np.testing.assert_array_equal(buf.arrays["obs"][:, 0], [5, 6, 2, 3, 4])
    np.testing.assert_array_equal(buf.arrays["next_obs"][:, 0], [5.5, 6.5, 2.5, 3.5, 4.5])
    np.testing.assert_array_equal(buf.arrays["terminated"], [False, True, True, False, True])
    buf.add(*transitions(7, 5))  # a whole capacity at once
    np.testing.assert_array_equal(buf.arrays["rewards"], [100, 110, 70, 80, 90])
    assert (buf.pos, buf.size) == (2, 5)


def test_buffer_samples_whole_stored_transitions_only():
    buf = sac.ReplayBuffer(capacity=100, obs_dim=2, act_dim=1)
    buf.add(*transitions(0, 30))
    torch.manual_seed(0)
    batch = buf.sample(4096, torch.device("cpu"))
    k = batch["obs"][:, 0]
    assert set(k.long().tolist()) == set(range(30)), "uniform over the 30 stored transitions, nothing beyond"
    # every field of a sampled row belongs to the same transition
    torch.testing.assert_close(batch["next_obs"][:, 0], k + 0.5)
    torch.testing.assert_close(batch["rewards"], k * 10)
    torch.testing.assert_close(batch["actions"][:, 0], k * 0.01)
    torch.testing.assert_close(batch["terminated"], (k % 2 == 0).float())
    assert batch["terminated"].dtype == torch.float32
    torch.manual_seed(0)
    torch.testing.assert_close(buf.sample(4096, torch.device("cpu"))["obs"], batch["obs"])  # torch's RNG: reproducible


def test_buffer_state_dict_roundtrip():
    """BufferPart, the buffer's checkpoint part: only the stored rows, as tensors; None without --save-buffer."""
    buf = sac.ReplayBuffer(capacity=5, obs_dim=2, act_dim=1)
    buf.add(*transitions(0, 3))
    assert sac.BufferPart(buf, save=False).state_dict() is None
    state = sac.BufferPart(buf).state_dict()
    assert state["obs"].shape == (3, 2) and isinstance(state["rewards"], torch.Tensor)  # only the stored part
    other = sac.ReplayBuffer(capacity=5, obs_dim=2, act_dim=1)
    sac.BufferPart(other).load_state_dict(None)  # saved without the buffer: it stays empty
    assert other.size == 0
    sac.BufferPart(other).load_state_dict(state)
    other.add(*transitions(3, 3))
    buf.add(*transitions(3, 3))
    for name in buf.arrays:
        np.testing.assert_array_equal(other.arrays[name], buf.arrays[name])
    assert (other.pos, other.size) == (buf.pos, buf.size)


# ---------------------------------------------------------------------------------------------------------------
# Rollout: what reaches the buffer at episode boundaries
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("env_id, ends_at, by_truncation", [("Counting-v0", 7, True), ("CountingTerminates-v0", 5, False)])
def test_stored_done_flag_is_termination_and_next_obs_the_true_final_obs(env_id, ends_at, by_truncation):
    envs = gym.vector.SyncVectorEnv([lambda: gym.make(env_id)] * 2, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    buf = sac.ReplayBuffer(capacity=100, obs_dim=2, act_dim=1)
    obs, _ = envs.reset(seed=0)
    ep_return, ep_length = np.zeros(2), np.zeros(2, np.int64)
    all_finished = []
    steps = 2 * ends_at + 1
    for _ in range(steps):
        actions = np.zeros((2, 1), np.float32)
        next_obs, real_next, rewards, terminations, ep_return, ep_length, finished = sac.env_step(
            envs, actions, ep_return, ep_length
        )
        buf.add(obs, real_next, actions, rewards, terminations)
        all_finished += finished
        obs = next_obs
    stored_obs, stored_next = buf.arrays["obs"][: 2 * steps], buf.arrays["next_obs"][: 2 * steps]
    # every stored transition stays inside one episode: next obs = obs one step later, same episode index
    np.testing.assert_array_equal(stored_next[:, 0], stored_obs[:, 0] + 1)
    np.testing.assert_array_equal(stored_next[:, 1], stored_obs[:, 1])
    at_end = stored_next[:, 0] == ends_at
    assert at_end.sum() == 4  # 2 envs x 2 episode ends
    # done flag: True exactly at a termination; a time-limit truncation is stored as not done
    expected_done = np.zeros_like(at_end) if by_truncation else at_end
    np.testing.assert_array_equal(buf.arrays["terminated"][: 2 * steps], expected_done)
    assert all_finished == [(float(ends_at), ends_at)] * 4
    np.testing.assert_array_equal(ep_return, [1.0, 1.0])  # the third episode's first step


def test_actor_and_alpha_losses_in_one_backward_pass_equal_two_separate_steps():
    """actor_update backpropagates L_pi + L_alpha at once. That equals two separate steps only because neither loss
    reaches the other's parameters (alpha enters L_pi detached, log pi enters L_alpha detached): recompute it apart."""
    batch = random_batch()
    learner, manual = make_learner(), make_learner()
    torch.manual_seed(3)
    sac.actor_update(learner, batch["obs"], autotune=True)
    torch.manual_seed(3)
    mean, log_std = manual.actor(batch["obs"])
    actions, log_prob = sac.squashed_gaussian(mean, log_std, manual.policy.scale, manual.policy.bias)
    frozen = copy.deepcopy(manual.qf).requires_grad_(False)  # the critics as the actor's loss must see them
    q = sac.q_values(frozen, batch["obs"], actions).min(0).values
    manual.actor_optimizer.zero_grad()
    (manual.alpha() * log_prob - q).mean().backward()
    manual.actor_optimizer.step()
    manual.alpha_optimizer.zero_grad()
    (-manual.log_alpha.exp() * (log_prob.detach() + manual.target_entropy)).mean().backward()
    manual.alpha_optimizer.step()
    torch.testing.assert_close(flat(learner.actor), flat(manual.actor))
    torch.testing.assert_close(learner.log_alpha.detach(), manual.log_alpha.detach())
    assert no_grad_in(manual.qf) and no_grad_in(learner.qf)


def test_every_form_of_zero_grad_trains_the_same():
    """The optimizers take the networks' own parameters, so zero_grad(), zero_grad(set_to_none=True) and
    zero_grad(set_to_none=False) all train, and alike."""
    batch, trained, initial = random_batch(), [], make_learner()
    for form in ({}, {"set_to_none": True}, {"set_to_none": False}):
        learner = make_learner()
        for optimizer in (learner.actor_optimizer, learner.q_optimizer):
            optimizer.zero_grad = lambda zero_grad=optimizer.zero_grad, form=form: zero_grad(**form)
        assert learner.q_optimizer.param_groups[0]["params"] == list(learner.qf.parameters())
        torch.manual_seed(7)
        for step in range(1, 5):
            sac.gradient_step(learner, batch, step, sac.Args(tau=0.05))
        for name in ("actor", "qf", "qf_target"):  # every parameter tensor moved
            for p, p0 in zip(getattr(learner, name).parameters(), getattr(initial, name).parameters()):
                assert not torch.equal(p, p0), f"{form}: a parameter of {name} did not move"
        trained.append(torch.cat([flat(learner.actor), flat(learner.qf), flat(learner.qf_target), learner.log_alpha]))
    torch.testing.assert_close(trained[1], trained[0], rtol=0, atol=0)
    torch.testing.assert_close(trained[2], trained[0], rtol=1e-6, atol=1e-7)  # a zeroed gradient: + 0 in the sum


def test_gradient_step_runs_the_delayed_schedule(monkeypatch):
    """Critics every step; every policy_frequency steps policy_frequency actor updates, summed; the targets every
    target_network_frequency steps. One function for both SAC scripts."""
    calls = []
    for name in ("critic_update", "actor_update", "soft_update"):
        real = getattr(sac, name)
        monkeypatch.setattr(sac, name, lambda *a, real=real, name=name: calls.append(name) or real(*a))
    learner, batch = make_learner(), random_batch()
    args = sac.Args(policy_frequency=2, target_network_frequency=3)
    actor_sums = []
    for step in range(1, 7):
        calls.append(step)
        _, actor_metrics = sac.gradient_step(learner, batch, step, args)
        actor_sums.append(actor_metrics)
    assert calls == [
        1,
        "critic_update",
        2,
        "critic_update",
        "actor_update",
        "actor_update",
        3,
        "critic_update",
        "soft_update",
        4,
        "critic_update",
        "actor_update",
        "actor_update",
        5,
        "critic_update",
        6,
        "critic_update",
        "actor_update",
        "actor_update",
        "soft_update",
    ]
    assert [m is None for m in actor_sums] == [True, False, True, False, True, False]
    assert actor_sums[1].shape == (3,) and actor_sums[1][1].item() < 2.0  # alpha summed over 2 updates, below 1 each


def test_a_replay_buffer_the_machine_cannot_hold_is_refused_before_anything_starts(tmp_path, monkeypatch):
    """numpy allocates the buffer lazily: without the check, --buffer-size 10^11 (3.6 TB on Pendulum) would start and
    be killed hours later as it fills. --save-buffer also needs the disk for it (two copies while a save runs)."""
    proc = run_script(
        "sac_continuous.py", "--env-id", "Pendulum-v1", "--buffer-size", 10**11, "--runs-dir", tmp_path / "runs", timeout=120
    )
    assert (
        proc.returncode == 2
        and "--buffer-size 100,000,000,000: the replay buffer needs" in proc.stderr
        and "at most" in proc.stderr
    )
    assert not (tmp_path / "runs").exists()  # refused before the run folder is made
    args = sac.Args(buffer_size=1_000_000, save_buffer=True, runs_dir=str(tmp_path))  # 36 MB of rows on Pendulum
    sac.check_buffer_fits(args, 3, 1)  # fits
    monkeypatch.setattr(sac.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**12, 10**12 - 50e6, 50e6))
    with pytest.raises(sac.UserError, match=r"needs 0\.1 GiB of disk with --save-buffer"):
        sac.check_buffer_fits(args, 3, 1)  # 72 MB for two copies, 50 MB free
    sac.check_buffer_fits(sac.Args(buffer_size=1_000_000, save_buffer=False, runs_dir=str(tmp_path)), 3, 1)
