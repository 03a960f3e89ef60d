"""The pure helpers of ppo_atari.py and a2c_atari.py: n-step returns, GAE, next-step autoreset targets, the
categorical log-prob and entropy, the A2C losses, the network's shapes and entry point, and its speed set-up
(channels-last memory, the --bf16 trunk) against the plain network."""

import copy

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
    np.testing.assert_allclose(got[:, 0], [1 + .5 * 2 + .25 * 3 + .125 * 4 + .0625 * 40, 2 + .5 * 3 + .25 * 4 + .125 * 40,
                                           15, 24])  # fmt: skip


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


def test_categorical_log_prob_and_entropy_match_torch_distributions():
    logits = torch.randn(64, 6)
    actions = torch.randint(0, 6, (64,))
    logprob, entropy = P.categorical_log_prob_entropy(logits, actions)
    dist = torch.distributions.Categorical(logits=logits)
    torch.testing.assert_close(logprob, dist.log_prob(actions))
    torch.testing.assert_close(entropy, dist.entropy())


def test_a2c_losses_values_and_gradients():
    logits = torch.zeros(2, 2, requires_grad=True)
    logprob, _ = A.categorical_log_prob_entropy(logits, torch.tensor([0, 1]))
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


class ComputeNotes:
    """Stands in for the Run that fast_cnn corrects args.json through."""

    def __init__(self):
        self.notes = []

    def note_compute(self, **resolved):
        self.notes.append(resolved)


@pytest.mark.parametrize("module", [P, A])
def test_fast_cnn_computes_what_the_plain_network_computes(module, capsys):
    """The speed set-up (below the banner) changes the memory layout and, with --bf16, the trunk's precision; not the
    function: in float32 it equals the plain network within 1e-5 of each output's scale, in bfloat16 within 5 %, the
    heads stay float32, evaluation computes float32, and Agent.network's own forward runs (it is not replaced)."""
    plain, fast = trained_like(module)
    obs = torch.randint(0, 256, (16, 4, 84, 84), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    run = ComputeNotes()
    speed = module.fast_cnn(fast, bf16=True, obs_shape=(4, 84, 84), run=run)
    assert capsys.readouterr().out == "" and run.notes == []  # the check at the start passed: no fallback line
    assert fast.network[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert "forward" not in vars(fast.network) and type(fast.network).forward is torch.nn.Sequential.forward
    with torch.no_grad():
        logits, value = plain(obs)
        logits16, value16 = fast(obs)
        with speed.float32():  # evaluation's precision
            logits32, value32 = fast(obs)
    assert_close_to_scale(logits32, logits, 1e-5)
    assert_close_to_scale(value32, value, 1e-5)
    assert logits16.dtype == torch.float32 and value16.dtype == torch.float32  # heads stay float32
    assert_close_to_scale(logits16, logits, 0.05)
    assert_close_to_scale(value16, value, 0.05)
    assert not torch.equal(logits16, logits32)  # bf16 really is on outside float32()...
    assert not torch.is_autocast_enabled("cpu")  # ...and only inside the trunk
    # gradients reach every weight through the hooked trunk, in float32
    _, logprob, _, value = fast.get_action_and_value(obs, torch.zeros(16, dtype=torch.long))
    (logprob.sum() + value.sum()).backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in fast.parameters())
    assert fast.state_dict().keys() == plain.state_dict().keys()  # checkpoints do not see the speed set-up


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
    assert P.disagreement(zeroed(obs), plain(obs), 1e-5, "in float32") is not None  # the start-up check too


@pytest.mark.parametrize("module", [P, A])
def test_fast_cnn_falls_back_to_the_plain_module_in_one_line(module, capsys):
    """A trunk the set-up cannot serve (a view that needs contiguous memory): the run computes with the plain module."""

    class Trunk(torch.nn.Module):
        def __init__(self, num_actions: int = 0):
            super().__init__()
            self.conv, self.linear = torch.nn.Conv2d(4, 8, 8, stride=4), torch.nn.Linear(8 * 20 * 20, 512)

        def forward(self, x):
            x = self.conv(x)
            return self.linear(x.view(x.shape[0], -1))  # fails on channels-last memory

    agent = module.Agent(num_actions=4)
    agent.network = Trunk()
    plain = copy.deepcopy(agent)
    run = ComputeNotes()
    speed = module.fast_cnn(agent, bf16=True, obs_shape=(4, 84, 84), run=run)
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("speed set-up off (RuntimeError: ") and "Agent.network as written" in line
    assert run.notes == [{"dtype": "float32"}]  # args.json records what the run computes in, not what was asked
    assert speed.hooks == [] and agent.network.conv.weight.is_contiguous()
    obs = torch.randint(0, 256, (4, 4, 84, 84), dtype=torch.uint8)
    with torch.no_grad():
        assert all(torch.equal(got, expected) for got, expected in zip(agent(obs), plain(obs)))


def test_scripts_share_the_network_and_preprocessing():
    assert P.Agent(4).state_dict().keys() == A.Agent(4).state_dict().keys()
    assert P.parse_atari_id("ALE/Pong-v5") == A.parse_atari_id("ALE/Pong-v5")


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
