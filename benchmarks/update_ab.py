"""Time two builds of the SAC update against each other, interleaved in one process.

Why not whole runs side by side: on a shared 2-core host the speed of two runs a minute apart differs by up to
±40%, far more than a change to the update is worth. Here both builds' learners live in one process and take turns,
`--steps` gradient steps each per round, so a slowdown of the machine hits both alike; the result is the median over
rounds of the per-round time ratio (build B / build A). Each gradient step is what the training loop does after
learning_starts: sample a batch of 256 from the replay buffer, one critic update, every second step two actor (and
temperature) updates, one Polyak update. HalfCheetah sizes (17 observations, 6 actions), random data.

    python benchmarks/update_ab.py OLD_SCRIPT.py NEW_SCRIPT.py [--bf16] [--rounds 30] [--steps 40] [--threads 2]

The scripts are imported by path (e.g. `git show OLD:sac_continuous.py > /tmp/old.py`), so each must be a
sac_continuous.py (or sac_continuous_ray.py) build exposing Learner (or, in older builds, make_learner),
ReplayBuffer, critic_update, actor_update and soft_update. --bf16 needs builds that still have it.
"""

import argparse
import importlib.util
import statistics
import time
import types
from pathlib import Path

import numpy as np
import torch

OBS_DIM, ACT_DIM, BATCH = 17, 6, 256


def load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("a", help="build A: path to a sac_continuous.py")
    parser.add_argument("b", help="build B: path to a sac_continuous.py")
    parser.add_argument("--bf16", action="store_true", help="run both learners with bfloat16 copies (--bf16)")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--steps", type=int, default=40, help="gradient steps per build per round")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    builds = [load(args.a, "build_a"), load(args.b, "build_b")]
    for build in builds:  # the process settings of the training loop; one call holds for both builds
        if hasattr(build, "flush_denormals"):
            build.flush_denormals()  # before torch's first parallel op (its threads copy the flag when they start)
        if hasattr(build, "keep_freed_memory"):
            build.keep_freed_memory()
    torch.set_num_threads(args.threads)
    learner_args = types.SimpleNamespace(autotune=True, alpha=0.2, bf16=args.bf16, policy_lr=3e-4, q_lr=1e-3, squash_eps=0.0)
    rng = np.random.default_rng(0)
    n = 20_000
    obs, next_obs = rng.standard_normal((n, OBS_DIM), np.float32), rng.standard_normal((n, OBS_DIM), np.float32)
    actions = rng.uniform(-1, 1, (n, ACT_DIM)).astype(np.float32)
    data = (obs, next_obs, actions, rng.standard_normal(n, np.float32), np.zeros(n, bool))
    setups = []
    for build in builds:
        torch.manual_seed(0)
        bounds = np.ones(ACT_DIM, np.float32)
        make = getattr(build, "make_learner", None) or build.Learner
        learner = make(OBS_DIM, ACT_DIM, -bounds, bounds, learner_args, torch.device("cpu"))
        buffer = build.ReplayBuffer(1_000_000, OBS_DIM, ACT_DIM)
        buffer.add(*data)
        setups.append((build, learner, buffer))

    def gradient_steps(build, learner, buffer, count: int) -> float:
        start = time.perf_counter()
        for i in range(count):
            batch = buffer.sample(BATCH, torch.device("cpu"))
            build.critic_update(learner, batch, 0.99)
            if i % 2 == 0:
                for _ in range(2):
                    build.actor_update(learner, batch["obs"], True)
            if not hasattr(build, "make_learner"):  # the critics as modules
                build.soft_update(learner.qf_target, learner.qf, 0.005)
            elif hasattr(learner, "qf_params"):  # the learner since the restructure: parameter lists
                build.soft_update(learner.qf_target_params, learner.qf_params, 0.005)
            else:  # builds before it: flat tensors
                build.soft_update(learner.qf_target_flat, learner.qf_flat, 0.005)
        return (time.perf_counter() - start) / count

    for setup in setups:
        gradient_steps(*setup, 60)  # warm-up: allocator, oneDNN primitive caches
    times = ([], [])
    for r in range(args.rounds):
        for k in (0, 1) if r % 2 == 0 else (1, 0):  # alternate who goes first
            times[k].append(gradient_steps(*setups[k], args.steps))
    ratios = [b / a for a, b in zip(*times)]
    dtype = "bfloat16" if args.bf16 else "float32"
    for label, path, t in (("A", args.a, times[0]), ("B", args.b, times[1])):
        print(f"{label} {Path(path).name} ({dtype}): median {statistics.median(t) * 1e3:.3f} ms per gradient step")
    print(
        f"B / A time per gradient step: median {statistics.median(ratios):.3f} over {args.rounds} rounds "
        f"(quartiles {np.percentile(ratios, 25):.3f} / {np.percentile(ratios, 75):.3f})"
    )


if __name__ == "__main__":
    main()
