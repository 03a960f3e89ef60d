"""Sweeps: run any of the five scripts over a grid of env ids x seeds x flag values on Ray Tune, then summarize.

    python tools/sweep.py --out sweeps/ppo --script ppo_continuous.py --env-id Hopper-v4 Walker2d-v4 --seeds 1 2 3 \\
        [--grid learning_rate=3e-4,1e-3] [--cpus-per-trial 1] [--address HOST:PORT] -- --total-timesteps 1000000
    python tools/sweep.py --out sweeps/ppo --resume          # after a Ctrl-C or a killed driver: finish the rest
    python tools/sweep.py --out sweeps/ppo --summarize       # rewrite summary.{json,md,png} from what is on disk
    python tools/sweep.py --out sweeps/tune --tune --script ppo_continuous.py --env-id Pendulum-v1 --seeds 1 2 \\
        --space learning_rate=loguniform:1e-4:1e-2 --space gamma=choice:0.95,0.99 --num-samples 8 --final-seeds 3 \\
        -- --total-timesteps 100000 --eval-interval 10000 --eval-episodes 5

Each trial runs the script itself, unmodified, as a subprocess in its own process group, in `<out>/trials/<id>/`
(`log.txt`, `runs/<run folder>`, and `result.json` once it has finished), with `--torch-threads` = --cpus-per-trial
and a Ray reservation of as many CPUs, so trials never oversubscribe the cores. Arguments after `--` go to every
trial; `--grid flag=v1,v2` multiplies the grid. Everything is checked before any trial starts (the script's own
`--help` for the flags, and the script itself, stopped once it has made its run folder, for the values): bad input
is refused in one paragraph, exit code 2. Ctrl-C (or SIGTERM) forwards SIGINT to every trial, which saves a
checkpoint and stops; `--resume` keeps finished trials and resumes the others from their newest checkpoint. A trial
whose Ray worker is lost (a node gone) is restarted by Tune (--max-failures) from its newest checkpoint. Exit code
0: every trial finished; 1: some failed; 130: stopped. docs/sweeps.md is the user's guide.
"""

import argparse
import ctypes
import itertools
import json
import math
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.aggregate import bootstrap_mean_interval, iqm_interval, normalized  # noqa: E402
from benchmarks.run import EVAL_TAG, RETURN_TAG, log_tail, read_scalars, summarize_seed  # noqa: E402

SCRIPTS = ("ppo_continuous.py", "ppo_atari.py", "a2c_atari.py", "sac_continuous.py", "sac_continuous_ray.py")
SET_BY_SWEEP = ("env-id", "seed", "runs-dir", "torch-threads", "resume", "progress", "no-progress")
CHECKPOINT = re.compile(r"(step|interrupted|final)_(\d{10})\.pt")  # the scripts' checkpoint names (best.pt aside)
PROGRESS = re.compile(r"^step\s+([\d,]+)/([\d,]+) \|\s+(\d+) SPS", re.M)  # the scripts' plain progress line
INTERRUPTED = 130  # a script's exit code after a Ctrl-C / SIGTERM (checkpoint saved)
STOP_FILE = "STOP"  # written by the driver on Ctrl-C: every trial, wherever it runs, stops and saves
TAIL = 15  # log lines shown for a failed trial


class UserError(Exception):
    """Bad input: one paragraph on stderr, exit code 2, before any trial starts."""


# --------------------------------------------------------------------------------------------------------------------
# The grid
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class Trial:
    id: str
    script: str
    env_id: str
    seed: int
    flags: list  # [flag, value] pairs of the grid point, value "true"/"false" for a switch
    extra: list  # the arguments after `--`, the same for every trial
    threads: int
    bool_flags: list = field(default_factory=list)

    def command(self, trial_dir: Path, python: str = sys.executable) -> list:
        return [
            python,
            str(ROOT / self.script),
            "--env-id",
            self.env_id,
            "--seed",
            str(self.seed),
            "--runs-dir",
            str(trial_dir / "runs"),
            "--torch-threads",
            str(self.threads),
            "--progress",
            *self.extra,
            *flag_args(self.flags, self.bool_flags),
        ]

    @property
    def task(self) -> str:
        """What the seeds of a task share: script, env id and flag values."""
        flags = " ".join(f"{name}={value}" for name, value in self.flags)
        return f"{Path(self.script).stem} {self.env_id}" + (f" {flags}" if flags else "")


def flag_args(flags: list, bool_flags: list) -> list:
    """[["learning-rate", "1e-3"], ["norm-adv", "false"]] -> ["--learning-rate", "1e-3", "--no-norm-adv"]."""
    out = []
    for name, value in flags:
        if name in bool_flags:
            if str(value).lower() not in ("true", "false"):
                raise UserError(f"--{name} is a switch: give it true or false, not '{value}'.")
            out.append(f"--{name}" if str(value).lower() == "true" else f"--no-{name}")
        else:
            out += [f"--{name}", str(value)]
    return out


def parse_grid(items: list) -> dict:
    """["learning_rate=3e-4,1e-3"] -> {"learning-rate": ["3e-4", "1e-3"]} (a flag's name with - or _, with or without --)."""
    grid = {}
    for item in items:
        name, sep, values = item.partition("=")
        if not sep or not values or not name:
            raise UserError(f"--grid '{item}': write flag=value1,value2 (e.g. learning_rate=3e-4,1e-3).")
        grid[flag_name(name)] = list(dict.fromkeys(v.strip() for v in values.split(",") if v.strip()))
    return grid


def flag_name(name: str) -> str:
    return name.strip().lstrip("-").replace("_", "-")


def expand_grid(
    scripts: list, env_ids: list, seeds: list, grid: dict, extra: list, cpus_per_trial: int, bool_flags: Optional[dict] = None
) -> list:
    """Every script x env id x flag values x seed, in that order, each a Trial with a stable, readable id."""
    trials = []
    points = list(itertools.product(*grid.values())) if grid else [()]
    for script, env_id, point, seed in itertools.product(scripts, env_ids, points, seeds):
        flags = [[name, value] for name, value in zip(grid, point)]
        label = "_".join(f"{name}={value}" for name, value in flags)
        raw = "_".join(x for x in (Path(script).stem, env_id, label, f"seed{seed}") if x)
        trial_id = f"{len(trials):03d}_" + re.sub(r"[^A-Za-z0-9=.+_-]+", "-", raw)
        trials.append(
            Trial(trial_id, script, env_id, seed, flags, list(extra), cpus_per_trial, list((bool_flags or {}).get(script, [])))
        )
    return trials


def concurrency(cores: int, cpus_per_trial: int) -> int:
    """Trials at once on a node: its cores / CPUs per trial (each trial's torch threads = its CPUs)."""
    return max(cores // cpus_per_trial, 0)


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# --------------------------------------------------------------------------------------------------------------------
# Checking the input before anything runs
# --------------------------------------------------------------------------------------------------------------------


def script_flags(script: str) -> tuple:
    """(every flag of the script, its switches) from its own `--help` (nothing of the script is imported)."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / script), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
        cwd=ROOT,
    )
    if proc.returncode != 0:
        raise UserError(f"{script} --help failed (exit {proc.returncode}): {one_paragraph(proc.stderr)}")
    flags = set(re.findall(r"(?<![\w-])--([a-z0-9][a-z0-9-]*)", proc.stdout))
    switches = {name for name in flags if f"no-{name}" in flags}
    return flags, switches


def one_paragraph(text: str, limit: int = 400) -> str:
    """A script's error output (tyro's boxes too) as one line."""
    text = re.sub(r"[│╭╮╰╯─]+", " ", text)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_script(script: str) -> str:
    name = Path(script).name
    if name not in SCRIPTS or (os.sep in script and Path(script).resolve() != ROOT / name):
        raise UserError(f"unknown script '{script}': the sweep runs one of {', '.join(SCRIPTS)} (this project's).")
    return name


def check_flags(script: str, names: list, known: set) -> None:
    for name in names:
        base = name[3:] if name.startswith("no-") and name[3:] in known else name
        if base in SET_BY_SWEEP or name in SET_BY_SWEEP:
            raise UserError(
                f"--{name} is set by the sweep for each trial (env ids: --env-id, seeds: --seeds, threads: "
                "--cpus-per-trial, folders: --out, resuming: --resume); leave it out of the flags."
            )
        if name not in known:
            raise UserError(f"{script} has no flag --{name} (see `python {script} --help`).")


def probe(cmd: list, timeout: float = 120) -> Optional[str]:
    """Run a trial's command until the script has made its run folder (its flags, values and env checked: it is about
    to train), then stop it. None if it got there; else its error, one paragraph."""
    runs = Path(tempfile.mkdtemp(prefix="sweep-check-"))
    cmd = [*cmd, "--runs-dir", str(runs)]  # a later flag wins (tyro)
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
        env={**os.environ, "WANDB_MODE": "disabled"},
    )
    deadline, started = time.time() + timeout, False
    try:
        while proc.poll() is None and time.time() < deadline:
            if any(p.is_dir() for p in runs.iterdir()):
                started = True
                break
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            stop_group(proc, signal.SIGKILL, wait=30)
        err = proc.stderr.read()
        proc.stderr.close()
        shutil.rmtree(runs, ignore_errors=True)
    if started or proc.returncode == 0:
        return None
    if proc.returncode is None:
        return f"it did not start within {timeout:.0f} s"
    return one_paragraph(err) or f"exit code {proc.returncode}"


def check_values(probes: list) -> None:
    """Each (description, command) probed, a core each at most; the first refusal is the error."""
    with ThreadPoolExecutor(max_workers=max(1, usable_cores())) as pool:
        errors = list(pool.map(lambda p: probe(p[1]), probes))
    for (what, _), error in zip(probes, errors):
        if error is not None:
            raise UserError(f"{what} is refused by the script: {error.removeprefix('error: ')}")


def value_probes(trials: list) -> list:
    """Per script and env id: enough commands that every grid value is tried once (run j takes each flag's j-th
    value), not every combination. Seeds are not probed (any seed >= 0 goes)."""
    probes, seen = [], set()
    by_task = {}
    for t in trials:
        by_task.setdefault((t.script, t.env_id), []).append(t)
    for (script, env_id), group in by_task.items():
        values = {}
        for t in group:
            for name, value in t.flags:
                values.setdefault(name, [])
                if value not in values[name]:
                    values[name].append(value)
        for j in range(max([len(v) for v in values.values()] or [1])):
            flags = [[name, vs[j % len(vs)]] for name, vs in values.items()]
            key = (script, env_id, json.dumps(flags))
            if key not in seen:
                seen.add(key)
                probe_trial = Trial("probe", script, env_id, group[0].seed, flags, group[0].extra, 1, group[0].bool_flags)
                shown = " ".join([f"--env-id {env_id}", *flag_args(flags, group[0].bool_flags), *group[0].extra])
                probes.append((f"`{script} {shown}`", probe_trial.command(Path("/nonexistent"))))
    return probes


def check_address(address: str) -> None:
    """Ray keeps retrying an unreachable address for minutes: a plain TCP connection first."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=5).close()
    except (OSError, ValueError) as e:
        raise UserError(
            f"--address {address}: cannot connect to {host or '127.0.0.1'}:{port} ({e}). Start the cluster "
            "first (`ray start --head --port=6379` prints the address), or leave --address out to run on "
            "this machine."
        ) from None


# --------------------------------------------------------------------------------------------------------------------
# A trial: the script in a subprocess (runs on a Ray worker)
# --------------------------------------------------------------------------------------------------------------------


def die_with_parent() -> None:
    """In the child before exec: SIGTERM it when its parent (the Ray worker) dies, so a lost worker's or a killed
    driver's script still saves its checkpoint and stops, instead of running on unowned (Linux prctl). And unblock
    every signal: a Ray worker's threads block SIGINT, and a child inherits the mask (the script would never see it)."""
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the driver's Ctrl-C still reaches the trials through the STOP file


def stop_group(proc: subprocess.Popen, sig: int, wait: float) -> Optional[int]:
    """Send `sig` to the process group of `proc`, wait for it; SIGKILL what is left after `wait` seconds."""
    try:
        os.killpg(proc.pid, sig)
        return proc.wait(timeout=wait)
    except ProcessLookupError:
        return proc.wait()
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return proc.wait()


def newest_checkpoint(runs: Path) -> Optional[Path]:
    found = [
        (int(m.group(2)), p.stat().st_mtime, p) for p in runs.glob("*/checkpoints/*.pt") if (m := CHECKPOINT.fullmatch(p.name))
    ]
    return max(found)[2] if found else None


def start_script(cmd: list, log_path: Path, threads: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **{k: str(threads) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}}
    with open(log_path, "a") as log:
        log.write(f"$ {shlex.join(cmd)}\n")
        log.flush()
        return subprocess.Popen(
            cmd,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )


def resume_or_fresh(trial_dir: Path, cmd: list) -> list:
    """The command, with `--resume <newest checkpoint>` when the trial ran before; a folder of a start that saved
    nothing is moved aside (so the trial has one run folder), never deleted."""
    runs = trial_dir / "runs"
    ckpt = newest_checkpoint(runs) if runs.is_dir() else None
    if ckpt is not None:
        return [*cmd, "--resume", str(ckpt)]
    for old in runs.iterdir() if runs.is_dir() else ():
        (trial_dir / "abandoned").mkdir(exist_ok=True)
        old.rename(trial_dir / "abandoned" / old.name)
    return cmd


def progress_of(log_path: Path) -> dict:
    """The last progress line of a script's log: {global_step, total, sps}, or {}."""
    try:
        with open(log_path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 4000))
            text = f.read().decode(errors="replace")
    except OSError:
        return {}
    found = PROGRESS.findall(text)
    if not found:
        return {}
    step, total, sps = found[-1]
    return {"global_step": int(step.replace(",", "")), "total": int(total.replace(",", "")), "sps": float(sps)}


def note(log_path: Path, text: str) -> None:
    with open(log_path, "a") as log:
        log.write(f"[sweep {time.strftime('%H:%M:%S')}] {text}\n")


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def run_trial(config: dict) -> None:
    """Tune's function for one grid trial: run (or resume) the script, report its progress, write result.json."""
    from ray import tune

    trial, sweep_dir = Trial(**config["trial"]), Path(config["sweep_dir"])
    trial_dir = sweep_dir / "trials" / trial.id
    trial_dir.mkdir(parents=True, exist_ok=True)
    if (sweep_dir / STOP_FILE).exists() or (trial_dir / "result.json").exists():
        return  # stopping: not started; or finished already (a Tune retry after the marker was written)
    cmd = resume_or_fresh(trial_dir, trial.command(trial_dir))
    log_path, start = trial_dir / "log.txt", time.time()
    proc = start_script(cmd, log_path, trial.threads)
    (trial_dir / "pid").write_text(f"{socket.gethostname()} {proc.pid}\n")
    last, interval, next_report = {}, config["report_interval"], time.time()
    try:
        while proc.poll() is None:
            time.sleep(0.2)
            if (sweep_dir / STOP_FILE).exists():
                note(log_path, "the sweep is stopping: SIGINT to the script (it saves a checkpoint)")
                stop_group(proc, signal.SIGINT, wait=300)  # the script saves interrupted_<step>.pt and exits 130
            elif time.time() >= next_report:
                next_report = time.time() + interval
                if (now := progress_of(log_path)) and now != last:
                    last = now
                    tune.report({**now, "state": "running"})
    finally:
        if proc.poll() is None:  # Tune stopped us (or an error here): the script still saves, on SIGINT
            note(log_path, "Tune stopped the trial: SIGINT to the script (it saves a checkpoint)")
            stop_group(proc, signal.SIGINT, wait=300)
    rc = proc.returncode
    state = "done" if rc == 0 else "interrupted" if rc == INTERRUPTED and (sweep_dir / STOP_FILE).exists() else "failed"
    result = {
        "state": state,
        "returncode": rc,
        "seconds": round(time.time() - start, 1),
        "command": shlex.join(cmd),
        "host": socket.gethostname(),
        **progress_of(log_path),
    }
    if state == "failed":
        result["log_tail"] = log_tail(log_path, TAIL)
    if state != "interrupted":  # the marker: a finished trial is never run again
        write_json(trial_dir / "result.json", result)
    tune.report({**progress_of(log_path), "state": state, "returncode": rc})


# --------------------------------------------------------------------------------------------------------------------
# The driver: Ray, Tune, progress lines, Ctrl-C
# --------------------------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def session_processes(sid: int) -> list:
    """The pids of a session (what `ray start` started keeps it, though Ray moves workers to groups of their own)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:  # after the name: state, ppid, pgrp, session
            pids.append(int(stat.parent.name))
    return pids


class LocalRay:
    """A Ray head of this sweep's own: `ray start --head --block` in a session of its own (so a Ctrl-C at the
    terminal reaches the driver, not Ray's servers), on 127.0.0.1, SIGTERMed if the driver dies; stopped at the end
    with everything in its session, and nothing else."""

    def __init__(self, cpus: int, log_path: Path):
        self.port, self.temp = free_port(), tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: socket paths <= 107 bytes
        cmd = [
            str(Path(sys.executable).with_name("ray")),
            "start",
            "--head",
            "--port",
            str(self.port),
            "--num-cpus",
            str(cpus),
            "--include-dashboard",
            "false",
            "--node-ip-address",
            "127.0.0.1",
            "--block",
            "--temp-dir",
            self.temp,
            "--disable-usage-stats",
        ]
        with open(log_path, "a") as log:
            self.proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        self.address = f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            stop_group(self.proc, signal.SIGTERM, wait=60)  # `ray start --block` drains, then stops what it started
        for pid in session_processes(self.proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.temp, ignore_errors=True)


def ray_env(local: bool) -> None:
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")  # `uv run` per worker start: only slower here
    os.environ.setdefault("TUNE_DISABLE_SIGINT_HANDLER", "1")  # ours: SIGINT reaches every trial's script
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    if local:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # servers on 127.0.0.1 (read at import)
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # nothing off this machine reaches them


def connect_ray(address: str, cpus_needed: int, local: bool):
    """Join the cluster (this sweep's own head, or --address); refuse a trial bigger than its largest node."""
    import ray

    # the workers import this module's imports (benchmarks.run): the project's folder, the same path on every node
    runtime_env = {"env_vars": {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}}
    deadline = time.time() + 120
    while True:
        try:
            ray.init(address=address, logging_level="ERROR", log_to_driver=False, runtime_env=runtime_env)
            break
        except ConnectionError as e:
            if not local or time.time() > deadline:
                raise UserError(f"--address {address}: could not join a Ray cluster ({e}).") from None
            time.sleep(1)  # our own head is still starting
    largest = max((n["Resources"].get("CPU", 0) for n in ray.nodes() if n["Alive"]), default=0)
    if cpus_needed > largest:
        ray.shutdown()
        raise UserError(
            f"a trial needs {cpus_needed} CPUs but the largest node of {address} has {largest:g}: lower --cpus-per-trial."
        )
    return ray


def hms(seconds: float) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "?"
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class Progress:
    """One line per trial event, and one for the sweep after it: done / running / failed / pending, ETA."""

    def __init__(self, total: int, done: int, failed: int):
        self.total, self.done, self.failed = total, done, failed
        self.running: dict = {}  # trial id -> its last progress report (Tune calls back on the driver's main thread)

    def callback(self):
        from ray import tune

        progress = self

        class Callback(tune.Callback):
            def on_trial_start(self, iteration, trials, trial, **info):
                progress.event(trial.config["trial"]["id"], {"state": "started"})

            def on_trial_result(self, iteration, trials, trial, result, **info):
                progress.event(trial.config["trial"]["id"], result)

            def on_trial_recover(self, iteration, trials, trial, **info):  # a failure Tune retries (--max-failures)
                progress.event(trial.config["trial"]["id"], {"state": "lost"})

            def on_trial_error(self, iteration, trials, trial, **info):  # retries spent
                progress.event(trial.config["trial"]["id"], {"state": "error"})

        return Callback()

    def event(self, trial_id: str, result: dict) -> None:
        state = result.get("state")
        if state in ("done", "failed", "interrupted", "error", "lost"):
            self.running.pop(trial_id, None)
            self.done += state == "done"
            self.failed += state in ("failed", "error")
            line = {
                "done": "done",
                "failed": f"FAILED (exit code {result.get('returncode')})",
                "interrupted": "stopped, checkpoint saved",
                "lost": "lost its worker (a node gone?): Tune restarts it, from its newest checkpoint",
                "error": "FAILED: its worker was lost more often than --max-failures allows (`--resume` tries again)",
            }[state]
        else:
            self.running[trial_id] = result
            if "global_step" in result:
                step, total, sps = result["global_step"], result["total"], result["sps"]
                eta = (total - step) / sps if sps > 0 else math.inf
                line = f"step {step:,}/{total:,} ({100 * step / max(total, 1):.0f} %), {sps:.0f} SPS, ETA {hms(eta)}"
            else:
                line = "started"
        print(f"[trial {trial_id}] {line}", flush=True)
        print(f"[sweep] {self.summary_line()}", flush=True)

    def summary_line(self) -> str:
        running = len(self.running)
        pending = max(self.total - self.done - self.failed - running, 0)
        known = [r for r in self.running.values() if "global_step" in r]
        rate = sum(r["sps"] for r in known)
        eta = "?"
        if known and rate > 0:
            per_trial = np.mean([r["total"] for r in known])
            left = sum(r["total"] - r["global_step"] for r in known) + (pending + running - len(known)) * per_trial
            eta = hms(left / rate)
        return f"{self.done}/{self.total} done, {running} running, {self.failed} failed, {pending} pending; ETA {eta}"


def install_stop_handler(sweep_dir: Path) -> dict:
    """Ctrl-C / SIGTERM: write the STOP file; each trial then sends SIGINT to its script's process group and waits
    for its checkpoint. A second Ctrl-C during that is only acknowledged (the saves are under way)."""
    state = {"stopping": False}

    def on_signal(signum, frame):
        if not state["stopping"]:
            print("[sweep] stopping: every running trial saves a checkpoint; `--resume` continues the sweep", flush=True)
        state["stopping"] = True
        (sweep_dir / STOP_FILE).touch()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    return state


def run_grid(sweep_dir: Path, spec: dict, stopping: dict) -> int:
    """Run the trials of spec that have no result.json on Tune; 0 all done, 1 some failed, 130 stopped."""
    import logging

    from ray import tune

    logging.getLogger("ray.tune").setLevel(logging.WARNING)  # our progress lines instead of Tune's
    trials = [Trial(**t) for t in spec["trials"]]
    markers = {t.id: read_result(sweep_dir, t.id) for t in trials}
    todo = [asdict(t) for t in trials if markers[t.id] is None]
    kept = len(trials) - len(todo)
    if kept:
        print(f"[sweep] {kept} finished trial(s) kept; {len(todo)} to run (resumed from their newest checkpoint)")
    progress = Progress(
        len(trials),
        sum(1 for m in markers.values() if m and m["state"] == "done"),
        sum(1 for m in markers.values() if m and m["state"] == "failed"),
    )
    if todo:
        trainable = tune.with_resources(run_trial, {"cpu": spec["cpus_per_trial"]})
        tuner = tune.Tuner(
            trainable,
            param_space={
                "trial": tune.grid_search(todo),
                "sweep_dir": str(sweep_dir.absolute()),
                "report_interval": spec["report_interval"],
            },
            tune_config=tune.TuneConfig(
                trial_name_creator=lambda t: t.config["trial"]["id"], trial_dirname_creator=lambda t: t.config["trial"]["id"]
            ),
            run_config=tune.RunConfig(
                name="tune",
                storage_path=str((sweep_dir / "tune").absolute()),
                verbose=0,
                failure_config=tune.FailureConfig(max_failures=spec["max_failures"]),
                callbacks=[progress.callback()],
            ),
        )
        tuner.fit()
    results = {t.id: read_result(sweep_dir, t.id) for t in trials}
    for t in trials:
        if results[t.id] and results[t.id]["state"] == "failed":
            tail = "\n".join(f"    {line}" for line in results[t.id].get("log_tail", "").splitlines())
            print(
                f"[trial {t.id}] FAILED (exit code {results[t.id]['returncode']}); last lines of its log:\n{tail}",
                file=sys.stderr,
            )
    if stopping["stopping"] or any(r is None for r in results.values()):
        return INTERRUPTED
    return 1 if any(r["state"] == "failed" for r in results.values()) else 0


def read_result(sweep_dir: Path, trial_id: str) -> Optional[dict]:
    try:
        return json.loads((sweep_dir / "trials" / trial_id / "result.json").read_text())
    except (OSError, ValueError):
        return None


# --------------------------------------------------------------------------------------------------------------------
# --tune: a search over a space of flag values; objective the mean over seeds of the periodic evaluation return
# --------------------------------------------------------------------------------------------------------------------


def parse_space(items: list) -> dict:
    """["learning_rate=loguniform:1e-4:1e-2", "gamma=choice:0.95,0.99"] -> {flag: [kind, args]}."""
    space = {}
    for item in items:
        name, _, rest = item.partition("=")
        kind, _, args = rest.partition(":")
        try:
            if kind in ("loguniform", "uniform"):
                low, high = (float(x) for x in args.split(":"))
                ok = low < high and (kind == "uniform" or low > 0)
            elif kind == "int":
                low, high = (int(x) for x in args.split(":"))
                ok = low <= high
            elif kind == "choice":
                low = high = None
                ok = bool([v for v in args.split(",") if v.strip()])
            else:
                ok = False
        except ValueError:
            ok = False
        if not name or not ok:
            raise UserError(
                f"--space '{item}': write flag=loguniform:LOW:HIGH, uniform:LOW:HIGH, int:LOW:HIGH or "
                "choice:A,B,... (LOW < HIGH; loguniform above 0)."
            )
        space[flag_name(name)] = [kind, [v.strip() for v in args.split(",") if v.strip()] if kind == "choice" else [low, high]]
    return space


def space_values(space: dict) -> dict:
    """What the value check probes: each range's ends, every choice."""
    return {
        name: [str(v) for v in args] if kind == "choice" else [fmt(args[0]), fmt(args[1])]
        for name, (kind, args) in space.items()
    }


def fmt(value) -> str:
    """A sampled value as the script gets it, and as the best command line shows it."""
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def tune_space(space: dict) -> dict:
    from ray import tune

    make = {
        "loguniform": lambda a: tune.loguniform(*a),
        "uniform": lambda a: tune.uniform(*a),
        "int": lambda a: tune.randint(a[0], a[1] + 1),
        "choice": lambda a: tune.choice(a),
    }
    return {name: make[kind](args) for name, (kind, args) in space.items()}


def tune_trial(config: dict) -> None:
    """Tune's function for one setting: its k seeds as k subprocesses; the mean of their evaluation returns at each
    step that all have evaluated is reported (ASHA may stop the setting there: the scripts then save and stop)."""
    from ray import tune

    sweep_dir, base = Path(config["sweep_dir"]), config["base"]
    trial_dir = sweep_dir / "tune_trials" / tune.get_context().get_trial_name()
    if (sweep_dir / STOP_FILE).exists():  # stopping: not started (an error, so that --resume runs it)
        raise StopRequested("the sweep is stopping")
    flags = [[name, fmt(value)] for name, value in config["setting"].items()]
    seeds, procs = [], []
    for seed in base["seeds"]:
        t = Trial(
            f"seed{seed}", base["script"], base["env_id"], seed, flags, base["extra"], base["threads"], base["bool_flags"]
        )
        seed_dir = trial_dir / f"seed{seed}"
        seed_dir.mkdir(parents=True, exist_ok=True)
        seeds.append(seed_dir)
        procs.append(start_script(resume_or_fresh(seed_dir, t.command(seed_dir)), seed_dir / "log.txt", t.threads))
    write_json(trial_dir / "setting.json", {"flags": flags, "seeds": base["seeds"]})
    reported = set()

    def report_new() -> None:
        curves = []
        for seed_dir in seeds:
            runs = [p for p in (seed_dir / "runs").glob("*") if p.is_dir()]
            curves.append(dict(zip(*(x.tolist() for x in read_scalars(runs[0], EVAL_TAG)))) if runs else {})
        for step in sorted(set.intersection(*(set(c) for c in curves)) - reported):
            reported.add(step)
            tune.report({"eval_return": float(np.mean([c[step] for c in curves])), "global_step": int(step)})

    try:
        next_report = time.time() + config["report_interval"]
        while any(p.poll() is None for p in procs):
            time.sleep(0.2)
            if (sweep_dir / STOP_FILE).exists():
                for p in procs:
                    stop_group(p, signal.SIGINT, wait=300)
            elif time.time() >= next_report:
                next_report = time.time() + config["report_interval"]
                report_new()
        report_new()
    finally:
        for p in procs:  # ASHA stopped this setting (or an error here): each script saves, on SIGINT
            if p.poll() is None:
                stop_group(p, signal.SIGINT, wait=300)
    failed = [str(d) for d, p in zip(seeds, procs) if p.returncode not in (0, INTERRUPTED)]
    if failed:
        raise RuntimeError(f"seeds failed: {failed}; last lines: {log_tail(Path(failed[0]) / 'log.txt', TAIL)}")
    if (sweep_dir / STOP_FILE).exists() and any(p.returncode == INTERRUPTED for p in procs):
        raise StopRequested("stopped by the sweep: each seed saved a checkpoint; --resume continues from it")


class StopRequested(Exception):
    """A setting stopped by Ctrl-C: Tune records it as errored, and a --resume of the study runs it again (its scripts
    resuming from their checkpoints); a setting that ended normally would count as finished."""


def run_tune(sweep_dir: Path, spec: dict, ns, stopping: dict) -> int:
    """The search, then the best setting on fresh seeds (a grid sweep in <out>/final). With --resume: the study as Tune
    saved it (the searcher's state, finished settings kept), its unfinished and stopped settings run again."""
    import logging

    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    logging.getLogger("ray.tune").setLevel(logging.ERROR)
    base, t = spec["base"], spec["tune"]
    searcher = None
    if t["search"] == "optuna":
        from ray.tune.search.optuna import OptunaSearch

        searcher = OptunaSearch(seed=t["search_seed"])
    scheduler = ASHAScheduler(time_attr="global_step", max_t=t["total"], grace_period=t["grace_steps"], reduction_factor=2)

    class Report(tune.Callback):
        def on_trial_result(self, iteration, trials, trial, result, **info):
            setting = " ".join(f"{k}={fmt(v)}" for k, v in trial.config["setting"].items())
            done = sum(x.status == "TERMINATED" for x in trials)
            print(
                f"[tune {trial.trial_id}] {setting}: mean eval return {result['eval_return']:.1f} at step "
                f"{result['global_step']:,} ({len(base['seeds'])} seeds); settings finished {done}/{t['num_samples']}",
                flush=True,
            )

    trainable = tune.with_resources(tune_trial, {"cpu": spec["cpus_per_trial"] * len(base["seeds"])})
    study = (sweep_dir / "tune" / "tune").absolute()
    if ns.resume and tune.Tuner.can_restore(str(study)):
        print(f"[tune] resuming the study in {study}", flush=True)
        tuner = tune.Tuner.restore(str(study), trainable=trainable, resume_unfinished=True, resume_errored=True)
    else:
        tuner = tune.Tuner(
            trainable,
            param_space={
                "setting": tune_space(t["space"]),
                "base": base,
                "sweep_dir": str(sweep_dir.absolute()),
                "report_interval": spec["report_interval"],
            },
            tune_config=tune.TuneConfig(
                metric="eval_return", mode="max", search_alg=searcher, scheduler=scheduler, num_samples=t["num_samples"]
            ),
            run_config=tune.RunConfig(
                name="tune",
                storage_path=str((sweep_dir / "tune").absolute()),
                verbose=0,
                failure_config=tune.FailureConfig(max_failures=spec["max_failures"]),
                callbacks=[Report()],
            ),
        )
    results = tuner.fit()
    rows = []
    for r in results:
        if r.metrics and "eval_return" in r.metrics:
            rows.append(
                {
                    "setting": {k: fmt(v) for k, v in r.config["setting"].items()},
                    "eval_return": r.metrics["eval_return"],
                    "global_step": r.metrics["global_step"],
                }
            )
    if stopping["stopping"]:
        return INTERRUPTED
    if not rows:
        print("[tune] no setting reported an evaluation: see <out>/tune_trials/*/seed*/log.txt", file=sys.stderr)
        return 1
    best = max(rows, key=lambda r: (r["global_step"], r["eval_return"]))  # among those that ran longest (ASHA)
    flags = [[k, v] for k, v in best["setting"].items()]
    command = shlex.join(
        ["python", base["script"], "--env-id", base["env_id"], *base["extra"], *flag_args(flags, base["bool_flags"])]
    )
    write_json(sweep_dir / "tune.json", {"settings": rows, "best": best, "best_command": command})
    print(
        f"[tune] best setting: {' '.join(f'{k}={v}' for k, v in flags)}: mean eval return {best['eval_return']:.1f} "
        f"over seeds {base['seeds']} at step {best['global_step']:,}"
    )
    print(f"[tune] best command line:\n{command}", flush=True)
    if not t["final_seeds"]:
        return 0
    final_dir = sweep_dir / "final"
    final_dir.mkdir(exist_ok=True)
    trials = expand_grid(
        [base["script"]],
        [base["env_id"]],
        t["final_seeds"],
        {k: [v] for k, v in flags},
        base["extra"],
        spec["cpus_per_trial"],
        {base["script"]: base["bool_flags"]},
    )
    final = {
        **{k: spec[k] for k in ("cpus_per_trial", "max_failures", "report_interval", "metric", "score_ranges")},
        "trials": [asdict(x) for x in trials],
        "command": spec["command"] + "  (the best setting on fresh seeds)",
    }
    write_json(final_dir / "sweep.json", final)
    print(f"[tune] the best setting on fresh seeds {t['final_seeds']}, in {final_dir}", flush=True)
    rc = run_grid(final_dir, final, stopping)
    summarize(final_dir, final, final["metric"], final["score_ranges"])
    print((final_dir / "summary.md").read_text(), end="")
    return rc


# --------------------------------------------------------------------------------------------------------------------
# Summary: per-trial scalars, per-task mean and interval, IQM of the normalized score, curves
# --------------------------------------------------------------------------------------------------------------------


def trial_scalars(trial_dir: Path) -> dict:
    """What one trial logged: the last-100 training return, the last evaluation, and both curves."""
    runs = sorted(p for p in (trial_dir / "runs").glob("*") if p.is_dir()) if (trial_dir / "runs").is_dir() else []
    if len(runs) != 1:
        return {"run_dir": None}
    out = {"run_dir": str(runs[0])}
    steps, values = read_scalars(runs[0], RETURN_TAG)
    if len(values):
        out.update({"train_" + k: v for k, v in summarize_seed(steps, values).items()})
        out["train_curve"] = [steps.tolist(), values.round(3).tolist()]
    steps, values = read_scalars(runs[0], EVAL_TAG)
    if len(values):
        out.update({"eval_last": float(values[-1]), "eval_step_last": int(steps[-1])})
        out["eval_curve"] = [steps.tolist(), values.round(3).tolist()]
    return out


METRICS = {
    "eval": ("eval_last", "the last evaluation's mean return (eval/episodic_return)"),
    "train": ("train_last100_mean", "the mean return of the last 100 training episodes (charts/episodic_return)"),
}


def summarize(sweep_dir: Path, spec: dict, metric: str, score_ranges: dict) -> dict:
    """Write summary.json, summary.md and summary.png of a sweep; return the summary."""
    key, meaning = METRICS[metric]
    per_trial, tasks = [], {}
    for t in (Trial(**t) for t in spec["trials"]):
        marker = read_result(sweep_dir, t.id)
        entry = {
            "id": t.id,
            "task": t.task,
            "env_id": t.env_id,
            "seed": t.seed,
            "state": marker["state"] if marker else "unfinished",
            **trial_scalars(sweep_dir / "trials" / t.id),
        }
        if marker and marker["state"] == "failed":
            entry["log_tail"] = marker.get("log_tail", "")
        per_trial.append(entry)
        tasks.setdefault(t.task, []).append(entry)
    rows = []
    for task, entries in tasks.items():
        values = np.array([e[key] for e in entries if e["state"] == "done" and key in e], dtype=np.float64)
        row = {
            "task": task,
            "env_id": entries[0]["env_id"],
            "seeds": len(entries),
            "n": int(values.size),
            "failed": [e["seed"] for e in entries if e["state"] == "failed"],
            "unfinished": [e["seed"] for e in entries if e["state"] == "unfinished"],
            "per_seed": values.tolist(),
        }
        if values.size:
            row.update({"mean": float(values.mean()), "std": float(values.std())})
            if values.size >= 3:
                row["ci95"] = bootstrap_mean_interval(values)
            else:
                row["min_max"] = [float(values.min()), float(values.max())]
            if row["env_id"] in score_ranges:
                low, high = score_ranges[row["env_id"]]
                row["normalized_per_seed"] = normalized(values, low, high).round(4).tolist()
        rows.append(row)
    scored = [r for r in rows if "normalized_per_seed" in r]
    aggregate = None
    if scored and len({r["n"] for r in scored}) == 1:
        iqm, low, high = iqm_interval(np.array([r["normalized_per_seed"] for r in scored]).T)
        aggregate = {
            "iqm": iqm,
            "ci95": [low, high],
            "tasks": [r["task"] for r in scored],
            "runs": sum(r["n"] for r in scored),
            "metric": f"IQM over (seed, task) of ({metric} score - low) / (high - low), --score-range per env",
        }
    elif scored:
        aggregate = {"error": "tasks have different numbers of finished seeds: no stratified bootstrap"}
    summary = {
        "metric": metric,
        "metric_meaning": meaning,
        "tasks": rows,
        "aggregate": aggregate,
        "trials": [{k: v for k, v in e.items() if not k.endswith("_curve")} for e in per_trial],
    }
    write_json(sweep_dir / "summary.json", summary)
    (sweep_dir / "summary.md").write_text(markdown(summary) + "\n")
    plot(tasks, sweep_dir / "summary.png")
    return summary


def markdown(summary: dict) -> str:
    lines = [
        f"Score: {summary['metric_meaning']}, per seed.",
        "",
        "| task | seeds done / all | mean ± std | 95 % CI (bootstrap) or min–max | normalized (mean) | failed seeds |",
        "|---|---|---|---|---|---|",
    ]
    for r in summary["tasks"]:
        mean = f"{r['mean']:.1f} ± {r['std']:.1f}" if "mean" in r else "–"
        spread = (
            f"[{r['ci95'][0]:.1f}, {r['ci95'][1]:.1f}]"
            if "ci95" in r
            else f"{r['min_max'][0]:.1f}–{r['min_max'][1]:.1f} (n={r['n']})"
            if "min_max" in r
            else "–"
        )
        norm = f"{np.mean(r['normalized_per_seed']):.2f}" if "normalized_per_seed" in r else "–"
        failed = ", ".join(map(str, r["failed"])) or "–"
        if r["unfinished"]:
            failed += f" (unfinished: {', '.join(map(str, r['unfinished']))})"
        lines.append(f"| {r['task']} | {r['n']} / {r['seeds']} | {mean} | {spread} | {norm} | {failed} |")
    agg = summary["aggregate"]
    if agg and "iqm" in agg:
        lines.append(
            f"\nIQM of the normalized score over {len(agg['tasks'])} task(s), {agg['runs']} runs: "
            f"**{agg['iqm']:.2f}** [{agg['ci95'][0]:.2f}, {agg['ci95'][1]:.2f}] (95 % stratified bootstrap, rliable)."
        )
    elif agg:
        lines.append(f"\nIQM: {agg['error']}.")
    failed = [t for t in summary["trials"] if t["state"] == "failed"]
    for t in failed:
        tail = "\n".join(f"    {line}" for line in t.get("log_tail", "").splitlines())
        lines.append(f"\nFAILED: trial {t['id']}; last lines of its log:\n\n{tail}")
    return "\n".join(lines)


def plot(tasks: dict, path: Path) -> None:
    """One panel per task: each seed's training curve (thin) and evaluations (dots)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    cols = min(3, len(tasks))
    nrows = -(-len(tasks) // cols)
    figure = Figure(figsize=(4.5 * cols, 3.4 * nrows), layout="constrained")
    for k, (task, entries) in enumerate(tasks.items()):
        ax = figure.add_subplot(nrows, cols, k + 1)
        for j, e in enumerate(entries):
            if "train_curve" in e:
                ax.plot(*e["train_curve"], color=f"C{j % 10}", alpha=0.4, linewidth=0.8)
            if "eval_curve" in e:
                ax.plot(*e["eval_curve"], "o-", color=f"C{j % 10}", markersize=3, label=f"seed {e['seed']} (eval)")
        ax.set_title(task, fontsize=9)
        ax.set_xlabel("env steps")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    figure.supylabel("episodic return (thin: training, dots: evaluation)")
    FigureCanvasAgg(figure).print_png(str(path))


# --------------------------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------------------------


def parse_args(argv: list) -> tuple:
    argv = list(argv)
    extra = []
    if "--" in argv:
        extra, argv = argv[argv.index("--") + 1 :], argv[: argv.index("--")]
    parser = argparse.ArgumentParser(
        prog="tools/sweep.py",
        description=__doc__.splitlines()[0],
        epilog="Arguments after a literal -- go to every trial's script.",
    )
    parser.add_argument("--out", required=True, type=Path, help="the sweep's folder (trials, summary, Tune's state)")
    parser.add_argument("--script", nargs="+", default=[], help=f"one or more of {', '.join(SCRIPTS)}")
    parser.add_argument("--env-id", nargs="+", default=[])
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--grid", action="append", default=[], help="flag=v1,v2: one trial per value (repeatable)")
    parser.add_argument("--cpus-per-trial", type=int, default=1, help="CPUs reserved and --torch-threads per trial")
    parser.add_argument("--address", default=None, help="a Ray cluster's HOST:PORT (default: Ray on this machine)")
    parser.add_argument("--max-failures", type=int, default=3, help="restarts of a trial whose worker is lost")
    parser.add_argument("--report-interval", type=float, default=10.0, help="seconds between a trial's progress lines")
    parser.add_argument("--resume", action="store_true", help="continue the sweep in --out")
    parser.add_argument("--summarize", action="store_true", help="only (re)write the summary of --out")
    parser.add_argument(
        "--metric",
        choices=sorted(METRICS),
        default=None,
        help="per-seed score: eval (last evaluation; the default with --eval-interval) or train",
    )
    parser.add_argument(
        "--score-range",
        action="append",
        default=[],
        help="ENV=LOW:HIGH: normalized score (x - LOW) / (HIGH - LOW), e.g. random and published returns",
    )
    tuning = parser.add_argument_group("--tune: search a space instead of a grid (one script, one env id)")
    tuning.add_argument("--tune", action="store_true", help="search --space; objective: mean eval return over --seeds")
    tuning.add_argument(
        "--space",
        action="append",
        default=[],
        help="flag=loguniform:LOW:HIGH | uniform:LOW:HIGH | int:LOW:HIGH | choice:A,B (repeatable)",
    )
    tuning.add_argument("--num-samples", type=int, default=8, help="settings tried")
    tuning.add_argument("--search", choices=["optuna", "random"], default="optuna")
    tuning.add_argument("--search-seed", type=int, default=0)
    tuning.add_argument(
        "--grace-steps",
        type=int,
        default=None,
        help="ASHA stops no setting before this many env steps (default: a quarter of the budget)",
    )
    tuning.add_argument(
        "--final-seeds",
        nargs="*",
        type=int,
        default=None,
        help="re-run the best setting on these seeds (default: 3 seeds after --seeds; none: no re-run)",
    )
    ns = parser.parse_args(argv)
    return ns, extra


def parse_ranges(items: list) -> dict:
    ranges = {}
    for item in items:
        env, _, rng = item.partition("=")
        try:
            low, high = (float(x) for x in rng.split(":"))
        except ValueError:
            raise UserError(f"--score-range '{item}': write ENV=LOW:HIGH, e.g. Hopper-v4=18:2400.") from None
        if low == high:
            raise UserError(f"--score-range '{item}': LOW and HIGH must differ.")
        ranges[env] = (low, high)
    return ranges


def new_spec(ns, extra: list) -> dict:
    """The sweep's trials, every input checked (flags, values, CPUs, address) before anything runs."""
    if not ns.script or not ns.env_id:
        raise UserError("a new sweep needs --script and --env-id (or --resume / --summarize of an existing --out).")
    scripts = [check_script(s) for s in ns.script]
    if ns.cpus_per_trial < 1 or ns.max_failures < 0 or ns.report_interval <= 0 or any(s < 0 for s in ns.seeds):
        raise UserError("--cpus-per-trial must be >= 1, --max-failures >= 0, --report-interval > 0, seeds >= 0.")
    if ns.address is None and ns.cpus_per_trial > usable_cores():
        raise UserError(
            f"--cpus-per-trial {ns.cpus_per_trial} is more than this machine's {usable_cores()} cores: "
            "no trial could start. Lower it."
        )
    if ns.address is not None:
        check_address(ns.address)
    grid = parse_grid(ns.grid)
    if ns.tune:
        return tune_spec(ns, extra, scripts)
    if ns.space:
        raise UserError("--space needs --tune (a grid takes --grid flag=v1,v2).")
    with ThreadPoolExecutor(max_workers=len(scripts)) as pool:
        helps = dict(zip(scripts, pool.map(script_flags, scripts)))
    given = [w[2:].split("=", 1)[0] for w in extra if w.startswith("--")]
    for script in scripts:
        check_flags(script, [*given, *grid], helps[script][0])
    bool_flags = {s: sorted(helps[s][1]) for s in scripts}
    trials = expand_grid(scripts, ns.env_id, ns.seeds, grid, extra, ns.cpus_per_trial, bool_flags)
    check_values(value_probes(trials))
    metric = ns.metric or ("eval" if any(w.startswith("--eval-interval") for w in extra) else "train")
    return {
        "trials": [asdict(t) for t in trials],
        "cpus_per_trial": ns.cpus_per_trial,
        "max_failures": ns.max_failures,
        "report_interval": ns.report_interval,
        "metric": metric,
        "score_ranges": parse_ranges(ns.score_range),
        "command": shlex.join([sys.executable, *sys.argv]),
    }


def tune_spec(ns, extra: list, scripts: list) -> dict:
    if len(scripts) != 1 or len(ns.env_id) != 1 or ns.grid or not ns.space:
        raise UserError("--tune searches one script on one env id over --space (no --grid): give one of each.")
    if not any(w.startswith("--eval-interval") for w in extra):
        raise UserError("--tune's objective is the evaluation return: give the script --eval-interval N (after --).")
    total = next((extra[i + 1] for i, w in enumerate(extra[:-1]) if w == "--total-timesteps"), None)
    if total is None or not total.isdigit():
        raise UserError("--tune needs the budget: give the script --total-timesteps N (after --).")
    k = len(ns.seeds)
    if ns.address is None and ns.cpus_per_trial * k > usable_cores():
        raise UserError(
            f"a --tune trial runs its {k} seeds at once, {ns.cpus_per_trial} CPU(s) each: {ns.cpus_per_trial * k} "
            f"is more than this machine's {usable_cores()} cores. Lower --cpus-per-trial or --seeds."
        )
    if ns.num_samples < 1:
        raise UserError("--num-samples must be >= 1.")
    space = parse_space(ns.space)
    flags, switches = script_flags(scripts[0])
    given = [w[2:].split("=", 1)[0] for w in extra if w.startswith("--")]
    check_flags(scripts[0], [*given, *space], flags)
    probes = expand_grid(scripts, ns.env_id, ns.seeds[:1], space_values(space), extra, 1, {scripts[0]: sorted(switches)})
    check_values(value_probes(probes))
    final = ns.final_seeds if ns.final_seeds is not None else [max(ns.seeds) + i for i in (1, 2, 3)]
    base = {
        "script": scripts[0],
        "env_id": ns.env_id[0],
        "seeds": ns.seeds,
        "extra": extra,
        "threads": ns.cpus_per_trial,
        "bool_flags": sorted(switches),
    }
    tune = {
        "space": space,
        "num_samples": ns.num_samples,
        "search": ns.search,
        "search_seed": ns.search_seed,
        "total": int(total),
        "grace_steps": ns.grace_steps or max(int(total) // 4, 1),
        "final_seeds": final,
    }
    return {
        "base": base,
        "tune": tune,
        "trials": [],
        "cpus_per_trial": ns.cpus_per_trial,
        "max_failures": ns.max_failures,
        "report_interval": ns.report_interval,
        "metric": "eval",
        "score_ranges": parse_ranges(ns.score_range),
        "command": shlex.join([sys.executable, *sys.argv]),
    }


def main(argv: Optional[list] = None) -> int:
    ns, extra = parse_args(sys.argv[1:] if argv is None else argv)
    sweep_dir = ns.out
    spec_path = sweep_dir / "sweep.json"
    if ns.resume or ns.summarize:
        if not spec_path.is_file():
            raise UserError(f"--out {sweep_dir} holds no sweep (no sweep.json): start one without --resume.")
        spec = json.loads(spec_path.read_text())
        if ns.summarize:
            summary = summarize(sweep_dir, spec, ns.metric or spec["metric"], spec["score_ranges"])
            print((sweep_dir / "summary.md").read_text(), end="")
            return 0 if all(t["state"] == "done" for t in summary["trials"]) else 1
        if ns.address is not None:
            check_address(ns.address)
    else:
        if spec_path.exists():
            raise UserError(f"--out {sweep_dir} already holds a sweep: continue it with --resume, or choose another --out.")
        spec = new_spec(ns, extra)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        write_json(spec_path, spec)
    (sweep_dir / STOP_FILE).unlink(missing_ok=True)
    n, cpt = len(spec["trials"]), spec["cpus_per_trial"]
    if "tune" in spec:
        k = len(spec["base"]["seeds"])
        print(
            f"[tune] {spec['tune']['num_samples']} settings x {k} seeds in {sweep_dir}; {cpt} CPU(s) and --torch-threads "
            f"{cpt} per seed" + ("" if ns.address else f", {concurrency(usable_cores(), cpt * k)} setting(s) at once")
        )
    else:
        print(
            f"[sweep] {n} trials in {sweep_dir}; {cpt} CPU(s) and --torch-threads {cpt} each"
            + ("" if ns.address else f", {concurrency(usable_cores(), cpt)} at once on this machine"),
            flush=True,
        )
    stopping = install_stop_handler(sweep_dir)
    ray_env(local=ns.address is None)
    head = LocalRay(usable_cores(), sweep_dir / "ray-head.log") if ns.address is None else None
    try:
        needed = cpt * len(spec["base"]["seeds"]) if "tune" in spec else cpt
        ray = connect_ray(ns.address or head.address, needed, local=head is not None)
        try:
            if "tune" in spec:
                return run_tune(sweep_dir, spec, ns, stopping)
            rc = run_grid(sweep_dir, spec, stopping)
        finally:
            ray.shutdown()
    finally:
        if head is not None:
            head.stop()
    summarize(sweep_dir, spec, spec["metric"], spec["score_ranges"])
    print((sweep_dir / "summary.md").read_text(), end="")
    print(
        f"[sweep] wrote {sweep_dir / 'summary.json'}, summary.md and summary.png"
        + ("; stopped: continue with --resume" if rc == INTERRUPTED else "")
    )
    return rc


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
