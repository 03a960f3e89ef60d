"""Stable-Baselines3 monitor CSVs (one per env) -> a results JSON in benchmarks/run.py's format, so that
benchmarks/summary.py can draw and tabulate a Stable-Baselines3 run beside ours.

    python benchmarks/sb3_monitor.py --run 1=DIR1 --run 2=DIR2 --n-envs 16 --frame-skip 4 \\
        --command "OMP_NUM_THREADS=1 PYTHON sb3_a2c.py 1000000 --seed {seed} --monitor-dir DIR" \\
        --python REFERENCE_PYTHON --env-id BreakoutNoFrameskip-v4 --total-timesteps 1000000 \\
        --label "Stable-Baselines3 A2C" --out benchmarks/results/sb3_a2c_BreakoutNoFrameskip-v4_1M.json

Each `<i>.monitor.csv` (Stable-Baselines3's Monitor, innermost wrapper) has one row per full game: `r` the unclipped
score, `l` its length in emulator frames, `t` seconds since that env's `t_start` (the header line). The x-axis (agent
steps of the whole vector env) is estimated from the frames: env i's games end at n_envs * (frames so far in env i) /
frame_skip. That counts the few frames its wrappers spend inside a reset (1-30 no-ops, FIRE, the step after a lost
life) as agent steps too, so it runs slightly ahead of the true count: the JSON records the estimate for all completed
games (`estimated_steps_of_completed_games`) next to the budget. Games are ordered by their end time (exact), which
is what "last 100" uses. Wall time: the monitors' clock from the first env's start to the last game's end (start-up
and the unfinished games excluded).
"""

import argparse
import csv
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.run import curve_block, machine_info, summarize_seed, summarize_seeds, utc_now  # noqa: E402


def read_monitors(folder: Path, n_envs: int, frame_skip: int) -> dict:
    """All games of one run, ordered by end time: steps (estimated, see the module docstring), returns, end times."""
    games = []  # (absolute end time, estimated global step, score)
    files = sorted(folder.glob("*.monitor.csv"))
    if not files:
        raise SystemExit(f"no *.monitor.csv in {folder}")
    starts = []
    for path in files:
        with open(path) as f:
            header = json.loads(f.readline().lstrip("#"))
            frames = 0
            for row in csv.DictReader(f):
                frames += int(row["l"])
                games.append((header["t_start"] + float(row["t"]), n_envs * frames / frame_skip, float(row["r"])))
        starts.append(header["t_start"])
    games.sort()
    ends, steps, returns = (np.array(column) for column in zip(*games))
    return {
        "steps": np.round(steps).astype(np.int64),
        "returns": returns,
        "wall_time_s": float(ends[-1] - min(starts)),
        "num_envs_files": len(files),
    }


def seed_entry(seed: int, folder: Path, args) -> dict:
    games = read_monitors(folder, args.n_envs, args.frame_skip)
    summary = summarize_seed(games["steps"], games["returns"])
    summary["final_step"] = int(games["steps"].max())
    return {
        "seed": seed,
        "status": "ok",
        "wall_time_s": round(games["wall_time_s"], 1),
        "command": args.command.format(seed=seed),
        **summary,
        "estimated_steps_of_completed_games": int(games["steps"].max()),
        "curve": curve_block(games["steps"], games["returns"]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="append", required=True, help="SEED=MONITOR_DIR (repeat per seed)")
    parser.add_argument("--n-envs", type=int, required=True)
    parser.add_argument("--frame-skip", type=int, default=4)
    parser.add_argument("--command", required=True, help="the command each seed ran ({seed} is filled in)")
    parser.add_argument("--python", required=True, help="the interpreter that ran it (its versions go in the JSON)")
    parser.add_argument("--env-id", required=True)
    parser.add_argument("--total-timesteps", type=int, required=True)
    parser.add_argument("--label", required=True, help="what ran, e.g. 'Stable-Baselines3 A2C'")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    per_seed = []
    for spec in args.run:
        seed, _, folder = spec.partition("=")
        per_seed.append(seed_entry(int(seed), Path(folder), args))
    machine = machine_info(args.python)
    machine["packages"]["stable-baselines3"] = machine_info_package(args.python, "stable-baselines3")
    report = {
        "script": args.label,
        "env_id": args.env_id,
        "total_timesteps": args.total_timesteps,
        "seeds": [entry["seed"] for entry in per_seed],
        "harness_command": " ".join(sys.argv),
        "date_utc": utc_now(),
        "metric": {
            "tag": "monitor CSV column r: the full game's unclipped score",
            "x": f"estimated agent steps: n_envs * frames / frame_skip ({args.n_envs} envs, frame skip {args.frame_skip})",
            "last100_mean": "mean score of the last min(100, games) games of a seed, by end time",
            "last10_mean": "mean score of the last min(10, games) games of a seed, by end time",
        },
        "per_seed": per_seed,
        "summary": {
            **summarize_seeds(per_seed),
            "seeds_used": [entry["seed"] for entry in per_seed],
            "std_note": "population standard deviation over seeds (numpy ddof=0)",
        },
        "machine": machine,
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    stats = report["summary"]["last100_mean"]
    print(f"{args.label}: last-100 {stats['mean']:.1f} ± {stats['std']:.1f} over {len(per_seed)} seeds; wrote {args.out}")
    return 0


def machine_info_package(python: str, name: str):
    from benchmarks.run import interpreter_versions

    return interpreter_versions(python, (name,))["packages"][name]


if __name__ == "__main__":
    sys.exit(main())
