"""Weight staleness of sac_continuous_ray.py at 1 and 4 rollout workers (the target: the mean at 4 workers at
most 1.5x that at 1 worker, the same flags otherwise).

    python benchmarks/ray_staleness.py [--out benchmarks/results/ray_staleness.json] [--steps 15000] [--workers 1 4]

Runs the script as a user runs it (embedded Ray, HalfCheetah-v4, utd 1, one learner thread), one configuration after
the other, and reads from TensorBoard `charts/weight_staleness` (each log window's mean over its batches: actor
updates between the weights that collected a batch and the learner's version when it was stored) and
`charts/weight_staleness_max`. With the default --log-interval of 100 env steps and batches of 100, a window holds
about one batch, so the mean of the window means is close to the mean over batches. Writes a JSON with the command,
the machine (lscpu's model name) and the date. Short runs: this measures the dispatch and sync rules, not learning.
"""

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.run import read_scalars  # noqa: E402


def cpu_model() -> str:
    """lscpu's "Model name" (None where lscpu is missing)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=30).stdout
    except OSError:
        return None
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), None)


def run_one(workers: int, steps: int, runs_dir: Path) -> dict:
    cmd = [
        sys.executable,
        str(ROOT / "sac_continuous_ray.py"),
        "--env-id",
        "HalfCheetah-v4",
        "--total-timesteps",
        str(steps),
        "--num-rollout-workers",
        str(workers),
        "--utd-ratio",
        "1",
        "--torch-threads",
        "1",
        "--checkpoint-interval",
        "0",
        "--no-progress",
        "--seed",
        "1",
        "--runs-dir",
        str(runs_dir),
    ]
    start = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=3600, stdin=subprocess.DEVNULL)
    wall = time.time() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    run_dir = next(d for d in runs_dir.iterdir() if d.is_dir())
    _, means = read_scalars(run_dir, "charts/weight_staleness")
    _, maxes = read_scalars(run_dir, "charts/weight_staleness_max")
    done = next(line for line in proc.stdout.splitlines() if line.startswith("done:"))
    command = " ".join(["python", Path(cmd[1]).name, *cmd[2:-2]])  # as run from the repository root
    return {
        "command": command,
        "windows": int(len(means)),
        "mean_staleness": float(np.mean(means)),
        "median_window_staleness": float(np.median(means)),
        "max_staleness": float(np.max(maxes)),
        "wall_s": round(wall, 1),
        "done": done,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "ray_staleness.json"))
    parser.add_argument("--steps", type=int, default=15_000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4])
    args = parser.parse_args()
    runs = {}
    for workers in args.workers:
        with tempfile.TemporaryDirectory() as tmp:
            runs[str(workers)] = run_one(workers, args.steps, Path(tmp))
        r = runs[str(workers)]
        print(
            f"{workers} worker(s): mean staleness {r['mean_staleness']:.0f}, max {r['max_staleness']:.0f} actor "
            f"updates ({r['windows']} windows, {r['wall_s']:.0f} s)",
            flush=True,
        )
    first, last = runs[str(args.workers[0])], runs[str(args.workers[-1])]
    result = {
        "what": "sac_continuous_ray.py weight staleness (actor updates) against the number of rollout workers",
        "command": f"python benchmarks/ray_staleness.py --steps {args.steps} --workers {' '.join(map(str, args.workers))}",
        "machine": cpu_model(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "runs": runs,
        "mean_ratio_last_to_first": last["mean_staleness"] / first["mean_staleness"],
        "target": "mean at 4 workers <= 1.5x the mean at 1 worker",
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"ratio {result['mean_ratio_last_to_first']:.2f}; wrote {args.out}")


if __name__ == "__main__":
    main()
