"""Benchmark harness: run one single-file training script over several seeds, then summarize and plot its returns.

    python benchmarks/run.py --script ppo_continuous.py --env-id HalfCheetah-v4 --seeds 1 2 3 \\
        --total-timesteps 1000000 --out benchmarks/results/ppo_continuous_halfcheetah \\
        --reference VALUE --reference-std STD --reference-label SOURCE [-- extra script args]

Each seed runs as `<python> <script> --env-id ENV --seed S --total-timesteps N --exp-name NAME --runs-dir <out>_runs
[extra args]`, with its stdout/stderr in `<out>_runs/seed<S>.log`. The script writes TensorBoard events into
`<out>_runs/{env_id}__{exp_name}__{seed}__{timestamp}/`; the harness reads `charts/episodic_return` (training episodes,
against global_step) from that folder (not its subfolders) and writes `<out>.json` (results, every episode's (step,
return) of each seed, how they were made, the machine) and `<out>.png` (curves). `--summarize-only` re-reads the
existing runs and rewrites both files.

Everything runs under main(): importing this module has no side effects.
"""

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

RETURN_TAG = "charts/episodic_return"
SPS_TAG = "charts/SPS"
EVAL_TAG = "eval/episodic_return"
THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
MACHINE_NOTE = "learning runs may share the machine; SPS here is not a speed result"


# --------------------------------------------------------------------------------------------------------------------
# Reading and summarizing (pure functions)
# --------------------------------------------------------------------------------------------------------------------


def read_scalars(run_dir: Path, tag: str) -> tuple[np.ndarray, np.ndarray]:
    """All values of scalar `tag` in the event files directly inside `run_dir` (subfolders are ignored), sorted by step.

    Returns (steps int64, values float64); both empty when the tag is absent. Steps that a resumed run rewrote are
    handled the way TensorBoard shows them (orphaned data after a restart is purged by the EventAccumulator).
    """
    from tensorboard.backend.event_processing import event_accumulator

    accumulator = event_accumulator.EventAccumulator(str(run_dir), size_guidance={event_accumulator.SCALARS: 0})
    accumulator.Reload()
    if tag not in accumulator.Tags()[event_accumulator.SCALARS]:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
    events = accumulator.Scalars(tag)
    steps = np.array([event.step for event in events], dtype=np.int64)
    values = np.array([event.value for event in events], dtype=np.float64)
    order = np.argsort(steps, kind="stable")
    return steps[order], values[order]


def summarize_seed(steps: np.ndarray, values: np.ndarray) -> dict[str, Any]:
    """Summary of one seed's training curve: means of the last 100 and last 10 episodes (or of all, if fewer)."""
    if len(values) == 0:
        raise ValueError("no episodes to summarize")
    if len(steps) != len(values):
        raise ValueError(f"steps and values differ in length ({len(steps)} != {len(values)})")
    return {
        "last100_mean": float(np.mean(values[-100:])),
        "last10_mean": float(np.mean(values[-10:])),
        "num_episodes": int(len(values)),
        "final_step": int(steps[-1]),
    }


def summarize_seeds(seed_summaries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Mean and population standard deviation (ddof=0) over seeds of `last100_mean` and `last10_mean`."""
    summary: dict[str, Any] = {"num_seeds": len(seed_summaries), "std_ddof": 0}
    for key in ("last100_mean", "last10_mean"):
        if seed_summaries:
            per_seed = np.array([seed[key] for seed in seed_summaries], dtype=np.float64)
            summary[key] = {"mean": float(np.mean(per_seed)), "std": float(np.std(per_seed, ddof=0))}
        else:
            summary[key] = None
    return summary


def moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing moving average of the same length (the first points average over what is available so far)."""
    values = np.asarray(values, dtype=np.float64)
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    cumulative = np.concatenate([[0.0], np.cumsum(values)])
    end = np.arange(1, len(values) + 1)
    start = np.maximum(end - window, 0)
    return (cumulative[end] - cumulative[start]) / (end - start)


def mean_curve(
    curves: Sequence[tuple[np.ndarray, np.ndarray]], window: int, num_points: int = 500
) -> tuple[np.ndarray, np.ndarray]:
    """Mean over seeds of the smoothed curves, interpolated on a common step grid (the range all seeds cover)."""
    curves = [(steps, values) for steps, values in curves if len(steps) > 0]
    if not curves:
        return np.zeros(0), np.zeros(0)
    low = max(float(steps[0]) for steps, _ in curves)
    high = min(float(steps[-1]) for steps, _ in curves)
    grid = np.linspace(low, high, num_points) if high > low else np.array([high])
    smoothed = [np.interp(grid, steps, moving_average(values, window)) for steps, values in curves]
    return grid, np.mean(smoothed, axis=0)


def find_run_dir(runs_dir: Path, env_id: str, exp_name: str, seed: int, not_before: Optional[int] = None) -> Optional[Path]:
    """Newest `{env_id}__{exp_name}__{seed}__{timestamp}` folder in `runs_dir` (timestamp >= not_before if given)."""
    safe_env_id = env_id.replace("/", "-").replace(":", "-")  # as the scripts name their run folders
    prefix = runs_dir / f"{safe_env_id}__{exp_name}__{seed}__"
    if not prefix.parent.is_dir():
        return None
    candidates = []
    for path in prefix.parent.iterdir():
        suffix = path.name[len(prefix.name) :]
        if path.is_dir() and path.name.startswith(prefix.name) and suffix.isdigit():
            if not_before is None or int(suffix) >= not_before:
                candidates.append((int(suffix), path.stat().st_mtime, path))
    return max(candidates)[2] if candidates else None


def log_tail(log_path: Path, num_lines: int) -> str:
    """Last `num_lines` lines of a log file ('' if it cannot be read)."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-num_lines:])


# --------------------------------------------------------------------------------------------------------------------
# Machine description
# --------------------------------------------------------------------------------------------------------------------


def _read_text(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def cpu_model(cpuinfo: str) -> Optional[str]:
    """CPU model from the text of /proc/cpuinfo (x86 'model name', or ARM 'Model'/'CPU part')."""
    for key in ("model name", "Model", "Hardware", "CPU part"):
        for line in cpuinfo.splitlines():
            name, _, value = line.partition(":")
            if name.strip() == key and value.strip():
                return value.strip()
    return None


def mem_total_gib(meminfo: str) -> Optional[float]:
    """Total memory in GiB from the text of /proc/meminfo."""
    for line in meminfo.splitlines():
        if line.startswith("MemTotal:"):
            kib = int(line.split()[1])
            return round(kib / 1024**2, 2)
    return None


PACKAGES = ("torch", "gymnasium", "mujoco", "numpy")
# Run by the interpreter that ran the seeds, which need not be this one (--python): the versions in the JSON must be
# those of the runs, e.g. the reference's own pinned stack, not the harness's.
VERSIONS_PROBE = """
import importlib.metadata as m, json, platform, sys
versions = {}
for name in sys.argv[1:]:
    try:
        versions[name] = m.version(name)
    except m.PackageNotFoundError:
        versions[name] = None
print(json.dumps({"python": platform.python_version(), "packages": versions}))
"""


def interpreter_versions(python: str, names: Sequence[str] = PACKAGES) -> dict[str, Any]:
    """Python version and installed package versions (importlib.metadata; nothing is imported) of `python`, asked in a
    subprocess. On failure the versions are None and `versions_error` says why: the report is still written."""
    try:
        proc = subprocess.run([python, "-c", VERSIONS_PROBE, *names], capture_output=True, text=True, timeout=120)
        if proc.returncode == 0:
            return json.loads(proc.stdout.strip().splitlines()[-1])
        error = f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}"
    except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError, IndexError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    return {"python": None, "packages": {name: None for name in names}, "versions_error": error}


def machine_info(python: str) -> dict[str, Any]:
    """The machine, and the versions of the interpreter that ran the seeds (`python`, which --python sets)."""
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {
        "platform": platform.platform(),
        "cpu_model": cpu_model(_read_text("/proc/cpuinfo")) or platform.processor() or None,
        "cpu_count": os.cpu_count(),
        "cpu_affinity_count": affinity,
        "mem_total_gib": mem_total_gib(_read_text("/proc/meminfo")),
        **interpreter_versions(python),
        "versions_of": python,
        "note": MACHINE_NOTE,
    }


# --------------------------------------------------------------------------------------------------------------------
# Running seeds
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class Config:
    script: str
    env_id: str
    seeds: list[int]
    total_timesteps: int
    out: Path
    exp_name: str
    python: str
    parallel: int
    summarize_only: bool
    extra_args: list[str]
    reference: Optional[float]
    reference_std: Optional[float]
    reference_label: str
    smooth: int
    tail_lines: int
    runs_in_cwd: bool = False
    commit: Optional[str] = None

    @property
    def runs_dir(self) -> Path:
        return self.out.parent / f"{self.out.name}_runs"

    @property
    def seed_cwd(self) -> Optional[Path]:
        """With --runs-in-cwd, the working directory the script runs in: `<out>_runs/.cwd`, whose `runs` entry is a
        link back to `<out>_runs`, so a script that writes to `./runs/<run_name>` (the reference's layout, which has
        no --runs-dir flag) writes where the harness reads. None otherwise (the caller's directory)."""
        return self.runs_dir / ".cwd" if self.runs_in_cwd else None

    def seed_command(self, seed: int) -> list[str]:
        python, script = self.python, self.script
        if self.runs_in_cwd:  # the script runs elsewhere: paths relative to here must be made absolute
            python = str(Path(python).absolute()) if os.sep in python else python  # (a bare name is a PATH lookup)
            script = str(Path(script).absolute())
        return [
            python,
            script,
            "--env-id",
            self.env_id,
            "--seed",
            str(seed),
            "--total-timesteps",
            str(self.total_timesteps),
            "--exp-name",
            self.exp_name,
            *([] if self.runs_in_cwd else ["--runs-dir", str(self.runs_dir)]),
            *self.threads_flag(),
            *self.extra_args,
        ]

    def threads_flag(self) -> list[str]:
        """Seeds run side by side share the cores: each of this project's scripts gets --torch-threads cores/parallel.
        Why: torch's OpenMP threads spin; two runs with a thread per core each ran ~6x slower on 2 cores."""
        ours = Path(self.script).name in ("ppo_continuous.py", "ppo_atari.py", "a2c_atari.py", "sac_continuous.py")
        if not ours or self.parallel < 2 or any(a.startswith("--torch-threads") for a in self.extra_args):
            return []
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        return ["--torch-threads", str(max(1, cores // self.parallel))]


@dataclass
class SeedRun:
    seed: int
    command: Optional[str]
    returncode: Optional[int]
    wall_time_s: Optional[float]
    run_dir: Optional[Path]


def run_seed(config: Config, seed: int) -> SeedRun:
    """Run one seed to completion, its output going to `<out>_runs/seed<S>.log`."""
    command = config.seed_command(seed)
    log_path = config.runs_dir / f"seed{seed}.log"
    print(f"[seed {seed}] start: {shlex.join(command)}  (log: {log_path})", flush=True)
    start = time.time()
    with open(log_path, "w") as log:
        try:
            returncode = subprocess.run(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=config.seed_cwd
            ).returncode
        except OSError as error:  # e.g. the python executable does not exist
            log.write(f"benchmarks/run.py: could not start the command: {error}\n")
            returncode = 127
    wall_time = time.time() - start
    print(f"[seed {seed}] done in {wall_time:.1f} s, exit code {returncode}", flush=True)
    run_dir = find_run_dir(config.runs_dir, config.env_id, config.exp_name, seed, not_before=int(start))
    return SeedRun(seed, shlex.join(command), returncode, round(wall_time, 2), run_dir)


SWEEP_TOOL = Path(__file__).resolve().parents[1] / "tools" / "sweep.py"
SWEPT = ("ppo_continuous.py", "ppo_atari.py", "a2c_atari.py", "sac_continuous.py", "sac_continuous_ray.py")


def swept(config: Config) -> bool:
    """This project's own scripts run as one grid sweep of tools/sweep.py (the one way to run many runs); another
    script (e.g. the reference's, with --runs-in-cwd) runs here, seed by seed."""
    return not config.runs_in_cwd and Path(config.script).name in SWEPT


def sweep_dir(config: Config) -> Path:
    return config.runs_dir / "sweep"


def run_as_sweep(config: Config) -> list[SeedRun]:
    """The seeds as one sweep in `<out>_runs/sweep/` (Ray tasks on this machine; `--parallel` seeds at once, each with
    cores / parallel torch threads, or --torch-threads N if given: the sweep's CPUs per trial). Run again, it resumes
    that sweep: finished seeds kept, interrupted ones resumed from their checkpoints (`tools/sweep.py --resume`)."""
    extra, cpus = list(config.extra_args), None
    if "--torch-threads" in extra:
        at = extra.index("--torch-threads")
        cpus, extra = int(extra[at + 1]), extra[:at] + extra[at + 2 :]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    # the sweep reserves --torch-threads CPUs per seed and runs as many seeds as the cores hold: --parallel must agree,
    # or the seeds would share the cores in another way than the JSON records (it says config.parallel)
    at_once = min(len(config.seeds), max(1, cores // cpus)) if cpus else None
    if at_once is not None and at_once != min(len(config.seeds), config.parallel):
        raise SystemExit(
            f"run.py: --torch-threads {cpus} on {cores} cores runs {at_once} seed(s) at once, not --parallel "
            f"{config.parallel}: give --parallel {at_once}, or --torch-threads {max(1, cores // config.parallel)}."
        )
    cpus = cpus or max(1, cores // config.parallel)
    out = sweep_dir(config)
    if (out / "sweep.json").is_file():
        command = [config.python, str(SWEEP_TOOL), "--out", str(out), "--resume"]
    else:
        command = [
            config.python,
            str(SWEEP_TOOL),
            "--out",
            str(out),
            "--script",
            config.script,
            "--env-id",
            config.env_id,
            "--seeds",
            *map(str, config.seeds),
            "--cpus-per-trial",
            str(cpus),
            "--",
            "--total-timesteps",
            str(config.total_timesteps),
            "--exp-name",
            config.exp_name,
            *extra,
        ]
    config.runs_dir.mkdir(parents=True, exist_ok=True)
    print(f"sweep: {shlex.join(command)}", flush=True)
    returncode = subprocess.run(command, stdin=subprocess.DEVNULL).returncode
    if not (out / "sweep.json").is_file():  # refused before anything ran: the sweep's own message is above
        raise SystemExit(returncode or 2)
    return sweep_seed_runs(config)


def sweep_seed_runs(config: Config) -> list[SeedRun]:
    """Each seed's trial of the sweep in `<out>_runs/sweep/`: its command, exit code and time (result.json, written
    when it finished), its run folder; its log linked as `<out>_runs/seed<S>.log`."""
    spec, runs = json.loads((sweep_dir(config) / "sweep.json").read_text()), []
    for trial in spec["trials"]:
        trial_dir = sweep_dir(config) / "trials" / trial["id"]
        result = load_previous(trial_dir / "result.json")
        log = config.runs_dir / f"seed{trial['seed']}.log"
        if (trial_dir / "log.txt").is_file() and not log.exists():
            log.symlink_to(os.path.relpath(trial_dir / "log.txt", config.runs_dir))
        run_dir = find_run_dir(trial_dir / "runs", config.env_id, config.exp_name, trial["seed"])
        returncode = result.get("returncode", None if result else 1)  # no result: the trial never finished
        runs.append(SeedRun(trial["seed"], result.get("command"), returncode, result.get("seconds"), run_dir))
    return runs


def run_all_seeds(config: Config) -> list[SeedRun]:
    if swept(config):
        return run_as_sweep(config)
    config.runs_dir.mkdir(parents=True, exist_ok=True)
    if config.seed_cwd is not None:
        config.seed_cwd.mkdir(exist_ok=True)
        if not (config.seed_cwd / "runs").is_symlink():
            (config.seed_cwd / "runs").symlink_to("..", target_is_directory=True)
    for seed in config.seeds:
        old = find_run_dir(config.runs_dir, config.env_id, config.exp_name, seed)
        if old is not None:
            print(f"[seed {seed}] note: {config.runs_dir} already holds runs of this seed; the new one will be used")
    with ThreadPoolExecutor(max_workers=max(1, config.parallel)) as pool:
        return list(pool.map(lambda seed: run_seed(config, seed), config.seeds))


def existing_seed_runs(config: Config, previous: dict[str, Any]) -> list[SeedRun]:
    """The newest run of each seed already on disk; command, exit code and wall time come from the previous JSON."""
    by_seed = {entry.get("seed"): entry for entry in previous.get("per_seed", [])}
    runs = []
    for seed in config.seeds:
        run_dir = find_run_dir(config.runs_dir, config.env_id, config.exp_name, seed)
        entry = by_seed.get(seed, {})
        same_run = run_dir is not None and entry.get("run_dir") == relative(run_dir, config.out.parent)
        if same_run:
            runs.append(SeedRun(seed, entry.get("command"), entry.get("returncode"), entry.get("wall_time_s"), run_dir))
        else:
            runs.append(SeedRun(seed, None, None, None, run_dir))
    return runs


# --------------------------------------------------------------------------------------------------------------------
# Results: JSON and plot
# --------------------------------------------------------------------------------------------------------------------


def relative(path: Path, start: Path) -> str:
    return os.path.relpath(path, start)


def seed_result(run: SeedRun, config: Config) -> tuple[dict[str, Any], tuple[np.ndarray, np.ndarray]]:
    """Per-seed JSON entry and its training curve (empty if there is none)."""
    base = config.out.parent
    log_path = config.runs_dir / f"seed{run.seed}.log"
    result: dict[str, Any] = {
        "seed": run.seed,
        "status": "ok",
        "returncode": run.returncode,
        "wall_time_s": run.wall_time_s,
        "command": run.command,
        "log": relative(log_path, base) if log_path.exists() else None,
        "run_dir": relative(run.run_dir, base) if run.run_dir is not None else None,
    }
    curve = (np.zeros(0, dtype=np.int64), np.zeros(0))
    if run.run_dir is not None:
        curve = read_scalars(run.run_dir, RETURN_TAG)
    if run.returncode not in (0, None):
        result["status"] = "failed"
    elif run.run_dir is None:
        result["status"] = "no_run_dir"
    elif len(curve[1]) == 0:
        result["status"] = "no_data"
    if len(curve[1]) > 0:
        result.update(summarize_seed(*curve))
        result["curve"] = curve_block(*curve)
        _, sps = read_scalars(run.run_dir, SPS_TAG)
        if len(sps) > 0:
            result["sps_median"] = float(np.median(sps))
        eval_steps, eval_values = read_scalars(run.run_dir, EVAL_TAG)
        if len(eval_values) > 0:
            result["eval_episodic_return_last"] = float(eval_values[-1])
            result["eval_step_last"] = int(eval_steps[-1])
    return result, curve


def curve_block(steps: np.ndarray, values: np.ndarray) -> dict[str, list]:
    """Every training episode's (global_step, return), kept in the JSON so that benchmarks/summary.py can draw the
    curves without the run folders (which are not committed). Returns are rounded to 2 decimals (TensorBoard stores
    float32)."""
    return {"steps": [int(s) for s in steps], "returns": [round(float(v), 2) for v in values]}


def reference_block(config: Config) -> Optional[dict[str, Any]]:
    if config.reference is None:
        return None
    return {"value": config.reference, "std": config.reference_std, "label": config.reference_label}


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def build_report(
    config: Config,
    harness_command: str,
    per_seed: list[dict[str, Any]],
    previous: dict[str, Any],
) -> dict[str, Any]:
    ok = [entry for entry in per_seed if entry["status"] == "ok"]
    if config.summarize_only:
        runs_command = previous.get("runs_harness_command")
        runs_date = previous.get("runs_date_utc")
        machine = previous.get("machine") or machine_info(config.python)
        machine_source = "previous JSON (the machine of the runs)" if previous.get("machine") else "this invocation"
    else:
        runs_command, runs_date, machine_source = harness_command, utc_now(), "this invocation"
        machine = machine_info(config.python)
    # thread settings the scripts inherited (e.g. OMP_NUM_THREADS=1 for a script without a thread flag): those of the
    # runs, so a --summarize-only keeps the previous JSON's
    current_thread_env = {k: os.environ[k] for k in THREAD_ENV_VARS if k in os.environ}
    thread_env = previous.get("harness", {}).get("thread_env") if config.summarize_only else current_thread_env
    return {
        "script": config.script,
        "env_id": config.env_id,
        "exp_name": config.exp_name,
        "total_timesteps": config.total_timesteps,
        "seeds": config.seeds,
        "extra_args": config.extra_args,
        "harness_command": harness_command,
        "runs_harness_command": runs_command,
        "commit": previous.get("commit") if config.summarize_only else config.commit,
        "summarize_only": config.summarize_only,
        "date_utc": utc_now(),
        "runs_date_utc": runs_date,
        "paths_relative_to": "the folder holding this JSON file",
        "metric": {
            "tag": RETURN_TAG,
            "x": "global_step",
            "last100_mean": "mean return of the last min(100, num_episodes) training episodes of a seed",
            "last10_mean": "mean return of the last min(10, num_episodes) training episodes of a seed",
        },
        "per_seed": per_seed,
        "summary": {
            **summarize_seeds(ok),
            "seeds_used": [entry["seed"] for entry in ok],
            "std_note": "population standard deviation over seeds (numpy ddof=0)",
        },
        "reference": reference_block(config),
        "machine": machine,
        "machine_source": machine_source,
        "harness": {
            "parallel": config.parallel,
            "python": config.python,
            "smooth_window_episodes": config.smooth,
            "runs_in_cwd": config.runs_in_cwd,
            "thread_env": thread_env,
        },
    }


def plot(config: Config, curves: dict[int, tuple[np.ndarray, np.ndarray]], summary: dict[str, Any], path: Path) -> None:
    """Per-seed training curves (light), their smoothed mean on a common step grid, and the reference band."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(9, 5.5))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    drawn = {seed: curve for seed, curve in curves.items() if len(curve[0]) > 0}
    for seed, (steps, values) in drawn.items():
        axes.plot(steps, values, linewidth=0.8, alpha=0.3, label=f"seed {seed}")
    grid, mean = mean_curve(list(drawn.values()), config.smooth)
    if len(grid) > 0:
        what = "one seed" if len(drawn) == 1 else f"mean of {len(drawn)} seeds"
        label = f"{what} (moving average over {config.smooth} episodes)"
        axes.plot(grid, mean, color="black", linewidth=2.0, label=label)
    if config.reference is not None:
        text = f"{config.reference_label}: {config.reference:g}"
        if config.reference_std:
            text += f" ± {config.reference_std:g}"
            low, high = config.reference - config.reference_std, config.reference + config.reference_std
            axes.axhspan(low, high, color="tab:red", alpha=0.12)
        axes.axhline(config.reference, color="tab:red", linestyle="--", linewidth=1.5, label=text)
    if not drawn:
        axes.text(0.5, 0.5, f"no {RETURN_TAG} data", transform=axes.transAxes, ha="center", va="center")
    title = f"{config.script} on {config.env_id}, {config.total_timesteps:,} steps"
    if summary.get("last100_mean"):
        stats = summary["last100_mean"]
        if summary["num_seeds"] == 1:
            title += f"\nlast-100-episode return {stats['mean']:.1f} (one seed)"
        else:
            title += f"\nlast-100-episode return {stats['mean']:.1f} ± {stats['std']:.1f} over {summary['num_seeds']} seeds"
    axes.set_title(title)
    axes.set_xlabel("global step")
    axes.set_ylabel("episodic return (training)")
    axes.grid(alpha=0.3)
    if axes.get_legend_handles_labels()[0]:
        axes.legend(loc="best", fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def report_failures(per_seed: list[dict[str, Any]], config: Config) -> None:
    for entry in per_seed:
        if entry["status"] == "ok":
            continue
        log_path = config.runs_dir / f"seed{entry['seed']}.log"
        if entry["status"] == "failed":
            reason = f"FAILED with exit code {entry['returncode']}"
        elif entry["status"] == "no_run_dir":
            reason = f"has no run folder in {config.runs_dir}"
        else:
            reason = f"logged no {RETURN_TAG}"
        message = f"seed {entry['seed']} {reason}"
        tail = log_tail(log_path, config.tail_lines)
        if tail:
            indented = "\n".join(f"    {line}" for line in tail.splitlines())
            message += f"; last {config.tail_lines} lines of {log_path}:\n{indented}"
        print(message, file=sys.stderr)


# --------------------------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str]) -> Config:
    """Harness options before a literal `--`; everything after it goes to the training script unchanged."""
    argv = list(argv)
    extra_args: list[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, extra_args = argv[:split], argv[split + 1 :]
    parser = argparse.ArgumentParser(
        prog="benchmarks/run.py",
        description="Run a training script over seeds; write <out>.json and <out>.png (runs under <out>_runs/).",
        epilog="Arguments after a literal -- are passed to the training script.",
    )
    parser.add_argument("--script", required=True, help="training script, e.g. ppo_continuous.py")
    parser.add_argument("--env-id", required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--total-timesteps", type=int, required=True)
    parser.add_argument("--out", required=True, help="path prefix, e.g. benchmarks/results/ppo_halfcheetah")
    parser.add_argument("--exp-name", default=None, help="--exp-name for the script (default: the script's file stem)")
    parser.add_argument("--reference", type=float, default=None, help="published figure to draw on the plot")
    parser.add_argument("--reference-std", type=float, default=None)
    parser.add_argument("--reference-label", default="reference")
    parser.add_argument("--parallel", type=int, default=1, help="seeds run at once (default 1: one after another)")
    parser.add_argument("--python", default=sys.executable, help="interpreter for the script (default: this one)")
    parser.add_argument("--summarize-only", action="store_true", help="do not run; re-read <out>_runs/ and rewrite")
    parser.add_argument("--smooth", type=int, default=20, help="moving-average window (episodes) of the mean curve")
    parser.add_argument("--tail-lines", type=int, default=20, help="log lines shown for a failing seed")
    parser.add_argument(
        "--commit",
        default=None,
        help="the project commit the runs use (default: `git rev-parse HEAD`, '-dirty' if the script "
        "differs from it; on a machine without the git folder, name it)",
    )
    parser.add_argument(
        "--runs-in-cwd",
        action="store_true",
        help="the script has no --runs-dir and writes to ./runs (e.g. the reference): run it in a "
        "folder whose runs/ is <out>_runs/",
    )
    args = parser.parse_args(argv)
    if args.parallel < 1 or args.smooth < 1:
        parser.error("--parallel and --smooth must be >= 1")
    return Config(
        script=args.script,
        env_id=args.env_id,
        seeds=args.seeds,
        total_timesteps=args.total_timesteps,
        out=Path(args.out),
        exp_name=args.exp_name or Path(args.script).stem,
        python=args.python,
        parallel=args.parallel,
        summarize_only=args.summarize_only,
        extra_args=extra_args,
        reference=args.reference,
        reference_std=args.reference_std,
        reference_label=args.reference_label,
        smooth=args.smooth,
        tail_lines=args.tail_lines,
        runs_in_cwd=args.runs_in_cwd,
        commit=args.commit or project_commit(args.script),
    )


def project_commit(script: str) -> Optional[str]:
    """HEAD of the project's git checkout, with '-dirty' when the script has uncommitted changes; None without git."""
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=30)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", script], cwd=root, capture_output=True, text=True, timeout=30
        )
    except OSError:
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def load_previous(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run (or re-read) the seeds, write `<out>.json` and `<out>.png`; 0 if every seed produced a curve, else 1."""
    if argv is None:
        argv = sys.argv[1:]
        harness_command = shlex.join([sys.executable, sys.argv[0], *argv])
    else:
        harness_command = shlex.join([sys.executable, relative(Path(__file__), Path.cwd()), *argv])
    config = parse_args(argv)
    json_path = config.out.parent / f"{config.out.name}.json"
    png_path = config.out.parent / f"{config.out.name}.png"
    previous = load_previous(json_path)

    if config.summarize_only:
        if not config.runs_dir.is_dir():
            print(f"--summarize-only: {config.runs_dir} does not exist", file=sys.stderr)
            return 1
        swept_before = (sweep_dir(config) / "sweep.json").is_file()
        runs = sweep_seed_runs(config) if swept_before else existing_seed_runs(config, previous)
    else:
        runs = run_all_seeds(config)

    per_seed, curves = [], {}
    for run in runs:
        result, curve = seed_result(run, config)
        per_seed.append(result)
        curves[run.seed] = curve
    report = build_report(config, harness_command, per_seed, previous)
    sweep_summary = sweep_dir(config) / "summary.json"
    if swept(config) and sweep_summary.is_file():  # the sweep's own table: the same last-100 mean, with its interval
        report["sweep_summary"] = json.loads(sweep_summary.read_text())["tasks"]
    config.out.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(report, indent=2) + "\n")
    plot(config, curves, report["summary"], png_path)

    stats = report["summary"]["last100_mean"]
    if stats is not None:
        print(f"last-100 mean return: {stats['mean']:.2f} ± {stats['std']:.2f} over {report['summary']['num_seeds']} seeds")
    print(f"wrote {json_path} and {png_path}")
    report_failures(per_seed, config)
    return 0 if all(entry["status"] == "ok" for entry in per_seed) else 1


if __name__ == "__main__":
    sys.exit(main())
