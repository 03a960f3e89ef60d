"""Two runs' learning curves on one plot, against gradient updates: does the distributed script learn like the
single-process one per update?

    python benchmarks/side_by_side.py --run LABEL=RUN_DIR --run LABEL=RUN_DIR --learning-starts 5000 --utd 1 \\
        --out benchmarks/results/sac_continuous_vs_ray_HalfCheetah-v4_150k

x = gradient updates made when the episode ended, from the env step (utd * (step - learning_starts + 1), the
schedule both scripts hold to; sac_continuous.py's is exactly one update per step). Writes <out>.json (per run: last
100 / last 10 training returns, returns at 50k-update marks, the run's wall time from its event files) and <out>.png.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.run import moving_average, read_scalars  # noqa: E402


def wall_time_s(run_dir: Path) -> float:
    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(str(run_dir), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    events = acc.Scalars("charts/SPS")
    return float(events[-1].wall_time - events[0].wall_time)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="append", required=True, help="LABEL=RUN_DIR")
    parser.add_argument("--learning-starts", type=int, default=5_000)
    parser.add_argument("--utd", type=float, default=1.0)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--smooth", type=int, default=10)
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    report = {"command": " ".join(sys.argv), "x": "gradient updates = utd * (env step - learning_starts + 1)", "runs": {}}
    fig, ax = plt.subplots(figsize=(7, 4))
    for spec in args.run:
        label, _, path = spec.partition("=")
        steps, values = read_scalars(Path(path), "charts/episodic_return")
        updates = np.maximum(args.utd * (steps - args.learning_starts + 1), 0)
        marks = {}
        for mark in (50_000, 100_000, 145_000):
            near = values[(updates <= mark)][-10:]
            marks[str(mark)] = float(np.mean(near)) if len(near) else None
        report["runs"][label] = {
            "run_dir": path,
            "episodes": int(len(values)),
            "final_step": int(steps[-1]),
            "last100_mean": float(np.mean(values[-100:])),
            "last10_mean": float(np.mean(values[-10:])),
            "last10_at_updates": marks,
            "wall_time_s_first_to_last_log": wall_time_s(Path(path)),
        }
        (line,) = ax.plot(updates, moving_average(values, args.smooth), label=f"{label} (moving average of {args.smooth})")
        ax.plot(updates, values, alpha=0.25, color=line.get_color())
    ax.set_xlabel("gradient updates")
    ax.set_ylabel("training episodic return")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out.with_suffix(".png"), dpi=110)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report["runs"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
