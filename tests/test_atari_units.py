"""The pure helpers of ppo_atari.py and a2c_atari.py: n-step returns, GAE, next-step autoreset targets, the A2C
losses, the network's shapes and entry point, the deterministic Policy, and the channels-last layout main() gives the
network against the plain one."""

import copy
from pathlib import Path

import numpy as np
import pytest
import torch

import a2c_atari as A
import ppo_atari as P


def one_env(*rows):
    return [np.array(r, dtype=np.float32)[:, None] for r in rows]


def test_n_step_returns_by_hand_with_an_episode_end_inside_the_window():
    rewards, next_values = one_env([1, 2, 3, 4], [10, 20, 30, 40])
    no = np.zeros((4, 1), bool)
    terminated_at_1 = no.copy()
    terminated_at_1[1] = True
    # R3 = 4 + .5*40 = 24 (window end: bootstrap); R2 = 3 + .5*24 = 15; R1 = 2 (terminal); R0 = 1 + .5*2 = 2
    got = A.n_step_returns(rewards, next_values, terminated_at_1, no, gamma=0.5)
    np.testing.assert_allclose(got[:, 0], [2, 2, 15, 24])
    # a truncation at 1 bootstraps from V(final obs) = next_values[1] = 20 instead: R1 = 2 + .5*20 = 12, R0 = 7
    got = A.n_step_returns(rewards, next_values, no, terminated_at_1, gamma=0.5)
    np.testing.assert_allclose(got[:, 0], [7, 12, 15, 24])
    # no episode end: the plain discounted sum to the window's end, bootstrapped there
    got = A.n_step_returns(rewards, next_values, no, no, gamma=0.5)
    np.testing.assert_allclose(
        got[:, 0], [1 + 0.5 * 2 + 0.25 * 3 + 0.125 * 4 + 0.0625 * 40, 2 + 0.5 * 3 + 0.25 * 4 + 0.125 * 40, 15, 24]
    )


def test_n_step_returns_equal_gae_with_lambda_one(rng):
    T, N = 5, 16
    rewards = rng.normal(size=(T, N)).astype(np.float32)
    values = rng.normal(size=(T, N)).astype(np.float32)
    terminations, truncations = rng.random((T, N)) < 0.2, rng.random((T, N)) < 0.1
    # as in a rollout: the value after step t is the next row's value, except where an episode ended (final obs)
    next_values = np.concatenate([values[1:], rng.normal(size=(1, N)).astype(np.float32)])
    ended = terminations | truncations
    next_values[ended] = rng.normal(size=ended.sum()).astype(np.float32)
    returns = A.n_step_returns(rewards, next_values, terminations, truncations, 0.99)
    gae = P.compute_gae(rewards, values, next_values, terminations, truncations, 0.99, 1.0)
    np.testing.assert_allclose(returns, gae + values, rtol=1e-5, atol=1e-5)


def test_gae_by_hand_with_truncation_and_termination():
    rewards, values, next_values = one_env([1, 1, 1], [0.5, 0.5, 0.5], [0.5, 2.0, 0.5])
    term, trunc = np.zeros((3, 1), bool), np.zeros((3, 1), bool)
    trunc[1] = True  # time limit at step 1: bootstrap from V(final obs) = 2.0, cut the recursion
    term[2] = True
    adv = P.compute_gae(rewards, values, next_values, term, trunc, gamma=0.9, gae_lambda=0.5)
    d0, d1, d2 = 1 + 0.9 * 0.5 - 0.5, 1 + 0.9 * 2.0 - 0.5, 1 - 0.5
    np.testing.assert_allclose(adv[:, 0], [d0 + 0.45 * d1, d1, d2], rtol=1e-6)


def test_next_step_targets_bootstrap_from_the_final_obs_and_drop_reset_steps():
    # env 0: the episode ends at step 1 (its final obs is obs[2]); step 2 is the reset step
    values = np.array([[1.0, 5.0], [2.0, 6.0], [3.0, 7.0], [4.0, 8.0]], np.float32)
    reset_steps = np.zeros((4, 2), bool)
    reset_steps[2, 0] = True
    next_values, real = P.next_step_targets(values, np.array([9.0, 10.0], np.float32), reset_steps)
    np.testing.assert_array_equal(next_values[:, 0], [2, 3, 4, 9])
    np.testing.assert_array_equal(next_values[:, 1], [6, 7, 8, 10])
    assert real.tolist() == [0, 1, 2, 3, 5, 6, 7]  # flat index 4 = (step 2, env 0) is out
    a_next, a_real = A.next_step_targets(values, np.array([9.0, 10.0], np.float32), reset_steps)
    np.testing.assert_array_equal(a_next, next_values)
    np.testing.assert_array_equal(a_real, real)


def test_a2c_losses_values_and_gradients():
    logits = torch.zeros(2, 2, requires_grad=True)
    logprob = torch.distributions.Categorical(logits=logits).log_prob(torch.tensor([0, 1]))
    values = torch.tensor([1.0, 2.0], requires_grad=True)
    returns = torch.tensor([2.0, 0.0])
    advantages = returns - values
    pg_loss, v_loss = A.a2c_losses(logprob, advantages, values, returns)
    assert v_loss.item() == pytest.approx((1 + 4) / 2)
    assert pg_loss.item() == pytest.approx(-(np.log(0.5) * 1 + np.log(0.5) * -2) / 2)
    pg_loss.backward(retain_graph=True)
    assert values.grad is None or torch.all(values.grad == 0)  # the advantage is a constant for the policy loss
    # a positive advantage raises the taken action's logit
    assert logits.grad[0, 0] < 0 and logits.grad[1, 1] > 0


def test_ppo_clip_bounds_the_ratio():
    adv = torch.ones(4)
    old = torch.zeros(4)
    new = torch.log(torch.tensor([0.5, 1.0, 1.05, 2.0]))  # ratios 0.5, 1, 1.05, 2
    pg_loss, _, _ = P.ppo_losses(new, old, adv, torch.zeros(4), torch.zeros(4), torch.zeros(4), 0.1, True)
    assert pg_loss.item() == pytest.approx(-(0.5 + 1.0 + 1.05 + 1.1) / 4)


def test_nature_cnn_shapes_and_entry_point():
    torch.manual_seed(0)
    agent = P.Agent(num_actions=4)
    obs = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    logits, value = agent(obs)
    assert logits.shape == (3, 4) and value.shape == (3,)
    convs = (4 * 32 * 8 * 8 + 32) + (32 * 64 * 4 * 4 + 64) + (64 * 64 * 3 * 3 + 64)
    assert sum(p.numel() for p in agent.parameters()) == convs + (3136 * 512 + 512) + (512 * 4 + 4) + (512 + 1)
    # get_action_and_value: the log-prob and entropy of the given actions, the value; a sampled action when none given
    actions = torch.tensor([0, 3, 1])
    same, logprob, entropy, value2 = agent.get_action_and_value(obs, actions)
    dist = torch.distributions.Categorical(logits=logits)
    assert torch.equal(same, actions) and torch.equal(value2, value)
    torch.testing.assert_close(logprob, dist.log_prob(actions))
    torch.testing.assert_close(entropy, dist.entropy())
    sampled, *_ = agent.get_action_and_value(obs)
    assert sampled.shape == (3,) and sampled.dtype == torch.long and ((0 <= sampled) & (sampled < 4)).all()


def assert_close_to_scale(got: torch.Tensor, expected: torch.Tensor, rtol: float) -> None:
    """Within rtol of the output's scale (max |expected|): an absolute tolerance would pass logits of size 0.005 that
    are all zero (an all-zero trunk)."""
    error, scale = (got - expected).abs().max().item(), expected.abs().max().item()
    assert scale > 0 and error <= rtol * scale, f"off by {error:.3g} at scale {scale:.3g} (rtol {rtol})"


def trained_like(module, seed: int = 0):
    """An Agent with weights as after some training (non-zero biases, logits far from 0), and one with the same."""
    torch.manual_seed(seed)
    agent = module.Agent(num_actions=4)
    with torch.no_grad():
        for p in agent.parameters():
            p.mul_(1 + 0.2 * torch.randn_like(p)).add_(0.01 * torch.randn_like(p))
    return agent, copy.deepcopy(agent)


@pytest.mark.parametrize("module", [P, A])
def test_channels_last_computes_what_the_plain_network_computes(module):
    """main() moves the Agent to channels-last memory (`.to(device, memory_format=torch.channels_last)`): a layout,
    not another function. Outputs within 1e-5 of their scale, float32, gradients in every weight, the same state
    dict; Agent.network's own forward runs (nothing is hooked or replaced)."""
    assert "Agent(num_actions).to(device, memory_format=torch.channels_last)" in Path(module.__file__).read_text()
    plain, fast = trained_like(module)
    fast.to(memory_format=torch.channels_last)
    assert fast.network[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert not fast.network._forward_hooks and not fast.network._forward_pre_hooks and "forward" not in vars(fast.network)
    obs = torch.randint(0, 256, (16, 4, 84, 84), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        for got, expected in zip(fast(obs), plain(obs)):
            assert got.dtype == torch.float32
            assert_close_to_scale(got, expected, 1e-5)
    _, logprob, _, value = fast.get_action_and_value(obs, torch.zeros(16, dtype=torch.long))
    (logprob.sum() + value.sum()).backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in fast.parameters())
    assert fast.state_dict().keys() == plain.state_dict().keys()


def test_the_scale_relative_check_rejects_an_all_zero_trunk():
    """The check the old test made (atol=0.05 on logits of size ~0.005) passes an all-zero trunk; this one does not."""
    torch.manual_seed(0)
    plain = P.Agent(num_actions=4)  # fresh weights: logits of size ~0.005
    zeroed = copy.deepcopy(plain)
    torch.nn.init.zeros_(zeroed.network[-2].weight)
    torch.nn.init.zeros_(zeroed.network[-2].bias)
    obs = torch.randint(0, 256, (16, 4, 84, 84), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        (logits, _), (zero_logits, _) = plain(obs), zeroed(obs)
    torch.testing.assert_close(zero_logits, logits, atol=0.05, rtol=0.05)  # the old tolerance: passes
    with pytest.raises(AssertionError):
        assert_close_to_scale(zero_logits, logits, 1e-5)


@pytest.mark.parametrize("module", [P, A])
def test_policy_plays_the_most_likely_action_and_loads_a_checkpoint(module):
    """Policy: the argmax of the Agent's own logits, deterministic; policy_from_checkpoint builds it on the CPU from
    the checkpoint's weights; weights of other shapes end in load_state_dict's error (tools/agent.py words it)."""
    agent, _ = trained_like(module)
    obs = torch.randint(0, 256, (32, 4, 84, 84), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        logits, _ = agent(obs)
        actions = module.Policy(agent)(obs)
    assert actions.dtype == torch.int64 and torch.equal(actions, logits.argmax(-1))
    assert len(set(actions.tolist())) > 1  # not a constant: the frames decide
    ckpt = {
        "script": module.SCRIPT_NAME,
        "args": {"env_id": "BreakoutNoFrameskip-v4"},
        "num_actions": 4,
        "model": agent.state_dict(),
    }
    loaded = module.policy_from_checkpoint(ckpt)
    with torch.no_grad():
        first, again = loaded(obs), loaded(obs)
    assert torch.equal(first, actions) and torch.equal(again, actions)  # no sampling: the same actions every call
    assert next(loaded.parameters()).device.type == "cpu"
    other = {**ckpt, "model": {**ckpt["model"], "network.0.weight": torch.zeros(16, 4, 8, 8)}}
    with pytest.raises(RuntimeError, match=r"size mismatch for network.0.weight"):
        module.policy_from_checkpoint(other)


def test_rmsprop_tf_by_hand_over_three_steps():
    """v_0 = 1, v_t = alpha v_{t-1} + (1 - alpha) g^2, theta -= lr g / sqrt(v_t + eps): eps under the root."""
    w = torch.nn.Parameter(torch.tensor([1.0, -2.0], dtype=torch.float64))
    opt = A.RMSpropTF([w], lr=0.1, alpha=0.9, eps=0.01)
    w.grad = torch.tensor([0.5, -1.0], dtype=torch.float64)
    opt.step()
    # step 1 by hand: v = 0.9 * 1 + 0.1 * g^2 = [0.925, 1.0]; theta = [1 - 0.1 * 0.5 / sqrt(0.935), -2 + 0.1 / sqrt(1.01)]
    np.testing.assert_allclose(w.detach().numpy(), [1 - 0.05 / np.sqrt(0.935), -2 + 0.1 / np.sqrt(1.01)], rtol=1e-12)
    v, theta = np.array([0.925, 1.0]), w.detach().numpy().copy()
    for g in ([2.0, 0.0], [-1.0, 3.0]):
        w.grad = torch.tensor(g, dtype=torch.float64)
        opt.step()
        v = 0.9 * v + 0.1 * np.square(g)
        theta = theta - 0.1 * np.array(g) / np.sqrt(v + 0.01)
        np.testing.assert_allclose(w.detach().numpy(), theta, rtol=1e-12)
    assert opt.state[w]["step"].item() == 3
    np.testing.assert_allclose(opt.state[w]["square_avg"].numpy(), v, rtol=1e-12)
    # a checkpoint round trip continues the same trajectory
    w2 = torch.nn.Parameter(w.detach().clone())
    opt2 = A.RMSpropTF([w2], lr=0.1, alpha=0.9, eps=0.01)
    opt2.load_state_dict(copy.deepcopy(opt.state_dict()))  # a copy, as torch.save/torch.load make
    for param, optimizer in ((w, opt), (w2, opt2)):
        param.grad = torch.tensor([0.3, -0.7], dtype=torch.float64)
        optimizer.step()
    assert torch.equal(w, w2)


def test_rmsprop_tf_first_step_is_about_the_gradient_times_lr_where_torchs_is_ten_times_lr():
    g = torch.tensor([0.01, 0.1, 2.0])
    moved = {}
    for name, kind in (("tf", A.RMSpropTF), ("torch", torch.optim.RMSprop)):
        w = torch.nn.Parameter(torch.zeros(3))
        opt = kind([w], lr=7e-4, alpha=0.99, eps=1e-5)
        w.grad = g.clone()
        opt.step()
        moved[name] = (-w.detach() / 7e-4).numpy()
    # torch: g / (sqrt(0.01 g^2) + eps) = ~10 for every weight, whatever its gradient's size
    np.testing.assert_allclose(moved["torch"], 10.0, rtol=0.02)
    # TensorFlow's: g / sqrt(0.99 + 0.01 g^2 + eps) = ~g
    np.testing.assert_allclose(moved["tf"], (g / torch.sqrt(0.99 + 0.01 * g**2 + 1e-5)).numpy(), rtol=1e-5)


def test_a2c_defaults_are_the_zoo_atari_recipe():
    """rl-baselines3-zoo, hyperparams/a2c.yml, atari: 16 envs, 5 steps, lr 7e-4 (constant), vf_coef 0.25, ent_coef
    0.01, RMSpropTFLike with alpha 0.99 and eps 1e-5; SB3's A2C defaults for the rest (gamma 0.99, gae_lambda 1,
    max_grad_norm 0.5, no advantage normalization)."""
    args = A.Args()
    assert (args.num_envs, args.num_steps, args.learning_rate, args.anneal_lr) == (16, 5, 7e-4, False)
    assert (args.vf_coef, args.ent_coef, args.gamma, args.max_grad_norm, args.norm_adv) == (0.25, 0.01, 0.99, 0.5, False)
    assert (args.optimizer, args.rmsprop_alpha, args.rmsprop_eps) == ("rmsprop-tf", 0.99, 1e-5)
