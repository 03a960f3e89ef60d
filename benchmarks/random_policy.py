"""The return of a uniformly random policy on each task: the zero point of the normalized scores (aggregate.py).

    python benchmarks/random_policy.py --env-ids Hopper-v4 Walker2d-v4 --episodes 100 \
        --out benchmarks/results/random_policy_mujoco.json

Each episode samples actions uniformly from the action space until the episode ends (termination or the env's time
limit), with the env's own reward; the JSON holds each env's mean, std and episode count, the command and the machine.
"""

import argparse
import json
import shlex
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.run import machine_info, utc_now  # noqa: E402


def random_returns(env_id: str, episodes: int, seed: int) -> list:
    env = gym.make(env_id)
    env.action_space.seed(seed)
    returns = []
    for episode in range(episodes):
        env.reset(seed=seed + episode)
        total, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    env.close()
    return returns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env-ids", nargs="+", required=True)
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    ns = parser.parse_args()
    per_env = {}
    for env_id in ns.env_ids:
        returns = random_returns(env_id, ns.episodes, ns.seed)
        per_env[env_id] = {"mean": float(np.mean(returns)), "std": float(np.std(returns)), "episodes": len(returns)}
        print(f"{env_id}: {per_env[env_id]['mean']:.2f} ± {per_env[env_id]['std']:.2f} over {len(returns)} episodes")
    report = {
        "what": "return of uniformly random actions per episode (until termination or the time limit)",
        "command": shlex.join([sys.executable, *sys.argv]),
        "date_utc": utc_now(),
        "machine": machine_info(sys.executable),
        "per_env": per_env,
    }
    ns.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
