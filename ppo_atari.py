"""Proximal Policy Optimization (PPO) on Atari (pixels, discrete actions), in one file.

Map of this file, top to bottom:
  Args            algorithm flags, then run flags (`python ppo_atari.py --help` lists them)
  make_env        the Atari preprocessing, one wrapper per step, in order (the wrappers are defined below the banner)
  Agent           the Nature CNN: a shared trunk, a policy-logit head and a value head
  helpers         next-step autoreset targets, GAE, the PPO losses (one line of math above each)
  main()          set-up, then the loop: rollout -> advantages -> update -> log, then finish
  # === Plumbing  runs, checkpoints, resume, errors, progress, the wrappers and env backends, speed set-up

Runs on gymnasium 1.x / ale-py 0.10+; `diff ppo_atari.py a2c_atari.py` shows what differs between
the two algorithms. Docs: docs/ppo_atari.md; the algorithm: https://arxiv.org/abs/1707.06347
"""

import atexit
import copy
import dataclasses
import importlib
import importlib.util
import json
import math
import os
import random
import re
import signal
import sys
import tempfile
import time
import warnings
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro

SCRIPT_NAME = "ppo_atari"  # written into checkpoints; a checkpoint of another script is refused


@dataclass
class Args:
    """PPO on Atari (pixels, discrete actions): trains an agent and logs to TensorBoard.

    Modes:  --resume CKPT             continue the run of checkpoint CKPT
            --eval-checkpoint CKPT    play checkpoint CKPT's agent, no training (see --eval-episodes)
            --export-checkpoint CKPT  write a folder that runs CKPT's agent with plain torch (see --export-dir)"""
    # --- algorithm ---
    env_id: str = "BreakoutNoFrameskip-v4"
    """id of the Atari game: GameNoFrameskip-v4 (no sticky actions) or ALE/Game-v5 (sticky actions, p=0.25)"""
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
    torch_threads: int = 0  # torch's CPU threads; 0 = share this machine's cores among the runs of these scripts on it
    bf16: bool = False  # run the CNN's convolutions and hidden layer in bfloat16 (autocast; heads, losses float32)
    env_backend: str = "gymnasium"
    """`gymnasium` (this file's wrappers on ale-py) or `ale-vector` (ale-py's C++ vector env, faster; unlike
    gymnasium: FIRE then 0-28 NOOPs at a game's start, one FIRE step after a lost life, the 108k-frame limit counted
    after the start's NOOPs, a stale newest frame at a game's end, other random streams; see the docs); video and the
    evaluation games always run on gymnasium"""
    async_envs: bool = False  # gymnasium backend: step the envs in worker processes (AsyncVectorEnv); off = in-process, faster
    env_threads: int = 0  # ale-vector backend: worker threads (0 = one per core this process may use)
    track: bool = False  # log to Weights and Biases too (WANDB_MODE=offline works without network)
    wandb_project_name: str = "onefile-rl"  # wandb project
    wandb_entity: Optional[str] = None  # wandb entity, a team or user (None = your wandb default)
    capture_video: bool = False  # record videos of env 0 under runs/<run>/videos (gymnasium backend)
    save_model: bool = False  # save a final checkpoint at the end of training, then evaluate it
    runs_dir: str = "runs"  # folder with one sub-folder per run (TensorBoard events, checkpoints, videos)
    checkpoint_interval: int = 100_000  # write a checkpoint every N env steps (0 = never; Ctrl-C and --save-model still save)
    keep_checkpoints: int = 3  # how many of the newest periodic checkpoints to keep (the final one is always kept)
    resume: Optional[str] = None  # continue the run of this checkpoint (appends to its run folder; the games restart)
    eval_checkpoint: Optional[str] = None  # play this checkpoint for --eval-episodes games, no training
    eval_episodes: int = 10  # full games per evaluation (every --eval-interval, after --save-model, with --eval-checkpoint)
    eval_interval: int = 0  # every N env steps, play --eval-episodes games (sampled actions) on a separate env (0 = never)
    keep_best: bool = False  # keep checkpoints/best.pt: the agent with the best evaluation (else training) return so far
    export_checkpoint: Optional[str] = None  # checkpoint to export as a folder that runs with plain torch (no training)
    export_dir: Optional[str] = None  # folder to export into; None = <run folder>/export/<checkpoint name>
    progress: bool = True  # show progress: a one-line display on a terminal, a plain line every 30 s otherwise

    # --- derived from the flags above (not flags themselves) ---
    batch_size: tyro.conf.Suppress[int] = 0  # the batch size: num_envs * num_steps
    minibatch_size: tyro.conf.Suppress[int] = 0  # the mini-batch size: batch_size // num_minibatches
    num_iterations: tyro.conf.Suppress[int] = 0  # the number of iterations: total_timesteps // batch_size


# --- shared: atari-make-env ---
MAX_FRAMES_PER_GAME = 108_000  # 30 minutes of play at 60 fps; ALE truncates the game there


def make_env(env_id: str, idx: int, capture_video: bool, video_dir: str, episodic_life: bool = True) -> Callable[[], gym.Env]:
    """One Atari env under the standard preprocessing (Mnih et al. 2015; Machado et al. 2018), one wrapper per step,
    innermost first. GameStatistics sits above EpisodicLife and below ClipReward: the logged return is the full
    game's score. The wrappers are defined below the banner. Video, when asked for, records env 0's full screen."""

    def thunk() -> gym.Env:
        import ale_py

        gym.register_envs(ale_py)
        ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
        _, sticky = parse_atari_id(env_id)
        render_mode = "rgb_array" if capture_video and idx == 0 else None
        # frameskip=1: our MaxAndSkip does the skipping; v5's own skip (4, no max-pooling) would be applied twice.
        env = gym.make(env_id, obs_type="grayscale", frameskip=1, repeat_action_probability=sticky,
                       max_num_frames_per_episode=MAX_FRAMES_PER_GAME, render_mode=render_mode)  # fmt: skip
        if render_mode is not None:
            env = gym.wrappers.RecordVideo(env, video_dir, disable_logger=True)
        env = NoopReset(env, noop_max=30)  # 1..30 NOOPs after a reset: each game starts in a different state
        env = MaxAndSkip(env, skip=4)  # each action held for 4 frames; the max of the last two frames
        if episodic_life:
            env = EpisodicLife(env)  # a lost life ends the learning episode (terminated), not the game
        if "FIRE" in env.unwrapped.get_action_meanings():
            env = FireReset(env)  # press FIRE after every reset (Breakout waits for it)
        env = GameStatistics(env)  # the whole game's score and length (all lives, unclipped) in info["episode"]
        env = ClipReward(env)  # learn from sign(r)
        env = Resize84(env)  # 210x160 -> 84x84 grayscale
        return FrameStack(env, 4)  # the last 4 frames, oldest first: (4, 84, 84) uint8

    return thunk


# --- end shared: atari-make-env ---


# --- shared: layer-init ---
def layer_init(layer: nn.Module, std: float = math.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    """Orthogonal weights with gain `std`, constant bias: the initialization the PPO implementations share."""
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


# --- end shared: layer-init ---


# --- shared: nature-cnn ---
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
        """(logits, V(obs)) of a batch of uint8 observations."""
        hidden = self.network(obs.float() / 255.0)
        return self.actor(hidden), self.critic(hidden).squeeze(-1)

    def get_action_and_value(self, obs: torch.Tensor, action: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, ...]:
        """(action, log pi(action|obs), entropy, V(obs)); samples a ~ pi(.|obs) when no action is given."""
        logits, value = self(obs)
        if action is None:
            action = torch.multinomial(torch.softmax(logits, -1), 1).squeeze(-1)
        logprob, entropy = categorical_log_prob_entropy(logits, action)
        return action, logprob, entropy, value


def categorical_log_prob_entropy(logits: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi(a|s) of the given actions and the entropy H = -sum_a pi(a|s) log pi(a|s), from unnormalized logits."""
    log_probs = torch.log_softmax(logits, dim=-1)
    logprob = log_probs.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return logprob, entropy


# --- end shared: nature-cnn ---


# ---- algorithm helpers: no globals, tensors / arrays in and out (the tests import them) ----
# --- shared: next-step-autoreset ---
def next_step_targets(values: np.ndarray, last_value: np.ndarray, reset_steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Under next-step autoreset, over a (num_steps, num_envs) rollout:
    next_values[t] = V(obs[t+1]), and V(obs after the rollout) for the last step. Where an episode ended at t,
    obs[t+1] is that episode's final obs (the env resets one step later), so a truncation bootstraps from it.
    real: the flat indices of the real transitions; a reset step (reset_steps[t]: the step after an episode end,
    whose action the env ignored and whose obs is the next episode's first) is not one and stays out of training."""
    next_values = np.concatenate([values[1:], last_value[None]], axis=0)
    real = np.flatnonzero(~reset_steps.reshape(-1))
    return next_values, real


# --- end shared: next-step-autoreset ---


# --- shared: gae ---
def compute_gae(
    rewards: np.ndarray,
    values: np.ndarray,
    next_values: np.ndarray,
    terminations: np.ndarray,
    truncations: np.ndarray,
    gamma: float,
    gae_lambda: float,
) -> np.ndarray:
    """Generalized Advantage Estimation over a (num_steps, num_envs) rollout, all arrays "after step t":

    next_values[t] is V of the true next state of transition t (V(final obs) when the episode ended at t).
        delta_t = r_t + gamma * (1 - terminated_t) * V(s_{t+1}) - V(s_t)
        A_t     = delta_t + gamma * lambda * (1 - (terminated_t or truncated_t)) * A_{t+1}
    A termination has no future value; a truncation (time limit) keeps V(final obs): the state was not terminal,
    only the episode was cut. Either one ends the recursion: A_{t+1} belongs to the next episode.
    """
    advantages = np.zeros_like(rewards)
    last_gae = np.zeros_like(rewards[0])
    not_terminated = 1.0 - terminations.astype(rewards.dtype)
    not_ended = 1.0 - np.logical_or(terminations, truncations).astype(rewards.dtype)
    for t in reversed(range(rewards.shape[0])):
        delta = rewards[t] + gamma * not_terminated[t] * next_values[t] - values[t]
        last_gae = delta + gamma * gae_lambda * not_ended[t] * last_gae
        advantages[t] = last_gae
    return advantages


# --- end shared: gae ---


# --- shared: ppo-losses ---
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
    if clip_vloss:
        v_clipped = old_values + torch.clamp(new_values - old_values, -clip_coef, clip_coef)
        v_loss = 0.5 * torch.max(v_loss_unclipped, (v_clipped - returns) ** 2).mean()
    else:
        v_loss = 0.5 * v_loss_unclipped.mean()
    return pg_loss, v_loss, log_ratio.detach()


def kl_diagnostics(log_ratio: torch.Tensor, clip_coef: float) -> torch.Tensor:
    """[old_approx_kl, approx_kl, clipfrac] averaged over all samples given (a minibatch, or a whole epoch's
    minibatches of equal size: then it is the mean of the per-minibatch values).
    KL(old || new) estimators, http://joschu.net/blog/kl-approx.html: k1 = -log r, k3 = (r - 1) - log r."""
    ratio = log_ratio.exp()
    return torch.stack(
        [(-log_ratio).mean(), ((ratio - 1) - log_ratio).mean(), ((ratio - 1.0).abs() > clip_coef).float().mean()]
    )


# --- end shared: ppo-losses ---


# --- shared: diagnostics-and-schedules ---
def explained_variance(y_pred: np.ndarray, y_true: np.ndarray) -> float:
    """1 - Var[y - y_pred] / Var[y]: 1 is a perfect value function, 0 no better than a constant, NaN if Var[y]=0."""
    var_y = np.var(y_true)
    return float("nan") if var_y == 0 else float(1 - np.var(y_true - y_pred) / var_y)


def annealed(iteration: int, num_iterations: int, value: float) -> float:
    """Linear decay from `value` at iteration 1 to value/num_iterations at the last iteration."""
    return (1.0 - (iteration - 1.0) / num_iterations) * value


# --- end shared: diagnostics-and-schedules ---


@dataclass
class LoopState:
    """What the training loop carries from one iteration to the next; checkpoints save and restore all of it. The
    games themselves are not in it: ALE states are not saved, so a resumed run restarts its games from a reset."""

    global_step: int = 0
    iteration: int = 0  # the last completed iteration


def main() -> None:
    args, ckpt, device = parse_command_line(Args, RESUME_OVERRIDABLE, FLAG_RULES, validate_args, FLAGS_BEFORE_THEY_EXISTED)
    if args.eval_checkpoint or args.export_checkpoint:
        return eval_only(args, device)  # evaluate or export a checkpoint: no training
    args.batch_size = args.num_envs * args.num_steps
    args.minibatch_size = args.batch_size // args.num_minibatches
    args.num_iterations = args.total_timesteps // args.batch_size
    obs_shape, num_actions = probe_env(args.env_id)
    run = Run(args, SCRIPT_NAME, ckpt, {"num_actions": num_actions}, args.batch_size)
    seed_everything(args.seed, args.torch_deterministic)
    # A resumed run restarts its games from a reset; a fresh env seed keeps it from replaying the first games.
    env_seed = args.seed + (0 if ckpt is None else ckpt["iteration"]) * args.num_envs

    # NEXT_STEP autoreset (gymnasium 1.x's default; ale-vector's too): the step after an episode ends returns the next
    # episode's first obs, reward 0, and ignores its action. Such a "reset step" is not a transition: it is
    # recorded in reset_step_buf and left out of training (see the update). The obs returned at the episode's last
    # step is its true final obs: a truncation is bootstrapped from V(final obs) without any final_obs lookup.
    envs = make_vector_env(args, str(run.dir / "videos"), env_seed)
    assert envs.metadata["autoreset_mode"] == gym.vector.AutoresetMode.NEXT_STEP, "the loop assumes next-step autoreset"

    agent = Agent(num_actions).to(device)
    check_agent(agent, obs_shape, ckpt, args.resume)  # below the banner: an edit that no longer fits stops here, named
    speed = fast_cnn(agent, args.bf16, obs_shape, run)  # below the banner: channels-last and --bf16, checked against the agent
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

    # ---- storage: everything indexed "at step t" of the rollout ----
    obs_buf = torch.zeros((args.num_steps, args.num_envs, *obs_shape), dtype=torch.uint8)  # frames the policy saw
    actions_buf = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long)
    logprobs_buf = torch.zeros((args.num_steps, args.num_envs))
    values_buf = torch.zeros((args.num_steps, args.num_envs))
    rewards_buf = np.zeros((args.num_steps, args.num_envs), np.float32)  # clipped rewards
    terminations_buf = np.zeros((args.num_steps, args.num_envs), bool)  # episode ended at t by a terminal state (or life)
    truncations_buf = np.zeros((args.num_steps, args.num_envs), bool)  # episode ended at t by the time limit
    reset_step_buf = np.zeros((args.num_steps, args.num_envs), bool)  # step t only reset the env: not a transition

    next_obs, _ = envs.reset(seed=env_seed)
    episode_ended = np.zeros(args.num_envs, bool)  # the last step ended an episode: the next step is a reset step
    s = LoopState()
    run.attach(s, envs, model=agent, optimizer=optimizer)
    # evaluation: full games on a separate env; the Run plays them every --eval-interval env steps
    run.play = lambda episodes, video_dir=None: evaluate(agent, args.env_id, episodes, args.seed + 10_000, device, video_dir,
                                                         speed)  # fmt: skip

    for iteration in run.iterations(s, args.num_iterations):  # between iterations: checkpoints, Ctrl-C, progress
        lr = annealed(iteration, args.num_iterations, args.learning_rate) if args.anneal_lr else args.learning_rate
        optimizer.param_groups[0]["lr"] = lr
        clip_coef = annealed(iteration, args.num_iterations, args.clip_coef) if args.anneal_clip else args.clip_coef

        # ---- rollout: act with the current policy, record transitions ----
        with run.timer("rollout"):
            for step in range(args.num_steps):
                s.global_step += args.num_envs
                obs_t = torch.from_numpy(next_obs)
                obs_buf[step] = obs_t
                reset_step_buf[step] = episode_ended
                with torch.inference_mode():
                    action, logprob, _, value = agent.get_action_and_value(obs_t.to(device))
                actions_buf[step], logprobs_buf[step], values_buf[step] = action.cpu(), logprob.cpu(), value.cpu()
                next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
                rewards_buf[step] = reward
                terminations_buf[step], truncations_buf[step] = terminations, truncations
                episode_ended = terminations | truncations
                for _, game_return, game_length in finished_games(infos):  # whole games, not lives
                    run.episode(game_return, game_length, s.global_step)

        with run.timer("update"):
            # ---- advantages ----
            with torch.inference_mode():
                _, last_value = agent(torch.from_numpy(next_obs).to(device))
            values = values_buf.numpy()
            next_values, real = next_step_targets(values, last_value.cpu().numpy(), reset_step_buf)
            advantages = compute_gae(rewards_buf, values, next_values, terminations_buf, truncations_buf,
                                     args.gamma, args.gae_lambda)  # fmt: skip
            returns = advantages + values

            # flatten (num_steps, num_envs) -> batch, keeping only real transitions (not the reset steps)
            valid = torch.from_numpy(real)
            b_obs = obs_buf.reshape(-1, *obs_shape)[valid].to(device)
            b_actions = actions_buf.reshape(-1)[valid].to(device)
            b_logprobs = logprobs_buf.reshape(-1)[valid].to(device)
            b_advantages = torch.from_numpy(advantages.reshape(-1)).to(device)[valid]
            b_returns = torch.from_numpy(returns.reshape(-1)).to(device)[valid]
            b_values = values_buf.reshape(-1)[valid].to(device)
            # Reset steps make the batch a few samples short of batch_size; the minibatches keep an equal size and
            # each epoch leaves out a different random remainder (fewer than num_minibatches samples).
            minibatch_size = len(valid) // args.num_minibatches

            # ---- update: update_epochs passes over the batch in shuffled minibatches ----
            # Metrics are summed over every minibatch (no .item() per minibatch: one sync per update) and averaged.
            loss_sums = torch.zeros(4, device=device)  # policy_loss, value_loss, entropy, grad_norm
            kl_sums, num_epochs = torch.zeros(3, device=device), 0  # old_approx_kl, approx_kl, clipfrac
            log_ratios = torch.zeros((args.num_minibatches, minibatch_size), device=device)
            for epoch in range(args.update_epochs):
                perm = torch.randperm(len(valid), device=device)[: args.num_minibatches * minibatch_size]
                perm = perm.view(args.num_minibatches, minibatch_size)
                for mb in range(args.num_minibatches):
                    idx = perm[mb]
                    _, new_logprob, entropy, new_values = agent.get_action_and_value(b_obs[idx], b_actions[idx])
                    entropy = entropy.mean()
                    mb_advantages = b_advantages[idx]
                    if args.norm_adv:
                        mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
                    pg_loss, v_loss, log_ratios[mb] = ppo_losses(
                        new_logprob, b_logprobs[idx], mb_advantages, new_values, b_values[idx], b_returns[idx],
                        clip_coef, args.clip_vloss,
                    )  # fmt: skip
                    # L = L^CLIP - c_ent * H + c_v * L^V
                    loss = pg_loss - args.ent_coef * entropy + args.vf_coef * v_loss
                    optimizer.zero_grad()
                    loss.backward()
                    grad_norm = nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)  # norm before clipping
                    optimizer.step()
                    loss_sums += torch.stack([pg_loss.detach(), v_loss.detach(), entropy.detach(), grad_norm])
                epoch_kl = kl_diagnostics(log_ratios, clip_coef)  # the epoch's mean over its minibatches
                kl_sums += epoch_kl
                num_epochs += 1
                # KL early stop, on the epoch's mean approx_kl (one sync per epoch)
                if args.target_kl is not None and epoch_kl[1].item() > args.target_kl:
                    break

        # ---- log: every metric is a mean over all minibatches of the update (not the last minibatch's value) ----
        metrics = dict(zip(("losses/policy_loss", "losses/value_loss", "losses/entropy", "losses/grad_norm"),
                           (loss_sums / (num_epochs * args.num_minibatches)).tolist()))  # fmt: skip
        metrics.update(zip(("losses/old_approx_kl", "losses/approx_kl", "losses/clipfrac"), (kl_sums / num_epochs).tolist()))
        metrics["losses/explained_variance"] = explained_variance(b_values.cpu().numpy(), b_returns.cpu().numpy())
        metrics["charts/learning_rate"], metrics["charts/clip_coef"] = lr, clip_coef
        run.log(s.global_step, metrics)

    run.finish()  # after Ctrl-C: saved, exits; with --save-model: the final agent evaluated (run.play), then saved
    run.close()


# === Plumbing: runs, checkpoints, errors, speed set-up; not needed to follow the algorithm ===
# What follows makes the script a dependable research tool: flag checks, resume, evaluation of a checkpoint, the
# Atari wrappers and env backends, checkpoints, TensorBoard / wandb, progress, Ctrl-C, and the speed set-up. The
# `shared:` blocks are the same text in every script that has them (tests/test_shared_blocks.py).

# Flags that --resume takes from the command line; every other field comes from the checkpoint.
RESUME_OVERRIDABLE = (
    "total_timesteps", "track", "wandb_project_name", "wandb_entity", "capture_video", "save_model", "runs_dir",
    "checkpoint_interval", "keep_checkpoints", "resume", "eval_checkpoint", "eval_episodes", "eval_interval", "keep_best",
    "export_checkpoint", "export_dir", "progress", "cuda", "torch_threads", "env_backend", "async_envs", "env_threads",
)  # fmt: skip
# A checkpoint written before a flag existed ran with these values (a resume refuses another value typed)
FLAGS_BEFORE_THEY_EXISTED = {}  # none yet (a2c_atari.py's --optimizer came later)
# Every numeric flag and the range it must lie in (checked before anything starts; see check_flags)
FLAG_RULES = {
    "total_timesteps": ">= 1", "learning_rate": "> 0", "num_envs": ">= 1", "num_steps": ">= 1", "gamma": "in [0, 1]",
    "gae_lambda": "in [0, 1]", "num_minibatches": ">= 1", "update_epochs": ">= 1", "clip_coef": "> 0",
    "ent_coef": ">= 0", "vf_coef": ">= 0", "max_grad_norm": "> 0", "target_kl": "> 0",
    "seed": ">= 0", "torch_threads": ">= 0", "env_threads": ">= 0", "checkpoint_interval": ">= 0",
    "keep_checkpoints": ">= 1", "eval_episodes": ">= 1", "eval_interval": ">= 0",
}  # fmt: skip


def validate_args(args: Args) -> None:
    """What single-flag rules cannot say: sizes that must fit together, and the env backend's options."""
    check_backend(args)
    batch_size = args.num_envs * args.num_steps
    if batch_size % args.num_minibatches != 0:
        raise UserError(f"num_minibatches ({args.num_minibatches}) must divide the batch size num_envs * num_steps = "
                        f"{args.num_envs} * {args.num_steps} = {batch_size}.")  # fmt: skip
    if args.total_timesteps < batch_size:
        raise UserError(f"total_timesteps ({args.total_timesteps}) is below one batch (num_envs * num_steps = "
                        f"{batch_size}): no update would run. Raise --total-timesteps or lower --num-steps.")  # fmt: skip
    minibatch = batch_size // getattr(args, "num_minibatches", 1)  # A2C: the whole batch
    if args.norm_adv and minibatch < 2:
        raise UserError(f"--norm-adv divides by the advantages' standard deviation over a minibatch, undefined for a "
                        f"minibatch of {minibatch}: raise --num-envs or --num-steps, or leave --norm-adv off.")  # fmt: skip


# --- shared: atari-wrappers ---
# The preprocessing that make_env chains, one small wrapper per step, and the ale-vector backend that
# do (nearly) the same in C++; then the vector env of any backend.
ATARI_ID = re.compile(r"^(?:(?P<v4>[A-Za-z]+)NoFrameskip-v4|ALE/(?P<v5>[A-Za-z]+)-v5)$")


def parse_atari_id(env_id: str) -> tuple[str, float]:
    """'BreakoutNoFrameskip-v4' -> ('Breakout', 0.0); 'ALE/Breakout-v5' -> ('Breakout', 0.25): the game and its
    sticky-action probability (v5 repeats the previous action with p=0.25, Machado et al. 2018; v4 never does)."""
    match = ATARI_ID.match(env_id)
    if match is None:
        raise UserError(f"'{env_id}' is not an Atari id this script takes: use GameNoFrameskip-v4 (e.g. "
                        f"BreakoutNoFrameskip-v4) or ALE/Game-v5 (e.g. ALE/Breakout-v5). {other_family(env_id)}")  # fmt: skip
    return (match["v4"], 0.0) if match["v4"] else (match["v5"], 0.25)


def other_family(env_id: str) -> str:
    """The hint for an id of another kind of task: which script takes it, by its action space."""
    continuous = "use ppo_continuous.py, sac_continuous.py or sac_continuous_ray.py"
    try:
        env = gym.make(env_id)
        space, atari = env.action_space, "ale_py" in str(env.spec.entry_point)
        env.close()
    except Exception:  # not a registered id, or its simulator is not installed: the general hint
        return f"For continuous-action environments (MuJoCo, Pendulum) {continuous}."
    if atari:
        return ""
    if isinstance(space, gym.spaces.Box):
        return f"{env_id} is a continuous-action environment: {continuous}."
    return (f"{env_id} is a discrete-action task on a state vector: no script here takes those (ppo_atari.py and "
            "a2c_atari.py take Atari games only).")  # fmt: skip


def check_atari_env(env_id: str) -> None:
    """Fail early and clearly: ale-py missing, an unknown game, or a game without a discrete action space."""
    parse_atari_id(env_id)
    try:
        import ale_py
    except ImportError:
        raise UserError("ale-py is not installed: run the README's commands (`uv run --all-extras ...`), or "
                        "`pip install ale-py`.") from None  # fmt: skip
    gym.register_envs(ale_py)  # gymnasium 1.x no longer finds the ALE envs by itself
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)  # no emulator banner on every env
    try:
        gym.spec(env_id)
    except gym.error.Error as e:
        raise UserError(
            f"unknown Atari game in '{env_id}' ({e}). The games are listed by `ale_py.roms.get_all_rom_ids()`."
        ) from None


class NoopReset(gym.Wrapper):
    """After a reset, take a random number (1..noop_max) of NOOP actions: the deterministic emulator then starts
    each game in a different state."""

    def __init__(self, env: gym.Env, noop_max: int = 30):
        super().__init__(env)
        assert env.unwrapped.get_action_meanings()[0] == "NOOP"
        self.noop_max = noop_max

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        earned = 0.0
        for _ in range(self.unwrapped.np_random.integers(1, self.noop_max + 1)):
            obs, reward, terminated, truncated, info = self.env.step(0)
            earned += float(reward)
            if terminated or truncated:  # a game over before the agent's first step: not a game it played
                obs, info = self.env.reset()
                earned = 0.0
        return obs, with_reset_steps(info, [(earned, False)])


class MaxAndSkip(gym.Wrapper):
    """Repeat the action for `skip` frames and sum the rewards. Return the pixel-wise max of the last two frames:
    Atari draws some sprites only on odd or even frames, so one frame alone can miss them."""

    def __init__(self, env: gym.Env, skip: int = 4):
        super().__init__(env)
        self.skip = skip

    def step(self, action):
        total_reward, previous, frame = 0.0, None, None
        for _ in range(self.skip):
            previous = frame
            frame, reward, terminated, truncated, info = self.env.step(action)
            total_reward += float(reward)
            if terminated or truncated:
                break
        pooled = frame if previous is None else np.maximum(previous, frame)
        return pooled, total_reward, terminated, truncated, info


class EpisodicLife(gym.Wrapper):
    """Learning sees a lost life as the end of an episode (terminated=True: no value beyond it), which speeds up
    learning; the game itself goes on. reset() after a lost life only takes one NOOP step; only a game over (or the
    time limit) resets the emulator. The game statistics (GameStatistics, above it) still span all lives."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.lives, self.game_over = 0, True

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = terminated or truncated
        lives = self.unwrapped.ale.lives()
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs):
        if self.game_over:
            obs, info = self.env.reset(**kwargs)
        else:
            obs, reward, terminated, truncated, info = self.env.step(0)
            steps = [(float(reward), terminated or truncated)]  # this NOOP can earn points, or end the game
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
            info = with_reset_steps(info, steps)
        self.lives, self.game_over = self.unwrapped.ale.lives(), False
        return obs, info


class FireReset(gym.Wrapper):
    """Press FIRE after every reset, and so after every lost life: games like Breakout wait for it, and an agent
    that has not learned to press it would idle until the time limit."""

    def reset(self, **kwargs):
        _, info = self.env.reset(**kwargs)
        steps = info.get("reset_steps", [])
        obs, reward, terminated, truncated, info = self.env.step(1)
        steps = steps + [(float(reward), truncated or self.unwrapped.ale.game_over())]  # `terminated`: maybe a life
        if terminated or truncated:
            obs, info = self.env.reset(**kwargs)
        return obs, with_reset_steps(info, steps)


def with_reset_steps(info: dict, steps: list) -> dict:
    """info with `steps`, [(reward, did the game end)] of the steps a reset took, ahead of those already in it (a
    reset the wrapper made after its own steps): GameStatistics books them to their games."""
    return {**info, "reset_steps": steps + info.get("reset_steps", [])}


class GameStatistics(gym.Wrapper):
    """Puts the whole game's score (unclipped, all lives) and length (agent steps) in info["episode"] = {"r", "l"}
    at the step where the game ends (game over or time limit). The length counts only the agent's own steps, not
    the NOOP and FIRE steps the reset wrappers below take; the score counts the points of those steps too, and a
    game that ends inside a reset (a NOOP after a lost life, or FIRE) is reported by that reset's info, under
    next-step autoreset the vector env's reset step: no game is lost or merged into the next one."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.score, self.length = 0.0, 0

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        info = dict(info)
        for reward, game_ended in info.pop("reset_steps", []):
            self.score += reward
            if game_ended:
                info["episode"] = {"r": self.score, "l": self.length}
                self.score, self.length = 0.0, 0
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.score += float(reward)
        self.length += 1
        if truncated or self.unwrapped.ale.game_over():
            info = {**info, "episode": {"r": self.score, "l": self.length}}
            self.score, self.length = 0.0, 0
        return obs, reward, terminated, truncated, info


class ClipReward(gym.RewardWrapper):
    """Learn from sign(r) in {-1, 0, 1}: one set of hyperparameters then fits games whose scores differ 1000x."""

    def reward(self, reward: float) -> float:
        return float(np.sign(reward))


class Resize84(gym.ObservationWrapper):
    """210x160 grayscale screen -> 84x84 (area interpolation, as the DQN paper does)."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.observation_space = gym.spaces.Box(0, 255, (84, 84), np.uint8)

    def observation(self, obs: np.ndarray) -> np.ndarray:
        import cv2

        return cv2.resize(obs, (84, 84), interpolation=cv2.INTER_AREA)


class FrameStack(gym.Wrapper):
    """The last `k` frames, oldest first, as a (k, 84, 84) uint8 array: one frame shows no motion. After a reset
    every slot holds the first frame."""

    def __init__(self, env: gym.Env, k: int = 4):
        super().__init__(env)
        self.frames = np.zeros((k, 84, 84), np.uint8)
        self.observation_space = gym.spaces.Box(0, 255, self.frames.shape, np.uint8)

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self.frames[:] = obs
        return self.frames.copy(), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.frames[:-1] = self.frames[1:]
        self.frames[-1] = obs
        return self.frames.copy(), reward, terminated, truncated, info


class AleVectorAtari:
    """ale-py's own C++ vector env (threads; wheels for Linux, macOS and Windows) behind the interface of a gymnasium
    vector env, set up to match make_env's chain as far as the library allows, with the same episode statistics.
    Why not its own switches: with reward_clipping it reports no unclipped score, and its episodic_life restarts
    the whole game at a lost life. So the rewards come unclipped and are clipped here; a lost life ends a learning
    episode here, the game goes on, and the next step presses FIRE (NOOP in games without it) in place of the
    agent's action: a reset step, as in the chain, that the loop leaves out of training; after any reset every
    frame-stack slot holds the first frame (the library pads with zeros). The differences that remain (the order
    of FIRE and the NOOPs at a game's start, their count, ...) are listed in docs/ppo_atari.md."""

    def __init__(self, env_id: str, num_envs: int, seed: int, num_threads: int):
        from ale_py.vector_env import AtariVectorEnv

        _, sticky = parse_atari_id(env_id)
        self.envs = AtariVectorEnv(
            gym.spec(env_id).kwargs["game"], num_envs, num_threads=num_threads, repeat_action_probability=sticky,
            max_num_frames_per_episode=MAX_FRAMES_PER_GAME, noop_max=30, frameskip=4, maxpool=True, stack_num=4,
            img_height=84, img_width=84, grayscale=True, episodic_life=False, life_loss_info=False,
            reward_clipping=False, use_fire_reset=True, autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP,
        )  # fmt: skip
        action_names = [action.name for action in self.envs.ale.get_action_set()]
        self.restart_action = action_names.index("FIRE") if "FIRE" in action_names else 0  # after a lost life
        self.num_envs, self.seed = num_envs, seed
        self.single_observation_space = self.envs.single_observation_space
        self.single_action_space = self.envs.single_action_space
        self.metadata = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}
        self.game_return, self.game_length = np.zeros(num_envs), np.zeros(num_envs, np.int64)
        self.lives = np.zeros(num_envs, np.int64)
        self.game_ended = np.zeros(num_envs, bool)  # the last step ended the game: the library resets it now
        self.life_lost = np.zeros(num_envs, bool)  # the last step lost a life: this step presses FIRE

    def reset(self, seed: Optional[int] = None) -> tuple[np.ndarray, dict]:
        obs, info = self.envs.reset(seed=self.seed if seed is None else seed)  # env i gets seed + i
        obs[:] = obs[:, -1:]  # every slot holds the first frame, as FrameStack after a reset
        self.game_return[:], self.game_length[:], self.lives[:] = 0.0, 0, info["lives"]
        self.game_ended[:], self.life_lost[:] = False, False
        return obs, {}

    def step(self, actions: np.ndarray) -> tuple:
        actions = np.where(self.life_lost, self.restart_action, actions)  # the agent's action is ignored there
        obs, reward, game_over, truncated, info = self.envs.step(actions)
        reset_step = self.game_ended | self.life_lost
        obs[reset_step] = obs[reset_step, -1:]  # after a reset (a new game or a new life): the first frame in every slot
        self.game_return += reward  # the unclipped reward, FIRE steps included; the library's reset step pays 0
        self.game_length += ~reset_step  # the agent's own steps only
        lives = info["lives"]
        life_lost = (0 < lives) & (lives < self.lives)
        ended = game_over | truncated
        infos: dict = {}
        if ended.any():
            infos["episode"] = {"r": np.where(ended, self.game_return, 0.0), "l": np.where(ended, self.game_length, 0)}
            infos["_episode"] = ended
            self.game_return[ended], self.game_length[ended] = 0.0, 0
        self.lives, self.game_ended, self.life_lost = lives, ended, life_lost & ~ended
        return obs, np.sign(reward).astype(np.float32), game_over | life_lost, truncated, infos

    def close(self) -> None:
        self.envs.close()


def ignoring_stop_signals(thunk: Callable[[], gym.Env]) -> Callable[[], gym.Env]:
    """For env worker processes: Ctrl-C reaches the whole process group, and a worker that died of it would break
    the main process's last iteration before its checkpoint. The main process decides when to stop."""

    def in_worker() -> gym.Env:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        return thunk()

    return in_worker


def make_vector_env(args, video_dir: str, seed: int):
    """The batch of envs for training, on any backend; all use next-step autoreset (see the rollout)."""
    if args.env_backend == "ale-vector":
        return AleVectorAtari(args.env_id, args.num_envs, seed, args.env_threads or usable_cores())
    thunks = [make_env(args.env_id, i, args.capture_video, video_dir) for i in range(args.num_envs)]
    if args.async_envs:
        thunks = [ignoring_stop_signals(thunk) for thunk in thunks]
        return gym.vector.AsyncVectorEnv(thunks, autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)
    return gym.vector.SyncVectorEnv(thunks, autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)


def finished_games(infos: dict) -> list:
    """[(env index, full-game return, length in agent steps)] for each game that ended at this step."""
    if "_episode" not in infos:
        return []
    episode = infos["episode"]
    return [(int(i), float(episode["r"][i]), int(episode["l"][i])) for i in np.flatnonzero(infos["_episode"])]


# --- end shared: atari-wrappers ---


# --- shared: atari-run ---
def check_backend(args) -> None:
    """The env backend's options, checked before anything starts."""
    if args.env_backend not in ("gymnasium", "ale-vector"):
        raise UserError(f"--env-backend must be 'gymnasium' or 'ale-vector', not '{args.env_backend}'.")
    if args.env_backend != "gymnasium" and args.capture_video:
        raise UserError(f"--capture-video records env 0 of the gymnasium backend; {args.env_backend} renders no frames. "
                        "Use --env-backend gymnasium to record video.")  # fmt: skip
    if args.env_backend != "gymnasium" and args.async_envs:
        raise UserError(f"--async-envs runs the gymnasium backend's envs in worker processes; {args.env_backend} steps "
                        "its envs in its own threads (--env-threads). Drop --async-envs, or use --env-backend "
                        "gymnasium.")  # fmt: skip
    if args.env_backend == "ale-vector" and importlib.util.find_spec("ale_py.vector_env") is None:
        raise UserError("--env-backend ale-vector needs ale-py >= 0.11 (ale_py.vector_env). Upgrade ale-py, or use "
                        "--env-backend gymnasium.")  # fmt: skip


def probe_env(env_id: str) -> tuple[tuple, int]:
    """Make one preprocessed env to check the id; return (observation shape, number of actions)."""
    check_atari_env(env_id)
    env = make_env(env_id, 0, False, "")()
    obs_shape, act_space = env.observation_space.shape, env.action_space
    env.close()
    if not isinstance(act_space, gym.spaces.Discrete):
        raise UserError(f"{env_id} has a {type(act_space).__name__} action space; this script needs discrete actions.")
    return obs_shape, int(act_space.n)


def evaluate(agent: Agent, env_id: str, episodes: int, seed: int, device: torch.device, video_dir: Optional[str] = None,
             speed: Optional["TrunkSpeedUp"] = None,
             report: Callable[[int, float], None] = lambda index, episode_return: None) -> list:  # fmt: skip
    """Full games with actions sampled from the policy (a greedy Atari policy can stall forever in a loop),
    under the training preprocessing, in float32 (`speed`: a --bf16 run's trunk too); returns each game's unclipped
    score over all its lives (`report` hears of each game). Samples with its own generator: training's RNG is left alone."""
    generator = torch.Generator(device).manual_seed(seed)
    env = make_env(env_id, 0, video_dir is not None, video_dir or "")()
    returns: list = []
    obs, _ = env.reset(seed=seed)
    with speed.float32() if speed is not None else nullcontext():
        while len(returns) < episodes:
            with torch.inference_mode():
                logits, _ = agent(torch.as_tensor(obs, device=device).unsqueeze(0))
                action = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator).item()
            obs, _, terminated, truncated, info = env.step(action)
            if "episode" in info:  # a game over (GameStatistics), not just a lost life
                returns.append(float(info["episode"]["r"]))
                report(len(returns) - 1, returns[-1])
            if (terminated or truncated) and len(returns) < episodes:  # a lost life (soft reset) or a game over
                obs, info = env.reset()
                if "episode" in info:  # the game ended inside the reset's NOOP / FIRE step
                    returns.append(float(info["episode"]["r"]))
                    report(len(returns) - 1, returns[-1])
    env.close()
    return returns


def eval_only(args, device: torch.device) -> None:
    """--eval-checkpoint: full games with the saved policy; print and log eval/episodic_return. --export-checkpoint:
    the checkpoint's agent as a folder that runs with plain torch (export_agent)."""
    path = args.eval_checkpoint or args.export_checkpoint
    ckpt = load_checkpoint(path, FLAGS_BEFORE_THEY_EXISTED)
    saved = Args(**{f.name: ckpt["args"][f.name] for f in dataclasses.fields(Args) if f.name in ckpt["args"]})
    obs_shape, num_actions = probe_env(saved.env_id)
    check_checkpoint_matches(ckpt, path, SCRIPT_NAME, {"num_actions": num_actions})
    agent = Agent(num_actions).to(device)
    check_agent(agent, obs_shape, ckpt, path)  # an edited Agent that no longer fits the checkpoint stops here
    agent.load_state_dict(ckpt["model"])

    def play(episodes: int, video_dir: Optional[str] = None) -> list:
        return evaluate(agent, saved.env_id, episodes, saved.seed + 10_000, device, video_dir,
                        report=episode_printer(episodes, "game"))  # fmt: skip

    if args.export_checkpoint:
        config = {"script": SCRIPT_NAME, "algorithm": SCRIPT_NAME.split("_")[0].upper() + " (Atari)",
                  "env_id": saved.env_id, "global_step": ckpt["global_step"], "agent_class": "Agent",
                  "agent_kwargs": {"num_actions": num_actions}, "network": "Nature CNN (Mnih et al. 2015)",
                  "obs_shape": [4, 84, 84], "num_actions": num_actions, "obs_rms": None,
                  "evaluation": "full games (all lives, unclipped score) with actions sampled from the policy; "
                                "policy.pt2 plays the most likely action instead (a greedy policy can stall in a loop: "
                                "sample from Agent's logits for the evaluated play)",
                  "policy_input": "uint8 frames, shape (batch, 4, 84, 84): the last 4 grayscale 84x84 frames, oldest "
                                  "first, under the script's preprocessing (make_env: 1-30 no-ops at reset, each action "
                                  "held 4 frames with the max of the last two, FIRE at reset where the game needs it)",
                  "policy_output": "int64 actions, shape (batch,): the most likely action (argmax of the logits)"}  # fmt: skip
        policy = AtariActingPolicy(agent)
        example = torch.zeros((2, 4, 84, 84), dtype=torch.uint8)
        return export_agent(args, ckpt, policy, example, agent.state_dict(), config, play, ATARI_USAGE)
    eval_dir = Path(path).resolve().parent.parent / "eval" / Path(path).stem
    returns = play(args.eval_episodes, str(eval_dir / "videos") if args.capture_video else None)
    writer = make_writer(eval_dir, saved, purge_step=None)
    writer.add_scalar("eval/episodic_return", float(np.mean(returns)), ckpt["global_step"])
    writer.close()
    print(f"eval {saved.env_id} at step {ckpt['global_step']}: {np.mean(returns):.2f} +- {np.std(returns):.2f} "
          f"over {len(returns)} games")  # fmt: skip


class AtariActingPolicy(nn.Module):
    """The deterministic acting policy for torch.export: the Nature CNN's most likely action for uint8 frames."""

    def __init__(self, agent: Agent):
        super().__init__()
        self.agent = agent

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        logits, _ = self.agent(frames)
        return torch.argmax(logits, dim=-1)


ATARI_USAGE = """
import torch

policy = torch.export.load("policy.pt2").module()
frames = torch.zeros((1, 4, 84, 84), dtype=torch.uint8)  # the last 4 preprocessed frames (see Input), oldest first
action = int(policy(frames)[0])
"""


# ---- the agent's start-up checks and speed set-up: derived from the module, checked against it ----
def probe_frames(obs_shape: tuple, device: torch.device, n: int = 64) -> torch.Tensor:
    """Fixed random uint8 frames for the start-up checks, from a generator of their own (the run's RNG is untouched)."""
    generator = torch.Generator().manual_seed(31)
    return torch.randint(0, 256, (n, *obs_shape), generator=generator, dtype=torch.uint8).to(device)


@contextmanager
def probing(agent: nn.Module):
    """A forward pass for a check only, in the mode the run computes in: no gradients; the buffers (e.g. batch-norm
    statistics) and the global RNG, reseeded for it (two passes draw the same noise), given back as they were."""
    buffers = [b.clone() for b in agent.buffers()]
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(0)
        try:
            yield agent
        finally:
            for b, saved in zip(agent.buffers(), buffers):
                b.copy_(saved)


def check_agent(agent: nn.Module, obs_shape: tuple, ckpt: Optional[dict] = None, path: Optional[str] = None) -> None:
    """Stop with one paragraph naming what to change where an edited Agent no longer runs on this env's frames
    (it names the innermost layer that failed), or no longer fits the weights of the checkpoint `path` it loads."""
    unfinished, hooks = [], []  # (name, module, input shape) of the modules entered and not yet left

    def enter(name: str, module: nn.Module, inputs: tuple) -> None:
        unfinished.append((name, module, tuple(inputs[0].shape) if inputs and torch.is_tensor(inputs[0]) else None))

    def leave(*_) -> None:
        unfinished.pop()

    for name, module in agent.named_modules():
        hooks += [module.register_forward_pre_hook(lambda m, inputs, name=name: enter(name, m, inputs)),
                  module.register_forward_hook(leave)]  # fmt: skip
    try:
        with probing(agent):
            agent(probe_frames(obs_shape, next(agent.parameters()).device))
    except RuntimeError as e:  # torch's shape errors
        name, layer, shape = unfinished[-1] if unfinished else ("", agent, None)
        where = "Agent" + re.sub(r"\.(\d+)", r"[\1]", f".{name}" if name else "")
        size, dim = {nn.Linear: ("in_features", -1), nn.Conv2d: ("in_channels", 1)}.get(type(layer), (None, 0))
        fix = f"Set its {size} to {shape[dim]} (now {getattr(layer, size)}), or change" if size and shape else "Change it or"
        raise UserError(f"the network no longer runs on {obs_shape} frames: {where} {type(layer).__name__}"
                        f"({layer.extra_repr()}) fails on its input{f' of shape {shape}' if shape else ''} "
                        f"({str(e).splitlines()[0]}). {fix} the layers before it, so that each layer's output fits the "
                        "next one's input.") from None
    finally:
        for hook in hooks:
            hook.remove()
    if ckpt is None:
        return
    mine, saved = agent.state_dict(), ckpt["model"]
    differ = [f"{k}: {tuple(saved[k].shape) if k in saved else 'none'} vs {tuple(v.shape)}" for k, v in mine.items()
              if k not in saved or saved[k].shape != v.shape] + [f"{k}: not in Agent" for k in saved.keys() - mine.keys()]
    if differ:
        raise UserError(f"checkpoint '{path}' holds weights of other shapes than this script's Agent (checkpoint vs "
                        f"Agent, {'; '.join(differ[:3])}{'; ...' if len(differ) > 3 else ''}). Undo the edits to Agent "
                        "to use this checkpoint, or start a new run.")  # fmt: skip


class TrunkSpeedUp:
    """Forward hooks on Agent.network (its own forward runs as written): the input in channels-last memory, and with
    bf16 a bfloat16 autocast around the trunk alone, its output back in float32 (the heads and losses stay float32).
    Why channels-last: CPU convolutions (oneDNN) run faster on it, with the same values (benchmarks/README.md)."""

    def __init__(self, bf16: bool):
        self.bf16, self.autocasts, self.hooks = bf16, [], []

    def attach(self, agent: nn.Module) -> None:
        agent.to(memory_format=torch.channels_last)  # the convolutions' weights: a layout, the same values
        self.hooks = [agent.network.register_forward_pre_hook(self.enter),
                      agent.network.register_forward_hook(self.leave, always_call=True)]  # fmt: skip

    def detach(self, agent: nn.Module) -> None:
        for hook in self.hooks:
            hook.remove()
        self.hooks, self.bf16 = [], False
        agent.to(memory_format=torch.contiguous_format)

    def enter(self, trunk: nn.Module, inputs: tuple) -> Optional[tuple]:
        if self.bf16:
            self.autocasts.append(torch.autocast(inputs[0].device.type, dtype=torch.bfloat16))
            self.autocasts[-1].__enter__()
        if inputs[0].dim() == 4:
            return (inputs[0].contiguous(memory_format=torch.channels_last), *inputs[1:])
        return None

    def leave(self, trunk: nn.Module, inputs: tuple, output):
        if self.autocasts:  # always called, also after an error in the trunk: the autocast never outlives it
            self.autocasts.pop().__exit__(None, None, None)
            return output.float() if torch.is_tensor(output) else output
        return None

    @contextmanager
    def float32(self):
        """The trunk in float32 whatever --bf16 says: evaluation, and the start-up check."""
        bf16, self.bf16 = self.bf16, False
        try:
            yield
        finally:
            self.bf16 = bf16


def fast_cnn(agent: nn.Module, bf16: bool, obs_shape: tuple, run: "Run") -> TrunkSpeedUp:
    """The speed set-up (TrunkSpeedUp; --bf16: the trunk ~2x faster on CPUs with AVX512-BF16/AMX), checked at the start
    against a copy of the plain agent on fixed frames: in float32 within 1e-5 of each output's scale, with bf16 within
    5 %. Where it disagrees or fails, the run computes with the plain module and says so in one line."""
    device = next(agent.parameters()).device
    frames, plain, speed = probe_frames(obs_shape, device), copy.deepcopy(agent), TrunkSpeedUp(bf16)
    # why: on a GPU, cuDNN runs float32 convolutions in TF32 (10-bit mantissa) by default, in both layouts
    rtol = 2e-3 if device.type == "cuda" and torch.backends.cudnn.allow_tf32 else 1e-5
    try:
        with probing(plain):
            expected = plain(frames)
        speed.attach(agent)
        with speed.float32(), probing(agent):
            problem = disagreement(agent(frames), expected, rtol, "in float32")
        if bf16 and not problem:
            with probing(agent):
                problem = disagreement(agent(frames), expected, 0.05, "with --bf16")
    except (RuntimeError, TypeError, AttributeError, ValueError) as e:  # e.g. a layer that channels-last does not fit
        problem = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    if problem:
        speed.detach(agent)
        print(f"speed set-up off ({problem}): the run computes with Agent.network as written, without channels-last"
              f"{' or --bf16' if bf16 else ''}")  # fmt: skip
        run.note_compute(dtype="float32")
    return speed


def disagreement(got, expected, rtol: float, how: str) -> Optional[str]:
    """None where each output tensor is within rtol * its scale (max |expected|) of the plain agent's, else why not."""
    got, expected = (x if isinstance(x, (tuple, list)) else (x,) for x in (got, expected))
    for i, (g, e) in enumerate(zip(got, expected)):
        error = (g.float() - e.float()).abs().max().item() if g.shape == e.shape else math.inf
        if not error <= rtol * e.abs().max().item():
            return f"output {i} differs from the plain agent's {how} by {error:.3g} at scale {e.abs().max().item():.3g}"
    return None


# --- end shared: atari-run ---


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


if __name__ == "__main__":
    run_cli(main)
