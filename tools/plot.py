"""Learning curves of a runs folder: one panel per env, the mean over seeds with a 95 % interval, as a PNG.

    python tools/plot.py runs                                      # writes curves.png
    python tools/plot.py runs --out hopper.png --tag eval/episodic_return --smooth 1

Every folder under RUNS_DIR (at any depth: a sweep's trials too) named as the scripts name a run,
`{env}__{exp_name}__{seed}__{time}`, is one seed; the runs of one env and one exp_name are the seeds of one curve.
A seed's curve is its values of --tag (the event files directly in its folder, read as TensorBoard reads them: a
resumed run's rewritten steps are dropped) against global_step (env steps), smoothed by a trailing moving average
over --smooth values, then interpolated linearly on a common grid of --points env steps that spans the steps every
seed covers. The line is the mean over seeds at each grid point. The band is a 95 % percentile bootstrap interval of
that mean: 10,000 resamples of the seeds, drawn with a fixed seed. With few seeds it is narrow (with two, it spans
the two curves), and with one seed there is no band.
"""

import argparse
import re
import sys
from pathlib import Path

import numpy as np

RUN_NAME = re.compile(r"(?P<env>.+?)__(?P<exp_name>.+)__(?P<seed>-?\d+)__\d+(?:-\d+)?")
RESAMPLES = 10_000


def read_tag(run_dir: Path, tag: str) -> tuple:
    """(steps, values) of one scalar tag in the event files directly in run_dir, sorted by step; empty if absent."""
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    accumulator = EventAccumulator(str(run_dir), size_guidance={SCALARS: 0}).Reload()
    events = accumulator.Scalars(tag) if tag in accumulator.Tags()[SCALARS] else []
    steps = np.array([event.step for event in events], dtype=np.float64)
    values = np.array([event.value for event in events], dtype=np.float64)
    order = np.argsort(steps, kind="stable")
    return steps[order], values[order]


def trailing_mean(values: np.ndarray, window: int) -> np.ndarray:
    """Mean of each value and the window - 1 before it (fewer at the start)."""
    cumulative = np.concatenate([[0.0], np.cumsum(values)])
    end = np.arange(1, len(values) + 1)
    start = np.maximum(end - window, 0)
    return (cumulative[end] - cumulative[start]) / (end - start)


def seed_runs(runs_dir: Path, tag: str) -> dict:
    """{(env, exp_name): [(seed, steps, values), ...]} of the run folders under runs_dir that hold the tag."""
    groups = {}
    for folder in sorted(path for path in Path(runs_dir).rglob("*__*") if path.is_dir()):
        name = RUN_NAME.fullmatch(folder.name)
        if name is None or not any(folder.glob("events.out.tfevents.*")):
            continue
        steps, values = read_tag(folder, tag)
        if len(steps):
            groups.setdefault((name["env"], name["exp_name"]), []).append((int(name["seed"]), steps, values))
    return groups


def curves(runs_dir: Path, tag: str = "charts/episodic_return", smooth: int = 10, points: int = 200) -> dict:
    """{(env, exp_name): {"steps", "mean", "low", "high", "seeds"}}: the grid, the mean over seeds, the bootstrap
    interval (None for one seed) and the seeds, as the module's docstring says."""
    result = {}
    for key, runs in sorted(seed_runs(runs_dir, tag).items()):
        first, last = max(steps[0] for _, steps, _ in runs), min(steps[-1] for _, steps, _ in runs)
        grid = np.linspace(first, max(first, last), points)
        per_seed = np.array([np.interp(grid, steps, trailing_mean(values, smooth)) for _, steps, values in runs])
        mean, low, high = per_seed.mean(axis=0), None, None
        if len(runs) > 1:
            picks = np.random.default_rng(0).integers(0, len(runs), size=(RESAMPLES, len(runs)))
            low, high = np.percentile(per_seed[picks].mean(axis=1), [2.5, 97.5], axis=0)
        result[key] = {"steps": grid, "mean": mean, "low": low, "high": high, "seeds": [seed for seed, _, _ in runs]}
    return result


def draw(found: dict, out: Path, tag: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = sorted({env for env, _ in found})
    columns = min(3, len(envs))
    rows = -(-len(envs) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(5.5 * columns, 3.8 * rows), squeeze=False)
    for panel, env in zip(axes.flat, envs):
        for (curve_env, exp_name), curve in found.items():
            if curve_env != env:
                continue
            label = f"{exp_name} ({len(curve['seeds'])} seed{'s' if len(curve['seeds']) > 1 else ''})"
            (line,) = panel.plot(curve["steps"], curve["mean"], label=label)
            if curve["low"] is not None:
                panel.fill_between(curve["steps"], curve["low"], curve["high"], color=line.get_color(), alpha=0.25)
        panel.set(title=env, xlabel="env steps", ylabel=tag)
        panel.grid(alpha=0.3)
        panel.legend(fontsize=8)
    for panel in axes.flat[len(envs) :]:
        panel.axis("off")
    figure.suptitle("mean over seeds and the 95 % bootstrap interval of the mean", fontsize=10)
    figure.tight_layout()
    figure.savefig(out, dpi=100)
    plt.close(figure)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs_dir", type=Path, metavar="RUNS_DIR", help="folder holding run folders (at any depth)")
    parser.add_argument("--out", type=Path, default=Path("curves.png"), help="the PNG to write (default: curves.png)")
    parser.add_argument("--tag", default="charts/episodic_return", help="the scalar to draw (default: %(default)s)")
    parser.add_argument("--smooth", type=int, default=10, help="trailing moving average over N values (default: 10)")
    parser.add_argument("--points", type=int, default=200, help="grid points per curve (default: 200)")
    args = parser.parse_args(argv)
    if args.smooth < 1 or args.points < 2:
        parser.error("--smooth must be at least 1 and --points at least 2")
    try:
        found = curves(args.runs_dir, args.tag, args.smooth, args.points) if args.runs_dir.is_dir() else {}
        if found:
            draw(found, args.out, args.tag)
    except Exception as error:  # one paragraph, not a traceback: an unreadable event file, an unwritable --out
        print(f"error: could not draw the curves of {args.runs_dir} into {args.out}: {error!r}", file=sys.stderr)
        return 2
    if not found:
        print(
            f"error: no run under {args.runs_dir} has values of {args.tag}: tools/plot.py reads the TensorBoard event "
            "files of run folders named {env}__{exp_name}__{seed}__{time}, as the scripts write them (give the folder "
            "passed to their --runs-dir, 'runs' by default, and a tag they log, such as charts/episodic_return).",
            file=sys.stderr,
        )
        return 2
    print(f"wrote {args.out}: " + ", ".join(f"{env} {exp} (seeds {c['seeds']})" for (env, exp), c in found.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
