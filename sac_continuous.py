"""Soft Actor-Critic (SAC) for continuous actions (MuJoCo, classic control), in one file.

Map of this file, top to bottom:
  Args            algorithm flags, then run flags (`python sac_continuous.py --help` lists them)
  make_env        one gymnasium env; episode statistics are kept in the loop, visibly
  Actor, TwinQ    the tanh-squashed Gaussian policy and the two soft Q-networks; its log-density; the soft-Q target
  ReplayBuffer    transitions (s, a, r, s', terminated); Learner: its updates, Polyak; gradient_step: their schedule
  rollout         act through the Actor module, step the envs, keep the true final observation at an auto-reset
  main()          set-up, then the loop: act -> store -> sample a batch -> update -> log, then finish
  # === Plumbing  runs, checkpoints, errors, progress, evaluation, the parameter holder, --bf16, the speed set-up
The `shared: sac-*` blocks are the parts sac_continuous_ray.py distributes; it carries them verbatim. Runs on
gymnasium 1.x: at an auto-reset the true final observation is stored, and only a termination (never a time-limit
truncation) stops bootstrapping. Docs: docs/sac_continuous.md; the algorithm: https://arxiv.org/abs/1812.05905
"""

import atexit
import copy
import ctypes
import dataclasses
import gc
import importlib
import json
import math
import os
import random
import signal
import sys
import tempfile
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro

SCRIPT_NAME = "sac_continuous"  # written into checkpoints; a checkpoint of another script is refused


@dataclass
class Args:
    """SAC for continuous actions (MuJoCo, classic control): trains an agent and logs to TensorBoard.

    Modes:  --resume CKPT             continue the run of checkpoint CKPT
            --eval-checkpoint CKPT    play checkpoint CKPT's agent, no training (see --eval-episodes)
            --export-checkpoint CKPT  write a folder that runs CKPT's agent with plain torch (see --export-dir)"""
    # --- algorithm ---
    env_id: str = "HalfCheetah-v4"  # gymnasium env id with continuous actions (MuJoCo, classic control)
    total_timesteps: int = 1_000_000  # env steps to train for, summed over all envs
    num_envs: int = 1  # envs stepped in parallel, as one vector env (one gradient step per vector step)
    buffer_size: int = 1_000_000  # replay buffer capacity, in transitions
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
    squash_eps: float = 0.0  # floor on tanh's slope in log pi: log(1 - tanh(u)^2 + eps); 0 = exact, 1e-6 = the reference's

    # --- run ---
    exp_name: str = os.path.basename(__file__)[: -len(".py")]  # name of the experiment, part of the run folder's name
    seed: int = 1  # random seed of the run
    torch_deterministic: bool = True  # make cuDNN pick deterministic algorithms (torch.backends.cudnn.deterministic)
    cuda: bool = True  # use the GPU when there is one
    torch_threads: int = 0  # torch's CPU threads; 0 = share this machine's cores among the runs of these scripts on it
    bf16: bool = False  # run the matmuls in bfloat16 (weights, Adam, losses stay float32); needs a CPU with AVX512_BF16 or AMX
    track: bool = False  # log to Weights and Biases too (WANDB_MODE=offline works without network)
    wandb_project_name: str = "onefile-rl"  # wandb project
    wandb_entity: Optional[str] = None  # wandb entity, a team or user (None = your wandb default)
    capture_video: bool = False  # record videos of env 0 under runs/<run>/videos
    save_model: bool = False  # save a final checkpoint at the end of training, then evaluate it
    runs_dir: str = "runs"  # folder with one sub-folder per run (TensorBoard events, checkpoints, videos)
    checkpoint_interval: int = 100_000  # write a checkpoint every N env steps (0 = never; Ctrl-C and --save-model still save)
    keep_checkpoints: int = 3  # how many of the newest periodic checkpoints to keep (the final one is always kept)
    save_buffer: bool = False  # also checkpoint the replay buffer for an exact --resume (large: up to buffer_size transitions)
    resume: Optional[str] = None  # continue the run of this checkpoint (appends to its run folder)
    eval_checkpoint: Optional[str] = None  # play this checkpoint for --eval-episodes episodes, no training
    eval_episodes: int = 10  # episodes per evaluation (every --eval-interval, after --save-model, with --eval-checkpoint)
    eval_interval: int = 0  # every N env steps, play --eval-episodes deterministic episodes on a separate env (0 = never)
    keep_best: bool = False  # keep checkpoints/best.pt: the agent with the best evaluation (else training) return so far
    export_checkpoint: Optional[str] = None  # checkpoint to export as a folder that runs with plain torch (no training)
    export_dir: Optional[str] = None  # folder to export into; None = <run folder>/export/<checkpoint name>
    log_interval: int = 100  # log losses (averaged over the window's gradient steps) and speed every N env steps
    progress: bool = True  # show progress: a one-line display on a terminal, a plain line every 30 s otherwise

    # --- derived from the flags above (not flags themselves) ---
    num_iterations: tyro.conf.Suppress[int] = 0  # the number of vector steps: total_timesteps // num_envs


# --- shared: sac-env ---
def make_env(env_id: str, idx: int, capture_video: bool, video_dir: str) -> Callable[[], gym.Env]:
    """One environment. Episode statistics are kept on the whole batch in the rollout (vectorized, checkpointable),
    not by per-env wrappers. No action clipping: the tanh-squashed actions are always within the bounds."""

    def thunk() -> gym.Env:
        if capture_video and idx == 0:
            env = gym.make(env_id, render_mode="rgb_array")
            env = gym.wrappers.RecordVideo(env, video_dir, disable_logger=True)
        else:
            env = gym.make(env_id)
        return gym.wrappers.FlattenObservation(env)

    return thunk


# --- end shared: sac-env ---


# --- shared: sac-networks ---
HIDDEN = 256
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


class Actor(nn.Module):
    """obs -> 256 -> 256 -> (mean, raw log-std) of a Gaussian over the pre-tanh action u, ReLU MLP."""

    def __init__(self, obs_dim: int, act_dim: int):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(obs_dim, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 2 * act_dim)
        )  # one output layer for mean and log-std: the same function as two heads, one matmul
        self.act_dim = act_dim

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, raw_log_std = self.net(obs).float().split(self.act_dim, dim=-1)  # float32 out, even from bfloat16
        return mean, bounded_log_std(raw_log_std)


class TwinQ(nn.Module):
    """Both soft Q-networks (obs, action) -> 256 -> 256 -> 1 in one module: each weight is stacked along a leading
    axis of size 2 and one batched matmul (baddbmm) evaluates both critics, a third of the ops of two MLPs. Same
    functions and initialization as two separate nn.Sequential MLPs."""

    def __init__(self, obs_dim: int, act_dim: int):
        super().__init__()
        sizes = [obs_dim + act_dim, HIDDEN, HIDDEN, 1]
        for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:]), 1):
            bound = 1.0 / math.sqrt(fan_in)  # nn.Linear's default initialization: U(-bound, bound), weights and biases
            w = nn.init.uniform_(torch.empty(2, fan_in, fan_out), -bound, bound)  # x @ w + b, per critic
            b = nn.init.uniform_(torch.empty(2, 1, fan_out), -bound, bound)
            self.register_parameter(f"w{i}", nn.Parameter(w))
            self.register_parameter(f"b{i}", nn.Parameter(b))

    def forward(self, obs: torch.Tensor, action: torch.Tensor, params: Optional[list] = None) -> torch.Tensor:
        """Q1 and Q2 as a (2, batch) tensor. `params` (w1, b1, w2, b2, w3, b3) replaces the module's own, e.g. with
        detached copies so that the actor's loss does not backpropagate into the critics' weights."""
        w1, b1, w2, b2, w3, b3 = params if params is not None else self.parameters()
        x = torch.cat([obs, action], -1)
        # ReLU in place: baddbmm's backward needs its inputs, not its output, so no new (2, batch, 256) tensor is due
        h = torch.baddbmm(b1, x.expand(2, *x.shape), w1).relu_()
        h = torch.baddbmm(b2, h, w2).relu_()
        # Output layer in float32, even with --bf16 (.float() is a no-op in float32): Q grows to the hundreds, where a
        # bfloat16 result (8 significant bits) would be off by about the TD error the critics learn from (docs page)
        return torch.baddbmm(b3.float(), h.float(), w3.float()).squeeze(-1)


def bounded_log_std(raw: torch.Tensor) -> torch.Tensor:
    """Squash the network's raw log-std into [LOG_STD_MIN, LOG_STD_MAX] smoothly (tanh), not by clipping."""
    return LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (torch.tanh(raw) + 1)


LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
LOG_2 = math.log(2.0)


def squashed_gaussian(mean: torch.Tensor, log_std: torch.Tensor, noise: torch.Tensor, action_scale: torch.Tensor,
                      action_bias: torch.Tensor, squash_eps: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Reparameterized sample a = tanh(u) * scale + bias, u = mean + std * noise, and its log-density summed over
    action dimensions (change of variables, SAC paper appendix C; tanh's slope floored at eps, 0 = exact: docs page):
        log pi(a|s) = log N(u; mean, std) - sum_i [log scale_i + log(1 - tanh(u_i)^2 + eps)]
        log N(u; mean, std) = sum_i (-noise_i^2 / 2 - log std_i - log sqrt(2 pi))      ((u - mean) / std = noise)
        log(1 - tanh(u)^2) = 2 log 2 - 2 (u + softplus(-2u)),   log(x + eps) = log x + softplus(log eps - log x)
    Finite even where tanh(u) rounds to +-1. Terms without gradient are summed apart (each op costs a backward one)."""
    u = torch.addcmul(mean, log_std.exp(), noise)
    minus_log_slope = 2.0 * (u + nn.functional.softplus(-2.0 * u))  # 2 log 2 - log(1 - tanh(u)^2); 2 log 2 is constant
    if squash_eps > 0.0:  # log(x + eps) = log x + softplus(log eps - log x), with log x = 2 log 2 - minus_log_slope
        minus_log_slope = minus_log_slope - nn.functional.softplus(math.log(squash_eps) - 2.0 * LOG_2 + minus_log_slope)
    through_net = minus_log_slope - log_std
    constant = 0.5 * noise.pow(2).sum(-1) + torch.log(action_scale).sum() + mean.shape[-1] * (LOG_SQRT_2PI + 2.0 * LOG_2)
    return torch.addcmul(action_bias, torch.tanh(u), action_scale), through_net.sum(-1) - constant


def soft_q_target(rewards: torch.Tensor, terminated: torch.Tensor, next_q: torch.Tensor, next_log_prob: torch.Tensor,
                  alpha: torch.Tensor, gamma: float) -> torch.Tensor:  # fmt: skip
    """y = r + gamma * (1 - terminated) * (min(Q1', Q2')(s', a') - alpha * log pi(a'|s')),  a' ~ pi(.|s').
    `next_q` is the target critics' (2, batch) output. Only a termination stops bootstrapping: at a time-limit
    truncation s' is the true final observation and the value beyond it is real."""
    soft_value = next_q.min(0).values - alpha * next_log_prob
    return rewards + gamma * (1.0 - terminated) * soft_value


# --- end shared: sac-networks ---


# --- shared: sac-replay-buffer ---
class ReplayBuffer:
    """Preallocated circular storage of transitions (s, a, r, s': the true next observation, terminated: never a
    truncation), float32. One row per transition holds all five fields, so sampling a batch is one gather of rows;
    `arrays` are numpy views of each field's columns (the rollout writes them), `rows` a torch view of the same memory."""

    FIELDS = ("obs", "next_obs", "actions", "rewards", "terminated")

    def __init__(self, capacity: int, obs_dim: int, act_dim: int):
        self.capacity, self.pos, self.size = capacity, 0, 0
        widths = (obs_dim, obs_dim, act_dim, 0, 0)  # 0: a scalar per transition (reward, done flag), one column
        rows = np.zeros((capacity, 2 * obs_dim + act_dim + 2), np.float32)
        self.columns, start = {}, 0
        for name, width in zip(self.FIELDS, widths):
            self.columns[name] = slice(start, start + width) if width else start
            start += max(width, 1)
        self.arrays = {name: rows[:, column] for name, column in self.columns.items()}
        self.rows = torch.from_numpy(rows)

    @property
    def nbytes(self) -> int:
        return self.rows.numel() * self.rows.element_size()

    def add(self, obs: np.ndarray, next_obs: np.ndarray, actions: np.ndarray, rewards: np.ndarray, terminated: np.ndarray):
        """Store a batch of n transitions (one per env), wrapping around and overwriting the oldest."""
        n = len(rewards)
        idx = (self.pos + np.arange(n)) % self.capacity if self.pos + n > self.capacity else slice(self.pos, self.pos + n)
        for name, value in zip(self.FIELDS, (obs, next_obs, actions, rewards, terminated)):
            self.arrays[name][idx] = value
        self.pos = (self.pos + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def sample(self, batch_size: int, device: torch.device) -> dict:
        """Uniform with replacement over the stored transitions (torch's global RNG: checkpointed, reproducible).
        The fields are column views of one gathered (batch_size, row width) tensor."""
        idx = torch.randint(0, self.size, (batch_size,))
        rows = self.rows.index_select(0, idx).to(device, non_blocking=True)
        return {name: rows[:, column] for name, column in self.columns.items()}

    def state_dict(self) -> dict:
        """The stored part as torch tensors (copies), with the write position: loads with weights_only=True."""
        return {"capacity": self.capacity, "pos": self.pos, "size": self.size,
                **{k: torch.from_numpy(v[: self.size].copy()) for k, v in self.arrays.items()}}  # fmt: skip

    def load_state_dict(self, state: dict) -> None:
        if state["capacity"] != self.capacity:
            raise ValueError(f"buffer capacity {state['capacity']} != {self.capacity}")
        for k in self.FIELDS:
            self.arrays[k][: state["size"]] = state[k].numpy()
        self.pos, self.size = state["pos"], state["size"]


# --- end shared: sac-replay-buffer ---


# --- shared: sac-learner ---
@dataclass
class Learner:
    """Everything the update changes: the networks, their optimizers and the entropy temperature."""

    actor: Actor
    qf: TwinQ  # the two critics
    qf_target: TwinQ  # their slowly following copies, for the target y (soft_update)
    actor_params: list  # the networks' parameters: what each optimizer (and soft_update) moves
    qf_params: list
    qf_target_params: list
    actor_optimizer: torch.optim.Optimizer
    q_optimizer: torch.optim.Optimizer
    log_alpha: torch.Tensor  # log of the entropy temperature; trained only with autotune
    alpha_optimizer: Optional[torch.optim.Optimizer]
    target_entropy: float
    squash_eps: float  # floor on tanh's slope in the log-prob (squashed_gaussian)
    action_scale: torch.Tensor  # (high - low) / 2
    action_bias: torch.Tensor  # (high + low) / 2
    # The networks as the forward and backward passes run them: the three above, or with --bf16 bfloat16 copies of
    # them (bf16_copies, below the banner; the optimizers then step the float32 weights from the copies' gradients).
    actor_run: Callable
    qf_run: Callable
    qf_target_run: Callable
    qf_frozen: list  # detached views of qf_run's weights: the actor's loss reads the critics through them

    def alpha(self) -> torch.Tensor:
        return self.log_alpha.detach().exp()

    def state_dict(self) -> dict:  # a checkpoint part (Run.attach): learner_state, below the banner
        return learner_state(self)

    def load_state_dict(self, state: dict) -> None:
        load_learner_state(self, state)


def make_learner(obs_dim: int, act_dim: int, low: np.ndarray, high: np.ndarray, args, device: torch.device) -> Learner:
    """The networks (the target critics start equal to the critics), an Adam optimizer for each, the temperature."""
    actor = Actor(obs_dim, act_dim).to(device)
    check_actor(actor, obs_dim, act_dim)  # an edit that broke its sizes stops here, saying what to change (below the banner)
    qf, qf_target = TwinQ(obs_dim, act_dim).to(device), TwinQ(obs_dim, act_dim).to(device)
    qf_target.load_state_dict(qf.state_dict())
    actor_params, qf_params, qf_target_params = list(actor.parameters()), list(qf.parameters()), list(qf_target.parameters())
    fused = device.type in ("cpu", "cuda")  # Adam's fused kernel (one op per step) exists there
    # alpha = 1 at the start with autotune, else args.alpha throughout (0: no entropy term)
    log_alpha_0 = 0.0 if args.autotune else (math.log(args.alpha) if args.alpha > 0 else -math.inf)
    log_alpha = torch.full((1,), log_alpha_0, device=device, requires_grad=args.autotune)
    learner = Learner(
        actor=actor, qf=qf, qf_target=qf_target, actor_params=actor_params, qf_params=qf_params,
        qf_target_params=qf_target_params,
        actor_optimizer=torch.optim.Adam(actor_params, lr=args.policy_lr, fused=fused),
        q_optimizer=torch.optim.Adam(qf_params, lr=args.q_lr, fused=fused),
        log_alpha=log_alpha,
        alpha_optimizer=torch.optim.Adam([log_alpha], lr=args.q_lr, fused=fused) if args.autotune else None,
        target_entropy=-float(act_dim), squash_eps=args.squash_eps,
        action_scale=torch.tensor((high - low) / 2.0, dtype=torch.float32, device=device),
        action_bias=torch.tensor((high + low) / 2.0, dtype=torch.float32, device=device),
        actor_run=actor, qf_run=qf, qf_target_run=qf_target,
        qf_frozen=[p.detach() for p in qf.parameters()],  # views: they follow every update of the critics
    )  # fmt: skip
    if args.bf16:
        bf16_copies(learner)  # speed (below the banner): the passes run through bfloat16 copies of the networks
    return learner


def sample_action(learner: Learner, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """a ~ pi(.|s) (reparameterized: differentiable in the actor's weights) and log pi(a|s)."""
    mean, log_std = learner.actor_run(obs)
    noise = torch.randn_like(mean)
    return squashed_gaussian(mean, log_std, noise, learner.action_scale, learner.action_bias, learner.squash_eps)


def critic_update(learner: Learner, batch: dict, gamma: float) -> torch.Tensor:
    """One gradient step on both critics: L_i = E[(Q_i(s, a) - y)^2], y from soft_q_target (the target critics and
    a fresh a' ~ pi(.|s')). Returns [mean Q1, mean Q2, L1, L2] as a detached tensor (no sync)."""
    with torch.no_grad():
        next_actions, next_log_prob = sample_action(learner, batch["next_obs"])
        next_q = learner.qf_target_run(batch["next_obs"], next_actions)
        y = soft_q_target(batch["rewards"], batch["terminated"], next_q, next_log_prob, learner.alpha(), gamma)
    q = learner.qf_run(batch["obs"], batch["actions"])
    losses = (q - y).pow(2).mean(1)  # (2,): one MSE per critic
    learner.q_optimizer.zero_grad()
    losses.sum().backward()
    learner.q_optimizer.step()
    return torch.cat([q.detach().mean(1), losses.detach()])


def actor_update(learner: Learner, obs: torch.Tensor, autotune: bool) -> torch.Tensor:
    """One gradient step on the actor, then (autotune) on the temperature. Returns [actor loss, alpha, alpha loss].
    L_pi    = E_s[ alpha * log pi(a|s) - min(Q1, Q2)(s, a) ],  a = tanh-squashed reparameterized sample
    L_alpha = E_s[ -alpha * (log pi(a|s) + target_entropy) ]   (log pi detached: only alpha moves)"""
    alpha = learner.alpha()
    actions, log_prob = sample_action(learner, obs)
    # Frozen critics (detached weights): the gradient reaches the action, and through it the actor, not the critics
    q = learner.qf_run(obs, actions, params=learner.qf_frozen).min(0).values
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


def soft_update(target_params: list, params: list, tau: float) -> None:
    """Polyak averaging, in place: theta' <- tau * theta + (1 - tau) * theta'."""
    with torch.no_grad():
        for target, param in zip(target_params, params):
            target.lerp_(param, tau)


def gradient_step(learner: Learner, batch: dict, step: int, args) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Gradient step number `step` (from 1) on one batch: the critics; every policy_frequency steps, policy_frequency
    actor updates (delayed, as TD3, compensated); every target_network_frequency steps, the targets' Polyak step.
    Returns critic_update's metrics and actor_update's summed over this step's actor updates (None: none ran)."""
    critic_metrics, actor_metrics = critic_update(learner, batch, args.gamma), None
    if step % args.policy_frequency == 0:
        actor_metrics = sum(actor_update(learner, batch["obs"], args.autotune) for _ in range(args.policy_frequency))
    if step % args.target_network_frequency == 0:
        soft_update(learner.qf_target_params, learner.qf_params, args.tau)
    return critic_metrics, actor_metrics


# --- end shared: sac-learner ---


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


# --- shared: sac-rollout ---
def policy_actions(obs: np.ndarray, actor: nn.Module, noise, scale, bias) -> np.ndarray:
    """a = tanh(mean + std * noise) * scale + bias for one step's observations: the Actor module itself and
    squashed_gaussian, in float32 without gradients; noise=None gives the deterministic action (noise 0)."""
    with torch.inference_mode():  # no_grad, and no version counters either: a quarter less time on one observation
        mean, log_std = actor(torch.as_tensor(obs, dtype=torch.float32))
        noise = torch.zeros_like(mean) if noise is None else torch.as_tensor(noise, dtype=torch.float32)
        scale, bias = torch.as_tensor(scale, dtype=torch.float32), torch.as_tensor(bias, dtype=torch.float32)
        return squashed_gaussian(mean, log_std, noise, scale, bias)[0].numpy()


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


# --- end shared: sac-rollout ---


@dataclass
class LoopState:
    """What the training loop carries from one vector step to the next; checkpoints save and restore all of it.
    Fields marked "env" describe the envs' running episodes: they are restored only with the envs' exact state."""

    global_step: int = 0
    iteration: int = 0  # the last completed vector step
    raw_obs: np.ndarray = field(default=None, metadata={"env": True})  # what the envs returned last: acted on next
    episode_return: np.ndarray = field(default=None, metadata={"env": True})
    episode_length: np.ndarray = field(default=None, metadata={"env": True})
    updates_start: int = 0  # the first gradient step comes once global_step reaches it
    grad_steps: int = 0
    actor_updates: int = 0  # also the version of the weights the rollout acts with
    loss_sums: Optional[torch.Tensor] = None  # critic_update's [Q1, Q2, L1, L2] summed over the log window's steps
    actor_sums: Optional[torch.Tensor] = None  # actor_update's [actor loss, alpha, alpha loss], over its actor updates
    window_grad_steps: int = 0
    window_actor_updates: int = 0


def main() -> None:
    args, ckpt, device = parse_command_line(Args, RESUME_OVERRIDABLE, FLAG_RULES, validate_args)
    speed_setup()  # speed (below the banner): before torch's first parallel op
    if args.eval_checkpoint or args.export_checkpoint:
        return eval_only(args, device)  # evaluate or export a checkpoint: no training
    # --bf16 only where the CPU has native bfloat16 instructions (else refused); a resumed run keeps its recorded dtype
    args.bf16, compute_note = resolve_bf16(args.bf16, device, cpu_has_native_bf16(), resumed=ckpt is not None)
    args.num_iterations = args.total_timesteps // args.num_envs
    obs_shape, act_shape = probe_env(args.env_id)
    run = Run(args, SCRIPT_NAME, ckpt, {"obs_shape": list(obs_shape), "act_shape": list(act_shape)}, args.log_interval)
    print(compute_note)
    seed_everything(args.seed, args.torch_deterministic)

    # SAME_STEP autoreset: step() returns the next episode's first obs, the finished one's last is in infos["final_obs"]
    # and is stored as next obs. (NEXT_STEP, gymnasium 1.x's default, adds a step per episode whose action is ignored.)
    envs = gym.vector.SyncVectorEnv(
        [make_env(args.env_id, i, args.capture_video, str(run.dir / "videos")) for i in range(args.num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    assert envs.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP, "the loop assumes same-step autoreset"
    obs_dim, act_dim = int(np.prod(obs_shape)), int(np.prod(act_shape))
    action_low, action_high = envs.single_action_space.low, envs.single_action_space.high
    action_scale, action_bias = (action_high - action_low) / 2.0, (action_high + action_low) / 2.0

    learner = make_learner(obs_dim, act_dim, action_low, action_high, args, device)
    holder = ParameterHolder()  # a copy of the actor the rollout acts with, and its version (below the banner)
    buffer = ReplayBuffer(args.buffer_size, obs_dim, act_dim)
    print(f"replay buffer: {args.buffer_size:,} transitions, {buffer.nbytes / 1e6:.1f} MB of arrays "
          f"({buffer.nbytes // args.buffer_size} bytes per transition)")  # fmt: skip

    state = LoopState(raw_obs=envs.reset(seed=args.seed)[0], episode_return=np.zeros(args.num_envs),
                      episode_length=np.zeros(args.num_envs, np.int64), updates_start=args.learning_starts,
                      loss_sums=torch.zeros(4, device=device), actor_sums=torch.zeros(3, device=device))  # fmt: skip
    stored = BufferPart(buffer, args.save_buffer)  # in checkpoints only with --save-buffer (it is large)
    run.attach(state, envs, learner=learner, env_states=EnvStates(envs), replay_buffer=stored)
    if ckpt is not None and not stored.loaded:  # resumed without a buffer: updates pause until it refills
        state.updates_start = refill_before_updating(state.global_step, args.learning_starts)
    holder.publish(learner.actor, state.actor_updates)
    # evaluation: deterministic episodes with the published actor; the Run plays them every --eval-interval env steps
    run.play = lambda episodes, video_dir=None: evaluate(holder.actor, args.env_id, episodes, args.seed + 10_000, video_dir)
    freeze_startup_objects()  # speed (below the banner): everything set up so far lives to the end of the run

    for iteration in run.iterations(state, args.num_iterations):  # between steps: checkpoints, Ctrl-C, progress
        # ---- rollout: act (uniform random before learning_starts), step the envs, store the transitions ----
        with run.timer("rollout"):
            if state.global_step < args.learning_starts:
                # torch's RNG rather than action_space.sample(): one checkpointed generator for everything
                uniform = torch.rand((args.num_envs, act_dim)).numpy()
                actions = (uniform * (action_high - action_low) + action_low).astype(np.float32)
            else:
                noise = torch.randn((args.num_envs, act_dim))
                actions = policy_actions(state.raw_obs, holder.actor, noise, action_scale, action_bias)
            obs = state.raw_obs
            (state.raw_obs, real_next_obs, rewards, terminations, state.episode_return, state.episode_length,
             finished) = env_step(envs, actions, state.episode_return, state.episode_length)
            state.global_step += args.num_envs
            # store terminations, not truncations: a time limit is not a terminal state (next obs = true final obs)
            buffer.add(obs, real_next_obs, actions, rewards, terminations)
            for episode_return, length in finished:
                run.episode(episode_return, length, state.global_step)

        # ---- update: one gradient step per vector step, metrics summed as tensors (no sync) ----
        with run.timer("update"):
            if state.global_step >= max(state.updates_start, 1):
                state.grad_steps += 1
                batch = buffer.sample(args.batch_size, device)
                # the critics; every policy_frequency steps policy_frequency actor updates; the targets' Polyak step
                critic_metrics, actor_metrics = gradient_step(learner, batch, state.grad_steps, args)
                state.loss_sums += critic_metrics
                state.window_grad_steps += 1
                if actor_metrics is not None:
                    state.actor_sums += actor_metrics
                    state.actor_updates += args.policy_frequency
                    state.window_actor_updates += args.policy_frequency
                    holder.publish(learner.actor, state.actor_updates)  # the rollout acts with the new actor

        # ---- log: at the end of each log window (--log-interval env steps), means over its updates; one sync ----
        if run.log_due():
            if state.window_grad_steps > 0:
                q1, q2, loss1, loss2 = (state.loss_sums / state.window_grad_steps).tolist()
                run.log(state.global_step, {"losses/qf1_values": q1, "losses/qf2_values": q2, "losses/qf1_loss": loss1,
                                            "losses/qf2_loss": loss2, "losses/qf_loss": (loss1 + loss2) / 2.0})  # fmt: skip
            if state.window_actor_updates > 0:
                actor_loss, alpha, alpha_loss = (state.actor_sums / state.window_actor_updates).tolist()
                run.log(state.global_step, {"losses/actor_loss": actor_loss, "losses/alpha": alpha})
                if args.autotune:
                    run.log(state.global_step, {"losses/alpha_loss": alpha_loss})
            state.loss_sums.zero_()
            state.actor_sums.zero_()
            state.window_grad_steps = state.window_actor_updates = 0

    run.finish()  # after Ctrl-C: saved, exits; with --save-model: the final agent evaluated (run.play), then saved
    run.close()


# === Plumbing: runs, checkpoints, errors, speed set-up; not needed to follow the algorithm ===
# What follows makes the script a dependable research tool: flag checks, resume, evaluation, env state capture,
# checkpoints, TensorBoard / wandb, progress, Ctrl-C, --bf16's check and copies and the speed set-up. The `shared:` blocks
# are the same text in every script that carries them (tests/test_shared_blocks.py).

# Flags that --resume takes from the command line; every other field comes from the checkpoint.
RESUME_OVERRIDABLE = (
    "total_timesteps", "track", "wandb_project_name", "wandb_entity", "capture_video", "save_model", "runs_dir",
    "checkpoint_interval", "keep_checkpoints", "save_buffer", "resume", "eval_checkpoint", "eval_episodes",
    "eval_interval", "keep_best", "export_checkpoint", "export_dir", "log_interval", "progress", "cuda", "torch_threads",
)  # fmt: skip
# Every numeric flag and the range it must lie in (checked before anything starts; see check_flags)
FLAG_RULES = {
    "total_timesteps": ">= 1", "num_envs": ">= 1", "buffer_size": ">= 1", "gamma": "in [0, 1]", "tau": "in (0, 1]",
    "batch_size": ">= 1", "learning_starts": ">= 0", "policy_lr": "> 0", "q_lr": "> 0", "policy_frequency": ">= 1",
    "target_network_frequency": ">= 1", "alpha": ">= 0", "squash_eps": "in [0, 1)", "seed": ">= 0",
    "torch_threads": ">= 0", "checkpoint_interval": ">= 0", "keep_checkpoints": ">= 1", "eval_episodes": ">= 1",
    "eval_interval": ">= 0", "log_interval": ">= 1",
}  # fmt: skip


def validate_args(args: Args) -> None:
    """What single-flag rules cannot say: sizes that must fit together."""
    if args.total_timesteps < args.num_envs:
        raise UserError(f"total_timesteps ({args.total_timesteps}) is below one vector step (num_envs = {args.num_envs}).")
    if args.learning_starts > args.total_timesteps:
        raise UserError(f"learning_starts ({args.learning_starts}) is above total_timesteps ({args.total_timesteps}): "
                        "no update would run. Lower --learning-starts or raise --total-timesteps.")  # fmt: skip
    if args.batch_size > args.buffer_size:
        raise UserError(f"batch_size ({args.batch_size}) is larger than buffer_size ({args.buffer_size}). "
                        "Lower --batch-size or raise --buffer-size.")  # fmt: skip


def refill_before_updating(global_step: int, learning_starts: int) -> int:
    """A run resumed from a checkpoint without a replay buffer: the step from which updates go on (the buffer starts
    empty and must hold learning_starts new transitions first), said in a warning."""
    start = global_step + learning_starts
    print(f"warning: the checkpoint holds no replay buffer (saved without --save-buffer): the buffer starts empty, and "
          f"updates pause until {learning_starts} new transitions are in it (step {start}). Acting continues with the "
          "trained policy.", file=sys.stderr)  # fmt: skip
    return start


class BufferPart:
    """The replay buffer as a checkpoint part: saved only with --save-buffer (up to buffer_size transitions, large),
    else as None. `loaded` says whether a resumed run found one; without it the buffer starts empty."""

    holds_replay_buffer = True  # never in best.pt (Run.checkpoint)

    def __init__(self, buffer: ReplayBuffer, save: bool):
        self.buffer, self.save, self.loaded = buffer, save, False

    def state_dict(self) -> Optional[dict]:
        return self.buffer.state_dict() if self.save else None

    def load_state_dict(self, state: Optional[dict]) -> None:
        if state is not None:
            self.buffer.load_state_dict(state)
        self.loaded = state is not None


def eval_only(args: Args, device: torch.device) -> None:
    """--eval-checkpoint: deterministic episodes; print and log eval/episodic_return. --export-checkpoint: the
    checkpoint's actor as a folder that runs with plain torch (export_agent)."""
    path = args.eval_checkpoint or args.export_checkpoint
    ckpt = load_checkpoint(path)
    saved = Args(**{f.name: ckpt["args"][f.name] for f in dataclasses.fields(Args) if f.name in ckpt["args"]})
    obs_shape, act_shape = probe_env(saved.env_id)
    check_checkpoint_matches(ckpt, path, SCRIPT_NAME, {"obs_shape": list(obs_shape), "act_shape": list(act_shape)})
    obs_dim, act_dim = int(np.prod(obs_shape)), int(np.prod(act_shape))
    actor = Actor(obs_dim, act_dim)
    actor.load_state_dict(ckpt["learner"]["actor"])

    def play(episodes: int, video_dir: Optional[str] = None) -> list:
        return evaluate(actor, saved.env_id, episodes, saved.seed + 10_000, video_dir, episode_printer(episodes))

    if args.export_checkpoint:
        return export_sac_actor(args, ckpt, actor, saved.env_id, SCRIPT_NAME, play)
    eval_dir = Path(path).resolve().parent.parent / "eval" / Path(path).stem
    returns = play(args.eval_episodes, str(eval_dir / "videos") if args.capture_video else None)
    writer = make_writer(eval_dir, saved, purge_step=None)
    writer.add_scalar("eval/episodic_return", float(np.mean(returns)), ckpt["global_step"])
    writer.close()
    print(f"eval {saved.env_id} at step {ckpt['global_step']}: {np.mean(returns):.2f} +- {np.std(returns):.2f} "
          f"over {len(returns)} episodes")  # fmt: skip


# --- shared: sac-parameters ---
class ParameterHolder:
    """The actor the rollout and the evaluation act with, a CPU copy of the learner's Actor module (acting runs the
    network that trains), and its version: the actor updates it includes. A distributed version ships `weights`
    (state_dict tensors, copies) when `version` has moved on, and load_weights puts them into its own Actor."""

    def __init__(self):
        self.actor: Optional[nn.Module] = None
        self.version = 0

    def publish(self, actor: nn.Module, version: int) -> None:
        if self.actor is None:
            self.actor = copy.deepcopy(actor).cpu()
        else:
            self.actor.load_state_dict(actor.state_dict())
        self.version = version

    @property
    def weights(self) -> list:
        return [value.detach().clone() for value in self.actor.state_dict().values()]


def load_weights(actor: nn.Module, weights: list) -> nn.Module:
    """Put ParameterHolder.weights into `actor`, an Actor of the same sizes (as a state_dict: names, shapes checked)."""
    actor.load_state_dict(dict(zip(actor.state_dict(), weights)))
    return actor


# --- end shared: sac-parameters ---


# --- shared: sac-export ---
class SacActingPolicy(nn.Module):
    """The deterministic acting policy for torch.export: a = tanh(mean(s)) * scale + bias, as evaluate() acts (SAC
    needs no observation normalization, and the squashing keeps the action within the bounds)."""

    def __init__(self, actor: Actor, low: np.ndarray, high: np.ndarray):
        super().__init__()
        self.actor = actor
        self.register_buffer("scale", torch.as_tensor((high - low) / 2.0, dtype=torch.float32))
        self.register_buffer("bias", torch.as_tensor((high + low) / 2.0, dtype=torch.float32))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        mean, log_std = self.actor(obs.to(torch.float32))
        return squashed_gaussian(mean, log_std, torch.zeros_like(mean), self.scale, self.bias)[0]


def export_sac_actor(args, ckpt: dict, actor: Actor, env_id: str, script: str, play: Callable[..., list]) -> Path:
    """--export-checkpoint of a SAC checkpoint: the actor (export_agent); the critics stay in the checkpoint."""
    space = make_env(env_id, 0, False, "")().action_space
    obs_dim, act_dim = actor.net[0].in_features, actor.act_dim
    config = {"script": script, "algorithm": "SAC (soft actor-critic)", "env_id": env_id,
              "global_step": ckpt["global_step"], "agent_class": "Actor",
              "agent_kwargs": {"obs_dim": obs_dim, "act_dim": act_dim}, "hidden_sizes": [HIDDEN, HIDDEN],
              "activation": "relu", "log_std_bounds": [LOG_STD_MIN, LOG_STD_MAX], "action_low": space.low.tolist(),
              "action_high": space.high.tolist(), "obs_rms": None,
              "evaluation": "deterministic episodes (tanh of the Gaussian's mean, scaled to the action bounds)",
              "policy_input": f"float32 observations, shape (batch, {obs_dim}), as the env returns them (flattened)",
              "policy_output": f"float32 actions, shape (batch, {act_dim}), within the action bounds"}  # fmt: skip
    usage = f"""
import gymnasium as gym
import torch

policy = torch.export.load("policy.pt2").module()
env = gym.make("{env_id}")
obs, _ = env.reset(seed=0)
done, total = False, 0.0
while not done:
    action = policy(torch.as_tensor(obs, dtype=torch.float32).reshape(1, -1))[0].numpy()
    obs, reward, terminated, truncated, _ = env.step(action)
    total, done = total + float(reward), terminated or truncated
print(total)
"""
    policy = SacActingPolicy(actor, space.low, space.high)
    return export_agent(args, ckpt, policy, torch.zeros(2, obs_dim), actor.state_dict(), config, play, usage)


# --- end shared: sac-export ---


# --- shared: sac-evaluation ---
def evaluate(actor: nn.Module, env_id: str, episodes: int, seed: int, video_dir: Optional[str] = None,
             report: Callable[[int, float], None] = lambda index, episode_return: None) -> list:  # fmt: skip
    """Deterministic episodes (tanh of the Gaussian's mean) of `actor` on a separate env, seeded seed, seed+1, ...;
    returns their returns (`report` hears of each). Uses no global RNG: evaluating leaves the training run alone."""
    env = make_env(env_id, 0, video_dir is not None, video_dir or "")()
    low, high = env.action_space.low, env.action_space.high
    scale, bias = (high - low) / 2.0, (high + low) / 2.0
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        done, total = False, 0.0
        while not done:
            action = policy_actions(obs[None], actor, None, scale, bias)[0]
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
        report(episode, total)
    env.close()
    return returns


# --- end shared: sac-evaluation ---


# --- shared: sac-run ---
def crossed(step: int, advance: int, interval: int) -> bool:
    """Did global_step pass a multiple of `interval` in its last advance (num_envs steps)? (interval 0: never)"""
    return interval > 0 and step // interval > (step - advance) // interval


def probe_env(env_id: str) -> tuple[tuple, tuple]:
    """Make the env once to check it exists and has a bounded continuous (Box) action space; return the shapes."""
    check_env_id(env_id)
    try:
        env = gym.wrappers.FlattenObservation(gym.make(env_id))
    except gym.error.Error as e:
        raise UserError(f"environment '{env_id}' could not be created: {e}") from None
    obs_space, act_space = env.observation_space, env.action_space
    env.close()
    if not isinstance(act_space, gym.spaces.Box):
        raise UserError(f"{env_id} has a {type(act_space).__name__} action space ({act_space}); this SAC needs a "
                        f"continuous Box action space (e.g. Pendulum-v1, HalfCheetah-v4). This project's discrete-action "
                        f"scripts, ppo_atari.py and a2c_atari.py, take Atari games only.")  # fmt: skip
    if not np.all(np.isfinite(act_space.low)) or not np.all(np.isfinite(act_space.high)):
        raise UserError(f"{env_id}'s action space {act_space} is unbounded; SAC squashes actions into its bounds.")
    return obs_space.shape, act_space.shape


def learner_state(learner: Learner) -> dict:
    """The learner's part of a checkpoint as plain data (copies): the float32 networks, the optimizers and the
    temperature (the bfloat16 copies of --bf16 are not saved: they are rebuilt from the float32 weights)."""
    return {
        "actor": {k: v.detach().clone().cpu() for k, v in learner.actor.state_dict().items()},
        "qf": {k: v.detach().clone().cpu() for k, v in learner.qf.state_dict().items()},
        "qf_target": {k: v.detach().clone().cpu() for k, v in learner.qf_target.state_dict().items()},
        "actor_optimizer": copy.deepcopy(learner.actor_optimizer.state_dict()),
        "q_optimizer": copy.deepcopy(learner.q_optimizer.state_dict()),
        "log_alpha": learner.log_alpha.detach().clone().cpu(),
        "alpha_optimizer": None if learner.alpha_optimizer is None else copy.deepcopy(learner.alpha_optimizer.state_dict()),
    }


def load_learner_state(learner: Learner, state: dict) -> None:
    """Restore what learner_state saved (in place: the parameters and their optimizers stay the same objects), then
    refresh the bfloat16 copies of --bf16 from the loaded weights."""
    learner.actor.load_state_dict(state["actor"])
    learner.qf.load_state_dict(state["qf"])
    learner.qf_target.load_state_dict(state["qf_target"])
    learner.actor_optimizer.load_state_dict(per_tensor_adam_state(state["actor_optimizer"], learner.actor_params))
    learner.q_optimizer.load_state_dict(per_tensor_adam_state(state["q_optimizer"], learner.qf_params))
    learner.log_alpha.data.copy_(state["log_alpha"])
    if learner.alpha_optimizer is not None:
        learner.alpha_optimizer.load_state_dict(state["alpha_optimizer"])
    for network in (learner.actor_run, learner.qf_run, learner.qf_target_run):
        if isinstance(network, ComputeCopy):
            network.refresh()


def per_tensor_adam_state(saved: dict, params: list) -> dict:
    """An Adam state_dict for `params` (per tensor). Older checkpoints stepped one flat tensor of all of a network's
    weights: their moments are split here in the parameters' order, so those runs still resume."""
    (group,) = saved["param_groups"]
    if len(group["params"]) != 1 or len(params) == 1:
        return saved
    flat = saved["state"].get(group["params"][0])
    state = {}
    if flat is not None:
        pieces = {k: v.split([p.numel() for p in params]) for k, v in flat.items() if k != "step"}
        state = {i: {"step": flat["step"].clone(), **{k: v[i].view_as(p).clone() for k, v in pieces.items()}}
                 for i, p in enumerate(params)}  # fmt: skip
    return {"state": state, "param_groups": [{**group, "params": list(range(len(params)))}]}


def check_actor(actor: nn.Module, obs_dim: int, act_dim: int) -> None:
    """Stop at once, naming what to change, where an edit broke the Actor's sizes (else the first failure would come
    after learning_starts steps): 64 observations must give a mean and a log-std of shape (64, act_dim) each."""
    probe = torch.zeros(64, obs_dim, device=next(actor.parameters()).device)  # no RNG: the seeded weights stay the same
    sizes = (f"Each layer's input size must be the previous layer's output size, the first one's obs_dim = {obs_dim}, "
             f"and the last layer's output size 2 * act_dim = {2 * act_dim} (mean and log-std).")  # fmt: skip
    try:
        with torch.no_grad():
            mean, log_std = actor(probe)
    except (RuntimeError, ValueError) as e:
        raise UserError(f"Actor cannot map observations to actions ({str(e).splitlines()[0]}). {sizes}") from None
    if mean.shape != (64, act_dim) or log_std.shape != (64, act_dim):
        raise UserError(f"Actor maps 64 observations to a mean of shape {tuple(mean.shape)} and a log-std of shape "
                        f"{tuple(log_std.shape)}, not (64, act_dim = {act_dim}) each. {sizes}")  # fmt: skip


# ---- bfloat16 (--bf16, opt-in): only where the CPU has native bfloat16 instructions ----
def cpu_has_native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Does this CPU have bfloat16 dot-product instructions (AVX512_BF16 or AMX-BF16)? Read from the CPU flags that
    Linux lists in /proc/cpuinfo; False where that file is missing (other systems)."""
    try:
        with open(cpuinfo) as f:
            lines = f.readlines()
    except OSError:
        return False
    flags = {word for line in lines if line.startswith("flags") for word in line.split()}
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def resolve_bf16(requested: bool, device: torch.device, native_bf16: bool, resumed: bool = False) -> tuple[bool, str]:
    """Whether the networks compute in bfloat16, and the line that says so. --bf16 is refused up front on another
    device or a CPU without native bfloat16 instructions (emulated: many times slower). A resumed run keeps the dtype
    its checkpoint recorded (`requested`), wherever it runs now, and says so: resuming never changes the numerics."""
    source = "as the checkpoint's run computed" if resumed else ("--bf16" if requested else "--bf16 is opt-in")
    if not requested:
        return False, f"compute: float32 ({source})"
    native = device.type == "cpu" and native_bf16
    if not native and not resumed:
        where = "this CPU has neither" if device.type == "cpu" else f"the run would be on {device.type}"
        raise UserError(f"--bf16 needs a CPU with native bfloat16 instructions (AVX512_BF16 or AMX), and {where}: "
                        "elsewhere bfloat16 is emulated and many times slower than float32. Drop --bf16.")  # fmt: skip
    slow = "" if native else f"; not native on this {device.type}: emulated, slower than float32"
    return True, f"compute: bfloat16 matmuls, float32 weights, Adam and losses ({source}{slow})"


# ---- speed set-up: each wraps one step of the algorithm above without changing its math ----
class ComputeCopy:
    """A network as the passes run it in `dtype`: a copy of `module`, overwritten from the float32 module's weights
    by refresh() (before every call with refresh_at_call). Called like the network, with its inputs cast to `dtype`;
    Actor and TwinQ return float32 all the same."""

    def __init__(self, module: nn.Module, dtype: torch.dtype, refresh_at_call: bool = False):
        self.source, self.module = module, copy.deepcopy(module).to(dtype)
        self.pairs = list(zip([*self.module.parameters(), *self.module.buffers()], [*module.parameters(), *module.buffers()]))
        self.dtype, self.refresh_at_call = dtype, refresh_at_call

    def refresh(self) -> None:
        with torch.no_grad():
            for low, high in self.pairs:
                low.copy_(high)

    def __call__(self, *inputs: torch.Tensor, **kwargs):
        if self.refresh_at_call:
            self.refresh()
        return self.module(*(x.to(self.dtype) for x in inputs), **kwargs)


class MasterWeightsOptimizer:
    """The optimizer of float32 weights whose passes ran through a ComputeCopy: zero_grad() (either form) clears the
    copy's gradients, step() brings them to the float32 weights, steps those and refreshes the copy. Its state_dict()
    is the float32 optimizer's: checkpoints are the same with and without --bf16."""

    def __init__(self, optimizer: torch.optim.Optimizer, compute: ComputeCopy):
        self.optimizer, self.compute = optimizer, compute

    @property
    def param_groups(self) -> list:  # a property: load_state_dict replaces the optimizer's lists
        return self.optimizer.param_groups

    @property
    def state(self) -> dict:
        return self.optimizer.state

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.compute.module.zero_grad(set_to_none)

    def step(self) -> None:
        for high, low in zip(self.compute.source.parameters(), self.compute.module.parameters()):
            high.grad = None if low.grad is None else low.grad.to(high.dtype)
        self.optimizer.step()
        self.compute.refresh()

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state)


def bf16_copies(learner: Learner) -> None:
    """--bf16: the passes run through bfloat16 copies of the three networks (ComputeCopy); weights, Adam's state,
    losses and the squashed Gaussian stay float32. Each copy is refreshed once per change of its float32 weights:
    after each optimizer step, the targets' at each use, all after a checkpoint load (why not autocast: docs page)."""
    learner.actor_run = ComputeCopy(learner.actor, torch.bfloat16)
    learner.qf_run = ComputeCopy(learner.qf, torch.bfloat16)
    learner.qf_target_run = ComputeCopy(learner.qf_target, torch.bfloat16, refresh_at_call=True)
    learner.qf_frozen = [p.detach() for p in learner.qf_run.module.parameters()]
    learner.actor_optimizer = MasterWeightsOptimizer(learner.actor_optimizer, learner.actor_run)
    learner.q_optimizer = MasterWeightsOptimizer(learner.q_optimizer, learner.qf_run)


def speed_setup() -> None:
    """The process-wide speed settings (flush_denormals, keep_freed_memory), made before torch's first parallel op:
    its OpenMP threads copy the denormal flag when they start."""
    flush_denormals()
    keep_freed_memory()


def flush_denormals() -> bool:
    """Make float32 arithmetic treat and produce denormals (|x| < 1.2e-38) as zero, in this thread and in the OpenMP
    threads torch starts later (call it before torch's first parallel op); returns whether it holds in every thread.
    Why: Adam's decaying moments of dead ReLU units crawl through the slow denormal range (measured: docs page)."""
    if not torch.set_flush_denormal(True):
        return False  # a CPU without the flush-to-zero / denormals-are-zero modes
    # The smallest denormal, 1.4e-45, written as its bit pattern: converting a Python float would already flush it
    probe = torch.ones(1 << 16, dtype=torch.int32).view(torch.float32)  # 2 chunks of 32k: both threads (2 cores)
    return bool(((probe * 1.0).view(torch.int32) == 0).all())  # bits: a comparison would read denormals as 0


def keep_freed_memory() -> None:
    """Let glibc's malloc reuse freed memory instead of handing it back to the OS (Linux with glibc; a no-op elsewhere).
    Why: by default every block over 128 KiB is mapped fresh and unmapped when freed, so each large activation of
    an update faults its pages in again (measured: docs page). The replay buffer's arrays are still mapped."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return  # another C library (e.g. musl): leave its allocator alone
    m_trim_threshold, m_mmap_threshold = -1, -3  # from glibc's malloc.h
    libc.mallopt(m_mmap_threshold, 32 * 1024 * 1024)
    libc.mallopt(m_trim_threshold, 512 * 1024 * 1024)


def freeze_startup_objects() -> None:
    """Move every object alive now (modules, envs, the networks) out of the garbage collector's full collections,
    which walk them all every few hundred gradient steps (measured: docs page); later objects are collected as usual.
    Handed back at exit: nanobind modules (triton, imported by torch) otherwise print "leaked" lines at shutdown."""
    gc.collect()
    gc.freeze()
    atexit.register(gc.unfreeze)


# --- end shared: sac-run ---


# --- shared: run ---
class StopRequest:
    """Ctrl-C / SIGTERM handler: the first signal asks the loop to stop at the end of the current iteration (a
    consistent state to save); a second one interrupts at once, without saving.
    Why a flag, not `except KeyboardInterrupt`: the exception lands at an arbitrary point (inside the TensorBoard
    writer, a checkpoint write, ...); a flag checked between iterations never cuts anything half-way."""

    def __init__(self):
        self.requested = False

    def __call__(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True


class Progress:
    """On a terminal: one self-overwriting line with an ETA. Otherwise (Slurm, nohup, CI logs): a plain line every
    `every_s` seconds and one at the end, so a log file shows the run advancing."""

    def __init__(self, enabled: bool, total: int, every_s: float = 30.0):
        self.enabled, self.tty, self.total, self.every_s = enabled, sys.stdout.isatty(), total, every_s
        self.last_print, self.line = time.monotonic(), ""

    def update(self, step: int, sps: float, recent_return: Optional[float], recent_sps: float) -> None:
        """sps: since the run (re)started, as logged; the ETA uses recent_sps, the last log window's speed, since a
        run's speed changes as it goes (SAC: random-action steps first, then a gradient step per env step)."""
        if not self.enabled:
            return
        ret = "   n/a" if recent_return is None else f"{recent_return:9.1f}"
        eta = (self.total - step) / recent_sps if recent_sps > 0 else math.inf
        eta_text = "?" if not math.isfinite(eta) else time.strftime("%H:%M:%S", time.gmtime(eta))
        if eta >= 86_400 and math.isfinite(eta):
            eta_text = f"{eta / 86_400:.1f} days"
        self.line = f"step {step:>10,}/{self.total:,} | {sps:6.0f} SPS | return (last 10) {ret} | ETA {eta_text}"
        if self.tty:
            print(f"\r{self.line}", end="", flush=True)
        elif time.monotonic() - self.last_print >= self.every_s:
            print(self.line, flush=True)
            self.last_print = time.monotonic()

    def close(self) -> None:
        if self.enabled and self.line:
            print() if self.tty else print(self.line, flush=True)


def to_plain(obj) -> dict:
    """An object's attributes (a dataclass's fields) as plain data that loads with weights_only=True: arrays become
    tensors; all are copies. For loop states, and for parts without state_dict() (e.g. running statistics)."""
    plain = {}
    for name, value in vars(obj).items():
        if isinstance(value, (np.ndarray, np.generic)):  # np.generic: 0-d arithmetic gives numpy scalars
            value = torch.from_numpy(np.array(value))
        elif isinstance(value, torch.Tensor):
            value = value.detach().cpu().clone()
        plain[name] = value
    return plain


def load_plain(obj, saved: dict, env_exact: bool = True) -> None:
    """Set an object's attributes from to_plain's dict, in their current types and devices. Dataclass fields marked
    metadata={"env": True} describe the envs' episodes: kept as they are when the envs restart from a reset."""
    env_fields = {f.name for f in dataclasses.fields(obj) if f.metadata.get("env")} if dataclasses.is_dataclass(obj) else set()
    for name, current in vars(obj).items():
        if name not in saved or (name in env_fields and not env_exact):
            continue
        value = saved[name]
        if isinstance(current, (np.ndarray, np.generic)):
            value = value.numpy().astype(current.dtype)
        elif isinstance(current, torch.Tensor):
            value = value.to(current.device)
        setattr(obj, name, value)


class Run:
    """A training run's bookkeeping, the same in every script: the run folder (a new
    `runs/<env>__<exp>__<seed>__<time>`, or the resumed checkpoint's), args.json, TensorBoard, wandb, the progress
    line, Ctrl-C / SIGTERM, the log window (SPS and phase timings) and checkpoints. A checkpoint holds the loop
    state (a dataclass with global_step and iteration), every part given to attach() (anything with state_dict /
    load_state_dict, or plain attributes), the recent returns, the best score (--keep-best) and the RNG states: plain
    data, written atomically. `run.play(episodes, video_dir)`, where a script sets it, is its evaluation: the Run plays
    it every --eval-interval env steps and after --save-model."""

    def __init__(self, args, script: str, ckpt: Optional[dict], shapes: dict, log_every: int):
        self.args, self.script, self.ckpt, self.shapes, self.log_every = args, script, ckpt, shapes, log_every
        if ckpt is not None:
            check_checkpoint_matches(ckpt, args.resume, script, shapes)
            if ckpt["iteration"] >= args.num_iterations:
                raise UserError(f"checkpoint '{args.resume}' is at iteration {ckpt['iteration']} (step "
                                f"{ckpt['global_step']}) and --total-timesteps {args.total_timesteps} gives "
                                f"{args.num_iterations} iterations: nothing left to do. Raise --total-timesteps to "
                                "continue.")  # fmt: skip
            self.dir, self.name = Path(args.resume).resolve().parent.parent, ckpt["run_name"]
        else:
            safe_env_id = args.env_id.replace("/", "-").replace(":", "-")  # "ALE/Pong-v5": no nested folders
            self.name = f"{safe_env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
            self.dir = Path(args.runs_dir) / self.name
        self.ckpt_dir = self.dir / "checkpoints"
        self.dir.mkdir(parents=True, exist_ok=True)
        if args.track:
            init_tracking(args, self.name, self.dir)
        self.writer = make_writer(self.dir, args, purge_step=None if ckpt is None else ckpt["global_step"] + 1)
        self.args_json = self.dir / "args.json" if ckpt is None else None  # a resumed run keeps the first start's
        if self.args_json:  # the flags, and what they resolved to on this machine ("compute")
            record = {**dataclasses.asdict(args), "compute": compute_record(args)}
            self.args_json.write_text(json.dumps(record, indent=2))
        print(f"run: {self.dir}" + (f" (resumed from {args.resume})" if ckpt else ""))
        self.recent_returns: list = []  # the last 10 episodes' returns, for the progress line
        self.phase_time: dict = {}  # seconds per phase (run.timer) in the current log window
        self.state, self.parts, self.closing, self.stopped = None, {}, None, False
        self.stop, self.window_step = StopRequest(), 0
        self.last = False  # set by a loop whose length is not known ahead: the current iteration is the last
        self.play: Optional[Callable[..., list]] = None  # the script's evaluation: (episodes, video_dir) -> returns
        self.best = KeepBest(args.keep_best, self.ckpt_dir / "best.pt", ckpt)

    def note_compute(self, **resolved) -> None:
        """Correct args.json's "compute" record where the set-up resolved otherwise (e.g. a fast path's fallback)."""
        if self.args_json:
            record = json.loads(self.args_json.read_text())
            record["compute"].update(resolved)
            self.args_json.write_text(json.dumps(record, indent=2))

    def attach(self, state, envs, **parts) -> None:
        """Register what a checkpoint holds (the loop state and the parts) and what to close at the end; on
        --resume, load them all from the checkpoint, then the RNG states."""
        self.state, self.closing, self.parts = state, envs, parts
        if hasattr(envs, "step"):  # what the envs return is checked as it arrives (a NaN stops the run: non_finite)
            envs.step = self.checked_step(envs.step)
        if self.ckpt is None:
            return
        for name, part in parts.items():
            part.load_state_dict(self.ckpt[name]) if hasattr(part, "load_state_dict") else load_plain(part, self.ckpt[name])
        exact = all(getattr(part, "exact", True) for part in parts.values())
        if not exact:
            print(f"warning: {self.args.env_id}'s simulator state cannot be captured; its envs restart from a reset.")
        load_plain(state, self.ckpt["run_state"], exact)
        self.recent_returns = list(self.ckpt["run_state"]["recent_returns"])
        set_rng_states(self.ckpt["rng_states"])

    def iterations(self, state, num_iterations: int):
        """The loop's iteration numbers, continuing a resumed run. After each iteration: at the end of a log window
        its SPS, phase timings and the progress line; periodic checkpoints (every --checkpoint-interval env steps);
        a clean stop after Ctrl-C / SIGTERM. A loop whose length is not known ahead sets `run.last = True` in the
        iteration that is to be its last."""
        self.stop = StopRequest()
        signal.signal(signal.SIGINT, self.stop)
        signal.signal(signal.SIGTERM, self.stop)
        progress = Progress(self.args.progress, self.args.total_timesteps)
        start_time, start_step = time.time(), state.global_step
        self.window_step, saved_step, threads_checked = state.global_step, state.global_step, time.monotonic()
        window_start = time.monotonic()
        evaluated_step = state.global_step
        try:
            for iteration in range(state.iteration + 1, num_iterations + 1):
                state.iteration = iteration
                yield iteration
                if self.log_due():
                    sps = (state.global_step - start_step) / (time.time() - start_time)
                    self.writer.add_scalar("charts/SPS", sps, state.global_step)
                    window = state.global_step - self.window_step  # 0 when a stop ends a window with no new step
                    for phase, seconds in self.phase_time.items() if window > 0 else ():
                        self.writer.add_scalar(f"charts/{phase}_us_per_step", seconds / window * 1e6, state.global_step)
                    self.phase_time = dict.fromkeys(self.phase_time, 0.0)
                    recent = float(np.mean(self.recent_returns)) if self.recent_returns else None
                    progress.update(state.global_step, sps, recent, window / max(time.monotonic() - window_start, 1e-9))
                    self.window_step, window_start = state.global_step, time.monotonic()
                if time.monotonic() - threads_checked > 5.0:
                    threads_before = torch.get_num_threads()
                    threads = share_threads(self.args.torch_threads, RUNS_FOLDER)
                    if threads != threads_before:  # another run started or ended: say so, the numbers may differ
                        note = f"torch threads {threads_before} -> {threads} at step {state.global_step}"
                        print(note)
                        self.writer.add_text("run/torch_threads", note, state.global_step)
                    threads_checked = time.monotonic()
                interval = self.args.eval_interval
                if self.play is not None and interval > 0 and state.global_step // interval > evaluated_step // interval:
                    self.evaluated(self.play(self.args.eval_episodes))
                    evaluated_step = state.global_step
                interval = self.args.checkpoint_interval
                if interval > 0 and state.global_step // interval > saved_step // interval:
                    self.best.offer_training_return(self)  # before the save: the checkpoint holds the best score
                    self.save("step")
                    prune_checkpoints(self.ckpt_dir, self.args.keep_checkpoints)
                    saved_step = state.global_step
                if self.stop.requested:
                    self.stopped = True
                    break
                if self.last:
                    break
        finally:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            progress.close()

    def log_due(self) -> bool:
        """Does the current iteration end a log window? Yes when global_step passed a multiple of log_every (every
        iteration when log_every <= the steps per iteration), at the last iteration, and after Ctrl-C / SIGTERM."""
        step = self.state.global_step
        return (step // self.log_every > self.window_step // self.log_every or self.state.iteration == self.args.num_iterations
                or self.last or self.stop.requested)  # fmt: skip

    @contextmanager
    def timer(self, phase: str):
        """Time a phase of the loop; logged per env step as charts/<phase>_us_per_step at the end of each window."""
        start = time.perf_counter()
        yield
        self.phase_time[phase] = self.phase_time.get(phase, 0.0) + time.perf_counter() - start

    def log(self, step: int, scalars: dict) -> None:
        """Log an update's (or a window's) metrics, after checking them and the weights for NaN / Inf: once per log
        call, no sync per minibatch (the losses and the gradient norm arrive as numbers)."""
        for tag, value in scalars.items():
            if not math.isfinite(value) and tag not in MAY_BE_NAN:
                self.non_finite(f"{tag} ({value})", cause="training")
        self.check_weights({name: weights_of(part) for name, part in self.parts.items()}, "the weights")
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, step)

    def episode(self, episode_return: float, length: int, step: int) -> None:
        """A finished episode: its true return and length, against the global step at which it ended."""
        if not math.isfinite(episode_return):
            self.non_finite(f"an episode's return ({episode_return})", cause="env")
        self.writer.add_scalar("charts/episodic_return", episode_return, step)
        self.writer.add_scalar("charts/episodic_length", length, step)
        self.recent_returns = (self.recent_returns + [float(episode_return)])[-10:]

    def checkpoint(self, best: bool = False) -> dict:
        """The checkpoint as plain data. For best.pt (best=True) a copy, which later training does not change (an
        asynchronous evaluation's snapshot), without the parts that hold a replay buffer (they say
        `holds_replay_buffer`): best.pt keeps an agent, and a buffer would make it as large as the buffer."""
        state = {"format": 1, "script": self.script, "run_name": self.name, "args": dataclasses.asdict(self.args),
                 "global_step": self.state.global_step, "iteration": self.state.iteration, **self.shapes,
                 **{name: None if best and getattr(part, "holds_replay_buffer", False)
                    else part.state_dict() if hasattr(part, "state_dict") else to_plain(part)
                    for name, part in self.parts.items()},
                 "run_state": {**to_plain(self.state), "recent_returns": list(self.recent_returns),
                               "best_score": self.best.score},
                 "rng_states": get_rng_states()}  # fmt: skip
        return copy.deepcopy(state) if best else state

    def save(self, kind: str) -> Path:
        """Write a checkpoint `<kind>_<global step>.pt`; tensors are saved as they are now (torch.save copies).
        An interrupted checkpoint of an earlier step goes once another kind is written."""
        path = self.ckpt_dir / checkpoint_name(kind, self.state.global_step)
        state = self.checkpoint()
        self.check_weights(state, f"the {kind} checkpoint about to be written")  # a broken state is never saved
        save_checkpoint(state, path)
        # a later checkpoint supersedes an interrupted one, unless that may hold the replay buffer and this one not
        if kind != "interrupted" and getattr(self.args, "save_buffer", True):
            for old in self.ckpt_dir.glob("interrupted_??????????.pt"):
                if old.stem[-10:].isdigit() and int(old.stem[-10:]) < self.state.global_step:
                    old.unlink()
        return path

    def evaluated(self, returns: list, step: Optional[int] = None, snapshot: Optional[dict] = None) -> None:
        """An evaluation's returns, logged as eval/episodic_return at `step` (default: now); with --keep-best a new
        best mean writes best.pt: `snapshot` (run.checkpoint(best=True) of the weights evaluated, for an evaluation
        that ran while training went on), else the agent as it is now."""
        step = self.state.global_step if step is None else step
        self.writer.add_scalar("eval/episodic_return", float(np.mean(returns)), step)
        self.best.offer(float(np.mean(returns)), step, "eval/best_return", self, snapshot)

    def finish(self) -> bool:
        """After the loop. Stopped by Ctrl-C / SIGTERM: save, say how to resume, exit 130. Else --keep-best's last
        look at the training returns; with --save-model: the final evaluation (run.play, with video under
        videos/eval), then the final checkpoint, and return True (a script without run.play evaluates it itself)."""
        if self.stopped:
            path = self.save("interrupted")
            print(f"interrupted: saved step {self.state.global_step} (iteration {self.state.iteration}) to {path}\n"
                  f"resume with: {launch_command(self.script)} --resume {quote(str(path))}", file=sys.stderr)  # fmt: skip
            self.close()
            sys.exit(130)
        self.best.offer_training_return(self)
        if self.args.save_model and self.play is not None:
            returns = self.play(
                self.args.eval_episodes, str(self.dir / "videos" / "eval") if self.args.capture_video else None
            )
            self.evaluated(returns)
            print(f"eval: {np.mean(returns):.2f} +- {np.std(returns):.2f} over {len(returns)} episodes")
        if self.args.save_model:
            print(f"model saved to {self.save('final')}")
        return self.args.save_model

    def checked_step(self, step: Callable) -> Callable:
        """envs.step, checking the actions it is given, then the observations, final observations and rewards it
        returns, for NaN / Inf (a policy gone NaN makes a simulator return NaN: the actions tell the two apart)."""

        def checked(actions):
            if first_non_finite(actions) is not None:
                self.non_finite("the actions the policy chose", cause="training")
            out = step(actions)
            for name, value in (("observation", out[0]), ("reward", out[1]), ("final observation", out[4].get("final_obs"))):
                if first_non_finite(value) is not None:
                    self.non_finite(f"the environment's {name}", cause="env")
            return out

        return checked

    def check_weights(self, state: dict, what: str) -> None:
        """Stop on a NaN / Inf in a checkpoint's (or the attached parts') tensors; replay buffers and counters aside."""
        buffers = {name for name, part in self.parts.items() if getattr(part, "holds_replay_buffer", False)}
        found = first_non_finite({k: v for k, v in state.items() if k in self.parts and k not in buffers})
        if found is not None:
            self.non_finite(f"{what}: {found}", cause="training")

    def non_finite(self, quantity: str, cause: str) -> None:
        """Stop the run on its first NaN / Inf: one paragraph (what, when, the likely causes among this run's flags,
        the newest checkpoint from before it, which stays as it is), the run closed, exit code 3. Nothing is saved."""
        args, state = self.args, self.state
        saved = [p for p in self.ckpt_dir.glob("*.pt") if p.name != "best.pt"] if self.ckpt_dir.is_dir() else []
        newest = max(saved, key=lambda p: p.stat().st_mtime, default=None)
        flags = [f"--{f.replace('_', '-')} {getattr(args, f)}" for f in NON_FINITE_FLAGS if hasattr(args, f)]
        likely = (f"the environment ({args.env_id}): a custom env's bug, or a simulator made unstable" if cause == "env"
                  else f"a step too large for these settings: {', '.join(flags)} (a lower learning rate, a larger "
                  "batch or normalization usually help)")  # fmt: skip
        resume = (f"The newest checkpoint from before it, {newest}, is untouched: resume it with "
                  f"`{launch_command(self.script)} --resume {quote(str(newest))}` once the cause is fixed"
                  if newest else "No checkpoint was written before it (--checkpoint-interval sets how often)")  # fmt: skip
        print(f"error: non-finite value (NaN or Inf) in {quantity} at env step {state.global_step} (iteration "
              f"{state.iteration}): the run stopped and saved nothing of this state. Likely cause: {likely}. "
              f"{resume}.", file=sys.stderr)  # fmt: skip
        self.close()
        sys.exit(3)

    def close(self) -> None:
        rss = peak_rss_mb()
        if rss is not None:
            print(f"peak RSS: {rss:.0f} MB")
        self.writer.close()
        if self.closing is not None:
            self.closing.close()
        if self.args.track:
            import wandb

            wandb.finish()


# Metrics that are NaN by definition in some updates, not a sign of a broken run: the explained variance of returns
# that are all equal (e.g. no reward yet).
MAY_BE_NAN = ("losses/explained_variance",)
# The flags a non-finite loss or weight most often comes from, named in the stop message when the script has them.
NON_FINITE_FLAGS = ("learning_rate", "policy_lr", "q_lr", "max_grad_norm", "num_minibatches", "batch_size",
                    "norm_adv", "norm_obs", "norm_reward", "bf16")  # fmt: skip


def first_non_finite(obj, path: str = "") -> Optional[str]:
    """Where the first NaN / Inf in obj is (tensors, float arrays, numbers, nested in dicts, lists or an object
    array of per-env values), as a dotted path ("" at the top), or None."""
    if isinstance(obj, torch.Tensor):
        return path if obj.is_floating_point() and not bool(torch.isfinite(obj).all()) else None
    if isinstance(obj, np.ndarray) and obj.dtype != object:
        return path if obj.dtype.kind in "fc" and not np.isfinite(obj).all() else None
    if isinstance(obj, float):
        return None if math.isfinite(obj) else path
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple, np.ndarray)) else ()
    for key, value in items:
        found = first_non_finite(value, f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return None


def weights_of(part) -> dict:
    """A checkpoint part's weights, for the check at each log: a module's parameters, or the modules' parameters and
    the tensors among a plain object's attributes (e.g. SAC's Learner); nothing of other parts (optimizers, envs)."""
    if isinstance(part, nn.Module):
        return dict(part.named_parameters())
    if getattr(part, "holds_replay_buffer", False) or not hasattr(part, "__dict__"):
        return {}
    return {name: dict(value.named_parameters()) if isinstance(value, nn.Module) else value
            for name, value in vars(part).items() if isinstance(value, (nn.Module, torch.Tensor))}  # fmt: skip


def compute_record(args) -> dict:
    """What the flags resolved to at the start: dtype, device, env backend and torch's thread count (args.json)."""
    return {"dtype": "bfloat16" if getattr(args, "bf16", False) else "float32",
            "device": "cuda" if torch.cuda.is_available() and args.cuda else "cpu",
            "env_backend": getattr(args, "env_backend", "gymnasium"), "torch_threads": torch.get_num_threads()}  # fmt: skip


def wandb_credentials_available() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    return netrc.is_file() and "api.wandb.ai" in netrc.read_text(errors="replace")


def check_tracking(track: bool) -> None:
    """Never wait at wandb's login prompt: with no credentials and WANDB_MODE not offline/disabled, stop at once,
    before anything is written."""
    mode = os.environ.get("WANDB_MODE", "").lower()
    if track and mode not in ("offline", "disabled", "dryrun") and not wandb_credentials_available():
        raise UserError("--track needs Weights & Biases credentials: run `wandb login`, set WANDB_API_KEY, or set "
                        "WANDB_MODE=offline to record the run locally (sync it later with `wandb sync`).")  # fmt: skip


def init_tracking(args, run_name: str, run_dir: Path) -> None:
    """wandb mirrors the TensorBoard scalars (sync_tensorboard=True: call before creating the SummaryWriter)."""
    check_tracking(True)
    import wandb

    wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, sync_tensorboard=True, config=vars(args),
               name=run_name, dir=str(run_dir), save_code=True)  # fmt: skip


def make_writer(run_dir: Path, args, purge_step: Optional[int]):
    """TensorBoard writer. On resume, purge_step hides events logged after the checkpoint (one continuous curve)."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(run_dir), purge_step=purge_step)
    if purge_step is None:
        table = "\n".join(f"|{k}|{v}|" for k, v in vars(args).items())
        writer.add_text("hyperparameters", f"|param|value|\n|-|-|\n{table}")
    return writer


EXTRAS = {"ppo_atari": "atari", "a2c_atari": "atari", "sac_continuous_ray": "ray"}  # the pyproject extra each needs


def quote(word: str) -> str:
    """A word as a POSIX shell reads it back (a path with spaces stays one argument)."""
    import shlex

    return shlex.quote(word)


def episode_printer(episodes: int, noun: str = "episode") -> Callable[[int, float], None]:
    """--eval-checkpoint and --export-checkpoint: a line per finished episode, so a long evaluation shows progress."""
    return lambda index, episode_return: print(f"{noun} {index + 1}/{episodes}: return {episode_return:.2f}", flush=True)


def launch_command(script: str) -> str:
    """The start of a command that runs this script again when pasted into the same shell: `uv run [--extra X] PATH`
    when uv runs it from the project's own .venv, else the interpreter running it now and PATH."""
    path, here = Path(__file__).resolve(), Path.cwd().resolve()
    project = path.parent
    shown = os.path.relpath(path) if path.is_relative_to(here) else str(path)
    if os.environ.get("UV") and Path(sys.prefix).resolve() == (project / ".venv").resolve():
        # why --project: outside the project folder, uv run would not find its .venv
        where = "" if here.is_relative_to(project) else f" --project {quote(str(project))}"
        return f"uv run{where}{f' --extra {EXTRAS[script]}' if script in EXTRAS else ''} {quote(shown)}"
    return f"{quote(sys.executable)} {quote(shown)}"


# --- end shared: run ---


# --- shared: keep-best ---
class KeepBest:
    """--keep-best: checkpoints/best.pt holds the agent with the best score so far, written (atomically) when the
    score improves: at most once per evaluation, or per --checkpoint-interval where evaluation is off. The score is
    the mean return of the script's evaluation (logged as eval/best_return), or where evaluation is off
    (--eval-interval 0) the mean return of the last 10 training episodes (charts/best_training_return): those were
    played by the policies of the last few updates, not by the saved one alone. Every checkpoint stores the best
    score, so a resumed run keeps a better best.pt. best.pt resumes like any checkpoint, but never holds the replay
    buffer; --keep-checkpoints never deletes it (it prunes step_*.pt only)."""

    def __init__(self, enabled: bool, path: Path, ckpt: Optional[dict]):
        self.enabled, self.path, self.step = enabled, path, None
        self.score = -math.inf if ckpt is None else float(ckpt["run_state"].get("best_score", -math.inf))

    def offer(self, score: float, step: int, tag: str, run, snapshot: Optional[dict] = None) -> None:
        """A new score at `step`: keep the agent if it beats the best so far; log the best (`tag`)."""
        if not self.enabled:
            return
        if score > self.score:
            self.score = score
            state = snapshot if snapshot is not None else run.checkpoint(best=True)
            run.check_weights(state, "the agent --keep-best was about to keep")  # a NaN agent is never kept
            state["run_state"]["best_score"] = score
            save_checkpoint(state, self.path)
        self.step = step
        run.writer.add_scalar(tag, self.score, step)

    def offer_training_return(self, run) -> None:
        """Where evaluation is off: the mean of the recent training returns, once per step (if an episode ended)."""
        step = run.state.global_step
        if run.args.eval_interval == 0 and run.recent_returns and step != self.step:
            self.offer(float(np.mean(run.recent_returns)), step, "charts/best_training_return", run)


# --- end shared: keep-best ---


# --- shared: export ---
# Flags that say nothing about how the agent was trained: the model card's command leaves them out.
NOT_TRAINING_FLAGS = ("exp_name", "cuda", "track", "wandb_project_name", "wandb_entity", "capture_video", "save_model",
                      "runs_dir", "keep_checkpoints", "save_buffer", "resume", "eval_checkpoint", "export_checkpoint",
                      "export_dir", "log_interval", "progress")  # fmt: skip


def export_agent(args, ckpt: dict, policy: nn.Module, example_obs: torch.Tensor, model_state: dict, config: dict,
                 play: Callable[..., list], usage: str) -> Path:  # fmt: skip
    """--export-checkpoint: a folder that someone without this repository can run and share.
    policy.pt2  the acting policy (observation normalization, network, deterministic action, action scaling or
                clipping) as a torch.export program: torch.export.load("policy.pt2").module()(obs) is the action;
    model.pt    the network's state_dict (loads with weights_only=True), with config.json (sizes, spaces,
                normalization statistics): config["agent_class"](**config["agent_kwargs"]) of the script;
    README.md   a model card: the env, the training, the evaluation over --eval-episodes, use, reproduction;
    replay.mp4  one evaluation episode, with --capture-video."""
    import shutil

    source = Path(args.export_checkpoint)
    out = Path(args.export_dir) if args.export_dir else source.resolve().parent.parent / "export" / source.stem
    out.mkdir(parents=True, exist_ok=True)
    policy = copy.deepcopy(policy).cpu().eval().requires_grad_(False)  # a CPU copy: `play` below runs on the device
    # the batch dimension stays free: any number of observations in, as many actions out
    program = torch.export.export(policy, (example_obs,), dynamic_shapes=({0: torch.export.Dim("batch")},))
    tmp = out / ".policy.tmp.pt2"  # atomic, as the checkpoints: written whole, then renamed (torch.export wants .pt2)
    torch.export.save(program, tmp)
    os.replace(tmp, out / "policy.pt2")
    save_checkpoint(model_state, out / "model.pt")
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    returns = play(args.eval_episodes)
    (out / "replay.mp4").unlink(missing_ok=True)  # a video in the folder is this agent's
    if args.capture_video:
        with tempfile.TemporaryDirectory() as temp:
            video_dir = str(Path(temp) / "video")  # why a new folder: RecordVideo warns when its folder exists
            try:
                play(1, video_dir)
            except gym.error.DependencyNotInstalled as e:  # e.g. classic control renders with pygame: say, go on
                print(f"warning: no replay.mp4, the env cannot render here ({e})", file=sys.stderr)
            videos = sorted(Path(video_dir).glob("*.mp4"))
            if videos:
                shutil.move(videos[0], out / "replay.mp4")
    video = (out / "replay.mp4").is_file()
    (out / "README.md").write_text(model_card(args, ckpt, config, returns, usage, video))
    print(f"exported {source} (step {ckpt['global_step']}) to {out}: eval {np.mean(returns):.2f} +- "
          f"{np.std(returns):.2f} over {len(returns)} episodes")  # fmt: skip
    return out


def reproduce_command(script: str, saved: dict, cls) -> str:
    """`launch_command(script)` with the training flags whose saved value differs from the default."""
    defaults, words = dataclasses.asdict(cls()), [launch_command(script)]
    for f in dataclasses.fields(cls):
        value = saved.get(f.name, defaults[f.name])
        if "Suppress" in str(f.type) or f.name in NOT_TRAINING_FLAGS or value == defaults[f.name] or value is None:
            continue
        flag = f.name.replace("_", "-")
        words.append(f"--{flag}" if value is True else f"--no-{flag}" if value is False else f"--{flag} {value}")
    return " ".join(words)


def script_source() -> dict:
    """This script's name, SHA-256 and, when it runs from a git checkout, the commit (noting local changes)."""
    import hashlib
    import subprocess

    path = Path(__file__).resolve()
    source = {"file": path.name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "commit": None}
    try:
        git = ["git", "-C", str(path.parent)]
        head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if head.returncode == 0:
            changed = subprocess.run([*git, "diff", "--quiet", "HEAD", "--", path.name], timeout=10).returncode != 0
            source["commit"] = head.stdout.strip() + (" (with local changes to the script)" if changed else "")
    except (OSError, subprocess.SubprocessError):  # no git: the SHA-256 identifies the script alone
        pass
    return source


def model_card(args, ckpt: dict, config: dict, returns: list, usage: str, video: bool) -> str:
    """The export's README.md."""
    source, saved = script_source(), ckpt["args"]
    commit = f"; git commit `{source['commit']}`" if source["commit"] else ""
    files = ["- `policy.pt2`: the acting policy as a `torch.export` program (plain torch, no code of this repository)",
             "- `model.pt`, `config.json`: the network's `state_dict` (`torch.load(..., weights_only=True)`) and its "
             f"sizes, spaces and normalization statistics, for `{config['agent_class']}(**config[\"agent_kwargs\"])` "
             f"of `{source['file']}`",
             "- `README.md`: this card"] + (["- `replay.mp4`: one evaluation episode"] if video else [])  # fmt: skip
    return "\n".join([
        f"# {config['algorithm']} on {saved['env_id']}", "",
        f"Trained by `{source['file']}` (onefile-rl) for "
        f"{ckpt['global_step']:,} env steps (checkpoint `{Path(args.export_checkpoint).name}` of run "
        f"`{ckpt['run_name']}`).", "",
        "## Evaluation", "",
        f"Return **{np.mean(returns):.2f} ± {np.std(returns):.2f}** (mean ± std) over {len(returns)} episodes (evaluation "
        f"seed {saved['seed'] + 10_000}): {config['evaluation']}.", "",
        "## Use", "",
        f"Input: {config['policy_input']}. Output: {config['policy_output']}.", "",
        "```python", usage.strip(), "```", "",
        "## Files", "", *files, "",
        "## Reproduce", "",
        "```", reproduce_command(Path(source["file"]).stem, saved, type(args)), "```", "",
        f"Script `{source['file']}`, SHA-256 `{source['sha256']}`{commit}. Exported with torch {torch.__version__}, "
        f"gymnasium {gym.__version__}.", "",
    ])  # fmt: skip


# --- end shared: export ---


# --- shared: checkpoint ---
def save_checkpoint(state: dict, path: Path) -> None:
    """Write atomically: a temporary file in the same folder, fsync, then rename over the target. A crash or
    Ctrl-C mid-write leaves at worst a stray .tmp file, never a truncated checkpoint under the real name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load_checkpoint(path: str, older_flags: Optional[dict] = None) -> dict:
    """Load with weights_only=True: plain tensors and Python data only, never arbitrary pickled objects.
    older_flags: {flag: the value runs had before the flag existed}, filled into a checkpoint that lacks the flag."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"checkpoint '{path}' does not exist (or is not a file).")
    try:
        # why the CPU: RNG and env states must be CPU tensors; the modules copy their weights to their own device
        state = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types here (pickle, zip, EOF, RuntimeError): report all the same way
        raise UserError(f"checkpoint '{path}' could not be read: it is corrupt or not a checkpoint ({type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''}).") from None  # fmt: skip
    if not isinstance(state, dict) or "format" not in state or "args" not in state:
        raise UserError(f"'{path}' is a torch file but not a checkpoint written by these scripts.")
    state["args"] = {**(older_flags or {}), **state["args"]}
    return state


def check_checkpoint_matches(ckpt: dict, path: str, script: str, shapes: dict) -> None:
    """Refuse a checkpoint of another script, or one made for an env of other shapes (`shapes`: name -> value)."""
    if ckpt.get("script") != script:
        raise UserError(f"checkpoint '{path}' was written by {ckpt.get('script', 'another script')}.py, not by "
                        f"{script}.py.")  # fmt: skip
    saved = {k: ckpt.get(k) for k in shapes}
    if saved != shapes:
        describe = lambda d: ", ".join(f"{k} {tuple(v) if isinstance(v, list) else v}" for k, v in d.items())  # noqa: E731
        raise UserError(f"checkpoint '{path}' was made for {ckpt['args']['env_id']} ({describe(saved)}), which does not "
                        f"fit this env ({describe(shapes)}).")  # fmt: skip


def prune_checkpoints(ckpt_dir: Path, keep: int, prefix: str = "step_") -> None:
    """Delete all but the newest `keep` periodic checkpoints (names sort by zero-padded global step)."""
    periodic = sorted(ckpt_dir.glob(f"{prefix}*.pt"))
    for old in periodic[: max(len(periodic) - keep, 0)]:
        old.unlink()


def checkpoint_name(kind: str, global_step: int) -> str:
    return f"{kind}_{global_step:010d}.pt"


# --- end shared: checkpoint ---


# --- shared: validation ---
RULES = {
    "> 0": lambda v: v > 0,
    ">= 0": lambda v: v >= 0,
    ">= 1": lambda v: v >= 1,
    "in [0, 1]": lambda v: 0 <= v <= 1,
    "in (0, 1]": lambda v: 0 < v <= 1,
    "in [0, 1)": lambda v: 0 <= v < 1,
}


def check_flags(args, rules: dict) -> None:
    """Every numeric flag against its rule in `rules` (flag name -> a key of RULES); None (an unset optional) passes."""
    for name, rule in rules.items():
        value = getattr(args, name)
        if value is not None and not RULES[rule](value):
            raise UserError(f"--{name.replace('_', '-')} must be {rule}, not {value}.")


def check_paths(args) -> None:
    """Every path flag, before anything is made: a checkpoint flag names a file, and the folder the run writes in
    is a folder (or can be made) and writable: a new run's --runs-dir; the checkpoint's run folder on --resume,
    its eval/ or export/ folder on --eval-checkpoint / --export-checkpoint; else --export-dir. Why: a wrong path
    otherwise fails after the set-up, or with pathlib's traceback."""
    flag = next((name for name in ("resume", "eval_checkpoint", "export_checkpoint") if getattr(args, name)), None)
    if flag is None:
        return check_folder("--runs-dir", args.runs_dir, Path(args.runs_dir), "the run's folder is made in it")
    value, name = getattr(args, flag), "--" + flag.replace("_", "-")
    path = Path(value)
    if not os.path.isfile(path):  # os.path: no PermissionError from a path under an unreadable folder
        problem = "is a folder, not a file" if os.path.isdir(path) else "does not exist (or cannot be read)"
        raise UserError(f"{name} '{value}': the checkpoint {problem}.")
    run_dir = path.resolve().parent.parent
    if flag == "resume":
        for folder in (run_dir, run_dir / "checkpoints"):
            check_folder(name, value, folder, f"a resumed run writes in '{folder}'")
    elif flag == "export_checkpoint" and args.export_dir:
        check_folder("--export-dir", args.export_dir, Path(args.export_dir), "the export is written in it")
    else:  # <run folder>/eval/<checkpoint name>, or export/
        kind, what = ("eval", "evaluation is logged") if flag == "eval_checkpoint" else ("export", "export is written")
        check_folder(name, value, run_dir / kind / path.stem, f"the {what} in '{run_dir / kind / path.stem}'")


def check_folder(flag: str, value: str, folder: Path, why: str) -> None:
    """Refuse `folder` (named by `flag`'s `value`) if it cannot be made, or written in: check the part that exists."""
    existing = folder.absolute()
    while not os.path.lexists(existing):  # os.path: no PermissionError from a path under an unreadable folder
        existing = existing.parent
    where = "it" if existing == folder.absolute() else f"'{existing}'"
    if not os.path.isdir(existing):
        kind = "a broken symbolic link" if os.path.islink(existing) else "a file"
        raise UserError(f"{flag} '{value}': {why}, but {where} is {kind}, not a folder.")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"{flag} '{value}': {why}, but {where} is not writable (no permission).")


def flags_on_command_line(argv: list, cls) -> set:
    """Field names of the flags typed on the command line (`--x`, `--x=v`, `--no-x`). Why read argv: tyro cannot
    tell a flag set to its default from a flag not given."""
    names = {f.name for f in dataclasses.fields(cls)}
    given = set()
    for word in argv:
        if word.startswith("--"):
            name = word[2:].split("=", 1)[0].replace("-", "_")
            given.add(name[3:] if name not in names and name.startswith("no_") else name)
    return given & names


def merge_resume_args(cli, saved: dict, overridable: tuple, given: set):
    """--resume: the checkpoint's Args, except the flags in `overridable` (taken from the command line). A fixed flag
    typed on the command line with another value than the checkpoint's is refused, never silently ignored."""
    cls = type(cli)
    merged = dict(saved)
    for f in dataclasses.fields(cls):
        if f.name in overridable or f.name not in saved:
            merged[f.name] = getattr(cli, f.name)
        elif f.name in given and getattr(cli, f.name) != saved[f.name]:
            raise UserError(f"--{f.name.replace('_', '-')} {getattr(cli, f.name)} conflicts with the checkpoint, which "
                            f"was trained with {saved[f.name]}: a resumed run keeps it. Drop the flag, or start a new "
                            "run.")  # fmt: skip
    return cls(**{f.name: merged[f.name] for f in dataclasses.fields(cls)})


def parse_command_line(cls, overridable: tuple, rules: dict, validate: Callable, older_flags: Optional[dict] = None):
    """(args, the --resume checkpoint or None, device): flags parsed and checked before anything starts, torch's
    threads set, and on --resume the checkpoint loaded (older_flags: see load_checkpoint) and its Args merged with
    the command line's."""
    args = tyro.cli(cls)
    if args.capture_video and not os.environ.get("DISPLAY"):
        # headless: MuJoCo renders through EGL (Mesa's software EGL works without a GPU). Set before mujoco loads.
        os.environ["MUJOCO_GL"] = os.environ.get("MUJOCO_GL") or "egl"
    quiet_mujoco_warnings()
    if args.resume and args.eval_checkpoint:
        raise UserError("--resume and --eval-checkpoint exclude each other: evaluate a checkpoint, or continue it.")
    if args.export_checkpoint and (args.resume or args.eval_checkpoint):
        raise UserError("--export-checkpoint excludes --resume and --eval-checkpoint: export a checkpoint, or use it.")
    check_paths(args)  # before anything is made or loaded
    check_flags(args, rules)  # a resumed run is checked again once its Args are merged with the checkpoint's
    if not args.resume:
        validate(args)
    check_tracking(args.track)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    register_run(RUNS_FOLDER, args.torch_threads)  # a fixed count holds its cores: the others share what is left
    share_threads(args.torch_threads, RUNS_FOLDER)
    ckpt = None
    if args.resume:
        ckpt = load_checkpoint(args.resume, older_flags)
        args = merge_resume_args(args, ckpt["args"], overridable, flags_on_command_line(sys.argv[1:], cls))
        check_flags(args, rules)
        validate(args)
    return args, ckpt, device


# --- end shared: validation ---


# --- shared: errors ---
class UserError(Exception):
    """A problem with the user's input (flags, env, checkpoint): reported as one paragraph, exit code 2."""


def run_cli(main: Callable[[], None]) -> None:
    """Run main(); turn a UserError into a short message on stderr and exit code 2 instead of a traceback."""
    try:
        main()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


def check_env_id(env_id: str) -> None:
    """Fail early and clearly on an unknown id, or an Atari game (for the Atari scripts). "module:Env-v0" ids import
    `module` first, as gym.make does."""
    module, _, name = env_id.rpartition(":")
    try:
        if module:
            importlib.import_module(module)
        spec = gym.spec(name)
    except ImportError as e:
        raise UserError(f"environment id '{env_id}': module '{module}' could not be imported ({e}).") from None
    except gym.error.Error as e:
        try:  # an Atari id is known once ale-py has registered its games
            import ale_py

            gym.register_envs(ale_py)
            spec = gym.spec(name)
        except (ImportError, gym.error.Error):
            raise UserError(f"unknown environment id '{env_id}' ({e}). Check the spelling and version suffix.") from None
    if "ale_py" in str(spec.entry_point):
        raise UserError(f"'{env_id}' is an Atari game: use ppo_atari.py or a2c_atari.py (this script takes "
                        "continuous-action environments).")  # fmt: skip


def quiet_mujoco_warnings() -> None:
    """MuJoCo 4 warns at every model load that the -v4 files' `settotalmass` attribute is deprecated; the -v4 and
    -v5 gymnasium environments still load and run the same. Hide that one warning (and gymnasium's note that -v4 is
    out of date), keep every other MuJoCo warning."""
    warnings.filterwarnings("ignore", message=r".*The environment .* is out of date.*")
    try:
        import mujoco
    except ImportError:
        return

    def on_warning(message: str) -> None:
        if "settotalmass" not in message:
            print(f"MuJoCo warning: {message}", file=sys.stderr)

    mujoco.set_mju_user_warning(on_warning)


# --- end shared: errors ---


# --- shared: seeding ---
def seed_everything(seed: int, torch_deterministic: bool) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.backends.cudnn.deterministic = torch_deterministic


def get_rng_states() -> dict:
    """The global RNG states (python, numpy, torch, cuda) as plain data that loads with weights_only=True."""
    np_state = np.random.get_state()
    states = {
        "python": random.getstate(),
        "numpy": {"key": torch.from_numpy(np_state[1].astype(np.int64)), "pos": np_state[2], "has_gauss": np_state[3],
                  "cached_gaussian": np_state[4]},
        "torch": torch.get_rng_state(),
    }  # fmt: skip
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict) -> None:
    random.setstate(states["python"])
    n = states["numpy"]
    np.random.set_state(("MT19937", n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


# --- end shared: seeding ---


# --- shared: threads ---
def usable_cores() -> int:
    """Cores this process may run on: os.sched_getaffinity respects taskset / cgroups but exists only on Linux;
    elsewhere (macOS, Windows) os.cpu_count()."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def peak_rss_mb() -> Optional[float]:
    """Peak resident memory of this process in MB; None where the `resource` module is missing (Windows)."""
    try:
        import resource
    except ImportError:
        return None
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 1024  # bytes on macOS, KiB on Linux


RUNS_FOLDER = Path(tempfile.gettempdir()) / "onefile-rl-runs"  # one file per live run, named by its pid


def register_run(folder: Path, threads: int) -> None:
    """Leave this process's entry in `folder`, holding its --torch-threads, for as long as it lives (share_threads)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        entry = folder / str(os.getpid())
        entry.write_text(str(threads))
        atexit.register(entry.unlink, missing_ok=True)
    except OSError:  # a read-only temp dir: this run then counts only the others
        pass


def live_runs(folder: Path) -> tuple[int, int]:
    """(runs sharing the cores, cores held by runs with a fixed --torch-threads) among the live runs of these scripts
    on this machine; at least one sharing run: this one. Entries of dead processes are removed."""
    sharing, fixed = 0, 0
    for entry in folder.glob("[0-9]*"):
        try:
            os.kill(int(entry.name), 0)
        except ProcessLookupError:
            entry.unlink(missing_ok=True)
            continue
        except (ValueError, OSError):  # PermissionError: another user's live process
            pass
        try:
            threads = int(entry.read_text() or 0)  # empty: an entry being written, or from before the count was kept
        except (ValueError, OSError):
            threads = 0
        sharing, fixed = (sharing, fixed + threads) if threads > 0 else (sharing + 1, fixed)
    return max(sharing, 1), fixed


def share_threads(requested: int, folder: Path) -> int:
    """Set torch's CPU threads: --torch-threads N > 0 fixes N; 0 (the default) shares the cores that runs with a fixed
    count leave among the runs of these scripts alive on this machine (re-checked every few seconds). Why: torch's
    OpenMP threads spin while they wait; two runs with a thread per core each ran ~6x slower on 2 cores."""
    threads = requested
    if requested == 0:
        sharing, fixed = live_runs(folder)
        threads = max(1, (usable_cores() - fixed) // sharing)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads


# --- end shared: threads ---


# --- shared: env-state ---
def _find_wrapper(env: gym.Env, wrapper_type: type) -> Optional[gym.Wrapper]:
    while isinstance(env, gym.Wrapper):
        if isinstance(env, wrapper_type):
            return env
        env = env.env
    return None


def capture_env_state(env: gym.Env) -> dict:
    """Everything needed to continue one environment exactly where it is, as plain numbers and tensors:
    its RNG, the time-limit counter, and the simulator state (MuJoCo's integration state, or a classic-control
    env's `state` array). Returns {"exact": False} parts when the env type is unknown (it then restarts from reset)."""
    base = env.unwrapped
    state: dict = {"np_random": base.np_random.bit_generator.state, "exact": True}
    time_limit = _find_wrapper(env, gym.wrappers.TimeLimit)
    state["elapsed_steps"] = None if time_limit is None else time_limit._elapsed_steps
    if hasattr(base, "model") and hasattr(base, "data") and type(base.data).__name__ == "MjData":
        import mujoco

        spec = mujoco.mjtState.mjSTATE_INTEGRATION  # qpos, qvel, act, warm-start, ctrl, time...: bit-exact stepping
        buffer = np.empty(mujoco.mj_stateSize(base.model, spec), np.float64)
        mujoco.mj_getState(base.model, base.data, buffer, spec)
        state["mujoco"] = torch.from_numpy(buffer)
    elif isinstance(getattr(base, "state", None), np.ndarray):
        state["classic"] = torch.from_numpy(np.array(base.state, dtype=np.float64))
        if hasattr(base, "last_u"):  # Pendulum renders with it; keep it for completeness
            state["last_u"] = None if base.last_u is None else float(np.asarray(base.last_u).reshape(-1)[0])
    else:
        state["exact"] = False
    return state


def restore_env_state(env: gym.Env, state: dict) -> None:
    base = env.unwrapped
    base.np_random.bit_generator.state = state["np_random"]
    time_limit = _find_wrapper(env, gym.wrappers.TimeLimit)
    if time_limit is not None and state["elapsed_steps"] is not None:
        time_limit._elapsed_steps = state["elapsed_steps"]
    if "mujoco" in state:
        import mujoco

        mujoco.mj_setState(base.model, base.data, state["mujoco"].numpy().copy(), mujoco.mjtState.mjSTATE_INTEGRATION)
    elif "classic" in state:
        base.state = state["classic"].numpy().copy()
        if "last_u" in state:
            base.last_u = state["last_u"]


class EnvStates:
    """The states of a SyncVectorEnv's envs as one checkpoint part (state_dict / load_state_dict); `exact` says
    whether the last load restored every env exactly (else they run on from a reset)."""

    def __init__(self, envs: gym.vector.SyncVectorEnv):
        self.envs, self.exact = envs, True

    def state_dict(self) -> list:
        return [capture_env_state(env) for env in self.envs.envs]

    def load_state_dict(self, states: list) -> None:
        if len(states) != len(self.envs.envs):
            raise UserError(f"checkpoint has {len(states)} env states, the run has {len(self.envs.envs)} envs.")
        for env, state in zip(self.envs.envs, states):
            restore_env_state(env, state)
        self.exact = all(state["exact"] for state in states)


# --- end shared: env-state ---


if __name__ == "__main__":
    run_cli(main)
