"""Wiring: what main() computes from a rollout, checked against values worked out from the definitions on scripted
envs whose every step is known in advance (tests/fake_envs.py: Wiring-v0, a termination and a truncation at known
steps; WiringAle, Atari games with lives, a game over and a time limit). The helpers are unit tested elsewhere; these
tests look at how main() feeds them: which flags, which values, which step's observation. The networks are fixed to
known formulas (subclasses of the scripts' own), so the advantages, returns and targets main() hands to the losses
follow from the env's script alone. Each test runs main() in-process for one or two iterations: a second or two.

The scripts are reached only through the names main() calls (Agent, ppo_losses, a2c_losses, make_env, probe_env,
ReplayBuffer, q_network, sample_action, soft_q_target, gradient_step, env_step, Run.episode): one monkeypatch each."""

import itertools

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn as nn

import tests.fake_envs  # noqa: F401  (registers Wiring-v0)
from tests.conftest import ROOT
from tests.fake_envs import WiringAle
from tests.student_copy import import_copy, main_in_process

GAMMA, LAMBDA = 0.9, 0.8


def known_value(obs: torch.Tensor) -> torch.Tensor:
    """V(s) = 1 + t / 2 - episode / 5 for s = [t, episode]: different at every step, and at every episode's end."""
    return 1.0 + 0.5 * obs[..., 0] - 0.2 * obs[..., 1]


def wiring_rollout(num_envs: int, num_steps: int) -> dict:
    """What Wiring-v0 gives, step by step, worked out from its rules: obs before each step, reward, terminated,
    truncated, and the true next observation (the last one of an episode, not the next episode's first)."""
    out = {
        k: np.zeros((num_steps, num_envs, 2) if "obs" in k else (num_steps, num_envs), bool if "ated" in k else float)
        for k in ("obs", "reward", "terminated", "truncated", "next_obs")
    }
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


def expected_advantages(r: dict) -> tuple[np.ndarray, np.ndarray]:
    """GAE from its definition: delta_t = r_t + gamma V(s'_t) [not after a termination] - V(s_t), with s'_t the true
    next state (a truncated episode is bootstrapped from its last state); A_t = delta_t + gamma lambda A_{t+1}, the
    sum stopping at any episode end. Returns (A, V(s))."""
    v = known_value(torch.from_numpy(r["obs"])).numpy()
    v_next = known_value(torch.from_numpy(r["next_obs"])).numpy()
    advantages, running = np.zeros_like(r["reward"]), np.zeros(r["reward"].shape[1])
    for t in reversed(range(r["reward"].shape[0])):
        bootstrap = np.where(r["terminated"][t], 0.0, GAMMA * v_next[t])
        running = (
            r["reward"][t] + bootstrap - v[t] + np.where(r["terminated"][t] | r["truncated"][t], 0.0, GAMMA * LAMBDA * running)
        )
        advantages[t] = running
    return advantages, v


def recording_ppo_losses(module, monkeypatch) -> list:
    """Record what main() hands ppo_losses, [advantages, old values, new values, returns] per minibatch, with the
    minibatches drawn in rollout order (torch.randperm: the identity)."""
    received, real_losses = [], module.ppo_losses

    def recording_losses(new_logprob, old_logprob, advantages, new_values, old_values, returns, *rest):
        received.append([x.detach().clone() for x in (advantages, old_values, new_values, returns)])
        return real_losses(new_logprob, old_logprob, advantages, new_values, old_values, returns, *rest)

    monkeypatch.setattr(module, "ppo_losses", recording_losses)
    monkeypatch.setattr(torch, "randperm", lambda n, **kw: torch.arange(n, device=kw.get("device")))
    return received


def run_main(module, monkeypatch, tmp_path, argv: list) -> None:
    main_in_process(
        module,
        [*argv, "--runs-dir", tmp_path, "--torch-threads", "1", "--no-progress", "--checkpoint-interval", "0", "--no-cuda"],
        monkeypatch,
    )


def test_ppo_continuous_main_hands_the_loss_the_advantages_and_targets_of_the_rollout(tmp_path, monkeypatch):
    """3 envs x 10 steps, one minibatch, one epoch, batches in rollout order: the advantages and value targets
    ppo_losses receives are those of the definition (terminations not bootstrapped, truncations bootstrapped from
    the final observation, the sums cut at every episode end), and the old values are V of the observations seen."""
    ppo = import_copy(ROOT / "ppo_continuous.py")

    class KnownValueAgent(ppo.Agent):
        def get_value(self, x):
            return known_value(x)

    monkeypatch.setattr(ppo, "Agent", KnownValueAgent)
    received = recording_ppo_losses(ppo, monkeypatch)
    num_envs, num_steps = 3, 10
    run_main(
        ppo,
        monkeypatch,
        tmp_path,
        [
            "--env-id",
            "tests.fake_envs:Wiring-v0",
            "--num-envs",
            str(num_envs),
            "--num-steps",
            str(num_steps),
            "--num-minibatches",
            "1",
            "--update-epochs",
            "1",
            "--total-timesteps",
            str(num_envs * num_steps),
            "--gamma",
            str(GAMMA),
            "--gae-lambda",
            str(LAMBDA),
            "--no-norm-adv",
            "--no-norm-obs",
            "--no-norm-reward",
        ],
    )
    ((advantages, old_values, new_values, returns),) = received
    expected, v = expected_advantages(wiring_rollout(num_envs, num_steps))
    np.testing.assert_allclose(old_values.numpy(), v.reshape(-1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(new_values.numpy(), v.reshape(-1), rtol=1e-5, atol=1e-5)  # V fixed: of the same obs
    np.testing.assert_allclose(advantages.numpy(), expected.reshape(-1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(returns.numpy(), (expected + v).reshape(-1), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# Atari: make_env's EpisodicLife and FireReset on WiringAle, under next-step autoreset
# ---------------------------------------------------------------------------------------------------------------
FLOATS = ("obs", "reward", "next_obs")


def atari_rollout(num_envs: int, num_steps: int) -> tuple[dict, list]:
    """What WiringAle under make_env's episode wrappers gives, agent step by agent step, worked out from the
    documented semantics (docs/ppo_atari.md, "Episodes and reset steps"): the game starts after a FIRE (emulator step
    1); a lost life ends the learning episode (terminated) and the game goes on; a game over is terminated, the time
    limit truncated. The step after any episode end is a reset step: the env ignores its action, pays 0, and returns
    the next episode's first obs (after a lost life: a NOOP and a FIRE later in the same game; else the next game's
    FIRE); the obs recorded at the reset step is the ended episode's final obs. Returns the arrays (as wiring_rollout,
    plus reset_step) and the games that ended: (agent step, env, whole-game score, emulator steps)."""
    out = {
        k: np.zeros((num_steps, num_envs, 2) if "obs" in k else (num_steps, num_envs), float if k in FLOATS else bool)
        for k in ("obs", "reward", "terminated", "truncated", "next_obs", "reset_step")
    }
    games = []
    for env in range(num_envs):
        script = WiringAle(env).event
        game, t, score, pending = 0, 1, 1.0, None  # after the reset's FIRE, worth t + game / 10 = 1
        for step in range(num_steps):
            out["obs"][step, env] = (t, game)
            out["reset_step"][step, env] = pending is not None
            if pending == "life":  # EpisodicLife's NOOP, FireReset's FIRE: their points count for the game only
                score += (t + 1 + game / 10) + (t + 2 + game / 10)
                t, pending = t + 2, None
            elif pending is not None:  # a new game and its FIRE
                game, t, pending = game + 1, 1, None
                score = 1 + game / 10
            else:
                t += 1
                out["reward"][step, env] = t + game / 10
                score += t + game / 10
                pending = script(game, t)
                out["terminated"][step, env] = pending in ("life", "game over")  # a lost life ends the episode
                out["truncated"][step, env] = pending == "time limit"
                if pending in ("game over", "time limit"):
                    games.append((step, env, score, t))
            out["next_obs"][step, env] = (t, game)
    return out, sorted(games)


def window(r: dict, iteration: int, num_steps: int) -> dict:
    """The steps of one iteration (from 0) of a rollout."""
    return {k: v[iteration * num_steps : (iteration + 1) * num_steps] for k, v in r.items()}


def expected_n_step_returns(r: dict) -> np.ndarray:
    """n-step returns from their definition over one window of T steps (docs/a2c_atari.md): R_t = r_t at a
    termination; r_t + gamma V(s'_t) at a truncation or at the window's last step; else r_t + gamma R_{t+1}."""
    v_next = known_value(torch.from_numpy(r["next_obs"])).numpy()
    returns = np.zeros_like(r["reward"])
    for t in reversed(range(len(returns))):
        later = GAMMA * (v_next[t] if t == len(returns) - 1 else returns[t + 1])
        later = np.where(r["truncated"][t], GAMMA * v_next[t], later)
        returns[t] = r["reward"][t] + np.where(r["terminated"][t], 0.0, later)
    return returns


def scripted_atari(module, idx: int) -> gym.Env:
    """make_env's chain with WiringAle in place of the emulator and its preprocessing: the episode wrappers of the
    script (RecordEpisodeStatistics for whole games, EpisodicLife, FireReset), in make_env's order. (ClipReward and
    the frame stack are left out: they change no episode boundary, and main() stores what the env returns.)"""
    return module.FireReset(module.EpisodicLife(gym.wrappers.RecordEpisodeStatistics(WiringAle(idx))))


def atari_copy(script: str, monkeypatch):
    """A fresh import of the script on WiringAle (make_env, probe_env), with V fixed to known_value (Agent) and the
    games main() logs recorded (Run.episode). Returns (module, logged games)."""
    module = import_copy(ROOT / script)

    class KnownValueAgent(module.Agent):
        """The script's Agent with V(s) = known_value(s); its policy's logits are a parameter of their own (whatever
        the frames: WiringAle's actions change nothing), so the loss keeps a gradient."""

        def __init__(self, num_actions: int):
            super().__init__(num_actions)
            self.logits = nn.Parameter(torch.zeros(num_actions))

        def forward(self, obs: torch.Tensor) -> tuple:
            return self.logits.expand(len(obs), -1), known_value(obs.float())

    logged, real_episode = [], module.Run.episode

    def recording_episode(run, episode_return, length, step):
        logged.append((episode_return, length, step))
        return real_episode(run, episode_return, length, step)

    monkeypatch.setattr(module, "Agent", KnownValueAgent)
    monkeypatch.setattr(module, "probe_env", lambda env_id: (WiringAle().observation_space.shape, 4))
    monkeypatch.setattr(module, "make_env", lambda env_id, idx, capture_video, video_dir: lambda: scripted_atari(module, idx))
    monkeypatch.setattr(module.Run, "episode", recording_episode)
    return module, logged


def expected_games(games: list, num_envs: int) -> list:
    """(score, length, global step) main() must log for each game: the whole game (every life, the resets' FIRE and
    NOOP steps), at the global step of the agent step that ended it."""
    return [(pytest.approx(score), length, (step + 1) * num_envs) for step, env, score, length in games]


ATARI_ITERATIONS, ATARI_ENVS, ATARI_STEPS = 2, 2, 6  # env 1 ends a game at the last step of the first iteration


def test_ppo_atari_main_hands_the_loss_the_advantages_and_targets_of_the_games(tmp_path, monkeypatch):
    """2 envs x 6 steps, two iterations, one minibatch, one epoch, batches in rollout order: ppo_losses receives,
    for every real transition (no reset step) in rollout order, GAE from its definition (a lost life and a game over
    not bootstrapped, the time limit bootstrapped from the final obs, each window bootstrapped from V of the obs
    after it, the sums cut at every episode end), V of the observations seen, and their sum as value targets; each
    game is logged whole, at the step that ended it."""
    ppo, logged = atari_copy("ppo_atari.py", monkeypatch)
    received = recording_ppo_losses(ppo, monkeypatch)
    run_main(
        ppo,
        monkeypatch,
        tmp_path,
        [
            "--num-envs",
            ATARI_ENVS,
            "--num-steps",
            ATARI_STEPS,
            "--total-timesteps",
            ATARI_ITERATIONS * ATARI_ENVS * ATARI_STEPS,
            "--num-minibatches",
            1,
            "--update-epochs",
            1,
            "--gamma",
            GAMMA,
            "--gae-lambda",
            LAMBDA,
            "--no-norm-adv",
        ],
    )
    rollout, games = atari_rollout(ATARI_ENVS, ATARI_ITERATIONS * ATARI_STEPS)
    assert len(received) == ATARI_ITERATIONS
    for iteration, (advantages, old_values, new_values, returns) in enumerate(received):
        w = window(rollout, iteration, ATARI_STEPS)
        expected, v = expected_advantages(w)
        real = ~w["reset_step"]  # boolean indexing flattens in rollout order, step by step
        np.testing.assert_allclose(old_values.numpy(), v[real], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(new_values.numpy(), v[real], rtol=1e-5, atol=1e-5)  # V fixed: of the same obs
        np.testing.assert_allclose(advantages.numpy(), expected[real], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(returns.numpy(), (expected + v)[real], rtol=1e-5, atol=1e-5)
    assert logged == expected_games(games, ATARI_ENVS)


def test_a2c_atari_main_hands_the_loss_the_n_step_returns_of_the_games(tmp_path, monkeypatch):
    """2 envs x 6 steps, two iterations: a2c_losses receives, for every real transition (no reset step) in rollout
    order, the n-step returns from their definition (cut at every episode end: a lost life and a game over with no
    value beyond, the time limit bootstrapped from V of its final obs, the window's last step from V of the obs
    after it), V of the observations seen, and their difference as advantages; each game is logged whole."""
    a2c, logged = atari_copy("a2c_atari.py", monkeypatch)
    received, real_losses = [], a2c.a2c_losses

    def recording_losses(logprob, advantages, values, returns, *rest):
        received.append((advantages.detach().clone(), values.detach().clone(), returns.detach().clone()))
        return real_losses(logprob, advantages, values, returns, *rest)

    monkeypatch.setattr(a2c, "a2c_losses", recording_losses)
    run_main(
        a2c,
        monkeypatch,
        tmp_path,
        [
            "--num-envs",
            ATARI_ENVS,
            "--num-steps",
            ATARI_STEPS,
            "--total-timesteps",
            ATARI_ITERATIONS * ATARI_ENVS * ATARI_STEPS,
            "--gamma",
            GAMMA,
            "--no-norm-adv",
            "--log-interval",
            1,
        ],
    )
    rollout, games = atari_rollout(ATARI_ENVS, ATARI_ITERATIONS * ATARI_STEPS)
    assert len(received) == ATARI_ITERATIONS
    for iteration, (advantages, values, returns) in enumerate(received):
        w = window(rollout, iteration, ATARI_STEPS)
        expected = expected_n_step_returns(w)
        v = known_value(torch.from_numpy(w["obs"])).numpy()
        real = ~w["reset_step"]
        np.testing.assert_allclose(returns.numpy(), expected[real], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(values.numpy(), v[real], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(advantages.numpy(), (expected - v)[real], rtol=1e-5, atol=1e-5)
    assert logged == expected_games(games, ATARI_ENVS)


# ---------------------------------------------------------------------------------------------------------------
# SAC: the transitions stored (same-step autoreset) and the soft Q targets, with known critics
# ---------------------------------------------------------------------------------------------------------------
ALPHA, TARGET_SHIFT = 0.2, 2.0


def known_q(x: torch.Tensor, critic: int, target: bool) -> torch.Tensor:
    """Q_i(s, a) for x = [t, episode, a]: one formula per critic (their minimum is either, depending on the row), and
    the target critics' TARGET_SHIFT above the online ones."""
    t, episode, a = x[..., 0], x[..., 1], x[..., 2]
    q = 1.0 + t / 2 - episode / 5 + a if critic == 0 else 1.5 + t / 4 + episode / 3 - a / 2
    return q + (TARGET_SHIFT if target else 0.0)


class KnownQ(nn.Module):
    """A critic that computes known_q; its one weight enters times 0 (the loss keeps a gradient, Adam leaves it 0)."""

    def __init__(self, critic: int):
        super().__init__()
        self.critic, self.target, self.weight = critic, False, nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return known_q(x, self.critic, self.target).unsqueeze(-1) + 0.0 * self.weight


def transitions_by_obs(r: dict) -> dict:
    """{obs: (reward, true next obs, terminated)} from a Wiring-v0 rollout: its transitions depend on the obs alone."""
    flat = {k: v.reshape(-1, *v.shape[2:]) for k, v in r.items()}
    return {
        tuple(o): (rew, nxt, term)
        for o, rew, nxt, term in zip(flat["obs"], flat["reward"], flat["next_obs"], flat["terminated"])
    }


def recording_env_step(module, monkeypatch) -> list:
    """Record the actions main() (or a rollout worker) sends to the envs, through the script's env_step."""
    sent, real_env_step = [], module.env_step

    def env_step(envs, actions, *rest):
        sent.append(np.array(actions, np.float32))
        return real_env_step(envs, actions, *rest)

    monkeypatch.setattr(module, "env_step", env_step)
    return sent


def assert_stored_transitions(stored: dict, sent: list, r: dict) -> None:
    """The stored rows, one per env and vector step in rollout order: (obs seen, action sent, reward, the true next
    obs (an episode's final obs at its end, not the next episode's first), terminated: never a truncation)."""
    flat = {k: v.reshape(-1, *v.shape[2:]) for k, v in r.items()}
    np.testing.assert_array_equal(stored["obs"], flat["obs"])
    np.testing.assert_array_equal(stored["actions"], np.concatenate(sent))
    np.testing.assert_allclose(stored["rewards"], flat["reward"], rtol=1e-6)
    np.testing.assert_array_equal(stored["next_obs"], flat["next_obs"])
    np.testing.assert_array_equal(stored["terminated"], flat["terminated"])


def test_sac_continuous_main_stores_the_true_transitions_and_regresses_on_the_soft_q_targets(tmp_path, monkeypatch):
    """2 envs x 8 vector steps on Wiring-v0 (3 of random actions, then the policy's; a gradient step at each of the
    last 6), critics fixed to known formulas: the buffer holds the rollout's transitions (true final obs at an
    episode end, terminated but not truncated as done), and at each gradient step the soft Q target of every sampled
    row is y = r + gamma (1 - terminated) (min_i Q'_i(s', a') - alpha log pi(a'|s')), with r, s', terminated those of
    the env's script for that row's obs and a' ~ pi(.|s') drawn for s'; the critics' losses are mean (Q_i(s, a) - y)^2."""
    sac = import_copy(ROOT / "sac_continuous.py")
    made, batches, samples, targets, metrics = [], [], [], [], []

    class RecordingBuffer(sac.ReplayBuffer):
        def __init__(self, *args):
            super().__init__(*args)
            made.append(self)

        def sample(self, *args):
            batches.append(super().sample(*args))
            return batches[-1]

    class KnownTargetsLearner(sac.Learner):
        def __init__(self, *args):
            super().__init__(*args)
            for critic in self.qf_target:
                critic.target = True

    real_sample_action, real_target, real_gradient_step = sac.sample_action, sac.soft_q_target, sac.gradient_step

    def sample_action(learner, obs):
        actions, log_prob = real_sample_action(learner, obs)
        samples.append((obs.clone(), actions.detach().clone(), log_prob.detach().clone()))
        return actions, log_prob

    def soft_q_target(*args):
        targets.append((samples[-1], real_target(*args).clone()))  # a' and log pi(a'|s') drawn just before
        return targets[-1][1]

    def gradient_step(*args):
        critic_metrics, actor_metrics = real_gradient_step(*args)
        metrics.append(critic_metrics.clone())
        return critic_metrics, actor_metrics

    critics = itertools.cycle([0, 1])
    monkeypatch.setattr(sac, "q_network", lambda obs_dim, act_dim: KnownQ(next(critics)))
    monkeypatch.setattr(sac, "Learner", KnownTargetsLearner)
    monkeypatch.setattr(sac, "ReplayBuffer", RecordingBuffer)
    monkeypatch.setattr(sac, "sample_action", sample_action)
    monkeypatch.setattr(sac, "soft_q_target", soft_q_target)
    monkeypatch.setattr(sac, "gradient_step", gradient_step)
    sent = recording_env_step(sac, monkeypatch)
    num_envs, num_steps = 2, 8
    run_main(
        sac,
        monkeypatch,
        tmp_path,
        [
            "--env-id",
            "tests.fake_envs:Wiring-v0",
            "--num-envs",
            num_envs,
            "--total-timesteps",
            num_envs * num_steps,
            "--learning-starts",
            6,
            "--batch-size",
            8,
            "--buffer-size",
            64,
            "--gamma",
            GAMMA,
            "--no-autotune",
            "--alpha",
            ALPHA,
        ],
    )
    r = wiring_rollout(num_envs, num_steps)
    (buffer,) = [b for b in made if b.capacity == 64]  # the run's (check_buffer_fits sizes a row with a 1-row one)
    assert len(sent) == num_steps and buffer.size == num_envs * num_steps
    assert_stored_transitions({k: v[: buffer.size] for k, v in buffer.arrays.items()}, sent, r)

    by_obs = transitions_by_obs(r)
    assert len(batches) == len(targets) == len(metrics) == num_steps - 2  # once global_step reaches learning_starts (6)
    for batch, ((next_obs_in, next_actions, next_log_prob), y), critic_metrics in zip(batches, targets, metrics):
        rows = [by_obs[tuple(o)] for o in batch["obs"].numpy()]
        rewards, next_obs, terminated = (torch.tensor(np.array(x), dtype=torch.float32) for x in zip(*rows))
        torch.testing.assert_close(next_obs_in, next_obs)  # a' drawn for s', the true next obs of each row
        x_next = torch.cat([next_obs, next_actions], -1)
        min_q_next = torch.minimum(known_q(x_next, 0, target=True), known_q(x_next, 1, target=True))
        expected_y = rewards + GAMMA * (1.0 - terminated) * (min_q_next - ALPHA * next_log_prob)
        torch.testing.assert_close(y, expected_y, rtol=1e-5, atol=1e-5)
        x = torch.cat([batch["obs"], batch["actions"]], -1)
        q = torch.stack([known_q(x, 0, target=False), known_q(x, 1, target=False)])
        expected_metrics = torch.stack([q.mean(1), (q - expected_y).pow(2).mean(1)])  # [[mean Q1, Q2], [L1, L2]]
        torch.testing.assert_close(critic_metrics, expected_metrics, rtol=1e-5, atol=1e-5)


def test_sac_continuous_ray_workers_store_the_true_transitions(monkeypatch):
    """sac_continuous_ray.py's rollout side, in-process (its main() starts Ray: tens of seconds): a RolloutWorker's
    batches on Wiring-v0 (2 envs; 5 vector steps, 3 of them random, then 3 more in a second batch), stored by a
    BufferShard, are the rollout's transitions as in sac_continuous.py. Its learner runs the same gradient_step (the
    shared sac-algorithm block, checked identical by tests/test_shared_blocks.py)."""
    sr = import_copy(ROOT / "sac_continuous_ray.py")
    sent = recording_env_step(sr, monkeypatch)
    server = sr.ParameterServer()
    server.publish(sr.actor_weights(sr.Actor(2, 1)), 0)
    worker = sr.RolloutWorker(0, "tests.fake_envs:Wiring-v0", 2, 1, server)
    shard = sr.BufferShard(64, 2, 1, 0)
    for steps, random_steps in ((5, 3), (3, 0)):  # the second batch goes on with the episodes of the first
        shard.add(worker.collect(steps, random_steps)[0])
    buffer = shard.buffer
    assert len(sent) == 8 and buffer.size == 16
    assert_stored_transitions({k: v[: buffer.size] for k, v in buffer.arrays.items()}, sent, wiring_rollout(2, 8))
