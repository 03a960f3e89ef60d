"""Wiring: what main() computes from a rollout, checked against values worked out from the definitions on a scripted
env (tests.fake_envs:Wiring-v0: known rewards, a termination and a truncation at known steps). The helpers are unit
tested elsewhere; these tests look at how main() feeds them: which flags, which values, which step's observation.
The value function is fixed to a known formula (a subclass of the script's Agent), so the advantages and targets
main() hands to the loss follow from the env's script alone. Each test runs main() in-process for one iteration:
about a second."""

import numpy as np
import torch

import tests.fake_envs  # noqa: F401  (registers Wiring-v0)
from tests.conftest import ROOT
from tests.student_copy import import_copy, main_in_process

GAMMA, LAMBDA = 0.9, 0.8


def known_value(obs: torch.Tensor) -> torch.Tensor:
    """V(s) = 1 + t / 2 - episode / 5 for s = [t, episode]: different at every step, and at every episode's end."""
    return 1.0 + 0.5 * obs[..., 0] - 0.2 * obs[..., 1]


def wiring_rollout(num_envs: int, num_steps: int) -> dict:
    """What Wiring-v0 gives, step by step, worked out from its rules: obs before each step, reward, terminated,
    truncated, and the true next observation (the last one of an episode, not the next episode's first)."""
    out = {k: np.zeros((num_steps, num_envs, 2) if "obs" in k else (num_steps, num_envs), bool if "ated" in k else float)
           for k in ("obs", "reward", "terminated", "truncated", "next_obs")}  # fmt: skip
    for env in range(num_envs):
        t, episode = 0, 0
        for step in range(num_steps):
            out["obs"][step, env] = (t, episode)
            t += 1
            out["reward"][step, env] = t + episode / 10
            out["next_obs"][step, env] = (t, episode)
            out["terminated"][step, env] = episode % 2 == 1 and t == 3
            out["truncated"][step, env] = not out["terminated"][step, env] and t == 4
            if out["terminated"][step, env] or out["truncated"][step, env]:
                t, episode = 0, episode + 1
    return out


def expected_advantages(r: dict) -> np.ndarray:
    """GAE from its definition: delta_t = r_t + gamma V(s'_t) [not after a termination] - V(s_t), with s'_t the true
    next state (a truncated episode is bootstrapped from its last state); A_t = delta_t + gamma lambda A_{t+1}, the
    sum stopping at any episode end."""
    v = known_value(torch.from_numpy(r["obs"])).numpy()
    v_next = known_value(torch.from_numpy(r["next_obs"])).numpy()
    advantages, running = np.zeros_like(r["reward"]), np.zeros(r["reward"].shape[1])
    for t in reversed(range(r["reward"].shape[0])):
        bootstrap = np.where(r["terminated"][t], 0.0, GAMMA * v_next[t])
        running = r["reward"][t] + bootstrap - v[t] + np.where(
            r["terminated"][t] | r["truncated"][t], 0.0, GAMMA * LAMBDA * running)  # fmt: skip
        advantages[t] = running
    return advantages, v


def run_main(module, monkeypatch, tmp_path, argv: list) -> None:
    main_in_process(module, [*argv, "--runs-dir", tmp_path, "--torch-threads", "1", "--no-progress",
                             "--checkpoint-interval", "0"], monkeypatch)  # fmt: skip


def test_ppo_continuous_main_hands_the_loss_the_advantages_and_targets_of_the_rollout(tmp_path, monkeypatch):
    """3 envs x 10 steps, one minibatch, one epoch, batches in rollout order: the advantages and value targets
    ppo_losses receives are those of the definition (terminations not bootstrapped, truncations bootstrapped from
    the final observation, the sums cut at every episode end), and the old values are V of the observations seen."""
    ppo = import_copy(ROOT / "ppo_continuous.py")

    class KnownValueAgent(ppo.Agent):
        def get_value(self, x):
            return known_value(x)

    received = []
    real_losses = ppo.ppo_losses

    def recording_losses(new_logprob, old_logprob, advantages, new_values, old_values, returns, *rest):
        received.append((advantages.detach().clone(), old_values.detach().clone(), returns.detach().clone()))
        return real_losses(new_logprob, old_logprob, advantages, new_values, old_values, returns, *rest)

    monkeypatch.setattr(ppo, "Agent", KnownValueAgent)
    monkeypatch.setattr(ppo, "ppo_losses", recording_losses)
    monkeypatch.setattr(torch, "randperm", lambda n, **kw: torch.arange(n, device=kw.get("device")))  # rollout order
    num_envs, num_steps = 3, 10
    run_main(ppo, monkeypatch, tmp_path, ["--env-id", "tests.fake_envs:Wiring-v0", "--num-envs", str(num_envs),
                                          "--num-steps", str(num_steps), "--num-minibatches", "1", "--update-epochs",
                                          "1", "--total-timesteps", str(num_envs * num_steps), "--gamma", str(GAMMA),
                                          "--gae-lambda", str(LAMBDA), "--no-norm-adv", "--no-norm-obs",
                                          "--no-norm-reward"])  # fmt: skip
    (advantages, old_values, returns), = received
    expected, v = expected_advantages(wiring_rollout(num_envs, num_steps))
    np.testing.assert_allclose(old_values.numpy(), v.reshape(-1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(advantages.numpy(), expected.reshape(-1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(returns.numpy(), (expected + v).reshape(-1), rtol=1e-5, atol=1e-5)
