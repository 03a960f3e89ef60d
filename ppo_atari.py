"""Proximal Policy Optimization (PPO) on Atari (pixels, discrete actions), in one file.
Docs: docs/ppo_atari.md; the algorithm: https://arxiv.org/abs/1707.06347; `diff ppo_atari.py a2c_atari.py` shows what differs
between the two algorithms. The map of this file, top to bottom:
  Args            algorithm flags, then run flags (`python ppo_atari.py --help` lists them)
  make_env        gymnasium's Atari preprocessing, and the two steps it lacks (EpisodicLife, FireReset)
  Agent           the Nature CNN: a shared trunk, a policy-logit head and a value head
  helpers         next-step autoreset targets, GAE, the PPO losses (one line of math above each)
  main()          set-up, then the loop: rollout -> advantages -> update -> log, then finish
  # === Plumbing  flag rules, runs, checkpoints, resume, errors, progress, evaluation (Policy)
"""

import argparse
import copy
import dataclasses
import fcntl
import json
import math
import os
import random
import re
import shlex
import shutil
import signal
import sys
import time
import traceback
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, get_args, get_type_hints

if __name__ == "__main__":  # Ctrl-C while the libraries below load (seconds): exit at once, nothing is written yet
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: os._exit(130))
import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro
from torch.distributions import Categorical

SCRIPT_NAME = "ppo_atari"  # written into checkpoints; a checkpoint of another script is refused


@dataclass
class Args:
    """PPO on Atari (pixels, discrete actions): trains an agent and logs to TensorBoard.
    --resume CKPT continues the run of checkpoint CKPT; `python tools/agent.py eval|export CKPT` plays or exports it."""

    # --- algorithm ---
    env_id: str = "BreakoutNoFrameskip-v4"  # the game: GameNoFrameskip-v4, or ALE/Game-v5 (sticky actions, p=0.25)
    total_timesteps: int = 10_000_000  # env steps to train for, summed over all envs (an env step is 4 emulator frames)
    learning_rate: float = 2.5e-4  # learning rate of Adam (the start value with --anneal-lr)
    num_envs: int = 8  # envs stepped in parallel, as one vector env
    num_steps: int = 128  # steps per env per rollout (batch = num_envs * num_steps)
    anneal_lr: bool = True  # decay the learning rate linearly towards 0 over training
    gamma: float = 0.99  # discount factor, in [0, 1]
    gae_lambda: float = 0.95  # lambda of GAE, in [0, 1] (0: one-step TD, 1: Monte Carlo)
    num_minibatches: int = 4  # minibatches per pass; must divide the batch (num_envs * num_steps)
    update_epochs: int = 4  # passes over the batch per update
    norm_adv: bool = True  # normalize advantages per minibatch
    clip_coef: float = 0.1  # clip range eps: the probability ratio is clipped to [1 - eps, 1 + eps]
    anneal_clip: bool = False  # decay the clip range linearly towards 0 over training, like the learning rate
    clip_vloss: bool = True  # clip the value loss around the rollout's values, by +-clip_coef
    ent_coef: float = 0.01  # weight of the entropy bonus in the loss
    vf_coef: float = 0.5  # weight of the value loss in the loss
    max_grad_norm: float = 0.5  # clip the gradients' global norm to this
    target_kl: Optional[float] = None  # stop the update after an epoch whose mean approx. KL exceeds this (None = never)

    # --- run ---
    exp_name: str = os.path.basename(__file__)[: -len(".py")]  # name of the experiment, part of the run folder's name
    seed: int = 1  # random seed of the run
    torch_deterministic: bool = True  # make cuDNN pick deterministic algorithms (torch.backends.cudnn.deterministic)
    cuda: bool = True  # use the GPU when there is one
    torch_threads: int = 0  # torch's CPU threads; 0 = one per usable core (set it when runs share a machine)
    async_envs: bool = False  # step the envs in worker processes (AsyncVectorEnv); off = in-process, faster
    track: bool = False  # log to Weights and Biases too (WANDB_MODE=offline works without network)
    wandb_project_name: str = "onefile-rl"  # wandb project
    wandb_entity: Optional[str] = None  # wandb entity, a team or user (None = your wandb default)
    capture_video: bool = False  # record videos of env 0 under runs/<run>/videos
    save_model: bool = False  # save a final checkpoint at the end of training, then evaluate it
    runs_dir: str = "runs"  # folder with one sub-folder per run (TensorBoard events, checkpoints, videos)
    checkpoint_interval: int = 100_000  # write a checkpoint every N env steps (0 = never; Ctrl-C and --save-model still save)
    keep_checkpoints: int = 3  # how many of the newest periodic checkpoints to keep (the final one is always kept)
    resume: Optional[str] = None  # continue the run of this checkpoint (in its folder if nothing came after; games restart)
    eval_episodes: int = 10  # full games per evaluation (every --eval-interval, and after --save-model)
    eval_interval: int = 0  # every N env steps, play --eval-episodes games (greedy actions) on a separate env (0 = never)
    keep_best: bool = False  # keep checkpoints/best.pt: the agent with the best evaluation (else training) return so far
    progress: bool = True  # show progress: a one-line display on a terminal, a plain line every 30 s otherwise

    # --- derived from the flags above (not flags themselves) ---
    batch_size: int = field(init=False, default=0)  # the batch size: num_envs * num_steps
    num_iterations: int = field(init=False, default=0)  # the number of iterations: total_timesteps // batch_size

    def __post_init__(self):
        validate_args(self)  # tyro runs it: each flag's range, the sizes that must fit together, the derived sizes


# --- shared: layer-init ---
def layer_init(layer: nn.Module, std: float = math.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    """Orthogonal weights with gain `std`, constant bias: the initialization the PPO implementations share."""
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


# --- end shared: layer-init ---


# --- shared: atari ---
def make_env(env_id: str, idx: int, capture_video: bool, video_dir: str) -> Callable[[], gym.Env]:
    """One Atari env under the standard preprocessing (Mnih et al. 2015; Machado et al. 2018), innermost first."""

    def thunk() -> gym.Env:
        import ale_py

        gym.register_envs(ale_py)
        ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
        render_mode = "rgb_array" if capture_video and idx == 0 else None
        # frameskip=1: AtariPreprocessing skips frames (v5's own skip would come on top); sticky actions: the id's own;
        # ALE truncates a game at 108,000 frames (30 minutes of play at 60 fps)
        env = gym.make(env_id, obs_type="grayscale", frameskip=1, max_num_frames_per_episode=108_000, render_mode=render_mode)
        if render_mode is not None:
            env = gym.wrappers.RecordVideo(env, video_dir, disable_logger=True)  # env 0's full screen, unprocessed
        # 1..30 NOOPs after a reset (each game starts in another state); each action held for 4 frames, returning
        # the max of the last two (Atari draws some sprites on odd frames only); the screen as 84x84 grayscale
        env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84)
        # info["episode"]: the whole game's score (all lives, unclipped) and length, below EpisodicLife and ClipReward
        env = gym.wrappers.RecordEpisodeStatistics(env)
        env = EpisodicLife(env)  # a lost life ends the learning episode (terminated), not the game
        if "FIRE" in env.unwrapped.get_action_meanings():
            env = FireReset(env)  # press FIRE after every reset (Breakout waits for it)
        env = gym.wrappers.ClipReward(env, -1.0, 1.0)  # learn from sign(r): Atari's rewards are whole points
        return gym.wrappers.FrameStackObservation(env, 4)  # the last 4 frames, oldest first: (4, 84, 84) uint8

    return thunk


class EpisodicLife(gym.Wrapper):
    """A lost life ends the learning episode (terminated: no value beyond it; learning goes faster), not the game: reset()
    then takes one NOOP step. By hand: AtariPreprocessing(terminal_on_life_loss=True) would restart the whole game."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.lives, self.game_over = 0, True

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = terminated or truncated
        lives = self.unwrapped.ale.lives()
        terminated = terminated or 0 < lives < self.lives
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs) if self.game_over else step_in_reset(self.env, 0, kwargs)
        self.lives, self.game_over = self.unwrapped.ale.lives(), False
        return obs, info


class FireReset(gym.Wrapper):
    """Press FIRE after every reset, and so after every lost life: games like Breakout wait for it, and an agent
    that has not learned to press it would idle until the time limit. By hand: gymnasium has no such wrapper."""

    def reset(self, **kwargs):
        _, info = self.env.reset(**kwargs)  # it may report a game that ended in EpisodicLife's NOOP step
        obs, fire_info = step_in_reset(self.env, 1, kwargs)
        return obs, {**info, **fire_info}


def step_in_reset(env: gym.Env, action: int, reset_kwargs: dict) -> tuple:
    """(obs, info) of a step a reset takes (EpisodicLife's NOOP, FireReset's FIRE). Where it ends the game or a life,
    the env resets again, and the info keeps a finished game's statistics: no game goes unreported."""
    obs, _, terminated, truncated, info = env.step(action)
    if terminated or truncated:
        obs, reset_info = env.reset(**reset_kwargs)
        info = {**reset_info, "episode": info["episode"]} if "episode" in info else reset_info
    return obs, info


class Agent(nn.Module):
    """The Nature CNN (Mnih et al. 2015): three convolutions and a 512-unit layer shared by a policy-logit head and
    a value head. Input: (batch, 4, 84, 84) uint8 frames, scaled to [0, 1] here."""

    def __init__(self, num_actions: int):
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(4, 32, 8, stride=4)),
            nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)),
            nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)),
            nn.ReLU(),
            nn.Flatten(),
            layer_init(nn.Linear(64 * 7 * 7, 512)),
            nn.ReLU(),
        )
        self.actor = layer_init(nn.Linear(512, num_actions), std=0.01)
        self.critic = layer_init(nn.Linear(512, 1), std=1.0)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(policy logits, V(obs)) of a batch of uint8 observations."""
        # the frames channels-last, as main() lays out the weights: the fast layout of CPU convolutions, the same function
        hidden = self.network(obs.contiguous(memory_format=torch.channels_last).float() / 255.0)
        return self.actor(hidden), self.critic(hidden).squeeze(-1)

    def get_action_and_value(self, obs: torch.Tensor, action: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, ...]:
        """(action, log pi(action|obs), entropy, V(obs)): the one policy distribution; samples a ~ pi(.|obs) if no action."""
        logits, value = self(obs)
        # validate_args=False: NaN weights reach the non-finite check at the next log (a message, a clean stop)
        pi = Categorical(logits=logits, validate_args=False)
        if action is None:
            action = pi.sample()
        return action, pi.log_prob(action), pi.entropy(), value


def next_step_targets(values: np.ndarray, last_value: np.ndarray, reset_steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Under next-step autoreset, over a (num_steps, num_envs) rollout: next_values[t] = V(obs[t+1]), the episode's final
    obs where it ended at t (a truncation bootstraps from it); real: the flat indices of the real transitions, all but
    the reset steps (reset_steps[t]: the step after an episode end, whose action the env ignored)."""
    next_values = np.concatenate([values[1:], last_value[None]], axis=0)
    real = np.flatnonzero(~reset_steps.reshape(-1))
    return next_values, real


# --- end shared: atari ---


# ---- algorithm helpers: no globals, tensors / arrays in and out (the tests import them) ----
# --- shared: ppo ---
def compute_gae(
    rewards: np.ndarray,
    values: np.ndarray,
    next_values: np.ndarray,
    terminations: np.ndarray,
    truncations: np.ndarray,
    gamma: float,
    gae_lambda: float,
) -> np.ndarray:
    """Generalized Advantage Estimation over a (num_steps, num_envs) rollout, all arrays "after step t"; next_values[t]
    is V of transition t's true next state (V(final obs) where the episode ended at t):
        delta_t = r_t + gamma * (1 - terminated_t) * V(s_{t+1}) - V(s_t)
        A_t     = delta_t + gamma * lambda * (1 - (terminated_t or truncated_t)) * A_{t+1}
    A truncation (time limit) keeps V(final obs): the state was not terminal. Either end stops the recursion."""
    advantages = np.zeros_like(rewards)
    last_gae = np.zeros_like(rewards[0])
    not_terminated = 1.0 - terminations.astype(rewards.dtype)
    not_ended = 1.0 - np.logical_or(terminations, truncations).astype(rewards.dtype)
    for t in reversed(range(rewards.shape[0])):
        delta = rewards[t] + gamma * not_terminated[t] * next_values[t] - values[t]
        last_gae = delta + gamma * gae_lambda * not_ended[t] * last_gae
        advantages[t] = last_gae
    return advantages


def ppo_losses(
    new_logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    new_values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    clip_coef: float,
    clip_vloss: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The clipped-surrogate policy loss and the (optionally clipped) value loss; also log(ratio) for diagnostics."""
    log_ratio = new_logprob - old_logprob
    ratio = log_ratio.exp()
    # L^CLIP = -E[min(r A, clip(r, 1-eps, 1+eps) A)], r = pi_new(a|s) / pi_old(a|s)
    pg_loss = torch.max(-advantages * ratio, -advantages * torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef)).mean()
    # L^V = 1/2 E[max((V - R)^2, (V_old + clip(V - V_old, -eps, eps) - R)^2)]  (unclipped: 1/2 E[(V - R)^2])
    v_loss_unclipped = (new_values - returns) ** 2
    v_clipped = old_values + torch.clamp(new_values - old_values, -clip_coef, clip_coef)
    v_loss = 0.5 * (torch.max(v_loss_unclipped, (v_clipped - returns) ** 2) if clip_vloss else v_loss_unclipped).mean()
    return pg_loss, v_loss, log_ratio.detach()


def kl_diagnostics(log_ratio: torch.Tensor, clip_coef: float) -> torch.Tensor:
    """[old_approx_kl, approx_kl, clipfrac], averaged over all samples given; the KL(old || new) estimators of
    http://joschu.net/blog/kl-approx.html: k1 = -log r, k3 = (r - 1) - log r."""
    ratio = log_ratio.exp()
    return torch.stack([(-log_ratio).mean(), ((ratio - 1) - log_ratio).mean(), ((ratio - 1).abs() > clip_coef).float().mean()])


# --- end shared: ppo ---


# --- shared: diagnostics-and-schedules ---
def explained_variance(y_pred: np.ndarray, y_true: np.ndarray) -> float:
    """1 - Var[y - y_pred] / Var[y]: 1 is a perfect value function, 0 no better than a constant, NaN if Var[y]=0."""
    var_y = np.var(y_true)
    return float("nan") if var_y == 0 else float(1 - np.var(y_true - y_pred) / var_y)


def annealed(iteration: int, num_iterations: int, value: float) -> float:
    """Linear decay from `value` at iteration 1 to value/num_iterations at the last iteration."""
    return (1.0 - (iteration - 1.0) / num_iterations) * value


# --- end shared: diagnostics-and-schedules ---


def main() -> None:
    args, ckpt, device = parse_command_line(Args)
    obs_shape, num_actions = probe_env(args.env_id)
    run = Run(args, SCRIPT_NAME, ckpt, {"num_actions": num_actions}, args.batch_size)
    seed_everything(args.seed, args.torch_deterministic)
    env_seed = args.seed + (0 if ckpt is None else ckpt["iteration"]) * args.num_envs  # a resumed run: other games
    # Next-step autoreset: the step after an episode's end ignores its action and returns the next episode's first obs:
    # a reset step, no transition (reset_step_buf marks it). An episode's last obs is its final obs: truncations bootstrap.
    envs = make_vector_env(args, str(run.dir / "videos"))
    assert envs.metadata["autoreset_mode"] == gym.vector.AutoresetMode.NEXT_STEP, "the loop assumes next-step autoreset"

    agent = Agent(num_actions).to(device, memory_format=torch.channels_last)  # same values, faster CPU convolutions
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)  # one kernel per step

    # ---- storage: everything indexed "at step t" of the rollout ----
    obs_buf = torch.zeros((args.num_steps, args.num_envs, *obs_shape), dtype=torch.uint8)  # frames the policy saw
    actions_buf = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long)
    logprobs_buf = torch.zeros((args.num_steps, args.num_envs))
    values_buf = torch.zeros((args.num_steps, args.num_envs))
    rewards_buf = np.zeros((args.num_steps, args.num_envs), np.float32)  # clipped rewards
    # the episode ended at t by a terminal state (or a lost life) / by the time limit; step t only reset the env
    terminations_buf, truncations_buf, reset_step_buf = np.zeros((3, args.num_steps, args.num_envs), bool)

    next_obs, _ = envs.reset(seed=env_seed)
    episode_ended = np.zeros(args.num_envs, bool)  # the last step ended an episode: the next step is a reset step
    s = LoopState()
    run.attach(s, envs, model=agent, optimizer=optimizer)
    run.play = player(Policy(agent), args.env_id, args.seed + 10_000)  # evaluation: full games on a separate env

    for iteration in run.iterations(s, args.num_iterations):  # between iterations: checkpoints, Ctrl-C, progress
        lr = annealed(iteration, args.num_iterations, args.learning_rate) if args.anneal_lr else args.learning_rate
        optimizer.param_groups[0]["lr"] = lr
        clip_coef = annealed(iteration, args.num_iterations, args.clip_coef) if args.anneal_clip else args.clip_coef

        # ---- rollout: act with the current policy, record transitions ----
        with run.timer("rollout"):
            for step in range(args.num_steps):
                s.global_step += args.num_envs
                obs_buf[step] = obs = torch.from_numpy(next_obs)
                reset_step_buf[step] = episode_ended
                with torch.inference_mode():
                    action, logprob, _, value = agent.get_action_and_value(obs.to(device))
                actions_buf[step], logprobs_buf[step], values_buf[step] = action.cpu(), logprob.cpu(), value.cpu()
                next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
                rewards_buf[step], terminations_buf[step], truncations_buf[step] = reward, terminations, truncations
                episode_ended = terminations | truncations
                for _, game_return, game_length in finished_games(infos):  # whole games, not lives
                    run.episode(game_return, game_length, s.global_step)

        with run.timer("update"):
            # ---- advantages ----
            with torch.inference_mode():
                _, last_value = agent(torch.from_numpy(next_obs).to(device))
            next_values, real = next_step_targets(values_buf.numpy(), last_value.cpu().numpy(), reset_step_buf)
            advantages = compute_gae(
                rewards_buf, values_buf.numpy(), next_values, terminations_buf, truncations_buf, args.gamma, args.gae_lambda
            )
            returns = advantages + values_buf.numpy()
            # flatten (num_steps, num_envs) -> batch, keeping only the real transitions (not the reset steps)
            b_obs, b_actions, b_logprobs, b_values, b_advantages, b_returns = (
                torch.as_tensor(x).flatten(0, 1)[real].to(device)
                for x in (obs_buf, actions_buf, logprobs_buf, values_buf, advantages, returns)
            )
            # the reset steps leave the batch a few samples short: each epoch leaves out another random remainder
            minibatch_size = len(real) // args.num_minibatches

            # ---- update: update_epochs passes over the batch in shuffled minibatches ----
            losses, kls = [], []  # on the device (one sync per update): per minibatch, losses and grad_norm; per epoch, KLs
            log_ratios = torch.zeros((args.num_minibatches, minibatch_size), device=device)
            for epoch in range(args.update_epochs):
                perm = torch.randperm(len(real), device=device)[: args.num_minibatches * minibatch_size]
                for mb, idx in enumerate(perm.view(args.num_minibatches, minibatch_size)):
                    _, new_logprob, entropy, new_values = agent.get_action_and_value(b_obs[idx], b_actions[idx])
                    entropy = entropy.mean()
                    mb_advantages = b_advantages[idx]
                    if args.norm_adv:
                        mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
                    pg_loss, v_loss, log_ratios[mb] = ppo_losses(
                        new_logprob,
                        b_logprobs[idx],
                        mb_advantages,
                        new_values,
                        b_values[idx],
                        b_returns[idx],
                        clip_coef,
                        args.clip_vloss,
                    )
                    # L = L^CLIP - c_ent * H + c_v * L^V
                    loss = pg_loss - args.ent_coef * entropy + args.vf_coef * v_loss
                    optimizer.zero_grad()
                    loss.backward()
                    grad_norm = nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)  # norm before clipping
                    optimizer.step()
                    losses.append(torch.stack([pg_loss.detach(), v_loss.detach(), entropy.detach(), grad_norm]))
                kls.append(kl_diagnostics(log_ratios, clip_coef))  # old_approx_kl, approx_kl, clipfrac over the epoch
                if args.target_kl is not None and kls[-1][1].item() > args.target_kl:  # KL early stop
                    break

        # ---- log: every metric is a mean over all minibatches of the update (not the last minibatch's value) ----
        names = ("policy_loss", "value_loss", "entropy", "grad_norm", "old_approx_kl", "approx_kl", "clipfrac")
        means = torch.cat([torch.stack(losses).mean(0), torch.stack(kls).mean(0)]).tolist()
        metrics = {f"losses/{name}": mean for name, mean in zip(names, means)}
        metrics["losses/explained_variance"] = explained_variance(b_values.cpu().numpy(), b_returns.cpu().numpy())
        metrics["charts/learning_rate"], metrics["charts/clip_coef"] = lr, clip_coef
        run.log(s.global_step, metrics)

    run.finish()  # after Ctrl-C: saved, exits; with --save-model: the final agent evaluated (run.play), then saved


# === Plumbing: runs, checkpoints, errors; not needed to follow the algorithm ===
# What follows makes the script a dependable research tool: the flags' rules, resume, evaluation,
# checkpoints, TensorBoard / wandb, progress, Ctrl-C. The `shared:` blocks are the same text in every script that has
# them (tests/test_shared_blocks.py).


# The rule each numeric flag must meet (rule: the flags it applies to; the run flags' are in RUN_RULES)
FLAG_RULES = {
    ">= 1": "total_timesteps num_envs num_steps num_minibatches update_epochs",
    "> 0": "learning_rate clip_coef target_kl max_grad_norm",
    "in [0, 1]": "gamma gae_lambda",
    ">= 0": "ent_coef vf_coef",
}


def validate_args(args: Args) -> None:
    """Each flag against its rule; then what single-flag rules cannot say: sizes that must fit together; the derived sizes."""
    check_flags(args, FLAG_RULES)
    batch_size = args.batch_size = args.num_envs * args.num_steps  # the derived sizes (Args' init=False fields)
    args.num_iterations = args.total_timesteps // batch_size
    if batch_size % args.num_minibatches != 0:
        raise UserError(
            f"num_minibatches ({args.num_minibatches}) must divide the batch size num_envs * num_steps = "
            f"{args.num_envs} * {args.num_steps} = {batch_size}."
        )
    if args.total_timesteps < batch_size:
        raise UserError(
            f"total_timesteps ({args.total_timesteps}) is below one batch (num_envs * num_steps = "
            f"{batch_size}): no update would run. Raise --total-timesteps or lower --num-steps."
        )
    minibatch = batch_size // args.num_minibatches
    if args.norm_adv and minibatch < 2:
        raise UserError(
            f"--norm-adv divides by the advantages' standard deviation over a minibatch, undefined for a "
            f"minibatch of {minibatch}: raise --num-envs or --num-steps, or leave --norm-adv off."
        )


# --- shared: atari-run ---
ATARI_ID = re.compile(r"^(?:(?P<v4>[A-Za-z]+)NoFrameskip-v4|ALE/(?P<v5>[A-Za-z]+)-v5)$")


def parse_atari_id(env_id: str) -> tuple[str, float]:
    """'BreakoutNoFrameskip-v4' -> ('Breakout', 0.0); 'ALE/Breakout-v5' -> ('Breakout', 0.25): the game and its
    sticky-action probability (v5 repeats the previous action with p=0.25, Machado et al. 2018; v4 never does)."""
    match = ATARI_ID.match(env_id)
    if match is None:
        raise UserError(
            f"'{env_id}' is not an Atari id this script takes: use GameNoFrameskip-v4 (e.g. "
            "BreakoutNoFrameskip-v4) or ALE/Game-v5 (e.g. ALE/Breakout-v5). For continuous-action tasks "
            "(MuJoCo, Pendulum) use ppo_continuous.py, sac_continuous.py or sac_continuous_ray.py."
        )
    return (match["v4"], 0.0) if match["v4"] else (match["v5"], 0.25)


def check_atari_env(env_id: str) -> None:
    """Fail early and clearly: an id of another form, ale-py missing, or an unknown game."""
    parse_atari_id(env_id)
    try:
        import ale_py
    except ImportError:
        raise UserError(
            "ale-py is not installed: run the README's commands (`uv run --all-extras ...`), or `pip install ale-py`."
        ) from None
    gym.register_envs(ale_py)  # gymnasium 1.x no longer finds the ALE envs by itself
    try:
        gym.spec(env_id)
    except gym.error.Error as e:
        raise UserError(
            f"unknown Atari game in '{env_id}' ({e}). The games are listed by `ale_py.roms.get_all_rom_ids()`."
        ) from None


def probe_env(env_id: str) -> tuple[tuple, int]:
    """Check the id and make one preprocessed env: (observation shape, number of actions)."""
    check_atari_env(env_id)
    env = make_env(env_id, 0, False, "")()
    obs_shape, num_actions = env.observation_space.shape, int(env.action_space.n)  # ALE's action spaces are discrete
    env.close()
    return obs_shape, num_actions


def ignoring_stop_signals(thunk: Callable[[], gym.Env]) -> Callable[[], gym.Env]:
    """For env worker processes: Ctrl-C reaches the whole process group, and a worker that died of it would break
    the main process's last iteration before its checkpoint. The main process decides when to stop."""

    def in_worker() -> gym.Env:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        return thunk()

    return in_worker


class Policy(nn.Module):
    """The agent as evaluation and export run it: uint8 frame stacks -> the most likely actions (argmax of the logits)."""

    def __init__(self, agent: Agent):
        super().__init__()
        self.agent = agent

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.agent(obs)[0].argmax(dim=-1)


def policy_from_checkpoint(ckpt: dict) -> Policy:
    """The checkpoint's agent as its Policy, on the CPU (tools/agent.py evaluates and exports it); a checkpoint of
    another script or another game's actions stops with a message (an Agent of other shapes: load_state_dict's)."""
    num_actions = probe_env(ckpt["args"]["env_id"])[1]
    check_checkpoint_matches(ckpt, ckpt.get("path", ""), SCRIPT_NAME, {"num_actions": num_actions})
    agent = Agent(num_actions)
    agent.load_state_dict(ckpt["model"])
    return Policy(agent)


@dataclass
class LoopState:
    """What the loop carries across iterations, saved in checkpoints (the games are not: a resumed run resets them)."""

    global_step: int = 0
    iteration: int = 0  # the last completed iteration


def make_vector_env(args, video_dir: str):
    """The batch of envs for training, with next-step autoreset (see the rollout)."""
    thunks = [make_env(args.env_id, i, args.capture_video, video_dir) for i in range(args.num_envs)]
    if args.async_envs:  # worker processes ignore Ctrl-C: the main process finishes its iteration and saves
        thunks = [ignoring_stop_signals(thunk) for thunk in thunks]
        return gym.vector.AsyncVectorEnv(thunks, autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)
    return gym.vector.SyncVectorEnv(thunks, autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)


def eval_env(env_id: str, video_dir: Optional[str] = None) -> gym.Env:
    """The env evaluation plays on: env 0's chain, recording a video into video_dir if given."""
    return make_env(env_id, 0, video_dir is not None, video_dir or "")()


def player(policy: nn.Module, env_id: str, seed: int) -> Callable:
    """run.play(episodes, video_dir=None): `policy` plays full games on a new eval_env, from the same seed each time."""
    return lambda episodes, video_dir=None: evaluate(policy, eval_env(env_id, video_dir), episodes, seed)


def finished_games(infos: dict) -> list:
    """[(env index, full-game return, length)] for each game that ended at this step (RecordEpisodeStatistics)."""
    episode = infos.get("episode")
    return [(int(i), float(episode["r"][i]), int(episode["l"][i])) for i in np.flatnonzero(infos.get("_episode", []))]


def evaluate(
    policy: nn.Module, env: gym.Env, episodes: int, seed: int, report: Callable[[int, float], None] = lambda i, r: None
) -> list[float]:
    """Plays `episodes` full games with `policy` on `env` (eval_env's), stepped as the rollout steps its envs (a game
    that loops without scoring ends at the 108k-frame limit); returns each game's unclipped score over all its lives
    (`report` hears of each game). Closes env."""
    envs = gym.vector.SyncVectorEnv([lambda: env], autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)
    device = next(policy.parameters()).device
    obs, _ = envs.reset(seed=seed)
    returns: list[float] = []
    while len(returns) < episodes:
        with torch.inference_mode():
            actions = policy(torch.as_tensor(obs, device=device)).cpu().numpy()
        obs, _, _, _, infos = envs.step(actions)
        for _, game_return, _ in finished_games(infos):  # whole games, not lives
            returns.append(game_return)
            report(len(returns) - 1, game_return)
    envs.close()
    return returns


# --- end shared: atari-run ---


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
