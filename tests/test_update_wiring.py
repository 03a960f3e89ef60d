"""Wiring of the update, with each script's defaults' machinery on (observation, reward and advantage normalization,
several minibatches and epochs with a real permutation, annealing, gradient clipping, autotune): main() runs
in-process on a scripted env (tests/fake_envs.py) with small networks, and what reaches the losses and the optimizer
is checked, at every minibatch, against values the test computes on its own from the rollout and the policy that
acted: the old log-probs and values (of the weights that acted), the advantages (returns - values, normalized per
minibatch), the clip range, the loss (its entropy and value terms, their signs and coefficients) through the
gradient it leaves, that gradient clipped to --max-grad-norm, the learning rate the optimizer steps with; for PPO on
continuous actions the normalized observations and scaled rewards GAE receives; for SAC the exploration noise, the
warm-up actions against the bounds, the target entropy and the logged means. A few seconds each.

The mutation runner (tests/mutants.py) counts on these tests: a one-line bug in any of those lines fails one here."""

import copy

import numpy as np
import pytest
import torch
import torch.nn as nn
from gymnasium.wrappers.utils import RunningMeanStd

import tests.fake_envs  # noqa: F401  (registers Wiring-v0, WiringBounds-v0)
from tests.conftest import ROOT
from tests.student_copy import import_copy
from tests.test_wiring import atari_copy, run_main, wiring_rollout

TOL = {"rtol": 1e-4, "atol": 1e-5}


def close(actual, expected, what: str) -> None:
    """assert_close whose message names the quantity that went wrong."""
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=torch.float32),
        torch.as_tensor(expected, dtype=torch.float32),
        **TOL,
        msg=lambda m: f"{what}: {m}",
    )


class UpdateRecorder:
    """Records, for every minibatch main() trains on, what the loss receives, checks it against the policy that acted
    in the rollout (a copy of its weights taken at each acting step, under inference mode), and computes the gradient
    the loss must leave (autograd on the test's own loss); the optimizer's step (a subclass of the script's) then
    checks the gradients it finds, clipped to max_grad_norm, and records its learning rate."""

    def __init__(self, module, agent_class, coefs: dict):
        self.coefs, self.acting_weights, self.last_call, self.expected_grads = coefs, None, None, None
        self.agents, self.lrs, self.clip_coefs, self.minibatches, self.clipped = [], [], [], 0, 0
        rec = self

        class RecordingAgent(agent_class):
            def __init__(self, *args):
                super().__init__(*args)
                rec.agents.append(self)

            def snapshot(self):
                if torch.is_inference_mode_enabled():  # the rollout: these weights act
                    rec.acting_weights = {k: v.detach().clone() for k, v in self.state_dict().items()}

            def distribution(self, x):  # ppo_continuous acts through it
                self.snapshot()
                return super().distribution(x)

            def get_action_and_value(self, x, action=None):
                self.snapshot()
                out = super().get_action_and_value(x, action)
                if torch.is_grad_enabled():  # the update: the minibatch's obs, actions, entropy
                    rec.last_call = (x.detach().clone(), out[0].detach().clone(), out[2])
                return out

        self.agent_class = RecordingAgent

    def acting(self, x, action):
        """log pi_old(a|s) and V_old(s) of the policy that acted, computed by the test on a copy with its weights."""
        agent = copy.deepcopy(self.agents[0])
        agent.load_state_dict(self.acting_weights)
        with torch.no_grad():
            _, logprob, _, value = agent.get_action_and_value(x, action)
        return logprob, value

    def expect_gradient(self, loss) -> None:
        params = [p for p in self.agents[0].parameters()]
        grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
        self.expected_grads = [torch.zeros_like(p) if g is None else g.detach().clone() for p, g in zip(params, grads)]

    def optimizer_class(self, base):
        rec = self

        class RecordingOptimizer(base):
            def step(self, *args, **kwargs):
                rec.check_step(self)
                return super().step(*args, **kwargs)

        return RecordingOptimizer

    def check_step(self, optimizer) -> None:
        self.lrs.append(optimizer.param_groups[0]["lr"])
        expected = self.expected_grads
        assert expected is not None, "the optimizer stepped without a loss computed first"
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in expected]))
        scale = min(1.0, self.coefs["max_grad_norm"] / (float(norm) + 1e-6))
        self.clipped += scale < 1.0
        params = [p for p in self.agents[0].parameters()]
        for p, g in zip(params, expected):
            actual = torch.zeros_like(p) if p.grad is None else p.grad
            close(actual, g * scale, "the gradient the optimizer steps with (the loss's, clipped to --max-grad-norm)")
        self.expected_grads = None


def ppo_minibatch_check(rec: UpdateRecorder, real_losses):
    """ppo_losses wrapped: checks its inputs against the test's own values, then computes the gradient of the test's
    own L = L^CLIP - c_ent H + c_v L^V (clipped value loss) for the optimizer's step to compare with."""

    def losses(new_logprob, old_logprob, advantages, new_values, old_values, returns, clip_coef, clip_vloss):
        x, action, entropy = rec.last_call
        acting_logprob, acting_value = rec.acting(x, action)
        close(old_logprob, acting_logprob, "old log-probs (pi_old: the policy that acted in the rollout)")
        close(old_values, acting_value, "old values (V of the policy that acted, of the minibatch's obs)")
        raw = (returns - old_values).detach()  # returns = advantages + values, row by row
        expected_adv = (raw - raw.mean()) / (raw.std() + 1e-8) if rec.coefs["norm_adv"] else raw
        close(advantages, expected_adv, "advantages (returns - values of the same rows, normalized over the minibatch)")
        rec.clip_coefs.append(clip_coef)
        ratio = (new_logprob - acting_logprob).exp()
        eps = clip_coef
        pg = torch.max(-expected_adv * ratio, -expected_adv * ratio.clamp(1 - eps, 1 + eps)).mean()
        v_clipped = acting_value + (new_values - acting_value).clamp(-eps, eps)
        v_loss = 0.5 * torch.max((new_values - returns) ** 2, (v_clipped - returns) ** 2).mean()
        rec.expect_gradient(pg - rec.coefs["ent_coef"] * entropy.mean() + rec.coefs["vf_coef"] * v_loss)
        rec.minibatches += 1
        return real_losses(new_logprob, old_logprob, advantages, new_values, old_values, returns, clip_coef, clip_vloss)

    return losses


def annealed_schedule(start: float, iterations: int, per_iteration: int) -> list:
    return [(1.0 - i / iterations) * start for i in range(iterations) for _ in range(per_iteration)]


# ---------------------------------------------------------------------------------------------------------------
# ppo_continuous: defaults on (obs and reward normalization, advantage normalization, lr annealing, value clipping)
# ---------------------------------------------------------------------------------------------------------------
PPO_COEFS = {"ent_coef": 0.01, "vf_coef": 0.5, "max_grad_norm": 0.05, "norm_adv": True}


def expected_normalization(num_envs: int, num_steps: int, gamma: float) -> dict:
    """What main() must hand GAE on Wiring-v0 with --norm-obs and --norm-reward: the observations normalized by the
    running statistics of every raw obs seen so far (the reset's, then each step's, incl. the next episode's first),
    the true next obs (the final obs at an episode end) normalized with the same statistics, and the rewards divided
    by the running std of the discounted return G <- gamma G + r, G restarting at every episode end."""
    r = wiring_rollout(num_envs, num_steps + 1)
    seen = r["obs"]  # the raw obs the envs return: seen[0] at reset, seen[t + 1] after step t
    obs_rms, ret_rms = RunningMeanStd(shape=(2,)), RunningMeanStd(shape=())
    obs_rms.update(seen[0])
    g = np.zeros(num_envs)
    out = {
        k: np.zeros((num_steps, num_envs, 2) if "obs" in k else (num_steps, num_envs)) for k in ("obs", "next_obs", "reward")
    }

    def norm(x):
        return np.clip((x - obs_rms.mean) / np.sqrt(obs_rms.var + 1e-8), -10, 10)

    current = norm(seen[0])
    for t in range(num_steps):
        out["obs"][t] = current
        obs_rms.update(seen[t + 1])
        current = norm(seen[t + 1])
        out["next_obs"][t] = norm(r["next_obs"][t])
        g = g * gamma + r["reward"][t]
        ret_rms.update(g)
        out["reward"][t] = np.clip(r["reward"][t] / np.sqrt(ret_rms.var + 1e-8), -10, 10)
        g = np.where(r["terminated"][t] | r["truncated"][t], 0.0, g)
    return out


def test_ppo_continuous_update_sees_the_normalized_rollout_and_the_whole_loss(tmp_path, monkeypatch):
    """2 envs x 8 steps, 2 iterations of 2 epochs x 2 shuffled minibatches, every default on: GAE receives the
    normalized obs' values, the normalized final obs' values and the scaled rewards (G restarting at terminations and
    truncations alike); each minibatch's loss the log-probs and values of the policy that acted, the advantages of its
    rows normalized, the clip range; the optimizer the gradient of L^CLIP - c_ent H + c_v L^V clipped to
    --max-grad-norm, at the annealed learning rate."""
    ppo = import_copy(ROOT / "ppo_continuous.py")
    rec = UpdateRecorder(ppo, ppo.Agent, PPO_COEFS)
    gae_inputs, real_gae = [], ppo.compute_gae

    def compute_gae(rewards, values, next_values, *rest):
        gae_inputs.append((rewards.copy(), values.copy(), next_values.copy(), dict(rec.acting_weights)))
        return real_gae(rewards, values, next_values, *rest)

    monkeypatch.setattr(ppo, "Agent", rec.agent_class)
    monkeypatch.setattr(ppo, "ppo_losses", ppo_minibatch_check(rec, ppo.ppo_losses))
    monkeypatch.setattr(ppo, "compute_gae", compute_gae)
    monkeypatch.setattr(torch.optim, "Adam", rec.optimizer_class(torch.optim.Adam))
    num_envs, num_steps, iterations, gamma, lr = 2, 8, 2, 0.9, 1e-3
    run_main(
        ppo,
        monkeypatch,
        tmp_path,
        ["--env-id", "tests.fake_envs:Wiring-v0", "--num-envs", num_envs, "--num-steps", num_steps]
        + ["--total-timesteps", iterations * num_envs * num_steps, "--num-minibatches", 2, "--update-epochs", 2]
        + ["--gamma", gamma, "--learning-rate", lr, "--ent-coef", PPO_COEFS["ent_coef"]]
        + ["--max-grad-norm", PPO_COEFS["max_grad_norm"], "--seed", 3],
    )
    assert rec.minibatches == iterations * 4 and len(gae_inputs) == iterations
    assert 0 < rec.clipped, "--max-grad-norm never acted: the test cannot tell clipping from none"
    np.testing.assert_allclose(rec.lrs, annealed_schedule(lr, iterations, 4), rtol=1e-6, err_msg="learning rate (annealed)")
    assert rec.clip_coefs == [0.2] * rec.minibatches
    expected = expected_normalization(num_envs, iterations * num_steps, gamma)
    for i, (rewards, values, next_values, weights) in enumerate(gae_inputs):
        rows = slice(i * num_steps, (i + 1) * num_steps)
        agent = copy.deepcopy(rec.agents[0])
        agent.load_state_dict(weights)
        with torch.no_grad():
            v, v_next = (agent.get_value(torch.tensor(expected[k][rows], dtype=torch.float32)) for k in ("obs", "next_obs"))
        close(rewards, expected["reward"][rows], f"iteration {i + 1}: rewards GAE receives (scaled by the return's std)")
        close(values, v, f"iteration {i + 1}: values GAE receives (V of the normalized obs)")
        close(next_values, v_next, f"iteration {i + 1}: next values GAE receives (V of the normalized true next obs)")


# ---------------------------------------------------------------------------------------------------------------
# Atari: ppo_atari and a2c_atari on WiringAle, with a small learned network in place of the Nature CNN
# ---------------------------------------------------------------------------------------------------------------
def small_atari_agent(module):
    class SmallAgent(module.Agent):
        """The script's Agent (its get_action_and_value) on a small MLP of the obs [t, game]: learned logits and V."""

        def __init__(self, num_actions: int):
            nn.Module.__init__(self)
            self.body = nn.Linear(2, 16)
            self.actor, self.critic = nn.Linear(16, num_actions), nn.Linear(16, 1)

        def forward(self, obs):
            hidden = torch.tanh(self.body(obs.float() / 4.0))
            return self.actor(hidden), self.critic(hidden).squeeze(-1)

    return SmallAgent


ATARI_COEFS = {"ent_coef": 0.05, "vf_coef": 0.5, "max_grad_norm": 0.05, "norm_adv": True}


def test_ppo_atari_update_sees_the_policy_that_acted_and_the_whole_loss(tmp_path, monkeypatch):
    """2 envs x 8 steps, 2 iterations of 2 epochs x 2 shuffled minibatches with --anneal-clip: each minibatch's loss
    receives the log-probs and values of the policy that acted for its rows, their advantages (returns - values)
    normalized, the annealed clip range; the optimizer the gradient of L^CLIP - c_ent H + c_v L^V, clipped, at the
    annealed learning rate."""
    ppo, _ = atari_copy("ppo_atari.py", monkeypatch)
    rec = UpdateRecorder(ppo, small_atari_agent(ppo), ATARI_COEFS)
    monkeypatch.setattr(ppo, "Agent", rec.agent_class)
    monkeypatch.setattr(ppo, "ppo_losses", ppo_minibatch_check(rec, ppo.ppo_losses))
    monkeypatch.setattr(torch.optim, "Adam", rec.optimizer_class(torch.optim.Adam))
    iterations, lr, clip = 2, 1e-3, 0.3
    run_main(
        ppo,
        monkeypatch,
        tmp_path,
        ["--num-envs", 2, "--num-steps", 8, "--total-timesteps", iterations * 16, "--num-minibatches", 2]
        + ["--update-epochs", 2, "--learning-rate", lr, "--clip-coef", clip, "--anneal-clip"]
        + ["--ent-coef", ATARI_COEFS["ent_coef"], "--max-grad-norm", ATARI_COEFS["max_grad_norm"], "--seed", 5],
    )
    assert rec.minibatches == iterations * 4 and 0 < rec.clipped
    np.testing.assert_allclose(rec.lrs, annealed_schedule(lr, iterations, 4), rtol=1e-6, err_msg="learning rate (annealed)")
    np.testing.assert_allclose(rec.clip_coefs, annealed_schedule(clip, iterations, 4), err_msg="clip range (--anneal-clip)")


def test_a2c_atari_update_is_the_gradient_of_the_whole_loss(tmp_path, monkeypatch):
    """2 envs x 5 steps, 3 iterations with --norm-adv and --anneal-lr: a2c_losses receives the log-probs of the
    batch's actions, returns - V normalized as advantages; the optimizer the gradient of
    L^PG - c_ent H + c_v L^V (advantages held constant), clipped to --max-grad-norm, at the annealed learning rate."""
    a2c, _ = atari_copy("a2c_atari.py", monkeypatch)
    rec = UpdateRecorder(a2c, small_atari_agent(a2c), {**ATARI_COEFS, "vf_coef": 0.25})
    real_losses = a2c.a2c_losses

    def a2c_losses(logprob, advantages, values, returns):
        x, action, entropy = rec.last_call
        acting_logprob, acting_value = rec.acting(x, action)
        close(logprob.detach(), acting_logprob, "log-probs of the batch's actions (the policy that acted)")
        close(values.detach(), acting_value, "values of the batch's obs")
        raw = (returns - values).detach()
        close(advantages, (raw - raw.mean()) / (raw.std() + 1e-8), "advantages (returns - values, normalized)")
        expected = (raw - raw.mean()) / (raw.std() + 1e-8)
        loss = -(logprob * expected).mean() - rec.coefs["ent_coef"] * entropy.mean()
        rec.expect_gradient(loss + rec.coefs["vf_coef"] * (returns - values).pow(2).mean())
        rec.minibatches += 1
        return real_losses(logprob, advantages, values, returns)

    monkeypatch.setattr(a2c, "Agent", rec.agent_class)
    monkeypatch.setattr(a2c, "a2c_losses", a2c_losses)
    monkeypatch.setattr(a2c, "RMSpropTF", rec.optimizer_class(a2c.RMSpropTF))
    iterations, lr = 3, 1e-3
    run_main(
        a2c,
        monkeypatch,
        tmp_path,
        ["--num-envs", 2, "--num-steps", 5, "--total-timesteps", iterations * 10, "--learning-rate", lr]
        + ["--norm-adv", "--anneal-lr", "--log-interval", 1, "--max-grad-norm", ATARI_COEFS["max_grad_norm"]]
        + ["--ent-coef", ATARI_COEFS["ent_coef"], "--seed", 5],
    )
    assert rec.minibatches == iterations and 0 < rec.clipped
    np.testing.assert_allclose(rec.lrs, annealed_schedule(lr, iterations, 1), rtol=1e-6, err_msg="learning rate (annealed)")


# ---------------------------------------------------------------------------------------------------------------
# sac_continuous: acting (warm-up in the bounds, then sampled with noise), the target entropy, the logged means
# ---------------------------------------------------------------------------------------------------------------
def test_sac_continuous_acts_in_the_bounds_with_noise_tunes_alpha_to_minus_a_and_logs_window_means(tmp_path, monkeypatch):
    """WiringBounds-v0 (actions in [0.5, 3]), 2 envs x 40 vector steps, 20 of them warm-up, autotune on, a log every 8
    env steps: the warm-up actions are uniform over the bounds (all inside, spread over most of them); the later ones
    are the policy's samples (inside, not its deterministic action: exploration noise); each actor update's alpha loss
    is -alpha (log pi + target entropy) with the target entropy -|A| = -1; each logged loss is the mean over its
    window's gradient steps only."""
    sac = import_copy(ROOT / "sac_continuous.py")
    learners, samples, steps, logs, acting = [], [], [], [], []
    real_gradient_step, real_sample_action, real_log = sac.gradient_step, sac.sample_action, sac.Run.log

    class RecordingLearner(sac.Learner):
        def __init__(self, *args):
            super().__init__(*args)
            learners.append(self)

    def sample_action(learner, obs):
        actions, log_prob = real_sample_action(learner, obs)
        samples.append(log_prob.detach().clone())
        return actions, log_prob

    def gradient_step(learner, batch, step, args):
        samples.clear()
        critic_metrics, actor_metrics = real_gradient_step(learner, batch, step, args)
        steps.append((critic_metrics.clone(), None if actor_metrics is None else actor_metrics.clone(), list(samples)))
        return critic_metrics, actor_metrics

    def env_step(envs, actions, *rest):
        obs = rollout["obs"][len(acting)]  # Wiring's obs do not depend on the actions: known in advance
        with torch.no_grad():
            deterministic = learners[0].policy(torch.as_tensor(obs, dtype=torch.float32), deterministic=True).numpy()
        acting.append((np.array(actions), deterministic))
        return real_env_step(envs, actions, *rest)

    real_env_step = sac.env_step
    num_envs, num_steps, warmup = 2, 40, 20
    rollout = wiring_rollout(num_envs, num_steps)

    def log(run, step, metrics):
        logs.append((len(steps), dict(metrics)))
        return real_log(run, step, metrics)

    monkeypatch.setattr(sac, "Learner", RecordingLearner)
    monkeypatch.setattr(sac, "sample_action", sample_action)
    monkeypatch.setattr(sac, "gradient_step", gradient_step)
    monkeypatch.setattr(sac, "env_step", env_step)
    monkeypatch.setattr(sac.Run, "log", log)
    run_main(
        sac,
        monkeypatch,
        tmp_path,
        ["--env-id", "tests.fake_envs:WiringBounds-v0", "--num-envs", num_envs, "--total-timesteps", num_envs * num_steps]
        + ["--learning-starts", num_envs * warmup, "--batch-size", 8, "--buffer-size", 256, "--policy-frequency", 1]
        + ["--log-interval", 8, "--seed", 2],
    )
    (learner,) = learners
    assert learner.target_entropy == -1.0, "target entropy: -|A| (here -1)"
    warm = np.concatenate([a for a, _ in acting[:warmup]])
    assert warm.min() >= 0.5 and warm.max() <= 3.0, f"warm-up actions outside the bounds [0.5, 3]: {warm.ravel()}"
    assert warm.max() - warm.min() > 1.5, f"warm-up actions not spread over the bounds [0.5, 3]: {warm.ravel()}"
    policy = np.concatenate([a for a, _ in acting[warmup:]])
    assert policy.min() >= 0.5 and policy.max() <= 3.0, "the policy's actions outside the bounds"
    deterministic = np.concatenate([d for _, d in acting[warmup:]])
    assert np.abs(policy - deterministic).min() > 1e-4, "the rollout acts with the deterministic action: no exploration noise"
    assert len(steps) == num_steps - warmup + 1
    for critic_metrics, actor_metrics, (target_log_prob, actor_log_prob) in steps:
        actor_loss, alpha, alpha_loss = actor_metrics.tolist()
        close(alpha_loss, -(alpha * (actor_log_prob - 1.0)).mean(), "alpha loss (-alpha (log pi + target entropy -|A|))")
    done = 0
    for count, metrics in logs:
        if "losses/qf1_loss" in metrics:
            window = [c for c, _, _ in steps[done:count]]
            close(metrics["losses/qf1_loss"], torch.stack(window)[:, 1, 0].mean(), "logged qf1_loss (the window's mean)")
        if "losses/actor_loss" in metrics:
            window = [a for _, a, _ in steps[done:count]]
            close(metrics["losses/actor_loss"], torch.stack(window)[:, 0].mean(), "logged actor_loss (the window's mean)")
            done = count
    assert done == len(steps)


@pytest.fixture(autouse=True)
def _threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
