"""Soft Actor-Critic distributed on Ray, in one file: rollout workers feed one learner.

The algorithm is sac_continuous.py's, copied verbatim (the `sac-algorithm` block; a test keeps the copies identical).
What this file adds is where each part runs:

    rollout workers (Ray actors, 1 CPU each) --batches of transitions--> driver --object refs--> replay buffer shard(s)
         ^  pull newer weights every --weight-sync-interval env steps (all workers')             |  sampled batches
         |                                                                                       v
    parameter server (Ray actor) <--weights + version-- learner (in the driver; a GPU if there is one) --> TensorBoard
    evaluation (in the driver, as in sac_continuous.py): deterministic episodes every --eval-interval env steps

A batch counts once its buffer shard has stored it: a lost batch is never counted, and its steps are collected again.
The learner holds --utd-ratio updates per collected env step (workers are held back when they run ahead): more
workers make the run faster, not a different algorithm.

Map of this file, top to bottom:
  Args            SAC flags (as sac_continuous.py), the distribution's, then run flags (`--help` lists them)
  sac-algorithm   sac_continuous.py's env, networks, Policy, replay buffer, learner (gradient_step), rollout step
  Ray actors      BufferShard, ParameterServer, RolloutWorker: plain classes, made remote in main()
  data flow       Publisher (weights to the parameter server), Sampler (batches from the buffer shards)
  driver helpers  the utd schedule and back-pressure, batch plans, dispatch and weight pulls, the batches in flight
  main()          set-up, then the driver loop: harvest -> dispatch -> learn -> log, then finish
  # === Plumbing  flag checks, Ray connection, faults, checkpoints, resume, evaluation, export, errors
Docs: docs/sac_continuous_ray.md; the algorithm: https://arxiv.org/abs/1812.05905
"""

import argparse
import atexit
import copy
import dataclasses
import fcntl
import json
import logging
import math
import os
import random
import re
import secrets
import shlex
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback
import warnings
from collections import deque
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Optional, get_args, get_type_hints

if __name__ == "__main__":  # Ctrl-C while the libraries below load (seconds): exit at once, nothing is written yet
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: os._exit(130))
import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro

SCRIPT_NAME = "sac_continuous_ray"  # written into checkpoints; a checkpoint of another script is refused


@dataclass
class Args:
    """SAC for continuous actions on Ray, rollout workers feeding one learner: trains an agent and logs to TensorBoard.
    --resume CKPT continues the run of checkpoint CKPT; `python tools/agent.py eval|export CKPT` plays or exports it."""

    # --- algorithm (as sac_continuous.py) ---
    env_id: str = "HalfCheetah-v4"  # gymnasium env id with continuous actions (MuJoCo, classic control)
    total_timesteps: int = 1_000_000  # env steps to train for, summed over all envs of all workers
    buffer_size: int = 1_000_000  # replay buffer capacity, in transitions (split evenly over --num-buffer-shards)
    gamma: float = 0.99  # discount factor, in [0, 1]
    tau: float = 0.005  # coefficient of the target Q-networks' Polyak update, in (0, 1]
    batch_size: int = 256  # transitions sampled per gradient step
    learning_starts: int = 5_000  # env steps (over all envs) of uniform random actions before learning starts
    policy_lr: float = 3e-4  # learning rate of the actor's Adam
    q_lr: float = 1e-3  # learning rate of the Q-networks' Adam (and of the entropy temperature's)
    policy_frequency: int = 2  # gradient steps between actor updates (delayed); each time, this many actor updates
    target_network_frequency: int = 1  # gradient steps between Polyak updates of the target Q-networks
    alpha: float = 0.2  # entropy coefficient, >= 0 (with --autotune: ignored, the tuned one starts at 1.0)
    autotune: bool = True  # tune the entropy coefficient automatically (target entropy -|A|)

    # --- distribution: where the parts run ---
    num_rollout_workers: int = 2  # rollout worker actors (one CPU each), each stepping --envs-per-worker envs
    envs_per_worker: int = 1  # envs each rollout worker steps, as one vector env
    weight_sync_interval: int = 1_000  # env steps (over all workers) between a worker's pulls of newer actor weights
    utd_ratio: float = 1.0  # gradient updates per collected env step that the learner holds to (0 = asynchronous)
    num_buffer_shards: int = 1  # replay buffer actors; worker i writes to shard i % shards, sampled in proportion to size
    worker_batch_steps: int = 100  # vector steps a worker takes per batch it sends (one object-store transfer per batch)
    ray_address: Optional[str] = None  # cluster to join: None starts a local Ray; `auto` or `host:port` joins a running one
    pause_learner: bool = False  # collect only, no gradient updates (to measure sampling throughput alone)

    # --- run ---
    exp_name: str = os.path.basename(__file__)[: -len(".py")]  # name of the experiment, part of the run folder's name
    seed: int = 1  # random seed of the run
    torch_deterministic: bool = True  # make cuDNN pick deterministic algorithms (torch.backends.cudnn.deterministic)
    cuda: bool = True  # run the learner on the GPU when there is one
    torch_threads: int = 0  # torch's CPU threads in the learner; 0 = one per usable core (set it when runs share a machine)
    track: bool = False  # log to Weights and Biases too (WANDB_MODE=offline works without network)
    wandb_project_name: str = "onefile-rl"  # wandb project
    wandb_entity: Optional[str] = None  # wandb entity, a team or user (None = your wandb default)
    capture_video: bool = False  # record videos of the final evaluation under runs/<run>/videos
    save_model: bool = False  # save a final checkpoint at the end of training, then evaluate it
    runs_dir: str = "runs"  # folder with one sub-folder per run (TensorBoard events, checkpoints, videos)
    checkpoint_interval: int = 100_000  # write a checkpoint every N env steps (0 = never; Ctrl-C and --save-model still save)
    keep_checkpoints: int = 3  # how many of the newest periodic checkpoints to keep (the final one is always kept)
    save_buffer: bool = False  # also checkpoint the replay buffer, all shards (large: up to buffer_size transitions)
    resume: Optional[str] = None  # continue the run of this checkpoint (in its folder if nothing came after, else a new one)
    eval_episodes: int = 10  # episodes per evaluation (every --eval-interval, and after --save-model)
    eval_interval: int = 0  # every N env steps, play --eval-episodes deterministic episodes on a separate env (0 = never)
    keep_best: bool = False  # keep checkpoints/best.pt: the agent with the best evaluation (else training) return so far
    log_interval: int = 100  # log losses (averaged over the window's gradient steps) and speed every N env steps
    progress: bool = True  # show progress: a one-line display on a terminal, a plain line every 30 s otherwise

    # --- derived from the flags above (not flags themselves) ---
    num_iterations: int = field(init=False, default=0)  # passes of the driver loop: no fixed number, it ends with `run.last`

    def __post_init__(self):
        validate_args(self)  # tyro runs it: each flag's range, the sizes that must fit together, the derived sizes


# --- shared: sac-algorithm ---
def make_env(env_id: str, idx: int, capture_video: bool, video_dir: str) -> Callable[[], gym.Env]:
    """One environment, flattened (episode statistics: kept by the rollout, checkpointable; bounds: kept by tanh)."""

    def thunk() -> gym.Env:
        env = gym.make(env_id, render_mode="rgb_array") if capture_video and idx == 0 else gym.make(env_id)
        if capture_video and idx == 0:
            env = gym.wrappers.RecordVideo(env, video_dir, disable_logger=True)
        return gym.wrappers.FlattenObservation(env)

    return thunk


HIDDEN = 256
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


class Actor(nn.Module):
    """obs -> 256 -> 256 -> (mean, log-std) of a Gaussian over the pre-tanh action u, ReLU MLP."""

    def __init__(self, obs_dim: int, act_dim: int):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(obs_dim, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 2 * act_dim)
        )  # one output layer for mean and log-std: the same function as two heads, one matmul
        self.act_dim = act_dim

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, raw_log_std = self.net(obs).split(self.act_dim, dim=-1)
        # the log-std squashed into [LOG_STD_MIN, LOG_STD_MAX] smoothly (tanh), not clipped
        return mean, LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (torch.tanh(raw_log_std) + 1)


def q_network(obs_dim: int, act_dim: int) -> nn.Sequential:
    """A soft Q-network: (obs, action) concatenated -> 256 -> 256 -> Q(s, a), ReLU MLP. The learner has two (Learner)."""
    return nn.Sequential(
        nn.Linear(obs_dim + act_dim, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 1)
    )


def q_values(critics: nn.ModuleList, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """Each critic's Q_i(s, a), as a (critics, batch) tensor: each critic called on its own (vmap was slower on CPU)."""
    x = torch.cat([obs, action], -1)
    return torch.stack([critic(x).squeeze(-1) for critic in critics])


def squashed_gaussian(
    mean: torch.Tensor, log_std: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor, deterministic: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """a = tanh(u) * scale + bias, u ~ N(mean, std) reparameterized (u = mean if deterministic), and log pi(a|s) summed
    over action dimensions: every action SAC takes or trains on is drawn here. The textbook form (a test swaps it in):
        normal = torch.distributions.Normal(mean, log_std.exp())
        u = mean if deterministic else normal.rsample()
        # change of variables (SAC paper appendix C): log pi(a|s) = log N(u) - sum_i log(scale_i (1 - tanh(u_i)^2))
        log_prob = normal.log_prob(u).sum(-1) - torch.log(scale * (1 - torch.tanh(u).pow(2))).sum(-1)
        return torch.tanh(u) * scale + bias, log_prob
    Below, the same numbers (to rounding) in fewer ops, finite where tanh(u) rounds to +-1, exact (no 1e-6: docs page):
        log N(u; mean, std) = sum_i (-noise_i^2 / 2 - log std_i - log sqrt(2 pi))      ((u - mean) / std = noise)
        log(1 - tanh(u)^2) = 2 log 2 - 2 (u + softplus(-2u))"""
    noise = torch.zeros_like(mean) if deterministic else torch.randn_like(mean)
    u = torch.addcmul(mean, log_std.exp(), noise)
    minus_log_slope = 2.0 * (u + nn.functional.softplus(-2.0 * u))  # 2 log 2 - log(1 - tanh(u)^2); 2 log 2 is constant
    # no gradient, summed apart (an op costs a backward one): sum_i (noise_i^2 / 2 + log scale_i + log sqrt(2 pi) + 2 log 2)
    constant = 0.5 * noise.pow(2).sum(-1) + torch.log(scale * (4.0 * math.sqrt(2.0 * math.pi))).sum()
    return torch.addcmul(bias, torch.tanh(u), scale), (minus_log_slope - log_std).sum(-1) - constant


def soft_q_target(
    rewards: torch.Tensor,
    terminated: torch.Tensor,
    next_q: torch.Tensor,
    next_log_prob: torch.Tensor,
    alpha: torch.Tensor,
    gamma: float,
) -> torch.Tensor:
    """y = r + gamma * (1 - terminated) * (min_i Q_i'(s', a') - alpha * log pi(a'|s')),  a' ~ pi(.|s').
    `next_q` is the target critics' (critics, batch) output. Only a termination stops bootstrapping: at a time-limit
    truncation s' is the true final observation and the value beyond it is real."""
    return rewards + gamma * (1.0 - terminated) * (next_q.min(0).values - alpha * next_log_prob)


class Policy(nn.Module):
    """The agent as it acts: observations as make_env's env returns them -> actions in the bounds, by the Actor's forward
    and squashed_gaussian: sampled in the rollout (act), deterministic (tanh of the mean) in evaluation and export."""

    def __init__(self, actor: Actor, low, high):
        super().__init__()
        self.actor = actor
        self.register_buffer("scale", torch.as_tensor((high - low) / 2.0, dtype=torch.float32))
        self.register_buffer("bias", torch.as_tensor((high + low) / 2.0, dtype=torch.float32))

    def forward(self, obs: torch.Tensor, deterministic: bool = True) -> torch.Tensor:
        mean, log_std = self.actor(obs.to(torch.float32))
        return squashed_gaussian(mean, log_std, self.scale, self.bias, deterministic)[0]

    def act(self, obs: np.ndarray) -> np.ndarray:  # a rollout step's actions, sampled
        with torch.inference_mode():  # no_grad, and no version counters either: a quarter less time on one observation
            return self(torch.as_tensor(obs, device=self.scale.device), deterministic=False).cpu().numpy()


class ReplayBuffer:
    """Preallocated circular storage of transitions (s, a, r, s': the true next observation, terminated: never a
    truncation), one float32 array per field; sampled uniformly with torch's global RNG (checkpointed, reproducible)."""

    def __init__(self, capacity: int, obs_dim: int, act_dim: int):
        self.capacity, self.pos, self.size = capacity, 0, 0
        fields = {"obs": (obs_dim,), "next_obs": (obs_dim,), "actions": (act_dim,), "rewards": (), "terminated": ()}
        self.arrays = {name: np.zeros((capacity, *shape), np.float32) for name, shape in fields.items()}
        self.nbytes = sum(array.nbytes for array in self.arrays.values())

    def add(self, obs: np.ndarray, next_obs: np.ndarray, actions: np.ndarray, rewards: np.ndarray, terminated: np.ndarray):
        idx = (self.pos + np.arange(len(rewards))) % self.capacity  # one row per env; wraps, overwriting the oldest
        for array, value in zip(self.arrays.values(), (obs, next_obs, actions, rewards, terminated)):
            array[idx] = value
        self.pos, self.size = (self.pos + len(rewards)) % self.capacity, min(self.size + len(rewards), self.capacity)

    def sample(self, batch_size: int, device: torch.device) -> dict:
        idx = torch.randint(0, self.size, (batch_size,))  # uniform, with replacement
        return {name: torch.from_numpy(array).index_select(0, idx).to(device) for name, array in self.arrays.items()}


class Learner:
    """Everything the update changes: the actor, two critics (q_network instances drawn independently) and their targets,
    Adam optimizers, the entropy temperature; the actor as a Policy (the action bounds). Checkpointed as a LearnerPart."""

    def __init__(self, obs_dim: int, act_dim: int, low: np.ndarray, high: np.ndarray, args, device: torch.device):
        self.actor = Actor(obs_dim, act_dim).to(device)
        self.qf = nn.ModuleList([q_network(obs_dim, act_dim) for _ in range(2)]).to(device)
        self.qf_target = copy.deepcopy(self.qf).requires_grad_(False)  # starts equal; moves only by soft_update
        fused = device.type in ("cpu", "cuda")  # Adam's fused kernel (one op per step) exists there
        self.actor_optimizer = torch.optim.Adam(self.actor.parameters(), lr=args.policy_lr, fused=fused)
        self.q_optimizer = torch.optim.Adam(self.qf.parameters(), lr=args.q_lr, fused=fused)
        # the temperature alpha = exp(log_alpha), tuned from 1 with autotune; else args.alpha throughout (0: none)
        self.log_alpha = torch.zeros(1, device=device, requires_grad=args.autotune)
        self.alpha_optimizer = torch.optim.Adam([self.log_alpha], lr=args.q_lr, fused=fused) if args.autotune else None
        self.fixed_alpha = None if args.autotune else torch.full((1,), args.alpha, device=device)  # log(0) = -inf: kept apart
        self.target_entropy = -float(act_dim)
        self.policy = Policy(self.actor, low, high).to(device)  # acts in the rollout and in evaluation
        # An edit that broke a size fails here (run_cli: one paragraph with the line), not after learning_starts. Why copies
        # and fork_rng: an edited network's BatchNorm statistics and Dropout draws stay as if this never ran.
        obs = torch.zeros(64, obs_dim, device=device)
        with torch.no_grad(), torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            actor, critics = copy.deepcopy(self.actor), copy.deepcopy(self.qf)
            q_values(critics, obs, squashed_gaussian(*actor(obs), self.policy.scale, self.policy.bias, True)[0])

    def alpha(self) -> torch.Tensor:
        return self.log_alpha.detach().exp() if self.fixed_alpha is None else self.fixed_alpha


def sample_action(learner: Learner, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """a ~ pi(.|s) (reparameterized: differentiable in the actor's weights) and log pi(a|s)."""
    mean, log_std = learner.actor(obs)
    return squashed_gaussian(mean, log_std, learner.policy.scale, learner.policy.bias)


def critic_update(learner: Learner, batch: dict, gamma: float) -> torch.Tensor:
    """One gradient step on every critic: L_i = E[(Q_i(s, a) - y)^2], y from soft_q_target (the target critics and
    a fresh a' ~ pi(.|s')). Returns [[mean Q_i], [L_i]] as a detached (2, critics) tensor (no sync)."""
    with torch.no_grad():
        next_actions, next_log_prob = sample_action(learner, batch["next_obs"])
        next_q = q_values(learner.qf_target, batch["next_obs"], next_actions)
        y = soft_q_target(batch["rewards"], batch["terminated"], next_q, next_log_prob, learner.alpha(), gamma)
    q = q_values(learner.qf, batch["obs"], batch["actions"])
    losses = (q - y).pow(2).mean(1)  # one MSE per critic
    learner.q_optimizer.zero_grad()
    losses.sum().backward()
    learner.q_optimizer.step()
    return torch.stack([q.detach().mean(1), losses.detach()])


def actor_update(learner: Learner, obs: torch.Tensor, autotune: bool) -> torch.Tensor:
    """One gradient step on the actor, then (autotune) on the temperature. Returns [actor loss, alpha, alpha loss].
    L_pi    = E_s[ alpha * log pi(a|s) - min_i Q_i(s, a) ],  a = tanh-squashed reparameterized sample
    L_alpha = E_s[ -alpha * (log pi(a|s) + target_entropy) ]   (log pi detached: only alpha moves)"""
    alpha = learner.alpha()
    actions, log_prob = sample_action(learner, obs)
    # Freeze the critics: the gradient reaches the action, and through it the actor; none is computed for their weights
    learner.qf.requires_grad_(False)
    q = q_values(learner.qf, obs, actions).min(0).values
    learner.qf.requires_grad_(True)
    actor_loss = (alpha * log_prob - q).mean()
    learner.actor_optimizer.zero_grad()
    if autotune:
        alpha_loss = (-learner.log_alpha.exp() * (log_prob.detach() + learner.target_entropy)).mean()
        learner.alpha_optimizer.zero_grad()
    else:
        alpha_loss = torch.zeros((), device=obs.device)
    # One backward pass for both losses: they share no parameter (alpha and log pi enter each other's detached)
    (actor_loss + alpha_loss).backward()
    learner.actor_optimizer.step()
    if autotune:
        learner.alpha_optimizer.step()
    return torch.stack([actor_loss.detach(), alpha.reshape(()), alpha_loss.detach()])


def soft_update(target: nn.Module, source: nn.Module, tau: float) -> None:
    """Polyak averaging, in place: theta' <- tau * theta + (1 - tau) * theta'."""
    with torch.no_grad():
        for target_param, param in zip(target.parameters(), source.parameters()):
            target_param.lerp_(param, tau)


def gradient_step(learner: Learner, batch: dict, step: int, args) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Gradient step `step` (from 1): the critics; every policy_frequency steps, policy_frequency actor updates (delayed,
    as TD3, compensated); the targets' Polyak step. Returns both updates' metrics (actor's summed; None: none ran)."""
    critic_metrics, actor_metrics = critic_update(learner, batch, args.gamma), None
    if step % args.policy_frequency == 0:
        actor_metrics = sum(actor_update(learner, batch["obs"], args.autotune) for _ in range(args.policy_frequency))
    if step % args.target_network_frequency == 0:
        soft_update(learner.qf_target, learner.qf, args.tau)
    return critic_metrics, actor_metrics


def critic_logs(metrics: torch.Tensor) -> dict:
    """critic_update's metrics (summed, divided by the window's gradient steps) by name: each critic's, and their mean loss."""
    values, losses = metrics.tolist()  # one column per critic
    return {
        **{f"losses/qf{i}_values": value for i, value in enumerate(values, 1)},
        **{f"losses/qf{i}_loss": loss for i, loss in enumerate(losses, 1)},
        "losses/qf_loss": sum(losses) / len(losses),
    }


def actor_logs(metrics: torch.Tensor, autotune: bool) -> dict:
    """actor_update's metrics (summed, divided by the window's actor updates) by name; alpha_loss with autotune only."""
    actor_loss, alpha, alpha_loss = metrics.tolist()
    return {"losses/actor_loss": actor_loss, "losses/alpha": alpha, **({"losses/alpha_loss": alpha_loss} if autotune else {})}


def env_step(envs: gym.vector.VectorEnv, actions: np.ndarray, episode_return: np.ndarray, episode_length: np.ndarray):
    """Step the envs once. Returns (obs to act on next, true next obs of this transition, rewards, terminations,
    new episode_return, new episode_length, [(return, length) of each episode that ended])."""
    raw_obs, rewards, terminations, truncations, infos = envs.step(actions)
    ended = terminations | truncations
    episode_return, episode_length = episode_return + rewards, episode_length + 1
    finished = [(float(episode_return[i]), int(episode_length[i])) for i in np.flatnonzero(ended)]
    real_next = true_next_obs(raw_obs, ended, infos)
    episode_return, episode_length = np.where(ended, 0.0, episode_return), np.where(ended, 0, episode_length)
    return raw_obs, real_next, rewards, terminations, episode_return, episode_length, finished


# --- end shared: sac-algorithm ---


# --- shared: episode-boundaries ---
def true_next_obs(raw_obs: np.ndarray, episode_ended: np.ndarray, infos: dict) -> np.ndarray:
    """The real next observation of each env's transition under same-step autoreset: `raw_obs`, except where the
    episode ended at this step: there `raw_obs` already holds the next episode's first observation, and the last
    observation of the finished episode is in infos["final_obs"]. Never mix the two: that would be a transition
    across an auto-reset."""
    if not episode_ended.any():
        return raw_obs
    real = np.array(raw_obs)
    for i in np.flatnonzero(episode_ended):
        real[i] = infos["final_obs"][i]
    return real


# --- end shared: episode-boundaries ---


# ---- the Ray actors: plain classes, made remote in main() (so the tests can also run them in-process) ----
class BufferShard:
    """A replay buffer actor: the shared ReplayBuffer behind add/sample calls. The driver forwards each worker batch
    here as an object ref (the data goes worker -> object store -> shard, never through the driver's memory)."""

    def __init__(self, capacity: int, obs_dim: int, act_dim: int, seed: int):
        torch.set_num_threads(1)
        torch.manual_seed(seed)  # ReplayBuffer.sample draws from torch's global RNG: this process's own
        self.buffer = ReplayBuffer(capacity, obs_dim, act_dim)

    def add(self, batch: dict) -> int:
        self.buffer.add(batch["obs"], batch["next_obs"], batch["actions"], batch["rewards"], batch["terminated"])
        return self.buffer.size

    def sample(self, n: int) -> dict:
        return self.buffer.sample(n, torch.device("cpu"))

    def size(self) -> int:
        return self.buffer.size

    def state_dict(self) -> dict:
        return BufferPart(self.buffer).state_dict()

    def load_state_dict(self, state: dict) -> int:
        BufferPart(self.buffer).load_state_dict(state)
        return self.buffer.size


class ParameterServer:
    """Where the workers find the actor's weights (actor_weights): the learner publishes (weights, version),
    workers pull when it moved on. Ray restarts it if it dies, empty: the driver's Publisher sends them again each second."""

    def __init__(self):
        self.weights, self.version = None, -1  # -1: nothing published (a fresh or restarted server)
        if restarted_actor():  # Ray prints an actor's stderr in the driver's
            print(f"the parameter server is back (restarted by Ray, pid {os.getpid()})", file=sys.stderr)

    def publish(self, weights: dict, version: int) -> None:
        self.weights, self.version = weights, version

    def pull(self, have_version: int) -> Optional[tuple]:  # None: an up-to-date worker receives nothing
        return (self.weights, self.version) if self.version > have_version else None


WEIGHTS_WAIT_S = 600.0  # how long a worker without weights waits for the first publish before it gives up


class RolloutWorker:
    """Steps its own vector env with its own Policy (an Actor), on the newest weights it pulled (when the driver asks:
    pull_due), and returns batches of true transitions: same-step autoreset, the final observation at a reset,
    `terminated` as the done flag (env_step and true_next_obs, the shared blocks, as in sac_continuous.py)."""

    def __init__(self, index: int, env_id: str, num_envs: int, seed: int, param_server):
        """`param_server`: the parameter server's actor name (looked up in Ray), or the object itself in-process."""
        quiet_mujoco_warnings()
        torch.set_num_threads(1)
        self.server_down: tuple = ()  # the errors of a parameter server that is restarting (none in-process)
        if isinstance(param_server, str):
            # by name, not by handle: Ray can restart an actor only if its constructor arguments are plain values
            import ray
            from ray.exceptions import RayActorError

            param_server, self.server_down = ray.get_actor(param_server), (RayActorError,)
        if restarted_actor():  # Ray restarted this worker after a crash: fresh seeds, or it would replay its first episodes
            seed = int.from_bytes(os.urandom(4), "little")
            print(
                f"rollout worker {index} is back (restarted by Ray, pid {os.getpid()}, node {node_id()[:8]})", file=sys.stderr
            )
        self.index, self.param_server = index, param_server
        self.envs = gym.vector.SyncVectorEnv(
            [make_env(env_id, i, False, "") for i in range(num_envs)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
        )
        space, obs_space = self.envs.single_action_space, self.envs.single_observation_space
        self.num_envs, self.act_dim, self.low, self.high = num_envs, int(np.prod(space.shape)), space.low, space.high
        self.raw_obs, _ = self.envs.reset(seed=seed)
        self.episode_return, self.episode_length = np.zeros(num_envs), np.zeros(num_envs, np.int64)
        # the script's own classes: acting runs the network that trains, through squashed_gaussian
        self.policy = Policy(Actor(int(np.prod(obs_space.shape)), self.act_dim), space.low, space.high)
        torch.manual_seed(seed)  # random actions and the policy's noise (squashed_gaussian): this process's torch RNG
        self.version = -1  # the version of the weights in self.policy.actor; -1: none pulled yet

    def info(self) -> dict:
        return {"pid": os.getpid(), "host": socket.gethostname(), "node": node_id()}

    def sync_weights(self) -> None:
        """Pull the newest weights if the server holds newer ones. A worker with none waits for the first publish.
        Why: a fresh or restarted worker can start before anything is published, and a restarted parameter server is
        empty until the driver publishes again."""
        deadline = time.monotonic() + WEIGHTS_WAIT_S
        while True:
            try:
                pulled = call(self.param_server, "pull", self.version)
            except self.server_down:  # restarting: Ray brings it back, and the driver publishes to it again
                pulled = None
            if pulled is not None:
                weights, self.version = pulled
                self.policy.actor.load_state_dict(weights)
            if self.version >= 0:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"rollout worker {self.index}: no weights published in {WEIGHTS_WAIT_S:.0f} s")
            time.sleep(0.05)

    def collect(self, num_steps: int, num_random: int, pull: bool = True) -> tuple[dict, dict]:
        """`num_steps` vector steps, the first `num_random` with uniform random actions (before learning_starts), then
        with its weights, pulled first if `pull` (pull_due). Returns the transitions (num_steps * num_envs rows) and
        stats: the episodes that ended, the weight version acted with (-1: none), the row count, where it ran."""
        e, steps, finished, version = self.num_envs, [], [], -1
        for t in range(num_steps):
            if t < num_random:
                uniform = torch.rand((e, self.act_dim)).numpy()  # torch's RNG, as sac_continuous.py
                actions = (uniform * (self.high - self.low) + self.low).astype(np.float32)
            else:
                if t == num_random and (pull or self.version < 0):  # one pull per batch, before its first policy step
                    self.sync_weights()
                version = self.version
                actions = self.policy.act(self.raw_obs)
            obs = self.raw_obs
            self.raw_obs, real_next_obs, rewards, terminations, self.episode_return, self.episode_length, ended = env_step(
                self.envs, actions, self.episode_return, self.episode_length
            )
            # store terminations, not truncations: a time limit is not a terminal state (next obs = true final obs)
            steps.append((obs, real_next_obs, actions, rewards, terminations))
            finished += ended
        names = ("obs", "next_obs", "actions", "rewards", "terminated")  # float32 rows, as ReplayBuffer stores them
        batch = {name: np.concatenate(column, dtype=np.float32) for name, column in zip(names, zip(*steps))}
        stats = {"steps": num_steps * e, "episodes": finished, "version": version, "pid": os.getpid(), "node": node_id()}
        return batch, stats


# ---- the data flow: weights from the learner to the workers (Publisher), batches from the shards (Sampler) ----
def actor_weights(actor: nn.Module) -> dict:
    """The actor's weights as they travel to the workers: a CPU copy of its state_dict, which their own Actor loads
    (load_state_dict checks the names and shapes)."""
    return {name: value.detach().cpu().clone() for name, value in actor.state_dict().items()}


class Publisher:
    """The driver's end of the parameter server: publishes the actor's weights when their version moved on, and the
    same weights again every second (refresh): Ray restarts a dead server empty, and its workers wait for weights."""

    def __init__(self, server, actor: nn.Module, version: int):
        self.server, self.version, self.sent = server, -1, -math.inf
        self.publish(actor, version)

    def publish(self, actor: nn.Module, version: int) -> None:
        if version != self.version:
            self.weights, self.version = actor_weights(actor), version
            self.refresh(every=0.0)

    def refresh(self, every: float = 1.0) -> None:
        """Send the weights last published again once `every` s passed since the last send (~0.3 MB: cheap each second)."""
        if time.monotonic() - self.sent >= every:
            self.server.publish.remote(self.weights, self.version)
            self.sent = time.monotonic()


def shard_sample_counts(sizes: list, n: int) -> list:
    """How many of n uniform draws each shard serves: multinomial in proportion to the shards' sizes, so that
    sampling each shard uniformly is uniform over all stored transitions (torch's global RNG, seeded)."""
    if len(sizes) == 1:
        return [n]
    draws = torch.multinomial(torch.tensor(sizes, dtype=torch.float64), n, replacement=True)
    return torch.bincount(draws, minlength=len(sizes)).tolist()


class Sampler:
    """The learner's end of the buffer: asks the shard(s) for `per_request` batches at once and keeps the next request
    in flight while the learner trains on the current one (prefetch), so the learner rarely waits on Ray."""

    def __init__(self, shards: list, batch_size: int, per_request: int, device: torch.device):
        self.shards, self.batch_size, self.per_request, self.device = shards, batch_size, per_request, device
        self.ready: deque = deque()
        self.pending: Optional[list] = None

    def next(self, sizes: list) -> dict:
        if not self.ready:
            import ray
            from ray.exceptions import RayActorError

            if self.pending is None:
                self.pending = self._request(sizes)
            try:
                parts = ray.get(self.pending)
            except RayActorError as e:
                raise ShardLost(None, e) from None
            self.pending = self._request(sizes)  # prefetch the next group now
            merged = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
            if len(parts) > 1:  # shard by shard -> shuffle, so each batch mixes the shards
                order = torch.randperm(len(merged["rewards"]))
                merged = {k: v[order] for k, v in merged.items()}
            for i in range(self.per_request):
                rows = slice(i * self.batch_size, (i + 1) * self.batch_size)
                self.ready.append({k: v[rows].to(self.device, non_blocking=True) for k, v in merged.items()})
        return self.ready.popleft()

    def _request(self, sizes: list) -> list:
        counts = shard_sample_counts(sizes, self.batch_size * self.per_request)
        return [shard.sample.remote(c) for shard, c in zip(self.shards, counts) if c > 0]


# ---- the driver's helpers: the utd ratio, batch plans, dispatch and weight pulls, the batches in flight ----
def updates_due(env_steps: int, updates_start: int, utd: float) -> int:
    """Gradient updates owed after `env_steps` collected steps: utd per step from updates_start on. With utd 1 this
    is sac_continuous.py's schedule (one update per env step, the first once learning_starts steps are stored)."""
    first = max(updates_start, 1)
    return 0 if env_steps < first else math.floor(utd * (env_steps - first + 1) + 1e-9)


def collection_allowed(
    dispatched: int, batch_steps: int, grad_steps: int, updates_start: int, utd: float, lead_steps: int
) -> bool:
    """May a worker start a batch that takes env collection to `dispatched + batch_steps`? Only while the learner has
    done the updates due `lead_steps` env steps earlier: collection leads the learner by a bounded amount (about one
    batch per worker), so the run keeps its utd ratio at any number of workers. utd 0: always (asynchronous)."""
    if utd <= 0:
        return True
    return updates_due(dispatched + batch_steps - lead_steps, updates_start, utd) <= grad_steps


def next_batch_plan(dispatched: int, total: int, learning_starts: int, num_envs: int, batch_steps: int) -> tuple[int, int]:
    """(vector steps, of which random) for a worker's next batch: at most batch_steps, never past `total`, and random
    actions for exactly the first learning_starts env steps of the run, whichever worker takes them."""
    steps = min(batch_steps, (total - dispatched) // num_envs)
    random_steps = min(steps, -(-max(learning_starts - dispatched, 0) // num_envs))  # ceil division
    return steps, random_steps


def pick_worker(in_flight: list, last_start: list, max_in_flight: int) -> Optional[int]:
    """The worker to hand the next batch: of those with fewer than max_in_flight batches, the one with the fewest,
    then the one whose last batch started longest ago (round-robin). Why not the lowest-numbered free worker: when
    the learner is the bottleneck, one worker is free at each dispatch and worker 0 took nearly every batch."""
    free = [i for i, busy in enumerate(in_flight) if busy < max_in_flight]
    return min(free, key=lambda i: (in_flight[i], last_start[i], i)) if free else None


def pull_due(global_step: int, last_pull_step: int, worker_version: int, published: int, interval: int) -> bool:
    """Does a worker pull the newest weights before its next batch? When the learner published a newer version and
    `interval` env steps, counted over all workers, passed since its last pull. Why global steps: counted in its own
    steps, a worker of N pulled every N * interval learner updates, so acting grew more off-policy with every worker."""
    return published > worker_version and global_step - last_pull_step >= interval


def next_dispatch(batches, state, args, total: int) -> Optional[tuple[int, int, int, bool]]:
    """The driver's next batch, (worker, vector steps, of which random, pull weights first?), or None: no worker free,
    nothing left, or the learner behind. Pure (it reads Batches' and LoopState's bookkeeping), so the simulated clock
    of tests/test_sac_continuous_ray_dispatch.py runs the very rules main() does."""
    index = pick_worker(batches.busy, batches.last_start, MAX_IN_FLIGHT)
    steps, random_steps = next_batch_plan(
        batches.dispatched, total, args.learning_starts, args.envs_per_worker, args.worker_batch_steps
    )
    utd = 0.0 if args.pause_learner else args.utd_ratio  # the coupling of collection to the learner (0: none)
    lead_steps = args.num_rollout_workers * args.worker_batch_steps * args.envs_per_worker  # one batch per worker
    made = state.grad_steps - state.updates_base  # the updates made under this schedule
    allowed = collection_allowed(batches.dispatched, steps * args.envs_per_worker, made, state.updates_start, utd, lead_steps)
    if index is None or steps == 0 or not allowed:
        return None
    # an acting worker pulls first if pull_due (of the learner's version, which main() publishes at the batch's start)
    pull = steps > random_steps and pull_due(
        state.global_step, batches.last_pull[index], batches.versions[index], state.actor_updates, args.weight_sync_interval
    )
    return index, steps, random_steps, pull


class Batches:
    """The workers' batches from dispatch to storage. A worker's `collect` returns two objects: the batch (arrays,
    into Ray's object store) and small stats, which the driver waits on. Up to MAX_IN_FLIGHT batches per worker are in
    flight: the next one is queued behind the one it collects, so a worker never waits for the driver."""

    def __init__(self, workers: list, dispatched: int, num_envs: int):
        import ray

        self.workers, self.dispatched = workers, dispatched  # env steps handed to workers, counted or in flight
        self.num_envs = num_envs  # envs per worker: a batch of n vector steps is n * num_envs env steps
        self.in_flight: dict = {}  # stats ref -> (worker index, env steps, batch ref)
        self.busy = [0] * len(workers)  # batches in flight per worker
        self.started, self.last_start = 0, [0] * len(workers)  # batches started; the count when each worker's last did
        self.last_pull = [dispatched] * len(workers)  # the global step at each worker's last requested pull
        self.versions = [-1] * len(workers)  # the weight version each worker holds, as far as the driver knows
        infos = ray.get([w.info.remote() for w in workers])
        self.pids, self.nodes = [i["pid"] for i in infos], [i["node"] for i in infos]  # a new pid: a restart

    def start(self, index: int, steps: int, random_steps: int, pull: bool, global_step: int, published: int):
        """Queue a batch of `steps` vector steps on worker `index` (next_dispatch's plan); if `pull`, it pulls first."""
        env_steps = steps * self.num_envs
        if pull:
            self.last_pull[index], self.versions[index] = global_step, published
        batch_ref, stats_ref = self.workers[index].collect.options(num_returns=2).remote(steps, random_steps, pull)
        self.in_flight[stats_ref] = (index, env_steps, batch_ref)
        self.busy[index] += 1
        self.started += 1
        self.last_start[index] = self.started
        self.dispatched += env_steps

    def harvest(self, shards: list) -> list:
        """The batches finished since the last call, each forwarded to its shard (worker i -> shard i % shards) and
        stored there, as (worker index, env steps, stats); stats["restarted"] says it came from a worker that Ray
        restarted. A batch is counted only once its shard has stored it: a batch whose worker died, or whose data
        was lost (with its node) before the shard fetched it, is dropped, never counted, and its env steps handed out
        again. A shard that cannot store raises ShardLost."""
        import ray
        from ray.exceptions import ActorDiedError, ObjectLostError, RayActorError

        ready = ray.wait(list(self.in_flight), num_returns=len(self.in_flight), timeout=0)[0] if self.in_flight else []
        adds = []
        for ref in ready:
            index, steps, batch_ref = self.in_flight.pop(ref)
            self.busy[index] -= 1
            try:
                stats = ray.get(ref)
            except ActorDiedError:  # dead for good: Ray restarted it MAX_WORKER_RESTARTS times (else: ActorUnavailableError)
                raise UserError(f"rollout worker {index} died {MAX_WORKER_RESTARTS + 1} times (out of memory?)") from None
            except RayActorError as e:
                self.drop(index, steps, f"a batch of rollout worker {index} failed ({type(e).__name__}): Ray restarts it")
                self.versions[index] = -1  # a restarted worker starts without weights
                continue
            stats["restarted"] = stats["pid"] != self.pids[index]  # a new process: Ray restarted the worker (it says so)
            self.pids[index], self.nodes[index] = stats["pid"], stats["node"]  # where the worker runs now
            self.versions[index] = max(self.versions[index], stats["version"])
            # the ref, not the data: the shard fetches the batch from the object store
            adds.append((index, steps, stats, shards[index % len(shards)].add.remote(batch_ref)))
        stored = []
        for index, steps, stats, add_ref in adds:  # awaited: a failed add is never counted
            try:
                ray.get(add_ref)
            except ObjectLostError as e:
                self.drop(index, steps, f"the data of a batch of rollout worker {index} was lost ({type(e).__name__})")
                continue
            except RayActorError as e:
                raise ShardLost(index % len(shards), e) from None
            stored.append((index, steps, stats))
        return stored

    def drop(self, index: int, steps: int, why: str) -> None:
        self.dispatched -= steps  # never counted: a later batch collects these env steps again
        print(f"warning: {why}. Its {steps} env steps are dropped and collected again.", file=sys.stderr)

    def wait(self, timeout: float) -> None:
        """Nothing to learn: wait until a batch comes back (at most `timeout` s), or a moment when none is out."""
        if self.in_flight:
            import ray

            ray.wait(list(self.in_flight), num_returns=1, timeout=timeout)
        else:
            time.sleep(0.01)  # not expected (held-back workers mean owed updates); a pause, not a busy loop


@dataclass
class LoopState:
    """What the driver loop carries from one pass to the next; checkpoints save and restore all of it. Batches in flight
    are not in it: they were never counted, and a resumed run collects those steps again."""

    global_step: int = 0  # env steps counted: collected by a worker, back at the driver, stored in a buffer shard
    iteration: int = 0  # the last completed pass of the driver loop
    grad_steps: int = 0  # the learner's gradient steps (critic updates)
    actor_updates: int = 0  # the learner's actor updates: the version of the weights it publishes
    # the update schedule, updates_base + utd * (env steps since updates_start); a resume without a buffer starts anew
    updates_start: int = 0
    updates_base: int = 0
    worker_restarts: int = 0  # rollout workers restarted by Ray so far


def updates_owed(state: LoopState, utd: float, total: int) -> int:
    """Gradient steps the learner owes now under the schedule. utd 0 (asynchronous): one at a time, from the first
    stored transition at updates_start for as long as env steps are still being collected."""
    if utd == 0:
        return int(max(state.updates_start, 1) <= state.global_step < total)
    return max(state.updates_base + updates_due(state.global_step, state.updates_start, utd) - state.grad_steps, 0)


def new_window(state: LoopState, device: torch.device) -> dict:
    """A log window's start: its time and counters (its rates are the differences), the sums of gradient_step's
    metrics over its gradient steps and actor updates, and its batches' staleness."""
    return {
        "time": time.time(),
        "step": state.global_step,
        "grad_steps": state.grad_steps,
        "actor_updates": state.actor_updates,
        "loss_sums": torch.zeros((), device=device),  # 0 until the first sum: then the shape of the updates' metrics
        "actor_sums": torch.zeros((), device=device),
        "stale": [],
    }


SAMPLE_GROUP = 16  # batches per buffer request: one Ray round trip per 16 gradient steps
MAX_IN_FLIGHT = 2  # batches queued per worker: one it collects, the next behind it
MAX_WORKER_RESTARTS = 3  # Ray restarts a dead rollout worker this many times; its next death ends the run (harvest)


def main() -> None:
    args, ckpt, device = parse_command_line(Args)
    total = args.total_timesteps - args.total_timesteps % args.envs_per_worker  # whole vector steps of every worker
    shapes, act_space = probe_env(args.env_id, args.capture_video)
    if ckpt is not None:
        check_resumable(ckpt, args.resume, total)
    obs_dim, act_dim = int(np.prod(shapes["obs_shape"])), int(np.prod(act_space.shape))
    nbytes = check_buffer_fits(args, obs_dim, act_dim)  # below the banner: memory and disk hold it
    run = Run(args, SCRIPT_NAME, ckpt, shapes, args.log_interval)
    ray = connect_ray(args.ray_address, args.num_rollout_workers)  # unreachable: the run's new folder goes (run_cli)
    seed_everything(args.seed, args.torch_deterministic)

    # ---- the learner (in this process) and the replay buffer shards (Ray actors, on this node) ----
    learner = Learner(obs_dim, act_dim, act_space.low, act_space.high, args, device)
    # Shards and the parameter server on this node, hard (the learner talks to them most); the workers SPREAD over the
    # cluster (Ray packs actors onto one node until it is full). Shards hold the only copy of their data: never
    # restarted (a restarted one would be empty: the run stops instead).
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
    shard_capacity = args.buffer_size // args.num_buffer_shards
    shards = [
        ray.remote(BufferShard)
        .options(num_cpus=0, scheduling_strategy=here)
        .remote(shard_capacity, obs_dim, act_dim, args.seed + 7 + i)
        for i in range(args.num_buffer_shards)
    ]
    state = LoopState(updates_start=args.learning_starts)  # the first gradient step once learning_starts steps are in
    shard_states = ShardStates(shards, args.save_buffer)
    # what the run closes at its end: Ray, and with it every actor this run started
    run.attach(state, SimpleNamespace(close=ray.shutdown), learner=LearnerPart(learner), replay_buffers=shard_states)
    if ckpt is not None and ckpt["replay_buffers"] is None:  # resumed without a buffer: a new schedule once it refills
        state.updates_start = refill_before_updating(state.global_step, args.learning_starts)
        state.updates_base = state.grad_steps

    # ---- the parameter server and the rollout workers (Ray actors) ----
    param_server_name = f"parameter-server-{run.name}-{os.getpid()}"  # unique on a shared cluster
    # restarted empty if it dies (its calls retried): the Publisher sends it the weights again within a second
    param_server = (
        ray.remote(ParameterServer)
        .options(name=param_server_name, num_cpus=0, max_restarts=-1, max_task_retries=-1, scheduling_strategy=here)
        .remote()
    )
    publisher = Publisher(param_server, learner.actor, state.actor_updates)
    # Workers: restarted by Ray when their process dies (MAX_WORKER_RESTARTS times); their in-flight batch then fails
    # (max_task_retries=0) and the driver hands those steps to the next batch, so nothing is counted twice.
    worker_class = ray.remote(RolloutWorker).options(
        num_cpus=1, max_restarts=MAX_WORKER_RESTARTS, max_task_retries=0, scheduling_strategy="SPREAD"
    )
    workers = [
        worker_class.remote(i, args.env_id, args.envs_per_worker, args.seed + 1_000 * i + state.global_step, param_server_name)
        for i in range(args.num_rollout_workers)
    ]
    run.play = lambda episodes, video_dir=None: evaluate(
        learner.policy, eval_env(args.env_id, video_dir), episodes, args.seed + 10_000
    )
    shard_sizes = ray.get([shard.size.remote() for shard in shards])
    sampler = Sampler(shards, args.batch_size, SAMPLE_GROUP, device)

    with stop_on_task_error(run, shard_states):  # (below the banner) a failed Ray task: checkpoint, one paragraph
        batches = Batches(workers, state.global_step, args.envs_per_worker)  # waits until every worker has started
        print_layout(args, batches, nbytes, device)  # (below the banner) where each part runs
        window = new_window(state, device)
        # one pass: harvest, dispatch, learn, log; then (Run) evaluation every --eval-interval steps, checkpoints
        for _ in run.iterations(state, args.num_iterations):
            # ---- harvest: count each batch its shard stored, note its episodes and its staleness ----
            for index, steps, stats in batches.harvest(shards):
                state.worker_restarts += stats["restarted"]
                shard = index % args.num_buffer_shards
                shard_sizes[shard] = min(shard_sizes[shard] + steps, shard_capacity)
                state.global_step += steps
                if stats["version"] >= 0:  # actor updates between the weights that collected it and the learner's now
                    window["stale"].append(state.actor_updates - stats["version"])
                for episode_return, length in stats["episodes"]:
                    run.episode(episode_return, length, state.global_step)

            # ---- dispatch: new batches, to the least busy worker idle longest, as far as the utd ratio allows ----
            while (plan := next_dispatch(batches, state, args, total)) is not None:
                index, steps, random_steps, pull = plan
                publisher.publish(learner.actor, state.actor_updates)  # at a batch's start, not at each update: ~0.3 MB
                batches.start(index, steps, random_steps, pull, state.global_step, publisher.version)
            publisher.refresh()  # a restarted parameter server is empty: it has the weights again within a second

            # ---- learn: the gradient steps owed (as sac_continuous.py's loop, batches from the shards) ----
            owed = 0 if args.pause_learner else updates_owed(state, args.utd_ratio, total)
            with run.timer("update"):
                # one per pass while the workers collect (they are served between two); all that remain once every
                # env step is in, so that the last pass logs and saves after the last update
                for _ in range(owed if state.global_step >= total else min(owed, 1)):
                    state.grad_steps += 1
                    critic_metrics, actor_metrics = gradient_step(learner, sampler.next(shard_sizes), state.grad_steps, args)
                    window["loss_sums"] = window["loss_sums"] + critic_metrics
                    if actor_metrics is not None:  # delayed: policy_frequency actor updates every policy_frequency steps
                        window["actor_sums"] = window["actor_sums"] + actor_metrics
                        state.actor_updates += args.policy_frequency
            if owed == 0 and state.global_step < total:
                batches.wait(timeout=0.2)  # nothing to learn: wait for a worker

            # ---- log: losses averaged over the window's updates, speeds over its wall time (one sync per window) ----
            run.last = state.global_step >= total  # every env step is in, and (above) every update owed is done
            if run.log_due():
                elapsed = max(time.time() - window["time"], 1e-9)
                grad_steps = state.grad_steps - window["grad_steps"]
                actor_updates = state.actor_updates - window["actor_updates"]
                metrics = {
                    "charts/env_steps_per_second": (state.global_step - window["step"]) / elapsed,
                    "charts/updates_per_second": grad_steps / elapsed,
                    "charts/worker_restarts": state.worker_restarts,
                    "charts/learner_busy": run.phase_time.get("update", 0.0) / elapsed,
                }  # sampling + updating
                if grad_steps > 0:
                    metrics.update(critic_logs(window["loss_sums"] / grad_steps))
                if actor_updates > 0:
                    metrics.update(actor_logs(window["actor_sums"] / actor_updates, args.autotune))
                if window["stale"]:
                    metrics.update(
                        {
                            "charts/weight_staleness": float(np.mean(window["stale"])),
                            "charts/weight_staleness_max": float(np.max(window["stale"])),
                        }
                    )
                run.log(state.global_step, metrics)
                window = new_window(state, device)

    print_end(run, batches, shards)  # (below the banner) the steps a stop drops, or the totals
    run.finish()  # after Ctrl-C: saved, Ray shut down, exits; with --save-model: the final agent evaluated, then saved


# === Plumbing: runs, checkpoints, errors; not needed to follow the algorithm ===
# The Ray connection, faults, checkpoints, resume (the cluster layout may change on --resume), logging, flag checks,
# the env probe (`shared:` blocks: tools/sync_shared.py).


# The rule each numeric flag must meet (rule: the flags it applies to; the run flags' are in RUN_RULES)
FLAG_RULES = {
    ">= 1": "total_timesteps buffer_size batch_size policy_frequency target_network_frequency num_rollout_workers"
    " envs_per_worker weight_sync_interval num_buffer_shards worker_batch_steps log_interval",
    "in [0, 1]": "gamma",
    "in (0, 1]": "tau",
    ">= 0": "learning_starts alpha utd_ratio",
    "> 0": "policy_lr q_lr",
}


def validate_args(args: Args) -> None:
    """Each flag against its rule; then what single-flag rules cannot say: sizes that must fit together; the derived size."""
    check_flags(args, FLAG_RULES)
    args.num_iterations = sys.maxsize  # the driver loop has no fixed number of passes: it ends by setting run.last
    if args.num_buffer_shards > args.num_rollout_workers:
        raise UserError(
            f"num_buffer_shards ({args.num_buffer_shards}) must be between 1 and num_rollout_workers "
            f"({args.num_rollout_workers}): worker i writes to shard i % shards, so a shard with no worker "
            "would stay empty."
        )
    if args.total_timesteps < args.envs_per_worker:
        raise UserError(f"total_timesteps ({args.total_timesteps}) is below one vector step ({args.envs_per_worker} envs).")
    if args.learning_starts > args.total_timesteps:
        raise UserError(
            f"learning_starts ({args.learning_starts}) is above total_timesteps ({args.total_timesteps}): "
            "no update would run. Lower --learning-starts or raise --total-timesteps."
        )
    if args.batch_size > args.buffer_size // args.num_buffer_shards:
        raise UserError(
            f"batch_size ({args.batch_size}) is larger than a buffer shard (buffer_size {args.buffer_size} / "
            f"{args.num_buffer_shards} shards). Lower --batch-size or raise --buffer-size."
        )
    if not math.isfinite(args.utd_ratio):  # (the rule ">= 0" lets infinity through)
        raise UserError(f"--utd-ratio must be finite, not {args.utd_ratio}.")


def check_resumable(ckpt: dict, path: str, total: int) -> None:
    """Checked before Ray starts: a checkpoint with env steps left to take (Run checks its script and env's shapes)."""
    if ckpt["global_step"] >= total:
        raise UserError(
            f"checkpoint '{path}' is at step {ckpt['global_step']} and --total-timesteps is "
            f"{total}: nothing left to do. Raise --total-timesteps to continue."
        )


def connect_ray(address: Optional[str], num_workers: int):
    """Start an embedded Ray (address None) or join a cluster; an unreachable address fails in seconds, clearly. More
    workers than it has CPUs are refused before any starts (an embedded Ray given a CPU per worker once ran 100 on 2 cores)."""
    if address not in (None, "auto"):  # Why probe first: ray.init retries an unreachable address for minutes
        host, _, port = address.removeprefix("ray://").rpartition(":")
        try:
            socket.create_connection((host or "127.0.0.1", int(port)), timeout=5).close()
        except (OSError, ValueError) as e:
            raise UserError(
                f"--ray-address {address}: cannot connect to {host or '127.0.0.1'}:{port} ({e}). Start the "
                "cluster first (`ray start --head` prints the address), check the host and port, or leave "
                "--ray-address out to run on this machine alone."
            ) from None
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage-stats prompt or upload
    if address is None:  # (each read when ray is first imported, so set before that)
        # no second virtual environment for the workers under `uv run` (tens of seconds per start; a cluster needs it)
        os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
        # it serves this process alone: servers on 127.0.0.1 only (the switch is named for Windows and macOS), and token
        # authentication on, with a token of this cluster's (its workers inherit it): no other local user can submit code
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        os.environ["RAY_AUTH_MODE"], os.environ["RAY_AUTH_TOKEN"] = "token", secrets.token_hex(32)
        paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)  # an empty entry: the working folder on sys.path
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    try:
        import ray
    except ImportError:
        raise UserError(
            "sac_continuous_ray.py needs Ray: install the project's `ray` extra (the README's commands do: "
            "`uv run --all-extras ...`), or `pip install 'ray>=2.40,<3'`."
        ) from None
    if address is None:
        # "local": a Ray of its own, as many CPUs as this machine (with no address, ray.init() joins a `ray start`
        # cluster already up on this machine, not what --ray-address None says)
        temp = tempfile.mkdtemp(prefix=f"ray-{os.getuid()}-")  # this user's, mode 0700 (Ray makes its own 0777); short:
        atexit.register(shutil.rmtree, temp, ignore_errors=True)  # socket paths must stay under 108 bytes
        ray.init(address="local", include_dashboard=False, logging_level=logging.WARNING, _temp_dir=f"{temp}/r")
    else:
        try:
            ray.init(address=address, logging_level=logging.WARNING)
        except ConnectionError as e:
            raise UserError(f"--ray-address {address}: could not join a Ray cluster ({e}).") from None
    signal.signal(signal.SIGTERM, Run.on_signal)  # ours again (run_cli installed it): Ray's is sys.exit(15)
    if num_workers > (cpus := int(ray.cluster_resources().get("CPU", 0))):
        ray.shutdown()
        where = f"the cluster at {address}" if address else "this machine"
        raise UserError(
            f"--num-rollout-workers {num_workers}: each worker takes one CPU and {where} has {cpus}; give at most {cpus}."
        )
    return ray


def print_layout(args, batches, nbytes: int, device: torch.device) -> None:
    """The start-up line: the workers' pids and nodes, the buffer's size, where the learner runs, the utd ratio."""
    print(
        f"ray: {args.num_rollout_workers} rollout workers x {args.envs_per_worker} envs (pids "
        f"{' '.join(map(str, batches.pids))} on nodes {' '.join((n or '-')[:8] for n in batches.nodes)}), "
        f"{args.num_buffer_shards} buffer shard(s) ({args.buffer_size:,} transitions, {nbytes / 1e6:.1f} MB of arrays) and "
        f"the parameter server on the learner's node {(node_id() or '-')[:8]}, learner on {device}, utd ratio "
        f"{args.utd_ratio:g}{' (asynchronous)' if args.utd_ratio == 0 else ''}"
        f"{', learner paused' if args.pause_learner else ''}"
    )


def print_end(run, batches, shards: list) -> None:
    """The last line: after a stop, the env steps in flight it drops; else the run's totals and its speed."""
    state = run.state
    if run.stopped:
        dropped = batches.dispatched - state.global_step
        print(f"stopping: {dropped} env steps in flight are dropped (never counted; a resume collects them)", file=sys.stderr)
        return
    import ray

    wall, stored = time.time() - run.start_time, sum(ray.get([shard.size.remote() for shard in shards]))
    print(
        f"done: {state.global_step} env steps ({state.worker_restarts} worker restarts), {stored} transitions in the "
        f"buffer, {state.grad_steps} gradient updates in {wall:.1f} s: "
        f"{(state.global_step - run.start_step) / wall:.1f} env steps/s"
    )


def restarted_actor() -> bool:
    """True inside a Ray actor that Ray restarted after its process died (False outside Ray)."""
    ray = sys.modules.get("ray")  # None: not imported, so not in Ray
    with warnings.catch_warnings():  # the property reads a deprecated attribute internally (Ray 2.5x)
        warnings.simplefilter("ignore")
        return bool(ray and ray.is_initialized() and ray.get_runtime_context().was_current_actor_reconstructed)


class ShardStates:
    """The buffer shards as one checkpoint part: with --save-buffer every shard's stored transitions, else None (a
    resumed run then refills the buffer before it updates again; see main())."""

    holds_replay_buffer = True  # never in best.pt (Run.checkpoint)

    def __init__(self, shards: list, save: bool):
        self.shards, self.save = shards, save

    def state_dict(self) -> Optional[list]:
        return [call(shard, "state_dict") for shard in self.shards] if self.save else None

    def load_state_dict(self, states: Optional[list]) -> None:
        for shard, state in zip(self.shards, states or []):
            call(shard, "load_state_dict", state)


def call(target, method: str, *args):
    """target.method(*args), waiting for the result, on a Ray actor handle or on a plain in-process object."""
    fn = getattr(target, method)
    if hasattr(fn, "remote"):
        import ray

        return ray.get(fn.remote(*args))
    return fn(*args)


def node_id() -> Optional[str]:
    """The Ray node this process runs on (None outside Ray): the workers report it, the log shows where they ran."""
    ray = sys.modules.get("ray")  # None: not imported, so not in Ray
    return ray.get_runtime_context().get_node_id() if ray and ray.is_initialized() else None


class ShardLost(Exception):
    """A replay buffer shard died (its `add` or `sample` failed with a dead actor): its transitions are gone."""

    def __init__(self, shard: Optional[int], cause: Exception):
        super().__init__(f"replay buffer shard {'' if shard is None else f'{shard} '}died ({type(cause).__name__})")


@contextmanager
def stop_on_task_error(run, shard_states: ShardStates):
    """Ray task errors the loop cannot repair (a lost buffer shard, an exception in an actor's code; dead workers, lost
    batches and a restarted parameter server are repaired inside it) end the run: an `interrupted` checkpoint (without
    the buffer when a shard was lost), one paragraph on stderr, exit code 1 (a UserError: a worker dead for good, 2)."""
    from ray.exceptions import RayError

    try:
        yield
    except (RayError, ShardLost, UserError) as e:
        what = str(e)
        if isinstance(e, ShardLost):
            shard_states.save = False  # the lost shard's transitions cannot be saved: the checkpoint holds no buffer
            what += "; it held the only copy of its transitions, so the run cannot go on (buffer shards are not restarted)"
        elif isinstance(e, RayError):
            lines = [line for line in str(e).splitlines() if line.strip()]
            what = f"a Ray task failed: {type(e).__name__}" + (f" ({lines[-1].strip()})" if lines else "")
        path = run.save("interrupted")
        buffer = "" if shard_states.save else " (without the replay buffer: a resumed run refills it first)"
        print(
            f"error: {what}. Saved step {run.state.global_step} to {path}{buffer}. Resume with: {resume_command(path)}",
            file=sys.stderr,
        )
        run.close()
        sys.exit(2 if isinstance(e, UserError) else 1)


# --- shared: sac-run ---
class LearnerPart:
    """A Learner as a checkpoint part: the state_dict of each network and optimizer, and log_alpha; loaded in place
    (the optimizers go on stepping the same tensors)."""

    def __init__(self, learner: Learner):
        self.learner = learner

    def parts(self) -> dict:
        """Every network and optimizer the Learner holds, in the order __init__ makes them (a student's new one too); the
        Policy aside: it holds the actor, saved as "actor"; alpha_optimizer None (no autotune) has no state_dict."""
        parts = vars(self.learner).items()
        return {name: part for name, part in parts if hasattr(part, "state_dict") and not isinstance(part, Policy)}

    def state_dict(self) -> dict:
        state = {name: part.state_dict() for name, part in self.parts().items()}
        return {**state, "log_alpha": self.learner.log_alpha.detach()}

    def load_state_dict(self, state: dict) -> None:
        for name, part in self.parts().items():
            try:
                part.load_state_dict(state[name])
            except (RuntimeError, ValueError, KeyError) as e:  # an edited network, or a checkpoint of an older build
                raise UserError(
                    f"the checkpoint's {name} does not fit this script's ({' '.join(str(e).split())[:160]}...). "
                    "Resume it with the script that wrote it, or undo the edit to Actor / q_network."
                ) from None
        with torch.no_grad():
            self.learner.log_alpha.copy_(state["log_alpha"])


class BufferPart:
    """A replay buffer as a checkpoint part: its stored rows (copies) and write position, as tensors that load with
    weights_only=True; with save False (no --save-buffer: up to buffer_size transitions, large) None instead."""

    holds_replay_buffer = True  # never in best.pt (Run.checkpoint)

    def __init__(self, buffer: ReplayBuffer, save: bool = True):
        self.buffer, self.save = buffer, save

    def state_dict(self) -> Optional[dict]:
        b = self.buffer
        return (
            {
                "capacity": b.capacity,
                "pos": b.pos,
                "size": b.size,
                **{k: torch.from_numpy(v[: b.size].copy()) for k, v in b.arrays.items()},
            }
            if self.save
            else None
        )

    def load_state_dict(self, state: Optional[dict]) -> None:  # None: saved without the buffer, which stays empty
        if state is not None:
            for k, array in self.buffer.arrays.items():
                array[: state["size"]] = state[k].numpy()
            self.buffer.pos, self.buffer.size = state["pos"], state["size"]


def refill_before_updating(global_step: int, learning_starts: int) -> int:
    """Resumed without a replay buffer: the step from which updates go on (learning_starts, >= 1, steps on), in a warning."""
    start = global_step + max(learning_starts, 1)
    print(
        f"warning: no replay buffer in the checkpoint (saved without --save-buffer): the buffer starts empty, and updates "
        f"pause until it holds {learning_starts} new transitions (step {start}); acting goes on.",
        file=sys.stderr,
    )
    return start


def policy_from_checkpoint(ckpt: dict) -> Policy:
    """The checkpoint's actor as its Policy, on the CPU (tools/agent.py evaluates and exports it)."""
    shapes, act_space = probe_env(ckpt["args"]["env_id"])  # the env exists, and the checkpoint's actor fits it
    check_checkpoint_matches(ckpt, ckpt.get("path", ""), SCRIPT_NAME, shapes)
    actor = Actor(int(np.prod(shapes["obs_shape"])), int(np.prod(act_space.shape)))
    actor.load_state_dict(ckpt["learner"]["actor"])
    return Policy(actor, act_space.low, act_space.high)


def check_buffer_fits(args, obs_dim: int, act_dim: int) -> int:
    """Refuse a replay buffer (the Ray script's: all its shards, on the driver's node) this machine cannot hold, before
    anything starts (numpy allocates it lazily: it would start, then be killed hours later as it fills); --save-buffer
    writes it into every checkpoint (twice during a save). Returns its size in bytes."""
    nbytes = args.buffer_size * ReplayBuffer(1, obs_dim, act_dim).nbytes  # a row's bytes, times the rows
    available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")  # numpy allocates lazily: it would fill, then die
    if nbytes > available:
        raise UserError(
            f"--buffer-size {args.buffer_size:,}: the replay buffer needs {nbytes / 2**30:.1f} GiB, but this "
            f"machine has {available / 2**30:.1f} GiB of memory available: at most "
            f"{args.buffer_size * available // nbytes:,} fit."
        )
    runs_dir = Path(args.runs_dir).absolute()
    disk = shutil.disk_usage(next(p for p in (runs_dir, *runs_dir.parents) if p.exists())).free  # the folder, or above
    if args.save_buffer and 2 * nbytes > disk:
        raise UserError(
            f"--buffer-size {args.buffer_size:,} needs {2 * nbytes / 2**30:.1f} GiB of disk with --save-buffer, "
            f"but {runs_dir} has {disk / 2**30:.1f} GiB free: lower --buffer-size."
        )
    return nbytes


# --- end shared: sac-run ---


# --- shared: continuous ---
def eval_env(env_id: str, video_dir: Optional[str] = None) -> gym.Env:
    """The env evaluation plays on (env 0's, recording a video into video_dir if given)."""
    return make_env(env_id, 0, video_dir is not None, video_dir or "")()


def evaluate(policy: nn.Module, env: gym.Env, episodes: int, seed: int, report: Callable = lambda index, ret: None) -> list:
    """The returns of `episodes` episodes of `policy` (the script's Policy: a batch of observations -> their actions)
    on `env`, seeded seed, seed + 1, ...; `report` hears of each (index, return). Closes env."""
    device, returns = next(policy.parameters()).device, []
    for episode in range(episodes):
        (obs, _), done, total = env.reset(seed=seed + episode), False, 0.0
        while not done:
            with torch.inference_mode():
                action = policy(torch.as_tensor(np.asarray(obs), device=device).unsqueeze(0))[0].cpu().numpy()
            obs, reward, terminated, truncated, _ = env.step(action)
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
        report(episode, total)
    env.close()
    return returns


def probe_env(env_id: str, render: bool = False) -> tuple[dict, gym.spaces.Box]:
    """Make the env once, before anything starts: it must exist and act in a bounded continuous (Box) space. Returns
    (its shapes, that space). MuJoCo's warnings quieted; a run that renders without a display does it through EGL."""
    if render and not os.environ.get("DISPLAY"):  # only then: MuJoCo told to use EGL fails at import where it is missing
        os.environ.setdefault("MUJOCO_GL", "egl")
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # pygame (classic control) draws off-screen, no display asked for
    quiet_mujoco_warnings()
    if re.fullmatch(r"(.+:)?(ALE/.+|.+NoFrameskip-v4)", env_id):  # the ids the Atari scripts take
        raise UserError(f"'{env_id}' is an Atari game: use ppo_atari.py or a2c_atari.py (this one takes continuous actions).")
    try:  # "module:Env-v0" imports module first
        env = gym.wrappers.FlattenObservation(gym.make(env_id))
    except (gym.error.Error, ImportError) as e:
        raise UserError(f"unknown environment id '{env_id}', or it could not be made ({e}).") from None
    env.close()
    space = env.action_space
    if not isinstance(space, gym.spaces.Box) or not (np.isfinite(space.low).all() and np.isfinite(space.high).all()):
        raise UserError(
            f"{env_id}'s action space {space} is not a bounded Box: this script needs continuous actions "
            "within bounds (e.g. Pendulum-v1, HalfCheetah-v4). This project's discrete-action scripts, "
            "ppo_atari.py and a2c_atari.py, take Atari games only."
        )
    return {"obs_shape": list(env.observation_space.shape), "act_shape": list(space.shape)}, space


def quiet_mujoco_warnings() -> None:
    """Hide MuJoCo 4's `settotalmass` warning at each -v4 load and gymnasium's "-v4 is out of date"; keep the rest."""
    warnings.filterwarnings("ignore", message=r".*The environment .* is out of date.*")
    try:
        import mujoco
    except ImportError:
        return
    except AttributeError as e:  # PyOpenGL's failure where MUJOCO_GL=egl (ours or the user's) and libEGL is missing
        raise UserError(f"MuJoCo's EGL needs libEGL ({e}): install libegl1, or unset MUJOCO_GL and drop --capture-video.")
    mujoco.set_mju_user_warning(lambda m: None if "settotalmass" in m else print(f"MuJoCo warning: {m}", file=sys.stderr))


# --- end shared: continuous ---


# --- shared: plumbing ---
# Flags a --resume command may change; every other flag keeps the checkpoint's value (given anew, it must equal it).
RESUME_OVERRIDABLE = set(
    "total_timesteps track wandb_project_name wandb_entity capture_video save_model runs_dir checkpoint_interval resume"
    " keep_checkpoints eval_episodes eval_interval keep_best progress cuda torch_threads save_buffer log_interval async_envs"
    " num_rollout_workers envs_per_worker weight_sync_interval worker_batch_steps ray_address pause_learner".split()
)
LEARNING_RATES = ("learning_rate", "policy_lr", "q_lr")  # named when a NaN stops a run
CHECKPOINT = re.compile(r"(step|interrupted|final)_(\d{10})\.pt")  # the names runs write; no other file is pruned
# The rule each numeric flag must meet (rule: the flags it applies to): the run flags' here, each script's in FLAG_RULES.
RULES = {">= 0": lambda v: v >= 0, "> 0": lambda v: v > 0, ">= 1": lambda v: v >= 1, "in [0, 1]": lambda v: 0 <= v <= 1}
RULES |= {"in (0, 1]": lambda v: 0 < v <= 1, "in [0, 1)": lambda v: 0 <= v < 1}
RUN_RULES = {">= 0": "seed torch_threads checkpoint_interval eval_interval", ">= 1": "keep_checkpoints eval_episodes"}


class UserError(Exception):
    """A problem with the user's input (flags, env, checkpoint, an edit the loop cannot serve): one paragraph, exit 2."""


def run_cli(main: Callable[[], None]) -> None:
    """Run main() inside the one boundary: whatever it raises (bad input, the user's env or edited network, a library)
    becomes one paragraph naming the user's file and line, exit code 2; Ctrl-C / SIGTERM before the first iteration ends,
    exit 130. A run that fails or stops before its first iteration ends takes what it made (folders, files) with it."""
    for sig in (signal.SIGINT, signal.SIGTERM):  # before anything is written: a signal at start-up cleans up too
        signal.signal(sig, Run.on_signal)
    try:
        main()
    except (Exception, KeyboardInterrupt) as e:
        with suppress(AttributeError):  # no run, or no writer yet; else its thread would write into a folder removed here
            Run.current.writer.close()
        for folder, before in Run.unstarted:
            for path in set(folder.iterdir()) - before if before else [folder]:
                shutil.rmtree(path) if path.is_dir() else path.unlink()
        if isinstance(e, KeyboardInterrupt):
            print("interrupted before the first iteration ended: the run left nothing behind.", file=sys.stderr)
            sys.exit(130)
        message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        libraries = (os.path.dirname(os.__file__), os.path.dirname(os.path.dirname(np.__file__)), "<")  # stdlib, site
        frames = [f for f in traceback.extract_tb(e.__traceback__) if not f.filename.startswith(libraries)]  # the user's
        if not isinstance(e, UserError) and frames:
            message += (
                f" ({type(e).__name__} at line {frames[-1].lineno} of {Path(frames[-1].filename).name}: `{frames[-1].line}`)"
            )
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def check_flags(args, rules: dict) -> None:
    """Every flag named in RUN_RULES and `rules` against its rule (None passes), and --exp-name, which names a folder."""
    for rule, names in [*RUN_RULES.items(), *rules.items()]:
        for name in names.split():
            if (value := getattr(args, name)) is not None and not RULES[rule](value):
                raise UserError(f"--{name.replace('_', '-')} must be {rule}, not {value}.")
    if args.exp_name in ("", ".", "..") or Path(args.exp_name).name != args.exp_name:
        raise UserError(f"--exp-name '{args.exp_name}' must be a plain name, not a path: it names the run's folder.")
    if len(args.exp_name.encode()) > 200:  # a folder name holds 255 bytes, with the env id, seed and time beside it
        raise UserError(f"--exp-name is {len(args.exp_name.encode())} bytes long: it names the run's folder; at most 200.")


def parse_command_line(cls):
    """(args, the --resume checkpoint or None, device). tyro checks each flag (Args.__post_init__); with --resume the
    checkpoint's args are tyro's defaults: a flag left out keeps the run's value, and only RESUME_OVERRIDABLE may change."""
    before = argparse.ArgumentParser(add_help=False)  # --resume first: its checkpoint holds the other flags' defaults
    before.add_argument("--resume")
    args, ckpt, resume = None, None, before.parse_known_args()[0].resume
    if resume:
        ckpt = load_checkpoint(resume, "--resume")
        check_checkpoint_matches(ckpt, resume, SCRIPT_NAME)  # another script's: refused before any flag check
        saved = {f.name: ckpt["args"][f.name] for f in dataclasses.fields(cls) if f.init and f.name in ckpt["args"]}
        saved.pop("runs_dir", None)  # a checkpoint never chooses a path: a new run folder goes under this --runs-dir
        if ":" in str(saved.get("env_id")) and not any(word.startswith("--env-id") for word in sys.argv):
            raise UserError(f"checkpoint '{resume}' names an env that imports a module: give --env-id to allow it.")
        args = tyro.cli(cls, default=cls(**saved))
        args.__post_init__()  # why again: tyro copies the derived fields (init=False) from the default, not recomputed
        for name in saved.keys() - RESUME_OVERRIDABLE:
            if getattr(args, name) != saved[name]:
                raise UserError(
                    f"--{name.replace('_', '-')} {getattr(args, name)} conflicts with the checkpoint, which was trained with "
                    f"{saved[name]}: a resumed run keeps it. Drop the flag, or start a new run."
                )
    args = args or tyro.cli(cls)
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    offline = os.environ.get("WANDB_MODE", "").lower() in ("offline", "disabled", "dryrun")
    logged_in = os.environ.get("WANDB_API_KEY") or netrc.is_file() and "api.wandb.ai" in netrc.read_text(errors="replace")
    if args.track and not (offline or logged_in):  # never wait at wandb's login prompt
        raise UserError("--track needs wandb credentials: run `wandb login`, set WANDB_API_KEY, or set WANDB_MODE=offline.")
    # 0: a thread per usable core; runs sharing a machine must split them, or slow each other severalfold
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()  # taskset, cgroups
    torch.set_num_threads(args.torch_threads or cores)
    return args, ckpt, torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")


def check_checkpoint_matches(ckpt: dict, path: str, script: str, shapes: Optional[dict] = None) -> None:
    """Refuse a checkpoint of another script, or one made for an env of other shapes (`shapes`: name -> value)."""
    if ckpt["script"] != script:
        raise UserError(f"checkpoint '{path}' was written by {ckpt['script']}.py, not {script}.py.")
    if shapes is not None and (saved := {k: ckpt.get(k) for k in shapes}) != shapes:
        saved, shapes = ({k: tuple(v) if isinstance(v, list) else v for k, v in d.items()} for d in (saved, shapes))
        raise UserError(f"checkpoint '{path}' was made for an env of {saved}, which does not fit this env's {shapes}.")


class Run:
    """A run's folder, args.json, TensorBoard (and wandb), progress, Ctrl-C, timings, evaluation (`run.play(episodes,
    video_dir) -> returns`, set by the script) and checkpoints: the loop state, attach()'s parts, torch's RNG."""

    unstarted = []  # (folder, what it held) while the first iteration runs: run_cli removes what a failure added
    current = None  # the run signals act on (Run.on_signal)

    def __init__(self, args, script: str, ckpt: Optional[dict], shapes: dict, log_every: int):
        self.args, self.script, self.ckpt, self.shapes, self.log_every = args, script, ckpt, shapes, log_every
        self.dir, runs_dir = None, Path(args.runs_dir)
        if ckpt is not None:
            check_checkpoint_matches(ckpt, args.resume, script, shapes)
            if ckpt["iteration"] >= args.num_iterations:
                raise UserError(
                    f"checkpoint '{args.resume}' is at step {ckpt['global_step']}, the end of --total-timesteps "
                    f"{args.total_timesteps}: nothing left to do. Raise --total-timesteps."
                )
            self.dir = resume_folder(args, ckpt)
        env_name = args.env_id.replace("/", "-").replace(":", "-")
        base = ckpt["run_name"] if ckpt else f"{env_name}__{args.exp_name}__{args.seed}__{int(time.time())}"
        made = [folder for folder in (runs_dir, *runs_dir.absolute().parents) if not folder.exists()]  # --runs-dir creates
        try:
            for n in range(1, 1000) if self.dir is None else ():  # exclusively: runs started in the same second get two
                runs_dir.mkdir(parents=True, exist_ok=True)
                self.dir = runs_dir / (base if n == 1 else f"{base}-{n}")
                with suppress(FileExistsError):
                    self.dir.mkdir()
                    break
        except OSError as e:  # the first write of the run: what stops it is said once, here
            raise UserError(f"--runs-dir '{args.runs_dir}' cannot hold run folders: {e.strerror} ('{e.filename}').") from None
        self.name, self.ckpt_dir, in_place = self.dir.name, self.dir / "checkpoints", (self.dir / "args.json").exists()
        Run.unstarted.append((self.dir, set(self.dir.iterdir())) if in_place else ((made or [self.dir])[-1], None))
        Run.current = self
        if not in_place:  # a run resumed in its folder keeps the first start's args.json and hyperparameter table
            compute = {"device": "cuda" if torch.cuda.is_available() and args.cuda else "cpu"}
            compute["torch_threads"] = torch.get_num_threads()
            (self.dir / "args.json").write_text(json.dumps({**dataclasses.asdict(args), "compute": compute}, indent=2))
        self.lock = open(self.dir / "args.json")  # one writer per run folder: this lock is held until the run ends
        try:
            fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # the holder's pid, from /proc/locks: "1: FLOCK ADVISORY WRITE <pid> <dev>:<inode> 0 EOF"
            locks = Path("/proc/locks").read_text() if sys.platform == "linux" else ""
            pid = re.findall(rf"FLOCK +\w+ +\w+ +(\d+) \S+:{os.fstat(self.lock.fileno()).st_ino} ", locks) or ["unknown"]
            raise UserError(f"run folder '{self.dir}' is being written by process {pid[0]}: resume once it ends.") from None
        if args.track:  # wandb mirrors the TensorBoard scalars: initialized before the writer
            import wandb

            # save=False: wandb reads the event files without copying them into its folder, inside the watched one
            wandb.tensorboard.patch(root_logdir=str(self.dir), save=False)  # (a copy it then synced again, and so on)
            tracking = {"project": args.wandb_project_name, "entity": args.wandb_entity, "config": vars(args)}
            wandb.init(**tracking, name=self.name, dir=str(self.dir), save_code=True)
        from torch.utils.tensorboard import SummaryWriter

        # on resume, purge_step hides events logged after the checkpoint: one continuous curve
        self.writer = SummaryWriter(str(self.dir), purge_step=ckpt["global_step"] + 1 if in_place else None)
        if not in_place:
            table = [f"|{name}|{value}|" for name, value in vars(args).items()]
            self.writer.add_text("hyperparameters", "\n".join(["|param|value|", "|-|-|", *table]))
        print(f"run: {self.dir}" + (f" (resumed from {args.resume})" if ckpt else ""))
        self.recent_returns, self.phase_time = [], {}  # the last 10 episodes' returns; seconds per run.timer phase
        self.state, self.parts, self.closing, self.play, self.line = None, {}, None, None, ""
        self.stop_requested = self.evaluating = self.stopped = self.last = False
        self.best_path, self.best_step = self.ckpt_dir / "best.pt", None
        self.best_score = float(ckpt["run_state"]["best_score"]) if in_place else -math.inf

    def attach(self, state, envs, **parts) -> None:
        """Register what a checkpoint holds and what to close at the end; on --resume, load it all."""
        self.state, self.closing, self.parts = state, envs, parts
        if self.ckpt is None:
            return
        for name, part in parts.items():
            try:  # an edited network (a layer, a width) no longer fits the checkpoint's weights
                getattr(part, "load_state_dict", lambda saved: load_plain(part, saved, name))(self.ckpt[name])
            except Exception as e:  # whatever the part raises: the checkpoint is input, never trusted
                raise UserError(
                    f"checkpoint '{self.args.resume}' does not fit this script's {name} ({str(e).splitlines()[-1].strip()}): "
                    "the script changed since it was saved. Resume with the script as it was, or start a new run."
                ) from None
        if not (exact := all(getattr(part, "exact", True) for part in parts.values())):
            print(f"warning: {self.args.env_id}'s simulator state cannot be captured; its envs restart from a reset.")
        load_plain(state, self.ckpt["run_state"], "run_state", exact)
        self.recent_returns = list(self.ckpt["run_state"]["recent_returns"])
        torch.set_rng_state(self.ckpt["rng_states"]["torch"])

    def iterations(self, state, num_iterations: int):
        """The iteration numbers; after each, what is due: logs, evaluation, checkpoints, a stop (a signal, `run.last`)."""
        for sig in (signal.SIGINT, signal.SIGTERM):  # again: ray.init replaces SIGTERM's
            signal.signal(sig, Run.on_signal)
        self.start_time, self.start_step, last_print, window_start = time.time(), state.global_step, 0.0, time.monotonic()
        self.window_step = saved_step = evaluated_step = state.global_step
        for iteration in range(state.iteration + 1, num_iterations + 1):
            state.iteration = iteration
            yield iteration
            Run.unstarted.clear()  # the first iteration ended: a failure from now on keeps the run's folder
            step, window = state.global_step, state.global_step - self.window_step
            if self.log_due():
                sps = (step - self.start_step) / (time.time() - self.start_time)
                self.writer.add_scalar("charts/SPS", sps, step)
                for phase, seconds in self.phase_time.items() if window > 0 else ():  # a stop's window may have no step
                    self.writer.add_scalar(f"charts/{phase}_us_per_step", seconds / window * 1e6, step)
                left = int((self.args.total_timesteps - step) * (time.monotonic() - window_start) / max(window, 1))
                self.phase_time, self.window_step, window_start = dict.fromkeys(self.phase_time, 0.0), step, time.monotonic()
                ret = f"{np.mean(self.recent_returns):.1f}" if self.recent_returns else "n/a"
                eta = f"{left // 3600}:{left % 3600 // 60:02d}:{left % 60:02d}"  # at the last window's speed
                self.line = f"step {step:,}/{self.args.total_timesteps:,} | {sps:.0f} SPS | return (last 10) {ret} | ETA {eta}"
                tty = sys.stdout.isatty()  # a terminal: one line, rewritten; else a line every 30 s and the last one
                if self.args.progress and (tty or time.monotonic() - last_print >= 30):
                    print(f"\r{self.line}" if tty else self.line, end="" if tty else "\n", flush=True)
                    last_print, self.line = time.monotonic(), self.line if tty else ""
            if self.play is not None and due(step, evaluated_step, self.args.eval_interval):
                self.evaluated(self.play(self.args.eval_episodes))
                evaluated_step = step
            if due(step, saved_step, self.args.checkpoint_interval):
                self.offer_best()  # before the save: the checkpoint holds the best score
                self.save("step")
                saved_step = step
            if self.stop_requested or self.last:
                self.stopped = self.stop_requested
                break
        if self.args.progress and self.line:
            print("" if sys.stdout.isatty() else self.line, flush=True)

    @staticmethod
    def on_signal(signum, frame) -> None:
        """Ctrl-C / SIGTERM: before the first iteration ends, or during the final evaluation, interrupt at once (run_cli
        cleans up; finish saves); else stop after this iteration and save. Repeated signals change nothing: the save runs."""
        if Run.unstarted or Run.current is None or Run.current.evaluating:
            for sig in (signal.SIGINT, signal.SIGTERM):  # once: the clean-up or the save that follows runs to its end
                signal.signal(sig, signal.SIG_IGN)
            raise KeyboardInterrupt
        Run.current.stop_requested = True

    def log_due(self) -> bool:
        """Does this iteration end a log window (a multiple of log_every passed, the last iteration, a stop)?"""
        last = self.state.iteration == self.args.num_iterations or self.last or self.stop_requested
        return last or due(self.state.global_step, self.window_step, self.log_every)

    @contextmanager
    def timer(self, phase: str):
        """Time a phase of the loop; logged per env step as charts/<phase>_us_per_step at the end of each log window."""
        start = time.perf_counter()
        yield
        self.phase_time[phase] = self.phase_time.get(phase, 0.0) + time.perf_counter() - start

    def log(self, step: int, scalars: dict) -> None:
        """Log an update's metrics; a NaN / Inf stops the run (explained variance may be NaN: all returns equal)."""
        for tag, value in scalars.items():
            if not math.isfinite(value) and tag != "losses/explained_variance":
                self.non_finite(f"{tag} ({value})")
            self.writer.add_scalar(tag, value, step)

    def episode(self, episode_return: float, length: int, step: int) -> None:
        """A finished episode: its true return and length, at the global step at which it ended."""
        if not math.isfinite(episode_return):
            self.non_finite(f"an episode's return ({episode_return})")
        self.writer.add_scalar("charts/episodic_return", episode_return, step)
        self.writer.add_scalar("charts/episodic_length", length, step)
        self.recent_returns = (self.recent_returns + [float(episode_return)])[-10:]

    def checkpoint(self, best: bool = False) -> dict:
        """The checkpoint as plain data (best.pt: a copy, without the parts that `holds_replay_buffer`); never a NaN weight."""
        state = {"format": 1, "script": self.script, "run_name": self.name, "args": dataclasses.asdict(self.args)}
        state |= {"global_step": self.state.global_step, "iteration": self.state.iteration, **self.shapes}
        for name, part in self.parts.items():
            if getattr(part, "holds_replay_buffer", False):
                state[name] = None if best else part.state_dict()
                continue
            state[name] = part.state_dict() if hasattr(part, "state_dict") else to_plain(part)
            if any(t.is_floating_point() and not t.isfinite().all() for t in tensors_in(state[name])):
                self.non_finite(f"{name}'s weights, about to be saved")
        state["run_state"] = {**to_plain(self.state), "recent_returns": self.recent_returns, "best_score": self.best_score}
        state["rng_states"] = {"torch": torch.get_rng_state()}  # the scripts draw every random number from torch or the envs
        return copy.deepcopy(state) if best else state

    def save(self, kind: str) -> Path:
        """Write `<kind>_<step>.pt`; it supersedes older interrupted ones and periodic ones past --keep-checkpoints."""
        path = self.ckpt_dir / f"{kind}_{self.state.global_step:010d}.pt"
        save_checkpoint(self.checkpoint(), path)
        periodic = sorted(p for p in self.ckpt_dir.glob("step_*.pt") if CHECKPOINT.fullmatch(p.name))  # zero-padded
        for old in periodic[: -self.args.keep_checkpoints] + sorted(set(self.ckpt_dir.glob("interrupted_*.pt")) - {path}):
            old.unlink()
        return path

    def evaluated(self, returns: list) -> None:
        """An evaluation's returns, logged now and offered to --keep-best."""
        self.writer.add_scalar("eval/episodic_return", float(np.mean(returns)), self.state.global_step)
        self.offer_best(float(np.mean(returns)))

    def offer_best(self, score: Optional[float] = None) -> None:
        """--keep-best: best.pt holds the agent of the best evaluation return so far; where evaluation is off (score None),
        of the best mean of the last 10 training episodes, offered at each checkpoint and at the end."""
        step, tag = self.state.global_step, "eval/best_return" if score is not None else "charts/best_training_return"
        if not self.args.keep_best:
            return
        if score is None:  # training returns: only where evaluation is off, an episode has ended, and once per step
            if self.args.eval_interval or not self.recent_returns or step == self.best_step:
                return
            score = float(np.mean(self.recent_returns))
        if self.best_path.is_file():  # compared with best.pt as it is on disk now (an older checkpoint's resume may lag it)
            self.best_score = max(self.best_score, float(load_checkpoint(str(self.best_path))["run_state"]["best_score"]))
        if score > self.best_score:
            self.best_score, state = score, self.checkpoint(best=True)
            state["run_state"]["best_score"] = score
            save_checkpoint(state, self.best_path)
        self.best_step = step
        self.writer.add_scalar(tag, self.best_score, step)

    def finish(self) -> None:
        """Stopped by a signal: save, say how to resume, exit 130; else (--save-model) evaluate, then save. Closes the run.
        A signal during the final evaluation ends it: the final checkpoint is saved, unevaluated, and the exit code is 130."""
        if self.stopped:
            path = self.save("interrupted")
            print(
                f"interrupted: saved step {self.state.global_step} to {path}\nresume with: {resume_command(path)}",
                file=sys.stderr,
            )
            self.close()
            sys.exit(130)
        self.offer_best()
        if self.args.save_model and self.play is not None:
            self.evaluating = True
            with suppress(KeyboardInterrupt):
                returns = self.play(self.args.eval_episodes, self.dir / "videos" / "eval" if self.args.capture_video else None)
                self.evaluated(returns)
                print(f"eval: {np.mean(returns):.2f} +- {np.std(returns):.2f} over {len(returns)} episodes")
                self.evaluating = False  # not reached if interrupted
            self.stopped, self.evaluating = self.evaluating, False
        if self.args.save_model:
            print(f"model saved to {self.save('final')}")
        self.close()
        if self.stopped:
            print("interrupted during the final evaluation: the final checkpoint is saved, unevaluated.", file=sys.stderr)
            sys.exit(130)

    def non_finite(self, quantity: str) -> None:
        """Stop on the first NaN / Inf, saving nothing: one paragraph (what, when, likely causes, how to resume), exit 3."""
        ours = [p for p in self.ckpt_dir.glob("*.pt") if CHECKPOINT.fullmatch(p.name)]  # as save and resume_folder read them
        newest = max(ours, key=lambda p: p.stat().st_mtime, default=None)
        rates = ", ".join(f"--{f.replace('_', '-')} {getattr(self.args, f)}" for f in LEARNING_RATES if hasattr(self.args, f))
        resume = (
            f"The newest checkpoint from before it, {newest}, is untouched: resume it with `{resume_command(newest)}`."
            if newest
            else "No checkpoint was written before it."
        )
        print(
            f"error: non-finite value (NaN or Inf) in {quantity} at env step {self.state.global_step} (iteration "
            f"{self.state.iteration}): the run stopped and saved nothing of this state. Likely cause: a step too large "
            f"for these settings ({rates}; a lower learning rate or normalization usually helps), or the environment "
            f"({self.args.env_id}) returning NaN / Inf. {resume}",
            file=sys.stderr,
        )
        self.close()
        sys.exit(3)

    def close(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):  # the run is over: a late signal must not kill the process's exit
            signal.signal(sig, signal.SIG_IGN)  # (at exit, Python would put back the default handler, which kills)
        self.writer.close()
        self.lock.close()  # the run folder is free for a resume
        if self.closing is not None:
            self.closing.close()  # the envs: a video being recorded is written now
        if self.args.track:
            wandb = sys.modules["wandb"]  # imported by __init__
            for video in sorted((self.dir / "videos").rglob("*.mp4")):  # as media: wandb's gym hook predates gymnasium 1.x
                wandb.log({"videos": wandb.Video(str(video))})
            wandb.finish()


def resume_folder(args, ckpt: dict) -> Optional[Path]:
    """The checkpoint's run folder; None (a new one under --runs-dir) if it is none, is not writable, or has later ones."""
    folder, step = Path(args.resume).resolve().parent, ckpt["global_step"]
    later = sorted(p.name for p in folder.glob("*.pt") if CHECKPOINT.fullmatch(p.name) and int(p.stem[-10:]) > step)
    if folder.name != "checkpoints" or not (folder.parent / "args.json").is_file():
        why = "is not in a run folder"
    elif not all(os.access(f, os.W_OK | os.X_OK) for f in (folder, folder.parent)):
        why = "sits in a run folder this user cannot write"
    elif later:
        why = f"is older than checkpoints saved later in its folder ({', '.join(later)}), which stay as they are"
    else:
        return folder.parent
    print(f"note: '{args.resume}' {why}: the resumed run writes into a new run folder under '{args.runs_dir}'.")
    return None


def to_plain(obj) -> dict:
    """An object's attributes as plain data that loads with weights_only=True (numpy arrays and scalars: tensors; copies)."""
    plain = {}
    for name, value in vars(obj).items():
        if isinstance(value, (np.ndarray, np.generic)):
            value = torch.from_numpy(np.array(value))
        plain[name] = value.detach().cpu().clone() if isinstance(value, torch.Tensor) else value
    return plain


def load_plain(obj, saved: dict, name: str, env_exact: bool = True) -> None:
    """Set attributes from to_plain's dict `saved` (the checkpoint's `name`); fields marked {"env": True} stay as they are
    unless env_exact. A checkpoint is input: each value must be of its attribute's kind (an array's: a tensor, its shape)."""
    if not isinstance(saved, dict):
        raise UserError(f"checkpoint field {name} is a {type(saved).__name__}, not what this script saves there (a dict).")
    env_fields = {f.name for f in dataclasses.fields(obj) if f.metadata.get("env")} if dataclasses.is_dataclass(obj) else set()
    for key, current in vars(obj).items():
        if key not in saved or key in env_fields and not env_exact:
            continue
        value, array = saved[key], isinstance(current, (np.ndarray, np.generic))
        if array or torch.is_tensor(current):  # a tensor's shape may change (a sum's), an array's may not
            fits = torch.is_tensor(value) and (not array or tuple(value.shape) == np.shape(current))
        else:
            fits = current is None or isinstance(value, (int, float) if type(current) in (int, float) else type(current))
        if not fits:
            got = f"{type(value).__name__} {tuple(getattr(value, 'shape', ()))}"
            raise UserError(
                f"checkpoint field {name}.{key} ({got}) is not what this script saves there: it is damaged or edited."
            )
        if array:
            value = value.numpy().astype(current.dtype)
        setattr(obj, key, value.to(current.device) if torch.is_tensor(current) else value)


def tensors_in(obj):
    """Every tensor in a checkpoint part: nested dicts, lists and tuples of tensors."""
    if isinstance(obj, torch.Tensor):
        yield obj
    for value in obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ():
        yield from tensors_in(value)


def resume_command(checkpoint: Path) -> str:
    """What resumes from `checkpoint`, pasted in this shell: this Python, this script, --resume (paths quoted)."""
    path = Path(__file__).resolve()
    path = os.path.relpath(path) if path.is_relative_to(Path.cwd()) else str(path)
    return f"{shlex.quote(sys.executable)} {shlex.quote(path)} --resume {shlex.quote(str(checkpoint))}"


def save_checkpoint(state: dict, path: Path) -> None:
    """Atomically (a temporary file, fsync, rename): a crash mid-write never leaves a truncated checkpoint. The folder has
    one writer (the run's lock): a temporary file found there is a save killed mid-write, removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(".*.pt.*.tmp"):
        stale.unlink()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load_checkpoint(path: str, what: str = "checkpoint") -> dict:
    """Load with weights_only=True: plain tensors and Python data, never arbitrary pickled objects."""
    if not os.path.isfile(path):
        raise UserError(f"{what} '{path}' " + ("is a folder, not a file." if os.path.isdir(path) else "does not exist."))
    try:  # why the CPU: RNG and env states must be CPU tensors; modules copy their weights to their own device
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types here (pickle, zip, EOF, RuntimeError): report all the same way
        raise UserError(
            f"checkpoint '{path}' could not be read: it is corrupt or not a checkpoint ({type(e).__name__})."
        ) from None
    found, kinds = state if isinstance(state, dict) else {}, {"script": str, "args": dict, "run_name": str, "global_step": int}
    kinds |= {"iteration": int, "run_state": dict, "rng_states": dict}  # what Run.checkpoint writes and --resume reads
    if found.get("script") == SCRIPT_NAME:  # what this script reads (another script's checkpoint is refused later)
        kinds |= {"run_state.recent_returns": list, "run_state.best_score": float, "rng_states.torch": torch.Tensor}
        hints = get_type_hints(Args)  # and each flag of Args's type
        kinds |= {f"args.{f.name}": hints[f.name] for f in dataclasses.fields(Args) if f.init and f.name in found["args"]}
    bad = [f"{key} ({getattr(kind, '__name__', kind)})" for key, kind in kinds.items() if not of_type(found, key, kind)]
    if bad or found["run_name"] in ("", ".", "..") or Path(found["run_name"]).name != found["run_name"]:  # names a folder
        bad = bad or [f"run_name ({found['run_name']!r} is not a plain folder name)"]
        raise UserError(f"'{path}' is not a checkpoint written by these scripts: {', '.join(bad)} missing or of another type.")
    for key, part in state.items():  # NaN / Inf weights: the run that saved them had diverged (the NaN stop's exit code)
        if any(t.is_floating_point() and not t.isfinite().all() for t in tensors_in(part)):
            print(f"error: non-finite value (NaN or Inf) in checkpoint '{path}' ({key}): use an earlier one.", file=sys.stderr)
            sys.exit(3)
    return state


def of_type(data: dict, key: str, kind) -> bool:
    """Is data's value at the dotted `key` of `kind` (a type, or Optional[type]; an int passes as a float)?"""
    for part in key.split("."):
        data = data.get(part, ...) if isinstance(data, dict) else ...
    kinds = tuple(k for k in get_args(kind) or (kind,) if isinstance(k, type))  # Optional[float]: float, NoneType
    return not kinds or isinstance(data, kinds + ((int,) if float in kinds else ())) and data is not ...


def due(step: int, last_step: int, every: int) -> bool:
    """Has a multiple of `every` (> 0) been passed since last_step?"""
    return every > 0 and step // every > last_step // every


def seed_everything(seed: int, torch_deterministic: bool) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.backends.cudnn.deterministic = torch_deterministic


# --- end shared: plumbing ---


if __name__ == "__main__":
    run_cli(main)
