# Docs: README.md, section "ppo_continuous.py" (https://arxiv.org/abs/1707.06347 for the algorithm)
"""Proximal Policy Optimization for continuous actions (MuJoCo, classic control), in one file.

Read it top to bottom: Args, the env factory, the network, small pure helpers (normalization, GAE, losses),
the shared blocks (seeding, env-state capture, checkpoints, logging, error reporting), then the training loop.
Runs on gymnasium 1.x: episode boundaries are handled explicitly, and a time-limit truncation is bootstrapped.
"""
import copy
import dataclasses
import importlib
import json
import math
import os
import random
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
    """whether to capture videos of the agent performances (env 0; under `runs/<run>/videos`)"""
    save_model: bool = False
    """whether to save a final checkpoint at the end of training, then evaluate it"""
    runs_dir: str = "runs"
    """folder that holds one sub-folder per run (TensorBoard events, checkpoints, videos)"""
    checkpoint_interval: int = 50
    """write a checkpoint every N iterations (0 = never; Ctrl-C and --save-model still save)"""
    keep_checkpoints: int = 3
    """keep the newest K periodic checkpoints (the final one is always kept)"""
    resume: Optional[str] = None
    """path of a checkpoint to continue from (appends to that run's folder)"""
    eval_checkpoint: Optional[str] = None
    """path of a checkpoint to evaluate (no training)"""
    eval_episodes: int = 10
    """number of episodes for evaluation (after --save-model, or with --eval-checkpoint)"""
    progress: bool = True
    """show a one-line progress display (only when stdout is a terminal)"""

    # --- algorithm ---
    env_id: str = "HalfCheetah-v4"
    """the id of the environment"""
    total_timesteps: int = 1_000_000
    """total timesteps of the experiments"""
    learning_rate: float = 3e-4
    """the learning rate of the optimizer"""
    num_envs: int = 1
    """the number of parallel game environments"""
    num_steps: int = 2048
    """the number of steps to run in each environment per policy rollout"""
    anneal_lr: bool = True
    """Toggle learning rate annealing for policy and value networks"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 32
    """the number of mini-batches"""
    update_epochs: int = 10
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """Toggles advantages normalization"""
    clip_coef: float = 0.2
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """Toggles whether or not to use a clipped loss for the value function, as per the paper."""
    ent_coef: float = 0.0
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: Optional[float] = None
    """the target KL divergence threshold (stop the update's epochs early when exceeded)"""
    norm_obs: bool = True
    """normalize observations with running statistics (clipped to +-obs_clip)"""
    norm_reward: bool = True
    """scale rewards by the running std of the discounted return (clipped to +-reward_clip)"""
    obs_clip: float = 10.0
    """clip range of normalized observations"""
    reward_clip: float = 10.0
    """clip range of normalized rewards"""

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
    "torch_threads",
)  # fmt: skip


def make_env(env_id: str, idx: int, capture_video: bool, video_dir: str) -> Callable[[], gym.Env]:
    """One environment. Episode statistics, action clipping and normalization are done on the whole batch in the
    training loop (vectorized, checkpointable, and visible), not by per-env wrappers."""

    def thunk() -> gym.Env:
        if capture_video and idx == 0:
            env = gym.make(env_id, render_mode="rgb_array")
            env = gym.wrappers.RecordVideo(env, video_dir, disable_logger=True)
        else:
            env = gym.make(env_id)
        return gym.wrappers.FlattenObservation(env)

    return thunk


def layer_init(layer: nn.Linear, std: float = math.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    """Separate Tanh-MLP critic and actor mean; the actor's log-std is a state-independent parameter."""

    def __init__(self, obs_dim: int, act_dim: int):
        super().__init__()
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor_mean = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, act_dim), std=0.01),
        )
        self.actor_logstd = nn.Parameter(torch.zeros(1, act_dim))

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x).squeeze(-1)


# ---------------------------------------------------------------------------------------------------------------
# Pure helpers: no globals, tensors/arrays in, tensors/arrays out. The tests import these.
# ---------------------------------------------------------------------------------------------------------------
class RunningMeanStd:
    """Running mean and variance of a stream of batches (Chan et al. parallel algorithm), in float64."""

    def __init__(self, shape: tuple = (), epsilon: float = 1e-4):
        self.mean = np.zeros(shape, np.float64)
        self.var = np.ones(shape, np.float64)
        self.count = epsilon

    def update(self, batch: np.ndarray) -> None:
        n = batch.shape[0]
        # ndarray.sum / n rather than np.mean / np.var: same numbers, a third of the overhead on a (1, 17) batch
        batch_mean = batch.sum(axis=0) / n
        batch_var = np.square(batch - batch_mean).sum(axis=0) / n
        delta = batch_mean - self.mean
        total = self.count + n
        self.mean = self.mean + delta * (n / total)
        self.var = (self.var * self.count + batch_var * n + np.square(delta) * (self.count * n / total)) / total
        self.count = total

    def state_dict(self) -> dict:
        as_tensor = lambda x: torch.from_numpy(np.array(x, dtype=np.float64))  # noqa: E731 (copies; 0-d for scalars)
        return {"mean": as_tensor(self.mean), "var": as_tensor(self.var), "count": float(self.count)}

    def load_state_dict(self, state: dict) -> None:
        self.mean = state["mean"].numpy().astype(np.float64)
        self.var = state["var"].numpy().astype(np.float64)
        self.count = float(state["count"])


def normalize_obs(obs: np.ndarray, rms: RunningMeanStd, clip: float, epsilon: float = 1e-8) -> np.ndarray:
    """(obs - mean) / sqrt(var + eps), clipped to [-clip, clip], as float32 for the network."""
    return np.clip((obs - rms.mean) / np.sqrt(rms.var + epsilon), -clip, clip).astype(np.float32)


def scale_rewards(
    rewards: np.ndarray,
    discounted_returns: np.ndarray,
    episode_ended: np.ndarray,
    rms: RunningMeanStd,
    gamma: float,
    clip: float,
    epsilon: float = 1e-8,
) -> tuple[np.ndarray, np.ndarray]:
    """Reward scaling: divide by the running std of the discounted return G <- gamma*G + r (not its mean: the
    reward's sign must survive). Returns (scaled rewards, new G). G restarts at any episode end, termination or
    truncation alike: the next reward belongs to a new episode."""
    discounted_returns = discounted_returns * gamma + rewards
    rms.update(discounted_returns)
    scaled = np.clip(rewards / np.sqrt(rms.var + epsilon), -clip, clip)
    return scaled.astype(np.float32), np.where(episode_ended, 0.0, discounted_returns)


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


LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def gaussian_log_prob(mean: torch.Tensor, log_std: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """log N(a; mu, sigma) summed over action dimensions: -((a-mu)/sigma)^2/2 - log(sigma) - log(sqrt(2 pi))."""
    return (-0.5 * ((action - mean) * torch.exp(-log_std)) ** 2 - log_std - LOG_SQRT_2PI).sum(-1)


def gaussian_entropy(log_std: torch.Tensor) -> torch.Tensor:
    """H[N(mu, sigma)] summed over action dimensions: 1/2 + log(sqrt(2 pi)) + log(sigma) per dimension."""
    return (0.5 + LOG_SQRT_2PI + log_std).sum(-1)


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


def flatten_parameters(module: nn.Module) -> nn.Parameter:
    """Make all of `module`'s parameters views into one flat parameter, and their .grad views into one flat grad.
    Why: these MLPs are tiny, so the update costs per-tensor overhead, not arithmetic. With one tensor, gradient
    clipping is two ops and Adam one fused call (about 20% of the update time here). Zero the gradient with
    `flat.grad.zero_()`, never `optimizer.zero_grad()`: set_to_none would cut the views loose."""
    params = list(module.parameters())
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    flat_grad = torch.zeros_like(flat)
    offset = 0
    for p in params:
        n = p.numel()
        p.data = flat[offset : offset + n].view_as(p)
        p.grad = flat_grad[offset : offset + n].view_as(p)
        offset += n
    flat_param = nn.Parameter(flat)
    flat_param.grad = flat_grad
    return flat_param


def mlp_numpy(x: np.ndarray, weights: list) -> np.ndarray:
    """The actor-mean MLP (Linear-Tanh-Linear-Tanh-Linear) in numpy, for acting on one step's observations.
    Why: torch spends ~5 us of dispatch per op on a (1, 17) input, numpy ~1 us; acting is ~60% of a step's
    non-env time. Training (batched, autograd) stays in torch; tests check both give the same mean."""
    w1, b1, w2, b2, w3, b3 = weights
    h = np.tanh(x @ w1.T + b1)
    h = np.tanh(h @ w2.T + b2)
    return h @ w3.T + b3


def explained_variance(y_pred: np.ndarray, y_true: np.ndarray) -> float:
    """1 - Var[y - y_pred] / Var[y]: 1 is a perfect value function, 0 no better than a constant, NaN if Var[y]=0."""
    var_y = np.var(y_true)
    return float("nan") if var_y == 0 else float(1 - np.var(y_true - y_pred) / var_y)


def annealed_lr(iteration: int, num_iterations: int, learning_rate: float) -> float:
    """Linear decay from learning_rate at iteration 1 to learning_rate/num_iterations at the last iteration."""
    return (1.0 - (iteration - 1.0) / num_iterations) * learning_rate


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


# --- end shared: env-state ---


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


def evaluate(
    agent: Agent,
    env_id: str,
    obs_rms: Optional[RunningMeanStd],
    obs_clip: float,
    episodes: int,
    seed: int,
    device: torch.device,
    video_dir: Optional[str] = None,
) -> list:
    """Deterministic episodes (the Gaussian's mean action) with the normalization statistics frozen."""
    env = make_env(env_id, 0, video_dir is not None, video_dir or "")()
    low, high = env.action_space.low, env.action_space.high
    returns = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        done, total = False, 0.0
        while not done:
            x = normalize_obs(obs, obs_rms, obs_clip) if obs_rms is not None else obs.astype(np.float32)
            with torch.inference_mode():
                action = agent.actor_mean(torch.as_tensor(x, device=device).unsqueeze(0))[0].cpu().numpy()
            obs, reward, terminated, truncated, _ = env.step(np.clip(action, low, high))
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return returns


def validate_args(args: Args) -> None:
    if args.num_envs < 1 or args.num_steps < 1 or args.num_minibatches < 1 or args.update_epochs < 1:
        raise UserError("num_envs, num_steps, num_minibatches and update_epochs must all be at least 1.")
    batch_size = args.num_envs * args.num_steps
    if batch_size % args.num_minibatches != 0:
        raise UserError(f"num_minibatches ({args.num_minibatches}) must divide the batch size num_envs * num_steps = "
                        f"{args.num_envs} * {args.num_steps} = {batch_size}.")  # fmt: skip
    if args.total_timesteps < batch_size:
        raise UserError(f"total_timesteps ({args.total_timesteps}) is below one batch (num_envs * num_steps = "
                        f"{batch_size}): no update would run. Raise --total-timesteps or lower --num-steps.")  # fmt: skip
    if args.checkpoint_interval < 0 or args.keep_checkpoints < 1 or args.eval_episodes < 1:
        raise UserError("checkpoint_interval must be >= 0, keep_checkpoints >= 1 and eval_episodes >= 1.")
    check_tracking(args.track)


def probe_env(env_id: str) -> tuple[tuple, tuple]:
    """Make the env once to check it exists and has a continuous (Box) action space; return (obs, action) shapes."""
    check_env_id(env_id)
    try:
        env = gym.wrappers.FlattenObservation(gym.make(env_id))
    except gym.error.Error as e:
        raise UserError(f"environment '{env_id}' could not be created: {e}") from None
    obs_space, act_space = env.observation_space, env.action_space
    env.close()
    if not isinstance(act_space, gym.spaces.Box):
        raise UserError(f"{env_id} has a {type(act_space).__name__} action space ({act_space}); this PPO needs a "
                        f"continuous Box action space. For discrete actions use a discrete-action PPO.")  # fmt: skip
    if not np.all(np.isfinite(act_space.low)) or not np.all(np.isfinite(act_space.high)):
        raise UserError(f"{env_id}'s action space {act_space} is unbounded; actions are clipped to its bounds.")
    return obs_space.shape, act_space.shape


def check_checkpoint_matches(ckpt: dict, path: str, obs_shape: tuple, act_shape: tuple) -> None:
    if ckpt.get("script") != "ppo_continuous":
        raise UserError(f"checkpoint '{path}' was written by {ckpt.get('script')}.py, not ppo_continuous.py.")
    if tuple(ckpt["obs_shape"]) != tuple(obs_shape) or tuple(ckpt["act_shape"]) != tuple(act_shape):
        raise UserError(f"checkpoint '{path}' was made for {ckpt['args']['env_id']} (observations {tuple(ckpt['obs_shape'])}"
                        f", actions {tuple(ckpt['act_shape'])}), which does not fit this env (observations {obs_shape}, "
                        f"actions {act_shape}).")  # fmt: skip


class StopRequest:
    """Ctrl-C / SIGTERM handler: the first signal asks the loop to stop at the end of the current iteration (a
    consistent state to save); a second one interrupts at once, without saving."""

    def __init__(self):
        self.requested = False

    def __call__(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True


def main() -> None:
    args = tyro.cli(Args)
    if args.capture_video and not os.environ.get("DISPLAY"):
        # headless: MuJoCo renders through EGL (Mesa's software EGL works without a GPU). Set before mujoco loads.
        os.environ["MUJOCO_GL"] = os.environ.get("MUJOCO_GL") or "egl"
    quiet_mujoco_warnings()
    if args.resume and args.eval_checkpoint:
        raise UserError("--resume and --eval-checkpoint exclude each other: evaluate a checkpoint, or continue it.")
    if not args.resume:  # a resumed run is checked once its Args are merged with the checkpoint's
        validate_args(args)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    # Small MLPs: a thread per core is the deliberate default (README, "Speed"); --torch-threads overrides.
    torch.set_num_threads(pick_torch_threads(args.torch_threads))

    if args.eval_checkpoint:
        return eval_only(args, device)

    ckpt = None
    if args.resume:
        ckpt = load_checkpoint(args.resume, device)
        args = merge_resume_args(args, ckpt["args"], RESUME_OVERRIDABLE)
        validate_args(args)
    args.batch_size = int(args.num_envs * args.num_steps)
    args.minibatch_size = int(args.batch_size // args.num_minibatches)
    args.num_iterations = args.total_timesteps // args.batch_size
    obs_shape, act_shape = probe_env(args.env_id)
    if ckpt is not None:
        check_checkpoint_matches(ckpt, args.resume, obs_shape, act_shape)
        if ckpt["iteration"] >= args.num_iterations:
            raise UserError(f"checkpoint '{args.resume}' is at iteration {ckpt['iteration']} (step {ckpt['global_step']}) "
                            f"and --total-timesteps {args.total_timesteps} gives {args.num_iterations} iterations: "
                            "nothing left to do. Raise --total-timesteps to continue.")  # fmt: skip
        run_dir = Path(args.resume).resolve().parent.parent
        run_name = ckpt["run_name"]
    else:
        # "ALE/Pong-v5" or "module:Env-v0" must not become nested or odd folder names
        safe_env_id = args.env_id.replace("/", "-").replace(":", "-")
        run_name = f"{safe_env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
        run_dir = Path(args.runs_dir) / run_name
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

    # ---- env setup ----
    # SAME_STEP autoreset: step() returns the next episode's first obs and puts the true last obs of the finished
    # episode in infos["final_obs"]. Every stored transition is then a real one (gymnasium 1.x's default, NEXT_STEP,
    # would return one extra step per episode whose action is ignored, which must not enter training).
    envs = gym.vector.SyncVectorEnv(
        [make_env(args.env_id, i, args.capture_video, str(run_dir / "videos")) for i in range(args.num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    assert envs.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP, "the loop assumes same-step autoreset"
    obs_dim, act_dim = int(np.prod(obs_shape)), int(np.prod(act_shape))
    action_low, action_high = envs.single_action_space.low, envs.single_action_space.high

    agent = Agent(obs_dim, act_dim).to(device)
    flat_params = flatten_parameters(agent)  # one tensor: cheap clipping and a single fused Adam step
    optimizer = torch.optim.Adam([flat_params], lr=args.learning_rate, eps=1e-5, fused=True)
    obs_rms = RunningMeanStd(shape=(obs_dim,))
    return_rms = RunningMeanStd(shape=())

    # ---- storage: everything indexed "at step t" of the rollout ----
    obs_buf = np.zeros((args.num_steps, args.num_envs, obs_dim), np.float32)  # normalized obs the policy saw
    next_obs_buf = np.zeros_like(obs_buf)  # normalized true next obs of transition t (final obs at an episode end)
    actions_buf = np.zeros((args.num_steps, args.num_envs, act_dim), np.float32)  # unclipped Gaussian samples
    rewards_buf = np.zeros((args.num_steps, args.num_envs), np.float32)  # scaled rewards
    terminations_buf = np.zeros((args.num_steps, args.num_envs), bool)  # episode ended at t by a terminal state
    truncations_buf = np.zeros((args.num_steps, args.num_envs), bool)  # episode ended at t by the time limit

    # ---- start or restore the state that runs across iterations ----
    raw_obs, _ = envs.reset(seed=args.seed)
    episode_return = np.zeros(args.num_envs)  # true (unscaled) return of each env's running episode
    episode_length = np.zeros(args.num_envs, np.int64)
    discounted_return = np.zeros(args.num_envs)  # for reward scaling
    recent_returns: list = []
    global_step, start_iteration = 0, 1
    if ckpt is not None:
        agent.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        obs_rms.load_state_dict(ckpt["obs_rms"])
        return_rms.load_state_dict(ckpt["return_rms"])
        run_state = ckpt["run_state"]
        if len(ckpt["env_states"]) != args.num_envs:
            raise UserError(f"checkpoint has {len(ckpt['env_states'])} env states, the run has {args.num_envs} envs.")
        exact = True
        for env, env_state in zip(envs.envs, ckpt["env_states"]):
            restore_env_state(env, env_state)
            exact = exact and env_state["exact"]
        if exact:
            raw_obs = run_state["raw_obs"].numpy()
            episode_return, episode_length = run_state["episode_return"].numpy(), run_state["episode_length"].numpy()
            discounted_return = run_state["discounted_return"].numpy()
        else:
            print(f"warning: {args.env_id}'s simulator state cannot be captured; its envs restart from a reset.")
        recent_returns = list(run_state["recent_returns"])
        global_step, start_iteration = ckpt["global_step"], ckpt["iteration"] + 1
        set_rng_states(ckpt["rng_states"])

    def training_state(iteration: int) -> dict:
        """A complete checkpoint as plain data (loads with weights_only=True); tensors are copies."""
        return {
            "format": 1,
            "script": "ppo_continuous",
            "run_name": run_name,
            "args": dataclasses.asdict(args),
            "global_step": global_step,
            "iteration": iteration,
            "obs_shape": list(obs_shape),
            "act_shape": list(act_shape),
            "model": {k: v.detach().clone().cpu() for k, v in agent.state_dict().items()},
            "optimizer": copy.deepcopy(optimizer.state_dict()),
            "obs_rms": obs_rms.state_dict(),
            "return_rms": return_rms.state_dict(),
            "env_states": [capture_env_state(env) for env in envs.envs],
            "run_state": {
                "raw_obs": torch.from_numpy(np.array(raw_obs, dtype=np.float64)),
                "episode_return": torch.from_numpy(episode_return.copy()),
                "episode_length": torch.from_numpy(episode_length.copy()),
                "discounted_return": torch.from_numpy(discounted_return.copy()),
                "recent_returns": list(recent_returns),
            },
            "rng_states": get_rng_states(),
        }

    if args.norm_obs and ckpt is None:
        obs_rms.update(raw_obs)
    next_obs = normalize_obs(raw_obs, obs_rms, args.obs_clip) if args.norm_obs else raw_obs.astype(np.float32)

    # Ctrl-C (and SIGTERM, e.g. a cluster preempting the job) stops the loop at the end of the current iteration,
    # whose state is consistent, and saves it. Why a flag, not `except KeyboardInterrupt`: the exception lands at an
    # arbitrary point (inside the TensorBoard writer, a checkpoint write, ...); a flag checked between iterations never
    # cuts anything half-way.
    stop = StopRequest()
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    progress = Progress(args.progress, args.total_timesteps)
    start_time, start_step = time.time(), global_step
    iteration = start_iteration - 1
    for iteration in range(start_iteration, args.num_iterations + 1):
        lr = annealed_lr(iteration, args.num_iterations, args.learning_rate) if args.anneal_lr else args.learning_rate
        optimizer.param_groups[0]["lr"] = lr

        # ---- rollout: act with the current policy, record transitions ----
        t_rollout = time.perf_counter()
        # a = mu(s) + sigma * eps, eps ~ N(0, I): the noise for the whole rollout in one draw of torch's RNG
        actor_weights = [p.detach().cpu().numpy() for p in agent.actor_mean.parameters()]
        std = agent.actor_logstd.detach().exp().cpu().numpy()
        noise = torch.randn((args.num_steps, args.num_envs, act_dim)).numpy()
        for step in range(args.num_steps):
            global_step += args.num_envs
            obs_buf[step] = next_obs
            action = mlp_numpy(next_obs, actor_weights) + std * noise[step]
            actions_buf[step] = action
            # The env gets the action clipped to its bounds; training keeps the sampled one, whose log-prob we know.
            raw_obs, reward, terminations, truncations, infos = envs.step(np.clip(action, action_low, action_high))
            episode_ended = terminations | truncations
            episode_return += reward
            episode_length += 1
            real_next_raw = true_next_obs(raw_obs, episode_ended, infos)
            if episode_ended.any():
                for i in np.flatnonzero(episode_ended):
                    writer.add_scalar("charts/episodic_return", episode_return[i], global_step)
                    writer.add_scalar("charts/episodic_length", episode_length[i], global_step)
                    recent_returns = (recent_returns + [float(episode_return[i])])[-10:]
                episode_return[episode_ended], episode_length[episode_ended] = 0.0, 0
            if args.norm_obs:
                obs_rms.update(raw_obs)
                next_obs = normalize_obs(raw_obs, obs_rms, args.obs_clip)
                # Easy to miss: the final obs is bootstrapped from, so it goes through the same normalization.
                next_obs_buf[step] = normalize_obs(real_next_raw, obs_rms, args.obs_clip) if episode_ended.any() else next_obs
            else:
                next_obs = raw_obs.astype(np.float32)
                next_obs_buf[step] = real_next_raw
            if args.norm_reward:
                rewards_buf[step], discounted_return = scale_rewards(
                    reward, discounted_return, episode_ended, return_rms, args.gamma, args.reward_clip
                )
            else:
                rewards_buf[step] = reward
            terminations_buf[step], truncations_buf[step] = terminations, truncations
        rollout_time = time.perf_counter() - t_rollout

        # ---- advantages: values and log-probs of the whole rollout in one batched pass ----
        t_update = time.perf_counter()
        b_obs_t = torch.from_numpy(obs_buf).to(device)
        with torch.no_grad():
            values = agent.get_value(b_obs_t)
            next_values = agent.get_value(torch.from_numpy(next_obs_buf).to(device))
            actions_t = torch.from_numpy(actions_buf).to(device)
            logprobs = gaussian_log_prob(agent.actor_mean(b_obs_t), agent.actor_logstd, actions_t)
        advantages = compute_gae(
            rewards_buf, values.cpu().numpy(), next_values.cpu().numpy(), terminations_buf, truncations_buf,
            args.gamma, args.gae_lambda,
        )  # fmt: skip
        returns = advantages + values.cpu().numpy()

        # flatten (num_steps, num_envs) -> batch
        b_obs = b_obs_t.reshape(-1, obs_dim)
        b_actions = actions_t.reshape(-1, act_dim)
        b_logprobs = logprobs.reshape(-1)
        b_advantages = torch.from_numpy(advantages).to(device).reshape(-1)
        b_returns = torch.from_numpy(returns).to(device).reshape(-1)
        b_values = values.reshape(-1)

        # ---- update: update_epochs passes over the batch in shuffled minibatches ----
        # Metrics are summed over every minibatch (no .item() per minibatch: one sync per update) and averaged.
        loss_sums = torch.zeros(4, device=device)  # policy_loss, value_loss, entropy, grad_norm
        kl_sums = torch.zeros(3, device=device)  # old_approx_kl, approx_kl, clipfrac
        num_epochs = 0
        log_ratios = torch.zeros((args.num_minibatches, args.minibatch_size), device=device)
        for epoch in range(args.update_epochs):
            perm = torch.randperm(args.batch_size, device=device).view(args.num_minibatches, args.minibatch_size)
            # one gather per epoch instead of one per minibatch
            e_obs, e_actions, e_logprobs = b_obs[perm], b_actions[perm], b_logprobs[perm]
            e_advantages, e_returns, e_values = b_advantages[perm], b_returns[perm], b_values[perm]
            for mb in range(args.num_minibatches):
                new_mean = agent.actor_mean(e_obs[mb])
                new_logprob = gaussian_log_prob(new_mean, agent.actor_logstd, e_actions[mb])
                entropy = gaussian_entropy(agent.actor_logstd).mean()  # state-independent sigma: same for all s
                new_values = agent.get_value(e_obs[mb])
                mb_advantages = e_advantages[mb]
                if args.norm_adv:
                    mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
                pg_loss, v_loss, log_ratios[mb] = ppo_losses(
                    new_logprob, e_logprobs[mb], mb_advantages, new_values, e_values[mb], e_returns[mb], args.clip_coef,
                    args.clip_vloss,
                )
                # L = L^CLIP - c_ent * H + c_v * L^V
                loss = pg_loss - args.ent_coef * entropy + args.vf_coef * v_loss
                flat_params.grad.zero_()
                loss.backward()
                grad_norm = nn.utils.clip_grad_norm_([flat_params], args.max_grad_norm)  # norm before clipping
                optimizer.step()
                loss_sums += torch.stack([pg_loss.detach(), v_loss.detach(), entropy.detach(), grad_norm])
            epoch_kl = kl_diagnostics(log_ratios, args.clip_coef)  # the epoch's mean over its minibatches
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
        for name, value in metrics.items():
            writer.add_scalar(f"losses/{name}", value, global_step)
        writer.add_scalar("losses/explained_variance", explained_variance(values.cpu().numpy(), returns), global_step)
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
        eval_video_dir = str(run_dir / "videos" / "eval") if args.capture_video else None
        eval_rms = obs_rms if args.norm_obs else None
        returns_eval = evaluate(
            agent, args.env_id, eval_rms, args.obs_clip, args.eval_episodes, args.seed + 10_000, device, eval_video_dir
        )
        writer.add_scalar("eval/episodic_return", float(np.mean(returns_eval)), global_step)
        print(f"eval: {np.mean(returns_eval):.2f} +- {np.std(returns_eval):.2f} over {len(returns_eval)} episodes")
    writer.close()
    envs.close()
    if args.track:
        import wandb

        wandb.finish()


def eval_only(args: Args, device: torch.device) -> None:
    """--eval-checkpoint: deterministic episodes with frozen normalization; print and log eval/episodic_return."""
    ckpt = load_checkpoint(args.eval_checkpoint, device)
    saved = Args(**{f.name: ckpt["args"][f.name] for f in dataclasses.fields(Args) if f.name in ckpt["args"]})
    obs_shape, act_shape = probe_env(saved.env_id)
    check_checkpoint_matches(ckpt, args.eval_checkpoint, obs_shape, act_shape)
    agent = Agent(int(np.prod(obs_shape)), int(np.prod(act_shape))).to(device)
    agent.load_state_dict(ckpt["model"])
    obs_rms = None
    if saved.norm_obs:
        obs_rms = RunningMeanStd(shape=(int(np.prod(obs_shape)),))
        obs_rms.load_state_dict(ckpt["obs_rms"])
    run_dir = Path(args.eval_checkpoint).resolve().parent.parent
    eval_dir = run_dir / "eval" / Path(args.eval_checkpoint).stem
    video_dir = str(eval_dir / "videos") if args.capture_video else None
    eval_seed = saved.seed + 10_000
    returns = evaluate(agent, saved.env_id, obs_rms, saved.obs_clip, args.eval_episodes, eval_seed, device, video_dir)
    writer = make_writer(eval_dir, saved, purge_step=None)
    writer.add_scalar("eval/episodic_return", float(np.mean(returns)), ckpt["global_step"])
    writer.close()
    print(f"eval {saved.env_id} at step {ckpt['global_step']}: {np.mean(returns):.2f} +- {np.std(returns):.2f} "
          f"over {len(returns)} episodes")  # fmt: skip


if __name__ == "__main__":
    run_cli(main)
