"""Do two environments (e.g. two MuJoCo versions) simulate the same physics? Step the same env in each interpreter
with the same uniform random actions from the same reset, and print the largest state difference after each step.

    python benchmarks/simulator_divergence.py /tmp/mujoco237/bin/python .venv/bin/python [--env-id HalfCheetah-v4]

How to read it: ~1e-15 after the first step, growing roughly exponentially, is floating-point rounding amplified by
a chaotic system (the same physics: returns differ only as runs with different seeds do); a first-step difference
far above rounding (say 1e-6) is a change of the model or the solver, which could shift returns systematically.
The state compared is the raw MuJoCo state (qpos, qvel) of the unwrapped env, so observation code does not matter.
Each interpreter needs gymnasium and numpy (and the simulator), nothing from this project.
"""

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

REPORT_STEPS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)


def dump_states(env_id: str, steps: int, seed: int, path: str) -> None:
    """Run in each interpreter: the (steps, nq + nv) MuJoCo states after each step, saved to `path`."""
    import warnings

    import gymnasium as gym

    warnings.filterwarnings("ignore")  # the -v4 models' deprecation warnings
    env = gym.make(env_id).unwrapped
    env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    low, high = env.action_space.low, env.action_space.high
    states = []
    for _ in range(steps):
        env.step(rng.uniform(low, high).astype(env.action_space.dtype))
        states.append(np.concatenate([env.data.qpos, env.data.qvel]))
    np.save(path, np.array(states))


def divergence(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Largest absolute state difference after each step."""
    return np.abs(a - b).max(axis=1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("python_a")
    parser.add_argument("python_b")
    parser.add_argument("--env-id", default="HalfCheetah-v4")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dump", help=argparse.SUPPRESS)  # internal: the child's output path
    args = parser.parse_args(argv)
    if args.dump:
        dump_states(args.env_id, args.steps, args.seed, args.dump)
        return 0
    sys.path.insert(0, str(ROOT))  # here, not at import: the --dump children need nothing from the project
    from benchmarks.run import interpreter_versions

    with tempfile.TemporaryDirectory() as tmp:
        states = []
        for i, python in enumerate((args.python_a, args.python_b)):
            path = str(Path(tmp) / f"{i}.npy")
            flags = ["--env-id", args.env_id, "--steps", str(args.steps), "--seed", str(args.seed), "--dump", path]
            subprocess.run([python, __file__, "-", "-", *flags], check=True)
            states.append(np.load(path))
            mujoco = interpreter_versions(python, ["mujoco"])["packages"]["mujoco"]
            print(f"{'AB'[i]}: {python} (mujoco {mujoco or 'not installed'})")
    diff = divergence(*states)
    print(f"{args.env_id}, seed {args.seed}: largest |state difference| after step")
    for step in REPORT_STEPS:
        if step <= len(diff):
            print(f"  {step:>5}: {diff[step - 1]:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
