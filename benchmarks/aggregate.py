"""Per-task statistics and the across-task aggregate of one script's results, with intervals (rliable).

    python benchmarks/aggregate.py --script ppo_continuous --budget 1M --random benchmarks/results/random_policy_mujoco.json \
        --out benchmarks/results/ppo_continuous_mujoco [--tasks Hopper-v4 ...]

Per task (one JSON of benchmarks/run.py each, `<script>_<task>_<budget>.json`): the mean ± population std over seeds
of the training return (last 100 episodes); for n >= 3 seeds a 95 % percentile-bootstrap interval of that mean,
for fewer the min-max and n. Across the tasks whose JSON holds a published figure: the interquartile mean (IQM) of
the normalized score (ours - random) / (published mean - random), per seed and task, with a 95 % stratified
bootstrap interval (rliable, 50,000 resamples; every task needs the same number of seeds). Writes `<out>.json`
(figures, inputs, commits), `<out>.png` (one panel per task, ours against the comparison) and prints a markdown table.
"""

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Optional

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
REPS = 50_000


def seed_returns(report: dict) -> np.ndarray:
    return np.array([s["last100_mean"] for s in report["per_seed"] if s["status"] == "ok"], dtype=np.float64)


def bootstrap_mean_interval(values: np.ndarray, seed: int = 0, reps: int = REPS) -> tuple:
    """95 % percentile-bootstrap interval of the mean of `values` (rliable, one task)."""
    from rliable import library as rly

    _, intervals = rly.get_interval_estimates(
        {"x": values[:, None]}, lambda x: np.array([x.mean()]), reps=reps, random_state=np.random.RandomState(seed)
    )
    return float(intervals["x"][0, 0]), float(intervals["x"][1, 0])


def normalized(scores: np.ndarray, random: float, reference: float) -> np.ndarray:
    """(ours - random) / (reference - random): 0 is a random policy, 1 the reference's published mean."""
    return (scores - random) / (reference - random)


def iqm_interval(matrix: np.ndarray, seed: int = 0, reps: int = REPS) -> tuple:
    """IQM over all (seed, task) scores of a (seeds, tasks) matrix and its 95 % stratified bootstrap interval."""
    from rliable import library as rly
    from rliable import metrics

    point, intervals = rly.get_interval_estimates(
        {"x": matrix}, lambda x: np.array([metrics.aggregate_iqm(x)]), reps=reps, random_state=np.random.RandomState(seed)
    )
    return float(point["x"][0]), float(intervals["x"][0, 0]), float(intervals["x"][1, 0])


def task_row(task: str, report: dict, random: Optional[float]) -> dict:
    values = seed_returns(report)
    row = {
        "task": task,
        "n": int(values.size),
        "mean": float(values.mean()),
        "std": float(values.std()),
        "per_seed": values.round(2).tolist(),
        "commit": report.get("commit"),
        "cpu_model": report["machine"].get("cpu_model"),
        "reference": report.get("reference"),
        "random": random,
    }
    if values.size >= 3:
        row["ci95"] = bootstrap_mean_interval(values)
    else:
        row["min_max"] = (float(values.min()), float(values.max()))
    if report.get("reference") and random is not None:
        row["normalized_per_seed"] = normalized(values, random, report["reference"]["value"]).round(4).tolist()
    return row


def markdown(rows: list, aggregate: Optional[dict]) -> str:
    lines = [
        "| task | seeds | ours: mean ± std | 95 % CI (bootstrap) or min–max | comparison | normalized (mean) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        spread = (
            f"[{r['ci95'][0]:.0f}, {r['ci95'][1]:.0f}]"
            if "ci95" in r
            else f"{r['min_max'][0]:.0f}–{r['min_max'][1]:.0f} (n={r['n']})"
        )
        ref = r["reference"]
        comparison = f"{ref['value']:.0f} ± {ref['std']:.0f} (CleanRL, published)" if ref else "none published"
        norm = f"{np.mean(r['normalized_per_seed']):.2f}" if "normalized_per_seed" in r else "–"
        lines.append(f"| {r['task']} | {r['n']} | {r['mean']:.0f} ± {r['std']:.0f} | {spread} | {comparison} | {norm} |")
    if aggregate:
        lines.append(
            f"\nIQM of the normalized score over {aggregate['tasks']} ({aggregate['runs']} runs): "
            f"**{aggregate['iqm']:.2f}** [{aggregate['ci95'][0]:.2f}, {aggregate['ci95'][1]:.2f}] "
            "(95 % stratified bootstrap)."
        )
    return "\n".join(lines)


def plot(rows: list, reports: dict, path: Path, smooth: int = 20) -> None:
    """One panel per task: each seed's smoothed curve (light), their mean, the published figure as a band."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    cols = 3
    nrows = -(-len(rows) // cols)
    figure = Figure(figsize=(12, 3.4 * nrows), layout="constrained")
    grid = np.linspace(0, 1, 201)
    for k, row in enumerate(rows):
        ax = figure.add_subplot(nrows, cols, k + 1)
        report = reports[row["task"]]
        budget = report["total_timesteps"]
        means = []
        for s in report["per_seed"]:
            steps, values = np.array(s["curve"]["steps"], float), np.array(s["curve"]["returns"], float)
            if values.size >= smooth:
                values = np.convolve(values, np.ones(smooth) / smooth, mode="valid")
                steps = steps[smooth - 1 :]
            ax.plot(steps, values, color="C0", alpha=0.25, linewidth=0.8)
            means.append(np.interp(grid * budget, steps, values, left=np.nan))
        with warnings.catch_warnings():  # grid points before any seed's first episode: no mean there (NaN)
            warnings.simplefilter("ignore", RuntimeWarning)
            mean_curve = np.nanmean(means, axis=0)
        ax.plot(grid * budget, mean_curve, color="C0", linewidth=2, label=f"ours ({len(means)} seeds)")
        ref = row["reference"]
        if ref:
            ax.axhspan(ref["value"] - ref["std"], ref["value"] + ref["std"], color="C1", alpha=0.25)
            ax.axhline(ref["value"], color="C1", linewidth=1.5, label="CleanRL (published, 1M)")
        ax.set_title(row["task"], fontsize=11)
        ax.set_xlabel("env steps")
        ax.ticklabel_format(axis="x", style="sci", scilimits=(6, 6))
        ax.legend(loc="lower right", fontsize=8, framealpha=0.9)
    figure.supylabel("training return (last episodes, smoothed)")
    FigureCanvasAgg(figure).print_png(str(path))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--script", required=True)
    parser.add_argument("--budget", required=True, help="the JSON names' budget part, e.g. 1M")
    parser.add_argument("--tasks", nargs="+", required=True)
    parser.add_argument("--random", type=Path, required=True, help="random_policy.py's JSON")
    parser.add_argument("--out", type=Path, required=True)
    ns = parser.parse_args()
    random_by_env = json.loads(ns.random.read_text())["per_env"]
    reports = {t: json.loads((RESULTS / f"{ns.script}_{t}_{ns.budget}.json").read_text()) for t in ns.tasks}
    rows = [task_row(t, reports[t], random_by_env.get(t, {}).get("mean")) for t in ns.tasks]
    scored = [r for r in rows if "normalized_per_seed" in r]
    aggregate = None
    if scored:
        n = {r["n"] for r in scored}
        if len(n) != 1:
            sys.exit(f"the stratified bootstrap needs the same number of seeds per task; got {n}")
        matrix = np.array([r["normalized_per_seed"] for r in scored]).T  # (seeds, tasks)
        iqm, low, high = iqm_interval(matrix)
        aggregate = {
            "metric": "IQM of (ours - random) / (CleanRL published mean - random) over all (seed, task)",
            "tasks": [r["task"] for r in scored],
            "runs": int(matrix.size),
            "iqm": iqm,
            "ci95": [low, high],
            "interval": f"95 % stratified bootstrap (rliable), {REPS} resamples",
        }
    report = {
        "script": ns.script,
        "budget": ns.budget,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "random_policy": str(ns.random.relative_to(ROOT) if ns.random.is_absolute() else ns.random),
        "tasks": rows,
        "aggregate": aggregate,
    }
    ns.out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    plot(rows, reports, ns.out.with_suffix(".png"))
    print(markdown(rows, aggregate))


if __name__ == "__main__":
    main()
