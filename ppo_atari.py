# Docs: README.md, section "ppo_atari.py" (https://arxiv.org/abs/1707.06347 for the algorithm)
"""Proximal Policy Optimization on Atari (pixels, discrete actions), in one file.

Read it top to bottom: Args, the Atari preprocessing (one small wrapper per step) and the two environment backends,
the Nature CNN, small pure helpers (GAE, categorical log-prob, losses), the shared blocks (seeding, checkpoints,
logging, error reporting), then the training loop. Runs on gymnasium 1.x / ale-py 0.9+ and envpool 1.x.
`diff ppo_atari.py a2c_atari.py` shows what differs between the two algorithms.
"""
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
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import tyro


@dataclass
class Args:
    # --- experiment ---
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """if toggled, cuda will be used when available"""
    torch_threads: int = 0
    """CPU threads for torch; 0 = one per core this process may use (os.sched_getaffinity)"""
    track: bool = False
    """if toggled, this experiment will be tracked with Weights and Biases (WANDB_MODE=offline works without network)"""
    wandb_project_name: str = "onefile-rl"
    """the wandb's project name"""
    wandb_entity: Optional[str] = None
    """the entity (team) of wandb's project"""
    capture_video: bool = False
    """whether to capture videos of the agent performances (env 0 of the gymnasium backend; under `runs/<run>/videos`)"""
    save_model: bool = False
    """whether to save a final checkpoint at the end of training, then evaluate it"""
    runs_dir: str = "runs"
    """folder that holds one sub-folder per run (TensorBoard events, checkpoints, videos)"""
    checkpoint_interval: int = 100
    """write a checkpoint every N iterations (0 = never; Ctrl-C and --save-model still save)"""
    keep_checkpoints: int = 3
    """keep the newest K periodic checkpoints (the final one is always kept)"""
    resume: Optional[str] = None
    """path of a checkpoint to continue from (appends to that run's folder; the games restart from a reset)"""
    eval_checkpoint: Optional[str] = None
    """path of a checkpoint to evaluate (no training)"""
    eval_episodes: int = 10
    """number of full games for evaluation (after --save-model, or with --eval-checkpoint)"""
    progress: bool = True
    """show a one-line progress display (only when stdout is a terminal)"""

    # --- environment ---
    env_id: str = "BreakoutNoFrameskip-v4"
    """the id of the environment: GameNoFrameskip-v4 (no sticky actions) or ALE/Game-v5 (sticky actions, 0.25)"""
    env_backend: str = "gymnasium"
    """`gymnasium` (ale-py under this file's wrappers, vector env) or `envpool` (C++ thread pool, same preprocessing)"""
    async_envs: bool = False
    """gymnasium backend: step the envs in worker processes (AsyncVectorEnv); off = in this process, measured faster"""
    envpool_threads: int = 0
    """envpool backend: worker threads (0 = one per core this process may use)"""

    # --- algorithm ---
    total_timesteps: int = 10_000_000
    """total timesteps of the experiments (agent steps; each is 4 emulator frames)"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 8
    """the number of parallel game environments"""
    num_steps: int = 128
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = True
    """Toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 4
    """the number of mini-batches"""
    update_epochs: int = 4
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """Toggles advantages normalization"""
    clip_coef: float = 0.1
    """the surrogate clipping coefficient"""
    anneal_clip: bool = False
    """decay the clipping coefficient linearly with training progress, like the learning rate"""
    clip_vloss: bool = True
    """Toggles whether or not to use a clipped loss for the value function, as per the paper."""
    ent_coef: float = 0.01
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: Optional[float] = None
    """the target KL divergence threshold (stop the update's epochs early when exceeded)"""
    bf16: bool = False
    """run the CNN's convolutions and hidden layer in bfloat16 (CPU autocast; the heads and losses stay float32)"""

    # --- derived (filled in at runtime) ---
    batch_size: int = 0
    """the batch size (computed in runtime)"""
    minibatch_size: int = 0
    """the mini-batch size (computed in runtime)"""
    num_iterations: int = 0
    """the number of iterations (computed in runtime)"""


# Flags that --resume takes from the command line; every other field comes from the checkpoint.
RESUME_OVERRIDABLE = (
    "total_timesteps", "track", "wandb_project_name", "wandb_entity", "capture_video", "save_model", "runs_dir",
    "checkpoint_interval", "keep_checkpoints", "resume", "eval_checkpoint", "eval_episodes", "progress", "cuda",
    "torch_threads", "env_backend", "async_envs", "envpool_threads",
)  # fmt: skip


# --- shared: atari-env ---
# Standard Atari preprocessing (Mnih et al. 2015; Machado et al. 2018), one wrapper per step, innermost first:
#   ALE (grayscale screen, frameskip 1) -> NoopReset -> MaxAndSkip -> EpisodicLife -> FireReset -> GameStatistics
#   -> ClipReward -> Resize84 -> FrameStack
# GameStatistics sits above EpisodicLife and below ClipReward: the logged return is the full game's score.
MAX_FRAMES_PER_GAME = 108_000  # 30 minutes of play at 60 fps; ALE truncates the game there
ATARI_ID = re.compile(r"^(?:(?P<v4>[A-Za-z]+)NoFrameskip-v4|ALE/(?P<v5>[A-Za-z]+)-v5)$")


def parse_atari_id(env_id: str) -> tuple[str, float]:
    """'BreakoutNoFrameskip-v4' -> ('Breakout', 0.0); 'ALE/Breakout-v5' -> ('Breakout', 0.25): the game and its
    sticky-action probability (v5 repeats the previous action with p=0.25, Machado et al. 2018; v4 never does)."""
    match = ATARI_ID.match(env_id)
    if match is None:
        raise UserError(f"'{env_id}' is not an Atari id this script takes: use GameNoFrameskip-v4 "
                        "(e.g. BreakoutNoFrameskip-v4) or ALE/Game-v5 (e.g. ALE/Breakout-v5). For continuous-action "
                        "environments (MuJoCo, Pendulum) use ppo_continuous.py or sac_continuous.py.")  # fmt: skip
    return (match["v4"], 0.0) if match["v4"] else (match["v5"], 0.25)


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
        for _ in range(self.unwrapped.np_random.integers(1, self.noop_max + 1)):
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset()
        return obs, info


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
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        self.lives, self.game_over = self.unwrapped.ale.lives(), False
        return obs, info


class FireReset(gym.Wrapper):
    """Press FIRE after every reset, and so after every lost life: games like Breakout wait for it, and an agent
    that has not learned to press it would idle until the time limit."""

    def reset(self, **kwargs):
        self.env.reset(**kwargs)
        obs, _, terminated, truncated, info = self.env.step(1)
        if terminated or truncated:
            obs, info = self.env.reset(**kwargs)
        return obs, info


class GameStatistics(gym.Wrapper):
    """Puts the whole game's score (unclipped, all lives) and length (agent steps) in info["episode"] = {"r", "l"}
    at the step where the game ends (game over or time limit). It counts only the agent's own steps, not the NOOP
    and FIRE steps the reset wrappers below take, as envpool does."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.score, self.length = 0.0, 0

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
    """210x160 grayscale screen -> 84x84 (area interpolation, as the DQN paper and envpool do)."""

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


def make_env(env_id: str, idx: int, capture_video: bool, video_dir: str, episodic_life: bool = True) -> Callable[[], gym.Env]:
    """One preprocessed Atari env (see the chain above). Video, when asked for, records env 0's full screen."""

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
        env = NoopReset(env, noop_max=30)
        env = MaxAndSkip(env, skip=4)
        if episodic_life:
            env = EpisodicLife(env)
        if "FIRE" in env.unwrapped.get_action_meanings():
            env = FireReset(env)
        env = GameStatistics(env)
        env = ClipReward(env)
        env = Resize84(env)
        return FrameStack(env, 4)

    return thunk


class EnvpoolAtari:
    """envpool's C++ Atari pool behind the interface of a gymnasium vector env, with the same preprocessing (noop
    reset 30, skip 4 with max-pooling, episodic life, FIRE reset, sign-clipped rewards, 84x84 gray, 4 frames,
    108k frames) and the same episode statistics: infos["episode"]["r"/"l"] where infos["_episode"], the full
    game's unclipped score and length in agent steps. Autoreset is next-step, as in gymnasium 1.x's default."""

    def __init__(self, env_id: str, num_envs: int, seed: int, num_threads: int):
        try:
            import envpool
        except ImportError:
            raise UserError("--env-backend envpool: envpool is not installed (it has wheels for Linux x86-64 with "
                            "Python >= 3.11 only). Use --env-backend gymnasium.") from None  # fmt: skip
        game, sticky = parse_atari_id(env_id)
        self.envs = envpool.make(
            f"{game}-v5", env_type="gymnasium", num_envs=num_envs, seed=seed, num_threads=num_threads,
            episodic_life=True, reward_clip=True, noop_max=30, frame_skip=4, stack_num=4, img_height=84, img_width=84,
            gray_scale=True, use_fire_reset=True, repeat_action_probability=sticky,
            max_episode_steps=MAX_FRAMES_PER_GAME // 4,
        )  # fmt: skip
        self.num_envs = num_envs
        self.single_observation_space = self.envs.observation_space
        self.single_action_space = self.envs.action_space
        self.metadata = {"autoreset_mode": gym.vector.AutoresetMode.NEXT_STEP}
        self.game_return = np.zeros(num_envs)

    def reset(self, seed: Optional[int] = None) -> tuple[np.ndarray, dict]:
        obs, _ = self.envs.reset()  # envpool is seeded once, at construction
        self.game_return[:] = 0.0
        return obs, {}

    def step(self, actions: np.ndarray) -> tuple:
        obs, reward, terminated, truncated, info = self.envs.step(actions)
        self.game_return += info["reward"]  # the unclipped reward; `reward` is clipped to its sign
        game_over = info["terminated"].astype(bool) | truncated  # `terminated` also marks a lost life
        infos: dict = {}
        if game_over.any():
            infos["episode"] = {"r": np.where(game_over, self.game_return, 0.0),
                                "l": np.where(game_over, info["elapsed_step"], 0)}  # fmt: skip
            infos["_episode"] = game_over
            self.game_return[game_over] = 0.0
        return obs, reward, terminated, truncated, infos

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
    """The batch of envs for training, either backend; both use next-step autoreset (see the rollout)."""
    if args.env_backend == "envpool":
        return EnvpoolAtari(args.env_id, args.num_envs, seed, pick_torch_threads(args.envpool_threads))
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


# --- end shared: atari-env ---


# --- shared: nature-cnn ---
def layer_init(layer: nn.Module, std: float = math.sqrt(2), bias_const: float = 0.0) -> nn.Module:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


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

        # channels-last ("NHWC") memory: CPU convolutions (oneDNN) run about 1.6x faster in float32 than on NCHW, with
        # the same arithmetic (README, "Speed"). Weights and inputs use it; nothing else changes.
        self.to(memory_format=torch.channels_last)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits, value) of a batch of uint8 observations. Under a bfloat16 autocast (--bf16) the convolutions and
        the 512-unit layer run in bfloat16; the two heads always run in float32, so the value and the log-probs
        that the losses compare keep float32 precision."""
        x = (obs.float() / 255.0).contiguous(memory_format=torch.channels_last)
        hidden = self.network(x)
        with torch.autocast(obs.device.type, enabled=False):
            hidden = hidden.float()
            return self.actor(hidden), self.critic(hidden).squeeze(-1)


def categorical_log_prob_entropy(logits: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi(a|s) of the given actions and the entropy H = -sum_a pi(a|s) log pi(a|s), from unnormalized logits."""
    log_probs = torch.log_softmax(logits, dim=-1)
    logprob = log_probs.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return logprob, entropy


def explained_variance(y_pred: np.ndarray, y_true: np.ndarray) -> float:
    """1 - Var[y - y_pred] / Var[y]: 1 is a perfect value function, 0 no better than a constant, NaN if Var[y]=0."""
    var_y = np.var(y_true)
    return float("nan") if var_y == 0 else float(1 - np.var(y_true - y_pred) / var_y)


def annealed(iteration: int, num_iterations: int, value: float) -> float:
    """Linear decay from `value` at iteration 1 to value/num_iterations at the last iteration."""
    return (1.0 - (iteration - 1.0) / num_iterations) * value


# --- end shared: nature-cnn ---


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


# ---------------------------------------------------------------------------------------------------------------
# Pure helpers: no globals, tensors/arrays in, tensors/arrays out. The tests import these.
# ---------------------------------------------------------------------------------------------------------------
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
    """Fail early and clearly on an unknown id. "module:Env-v0" ids import `module` first, as gym.make does."""
    module, _, name = env_id.rpartition(":")
    try:
        if module:
            importlib.import_module(module)
        gym.spec(name)
    except ImportError as e:
        raise UserError(f"environment id '{env_id}': module '{module}' could not be imported ({e}).") from None
    except gym.error.Error as e:
        raise UserError(f"unknown environment id '{env_id}' ({e}). Check the spelling and version suffix.") from None


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


def pick_torch_threads(requested: int) -> int:
    """0 means one thread per core this process may run on (respects taskset/cgroups, unlike os.cpu_count)."""
    return requested if requested > 0 else len(os.sched_getaffinity(0))


# --- end shared: seeding ---


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


def load_checkpoint(path: str, map_location: torch.device) -> dict:
    """Load with weights_only=True: plain tensors and Python data only, never arbitrary pickled objects."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"checkpoint '{path}' does not exist (or is not a file).")
    try:
        state = torch.load(p, map_location=map_location, weights_only=True)
    except Exception as e:  # torch raises many types here (pickle, zip, EOF, RuntimeError): report all the same way
        raise UserError(f"checkpoint '{path}' could not be read: it is corrupt or not a checkpoint ({type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''}).") from None  # fmt: skip
    if not isinstance(state, dict) or "format" not in state or "args" not in state:
        raise UserError(f"'{path}' is a torch file but not a checkpoint written by these scripts.")
    return state


def prune_checkpoints(ckpt_dir: Path, keep: int, prefix: str = "step_") -> None:
    """Delete all but the newest `keep` periodic checkpoints (names sort by zero-padded global step)."""
    periodic = sorted(ckpt_dir.glob(f"{prefix}*.pt"))
    for old in periodic[: max(len(periodic) - keep, 0)]:
        old.unlink()


def checkpoint_name(kind: str, global_step: int) -> str:
    return f"{kind}_{global_step:010d}.pt"


def merge_resume_args(cli, saved: dict, overridable: tuple):
    """The checkpoint's Args win, except the flags in `overridable`; a conflicting flag gets a warning."""
    cls = type(cli)
    defaults = cls()
    merged = dict(saved)
    for f in dataclasses.fields(cls):
        if f.name in overridable or f.name not in saved:
            merged[f.name] = getattr(cli, f.name)
        elif getattr(cli, f.name) != getattr(defaults, f.name) and getattr(cli, f.name) != saved[f.name]:
            print(f"warning: --{f.name.replace('_', '-')} {getattr(cli, f.name)} ignored: resuming keeps the checkpoint's "
                  f"value {saved[f.name]}.", file=sys.stderr)  # fmt: skip
    return cls(**{f.name: merged[f.name] for f in dataclasses.fields(cls)})


# --- end shared: checkpoint ---


# --- shared: logging ---
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


class Progress:
    """One self-overwriting status line on a terminal; silent when stdout is not a TTY (logs, CI, nohup)."""

    def __init__(self, enabled: bool, total: int):
        self.enabled = enabled and sys.stdout.isatty()
        self.total = total

    def update(self, step: int, sps: float, recent_return: Optional[float]) -> None:
        if self.enabled:
            ret = "   n/a" if recent_return is None else f"{recent_return:9.1f}"
            print(f"\rstep {step:>10,}/{self.total:,} | {sps:6.0f} SPS | return (last 10) {ret}", end="", flush=True)

    def close(self) -> None:
        if self.enabled:
            print()


# --- end shared: logging ---


# --- shared: atari-run ---
def evaluate(
    agent: Agent, env_id: str, episodes: int, seed: int, device: torch.device, video_dir: Optional[str] = None
) -> list:
    """Full games with actions sampled from the policy (a greedy Atari policy can stall forever in a loop),
    under the training preprocessing; returns each game's unclipped score over all its lives."""
    env = make_env(env_id, 0, video_dir is not None, video_dir or "")()
    returns: list = []
    obs, _ = env.reset(seed=seed)
    while len(returns) < episodes:
        with torch.inference_mode():
            logits, _ = agent(torch.as_tensor(obs, device=device).unsqueeze(0))
            action = torch.multinomial(torch.softmax(logits, -1), 1).item()
        obs, _, terminated, truncated, info = env.step(action)
        if "episode" in info:  # a game over (GameStatistics), not just a lost life
            returns.append(float(info["episode"]["r"]))
        if (terminated or truncated) and len(returns) < episodes:  # a lost life (soft reset) or a game over
            obs, _ = env.reset()
    env.close()
    return returns


def probe_env(env_id: str) -> tuple[tuple, int]:
    """Make one preprocessed env to check the id; return (observation shape, number of actions)."""
    check_atari_env(env_id)
    env = make_env(env_id, 0, False, "")()
    obs_shape, act_space = env.observation_space.shape, env.action_space
    env.close()
    if not isinstance(act_space, gym.spaces.Discrete):
        raise UserError(f"{env_id} has a {type(act_space).__name__} action space; this script needs discrete actions.")
    return obs_shape, int(act_space.n)


def check_checkpoint_matches(ckpt: dict, path: str, script: str, num_actions: int) -> None:
    if ckpt.get("script") != script:
        raise UserError(f"checkpoint '{path}' was written by {ckpt.get('script')}.py, not {script}.py.")
    if ckpt["num_actions"] != num_actions:
        raise UserError(f"checkpoint '{path}' was made for {ckpt['args']['env_id']} ({ckpt['num_actions']} actions), "
                        f"which does not fit this game ({num_actions} actions).")  # fmt: skip


def eval_only(args, device: torch.device, script: str) -> None:
    """--eval-checkpoint: full games with the saved policy; print and log eval/episodic_return."""
    ckpt = load_checkpoint(args.eval_checkpoint, device)
    env_id, seed = ckpt["args"]["env_id"], ckpt["args"]["seed"]
    _, num_actions = probe_env(env_id)
    check_checkpoint_matches(ckpt, args.eval_checkpoint, script, num_actions)
    agent = Agent(num_actions).to(device)
    agent.load_state_dict(ckpt["model"])
    run_dir = Path(args.eval_checkpoint).resolve().parent.parent
    eval_dir = run_dir / "eval" / Path(args.eval_checkpoint).stem
    video_dir = str(eval_dir / "videos") if args.capture_video else None
    returns = evaluate(agent, env_id, args.eval_episodes, seed + 10_000, device, video_dir)
    writer = make_writer(eval_dir, args, purge_step=None)
    writer.add_scalar("eval/episodic_return", float(np.mean(returns)), ckpt["global_step"])
    writer.close()
    print(f"eval {env_id} at step {ckpt['global_step']}: {np.mean(returns):.2f} +- {np.std(returns):.2f} "
          f"over {len(returns)} games")  # fmt: skip


def validate_common_args(args) -> None:
    if args.num_envs < 1 or args.num_steps < 1:
        raise UserError("num_envs and num_steps must be at least 1.")
    if args.total_timesteps < args.num_envs * args.num_steps:
        raise UserError(f"total_timesteps ({args.total_timesteps}) is below one batch (num_envs * num_steps = "
                        f"{args.num_envs * args.num_steps}): no update would run. "
                        "Raise --total-timesteps or lower --num-steps.")  # fmt: skip
    if args.env_backend not in ("gymnasium", "envpool"):
        raise UserError(f"--env-backend must be 'gymnasium' or 'envpool', not '{args.env_backend}'.")
    if args.env_backend == "envpool" and args.capture_video:
        raise UserError("--capture-video records env 0 of the gymnasium backend; envpool renders no frames. "
                        "Use --env-backend gymnasium to record video.")  # fmt: skip
    if args.env_backend == "envpool" and importlib.util.find_spec("envpool") is None:
        raise UserError("--env-backend envpool: envpool is not installed (it has wheels for Linux x86-64 with "
                        "Python >= 3.11 only). Use --env-backend gymnasium.")  # fmt: skip
    if args.checkpoint_interval < 0 or args.keep_checkpoints < 1 or args.eval_episodes < 1:
        raise UserError("checkpoint_interval must be >= 0, keep_checkpoints >= 1 and eval_episodes >= 1.")
    check_tracking(args.track)


def start_run(args, ckpt: Optional[dict]) -> tuple[Path, str]:
    """(run folder, run name): a new `runs/<env>__<exp>__<seed>__<time>`, or the resumed checkpoint's own."""
    if ckpt is not None:
        return Path(args.resume).resolve().parent.parent, ckpt["run_name"]
    safe_env_id = args.env_id.replace("/", "-").replace(":", "-")  # "ALE/Pong-v5" must not become nested folders
    run_name = f"{safe_env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
    return Path(args.runs_dir) / run_name, run_name


def log_finished_games(writer, infos: dict, global_step: int, recent_returns: list) -> list:
    """charts/episodic_return and charts/episodic_length of every game that ended; returns the last 10 returns."""
    for _, game_return, game_length in finished_games(infos):
        writer.add_scalar("charts/episodic_return", game_return, global_step)
        writer.add_scalar("charts/episodic_length", game_length, global_step)
        recent_returns = (recent_returns + [game_return])[-10:]
    return recent_returns


class StopRequest:
    """Ctrl-C / SIGTERM handler: the first signal asks the loop to stop at the end of the current iteration (a
    consistent state to save); a second one interrupts at once, without saving."""

    def __init__(self):
        self.requested = False

    def __call__(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True


# --- end shared: atari-run ---


def validate_args(args: Args) -> None:
    validate_common_args(args)
    if args.num_minibatches < 1 or args.update_epochs < 1:
        raise UserError("num_minibatches and update_epochs must be at least 1.")
    batch_size = args.num_envs * args.num_steps
    if batch_size % args.num_minibatches != 0:
        raise UserError(f"num_minibatches ({args.num_minibatches}) must divide the batch size num_envs * num_steps = "
                        f"{args.num_envs} * {args.num_steps} = {batch_size}.")  # fmt: skip


def main() -> None:
    args = tyro.cli(Args)
    if args.resume and args.eval_checkpoint:
        raise UserError("--resume and --eval-checkpoint exclude each other: evaluate a checkpoint, or continue it.")
    if not args.resume:  # a resumed run is checked once its Args are merged with the checkpoint's
        validate_args(args)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    torch.set_num_threads(pick_torch_threads(args.torch_threads))

    if args.eval_checkpoint:
        return eval_only(args, device, "ppo_atari")

    ckpt = None
    if args.resume:
        ckpt = load_checkpoint(args.resume, device)
        args = merge_resume_args(args, ckpt["args"], RESUME_OVERRIDABLE)
        validate_args(args)
    args.batch_size = int(args.num_envs * args.num_steps)
    args.minibatch_size = int(args.batch_size // args.num_minibatches)
    args.num_iterations = args.total_timesteps // args.batch_size
    obs_shape, num_actions = probe_env(args.env_id)
    if ckpt is not None:
        check_checkpoint_matches(ckpt, args.resume, "ppo_atari", num_actions)
        if ckpt["iteration"] >= args.num_iterations:
            raise UserError(f"checkpoint '{args.resume}' is at iteration {ckpt['iteration']} (step {ckpt['global_step']}) "
                            f"and --total-timesteps {args.total_timesteps} gives {args.num_iterations} iterations: "
                            "nothing left to do. Raise --total-timesteps to continue.")  # fmt: skip
    run_dir, run_name = start_run(args, ckpt)
    ckpt_dir = run_dir / "checkpoints"

    # ---- logging ----
    run_dir.mkdir(parents=True, exist_ok=True)
    if args.track:
        init_tracking(args, run_name, run_dir)
    writer = make_writer(run_dir, args, purge_step=None if ckpt is None else ckpt["global_step"] + 1)
    if ckpt is None:
        (run_dir / "args.json").write_text(json.dumps(dataclasses.asdict(args), indent=2))
    print(f"run: {run_dir}" + (f" (resumed from {args.resume})" if ckpt else ""))

    # ---- seeding ----
    seed_everything(args.seed, args.torch_deterministic)
    start_iteration = 1 if ckpt is None else ckpt["iteration"] + 1
    # A resumed run restarts its games from a reset; a fresh env seed keeps it from replaying the first games.
    env_seed = args.seed + (start_iteration - 1) * args.num_envs

    # ---- env setup ----
    # NEXT_STEP autoreset (gymnasium 1.x's default, and envpool's): the step after an episode ends returns the next
    # episode's first obs, reward 0, and ignores its action. Such a "reset step" is not a transition: it is
    # recorded in reset_step_buf and left out of training (see the update). The obs returned at the episode's last
    # step is its true final obs: a truncation is bootstrapped from V(final obs) without any final_obs lookup.
    envs = make_vector_env(args, str(run_dir / "videos"), env_seed)
    assert envs.metadata["autoreset_mode"] == gym.vector.AutoresetMode.NEXT_STEP, "the loop assumes next-step autoreset"

    agent = Agent(num_actions).to(device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    # --bf16: bfloat16 matmuls/convolutions (about 2x faster on CPUs with AVX512-BF16/AMX); weights stay float32
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16)

    # ---- storage: everything indexed "at step t" of the rollout ----
    obs_buf = torch.zeros((args.num_steps, args.num_envs, *obs_shape), dtype=torch.uint8)  # frames the policy saw
    actions_buf = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long)
    logprobs_buf = torch.zeros((args.num_steps, args.num_envs))
    values_buf = torch.zeros((args.num_steps, args.num_envs))
    rewards_buf = np.zeros((args.num_steps, args.num_envs), np.float32)  # clipped rewards
    terminations_buf = np.zeros((args.num_steps, args.num_envs), bool)  # episode ended at t by a terminal state (or life)
    truncations_buf = np.zeros((args.num_steps, args.num_envs), bool)  # episode ended at t by the time limit
    reset_step_buf = np.zeros((args.num_steps, args.num_envs), bool)  # step t only reset the env: not a transition

    # ---- start or restore the state that runs across iterations ----
    next_obs, _ = envs.reset(seed=env_seed)
    episode_ended = np.zeros(args.num_envs, bool)  # the last step ended an episode: the next step is a reset step
    recent_returns: list = []
    global_step = 0
    if ckpt is not None:
        agent.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        recent_returns = list(ckpt["run_state"]["recent_returns"])
        global_step = ckpt["global_step"]
        set_rng_states(ckpt["rng_states"])

    def training_state(iteration: int) -> dict:
        """A complete checkpoint as plain data (loads with weights_only=True); tensors are copies."""
        return {
            "format": 1,
            "script": "ppo_atari",
            "run_name": run_name,
            "args": dataclasses.asdict(args),
            "global_step": global_step,
            "iteration": iteration,
            "num_actions": num_actions,
            "model": {k: v.detach().clone().cpu() for k, v in agent.state_dict().items()},
            "optimizer": copy.deepcopy(optimizer.state_dict()),
            "run_state": {"recent_returns": list(recent_returns)},
            "rng_states": get_rng_states(),
        }

    # Ctrl-C (and SIGTERM, e.g. a cluster preempting the job) stops the loop at the end of the current iteration,
    # whose state is consistent, and saves it. (The env workers ignore both signals: they stay alive until then.)
    stop = StopRequest()
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    progress = Progress(args.progress, args.total_timesteps)
    start_time, start_step = time.time(), global_step
    iteration = start_iteration - 1
    for iteration in range(start_iteration, args.num_iterations + 1):
        lr = annealed(iteration, args.num_iterations, args.learning_rate) if args.anneal_lr else args.learning_rate
        optimizer.param_groups[0]["lr"] = lr
        clip_coef = annealed(iteration, args.num_iterations, args.clip_coef) if args.anneal_clip else args.clip_coef

        # ---- rollout: act with the current policy, record transitions ----
        t_rollout = time.perf_counter()
        for step in range(args.num_steps):
            global_step += args.num_envs
            obs_t = torch.from_numpy(next_obs)
            obs_buf[step] = obs_t
            reset_step_buf[step] = episode_ended
            with torch.inference_mode(), autocast:
                logits, value = agent(obs_t.to(device))
                action = torch.multinomial(torch.softmax(logits, -1), 1).squeeze(-1)
                logprob, _ = categorical_log_prob_entropy(logits, action)
            actions_buf[step], logprobs_buf[step], values_buf[step] = action.cpu(), logprob.cpu(), value.cpu()
            next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
            rewards_buf[step] = reward
            terminations_buf[step], truncations_buf[step] = terminations, truncations
            episode_ended = terminations | truncations
            recent_returns = log_finished_games(writer, infos, global_step, recent_returns)
        rollout_time = time.perf_counter() - t_rollout

        # ---- advantages ----
        t_update = time.perf_counter()
        with torch.inference_mode(), autocast:
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
        kl_sums = torch.zeros(3, device=device)  # old_approx_kl, approx_kl, clipfrac
        num_epochs = 0
        log_ratios = torch.zeros((args.num_minibatches, minibatch_size), device=device)
        for epoch in range(args.update_epochs):
            perm = torch.randperm(len(valid), device=device)[: args.num_minibatches * minibatch_size]
            perm = perm.view(args.num_minibatches, minibatch_size)
            for mb in range(args.num_minibatches):
                idx = perm[mb]
                with autocast:
                    logits, new_values = agent(b_obs[idx])
                new_logprob, entropy = categorical_log_prob_entropy(logits, b_actions[idx])
                entropy = entropy.mean()
                mb_advantages = b_advantages[idx]
                if args.norm_adv:
                    mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
                pg_loss, v_loss, log_ratios[mb] = ppo_losses(
                    new_logprob, b_logprobs[idx], mb_advantages, new_values, b_values[idx], b_returns[idx], clip_coef,
                    args.clip_vloss,
                )
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
        # every metric is a mean over all minibatches of the update (not the last minibatch's value)
        metrics = dict(zip(("policy_loss", "value_loss", "entropy", "grad_norm"),
                           (loss_sums / (num_epochs * args.num_minibatches)).tolist()))  # fmt: skip
        metrics.update(zip(("old_approx_kl", "approx_kl", "clipfrac"), (kl_sums / num_epochs).tolist()))
        update_time = time.perf_counter() - t_update

        # ---- logging ----
        sps = (global_step - start_step) / (time.time() - start_time)
        writer.add_scalar("charts/learning_rate", lr, global_step)
        writer.add_scalar("charts/clip_coef", clip_coef, global_step)
        for name, value in metrics.items():
            writer.add_scalar(f"losses/{name}", value, global_step)
        explained = explained_variance(b_values.cpu().numpy(), b_returns.cpu().numpy())
        writer.add_scalar("losses/explained_variance", explained, global_step)
        writer.add_scalar("charts/SPS", sps, global_step)
        writer.add_scalar("charts/rollout_us_per_step", rollout_time / args.batch_size * 1e6, global_step)
        writer.add_scalar("charts/update_us_per_step", update_time / args.batch_size * 1e6, global_step)
        progress.update(global_step, sps, float(np.mean(recent_returns)) if recent_returns else None)

        if args.checkpoint_interval > 0 and iteration % args.checkpoint_interval == 0:
            save_checkpoint(training_state(iteration), ckpt_dir / checkpoint_name("step", global_step))
            prune_checkpoints(ckpt_dir, args.keep_checkpoints)
        if stop.requested:
            break
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    progress.close()

    if stop.requested:
        path = ckpt_dir / checkpoint_name("interrupted", global_step)
        save_checkpoint(training_state(iteration), path)
        print(f"interrupted: saved iteration {iteration} to {path}\nresume with: python {os.path.basename(__file__)} "
              f"--resume {path}", file=sys.stderr)  # fmt: skip
        writer.close()
        envs.close()
        sys.exit(130)

    if args.save_model:
        path = ckpt_dir / checkpoint_name("final", global_step)
        save_checkpoint(training_state(iteration), path)
        print(f"model saved to {path}")
        video_dir = str(run_dir / "videos" / "eval") if args.capture_video else None
        returns_eval = evaluate(agent, args.env_id, args.eval_episodes, args.seed + 10_000, device, video_dir)
        writer.add_scalar("eval/episodic_return", float(np.mean(returns_eval)), global_step)
        print(f"eval: {np.mean(returns_eval):.2f} +- {np.std(returns_eval):.2f} over {len(returns_eval)} games")
    writer.close()
    envs.close()
    if args.track:
        import wandb

        wandb.finish()


if __name__ == "__main__":
    run_cli(main)
