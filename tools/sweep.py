"""Sweeps: run a training script over env ids x seeds x flag values on Ray, or over settings drawn from a space.

    python tools/sweep.py --out S --script ppo_continuous.py --env-id Hopper-v4 --seeds 1 2 3 \\
        [--grid learning_rate=3e-4,1e-3] [--cpus-per-trial 1] [--address HOST:PORT] -- --total-timesteps 1000000
    python tools/sweep.py --out S --resume [--seeds 4 5] [--grid ...]   # finish the sweep in S, or add trials to it
    python tools/sweep.py --out S --summarize                           # rewrite S/summary.{json,md} from the trials
    python tools/sweep.py --out T --tune --script ppo_continuous.py --env-id Pendulum-v1 --num-samples 8 \\
        --space learning_rate=loguniform:1e-4:1e-2 --space gamma=choice:0.95,0.99 -- --eval-interval 10000

A trial runs the script, unmodified, in `<out>/trials/<id>/` (the id ends in a hash of its command). See docs/sweeps.md.
"""

import argparse
import contextlib
import ctypes
import fcntl
import hashlib
import itertools
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Optional

import numpy as np

HERE, CORES = Path(__file__).resolve().parent, len(os.sched_getaffinity(0))  # (Linux: flock, prctl)
SET_BY_SWEEP = ("env-id", "seed", "runs-dir", "torch-threads", "resume", "progress", "no-progress")
CHECKPOINT = re.compile(r"(step|interrupted|final)_(\d{10})\.pt")  # the scripts' checkpoint names (best.pt aside)
PROGRESS = re.compile(r"^step\s+[\d,]+/[\d,]+ \|\s+\d+ SPS", re.M)  # the scripts' plain progress line
SPACE_FORMS = "loguniform:LOW:HIGH (LOW > 0), uniform:LOW:HIGH, int:LOW:HIGH or choice:A,B"  # --tune's --space
DEFAULTS = dict(seeds=[1, 2, 3], grid={}, extra=[], cpus_per_trial=1, space=[], tune=False, num_samples=8, search_seed=0)
INTERRUPTED, STOP_FILE, TAIL = 130, "STOP", 15  # a script's exit code after Ctrl-C; the driver's stop marker; log lines


class UserError(Exception):
    """Bad input: one paragraph on stderr, exit code 2, nothing written."""


# ---- the grid ------------------------------------------------------------------------------------------------------
@dataclass
class Trial:
    id: str
    script: str  # absolute path
    env_id: str
    seed: int
    flags: list  # [flag, value] pairs of the grid point
    extra: list  # the arguments after `--`
    threads: int
    checksum: str  # the script's sha256 when the trial was made

    def command(self, trial_dir: Path) -> list:
        per_trial = ["--runs-dir", str(trial_dir / "runs"), "--torch-threads", str(self.threads), "--progress"]
        per_trial += [*self.extra, *flag_args(self.flags)]
        return [sys.executable, self.script, "--env-id", self.env_id, "--seed", str(self.seed), *per_trial]

    def shown(self) -> str:
        """The command line as a user types it, without what the sweep sets per trial."""
        return shlex.join([Path(self.script).name, "--env-id", self.env_id, *self.extra, *flag_args(self.flags)])

    @property
    def task(self) -> str:
        """What the seeds of a task share: script, env id and flag values."""
        return " ".join([Path(self.script).stem, self.env_id, *(f"{name}={value}" for name, value in self.flags)])


def flag_args(flags: list) -> list:
    """[["learning-rate", "1e-3"], ["norm-adv", "false"]] -> ["--learning-rate", "1e-3", "--no-norm-adv"]."""
    out = []
    for name, value in flags:
        switch = {"true": [f"--{name}"], "false": [f"--no-{name}"]}.get(str(value).lower())
        out += switch or [f"--{name}", str(value)]
    return out


def flag_name(name: str) -> str:
    return name.strip().lstrip("-").replace("_", "-")


def parse_grid(items: list) -> dict:
    """["learning_rate=3e-4,1e-3"] -> {"learning-rate": ["3e-4", "1e-3"]} (a flag's name with - or _, with or without --)."""
    grid = {}
    for item in items:
        name, _, values = item.partition("=")
        values = list(dict.fromkeys(v.strip() for v in values.split(",") if v.strip()))
        if not name.strip() or not values or flag_name(name) in grid:
            raise UserError(f"--grid '{item}': write flag=value1,value2 (e.g. learning_rate=3e-4,1e-3), each flag once.")
        grid[flag_name(name)] = values
    return grid


def expand_grid(scripts: list, env_ids: list, seeds: list, grid: dict, extra: list, threads: int) -> list:
    """Every script x env id x flag values x seed, in that order; a trial's id: readable, then a hash of its command."""
    trials = []
    for script, env_id, point, seed in itertools.product(scripts, env_ids, itertools.product(*grid.values()), seeds):
        flags = [[name, value] for name, value in zip(grid, point)]
        digest = hashlib.sha256(Path(script).read_bytes()).hexdigest()
        key = json.dumps([digest, env_id, seed, flag_args(flags), extra, threads])
        label = "_".join([Path(script).stem, env_id, *(f"{n}={v}" for n, v in flags), f"seed{seed}"])
        label = re.sub(r"[^A-Za-z0-9=.+_-]+", "-", label)[:100]
        trial_id = f"{label}_{hashlib.sha256(key.encode()).hexdigest()[:10]}"
        trials.append(Trial(trial_id, script, env_id, seed, flags, list(extra), threads, digest))
    return trials


# ---- checking the input before anything is written -----------------------------------------------------------------
def find_script(name: str) -> str:
    """A script given as a path (from here), or by name beside this tool or one folder up (this project's layout)."""
    for path in (Path(name), HERE / name, HERE.parent / name):
        if path.is_file() and path.suffix == ".py":
            return str(path.resolve())
    raise UserError(f"unknown script '{name}': no such .py file here, in {HERE} or in {HERE.parent}.")


def one_paragraph(text: str, limit: int = 400) -> str:
    """A script's error output (tyro's boxes too) as one line."""
    text = " ".join(re.sub(r"[│╭╮╰╯─]+", " ", text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def probe(cmd: list, timeout: float = 120) -> Optional[str]:
    """Run a trial's command until the script has made its run folder (args.json: its flags, values and env checked,
    about to train), then kill it. None if it got there; else why not, one paragraph."""
    env = {**os.environ, "WANDB_MODE": "disabled"}
    with tempfile.TemporaryDirectory(prefix="sweep-probe-", ignore_cleanup_errors=True) as runs:
        proc = subprocess.Popen([*cmd, "--runs-dir", runs], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + timeout
        while proc.poll() is None and time.time() < deadline and not any(Path(runs).glob("*/args.json")):
            time.sleep(0.1)
        ok = any(Path(runs).glob("*/args.json"))
        proc.kill()
        output = proc.communicate()[0].decode(errors="replace")
    if ok:
        return None
    if proc.returncode == 0:
        return f"it exited (code 0) without starting a training run: {one_paragraph(output, 200) or 'no output'}"
    return f"it did not start within {timeout:.0f} s" if time.time() >= deadline else one_paragraph(output)


def check_values(trials: list) -> None:
    """Per script and env id, probe j takes each grid flag's j-th value: every value is tried once, not every
    combination (a combination the script refuses fails its trial at start, with the script's own message)."""
    names = dict.fromkeys(n for t in trials for n, _ in t.flags)  # every trial has the grid's (or space's) flags
    values = {n: list(dict.fromkeys(v for t in trials for m, v in t.flags if m == n)) for n in names}
    probes = {}
    for t in {(t.script, t.env_id): t for t in trials}.values():
        for j in range(max(map(len, values.values()), default=1)):
            flags = [[n, vs[j % len(vs)]] for n, vs in values.items()]
            trial = Trial("probe", t.script, t.env_id, t.seed, flags, t.extra, 1, "")
            probes[trial.shown()] = trial.command(Path("probe"))
    with ThreadPoolExecutor(max_workers=CORES) as pool:
        for shown, error in zip(probes, pool.map(probe, probes.values())):
            if error is not None:
                raise UserError(f"`{shown}` is refused by the script: {error.removeprefix('error: ')}")


def check_address(address: str) -> None:
    """Ray retries an address that is not a Ray head for minutes: a gRPC handshake with it first, 20 s at most."""
    import grpc

    host, _, port = address.removeprefix("ray://").rpartition(":")
    with grpc.insecure_channel(f"{host or '127.0.0.1'}:{port}") as channel:
        try:
            grpc.channel_ready_future(channel).result(timeout=20)
        except (grpc.FutureTimeoutError, ValueError) as e:
            raise UserError(f"--address {address}: no Ray head answers there ({type(e).__name__} within 20 s).") from None


# ---- the sweep's folder: one sweep at a time -----------------------------------------------------------------------
def claim(out: Path) -> tuple:
    """Lock --out for this process's life (an flock on the folder: no file; gone when it dies), or name the holder."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file, not a folder: give a folder (it is made if missing).")
    made = [p for p in (out, *out.parents) if not p.exists()]  # removed at the end if still empty (nothing written)
    out.mkdir(parents=True, exist_ok=True)
    if not os.access(out, os.W_OK | os.X_OK):
        raise UserError(f"--out {out} is not writable by this user: give a folder you can write in.")
    fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        held = f":{os.fstat(fd).st_ino} "  # /proc/locks: "1: FLOCK ADVISORY WRITE <pid> <major>:<minor>:<inode> 0 EOF"
        holder = next((line.split()[-4] for line in open("/proc/locks") if held in line), "unknown")
        os.close(fd)
        raise UserError(f"--out {out} is in use by another sweep (pid {holder}): wait for it, or use another --out.") from None
    return fd, made


# ---- a trial: the script in a subprocess, on a Ray worker ----------------------------------------------------------
def die_with_parent() -> None:
    """In the child before exec: SIGTERM when its parent (the Ray worker) dies, so the script saves and stops instead
    of running on unowned (Linux prctl); and every signal unblocked (Ray blocks SIGINT in its workers)."""
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def stop_group(proc: subprocess.Popen) -> None:
    """SIGINT to the script's process group (the script saves a checkpoint); SIGKILL what is left after 300 s."""
    with contextlib.suppress(ProcessLookupError):  # (the group has exited)
        os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def start_script(trial_dir: Path, cmd: list, threads: int) -> subprocess.Popen:
    """The command, with `--resume <newest checkpoint>` when it ran before (a start that saved nothing is moved aside)."""
    runs = trial_dir / "runs"
    found = [(int(m[2]), m[1] != "step", p) for p in runs.glob("*/checkpoints/*.pt") if (m := CHECKPOINT.fullmatch(p.name))]
    if found:  # the newest step; at one step, Ctrl-C's interrupted_ (or final_) over the periodic step_ saved with it
        cmd = [*cmd, "--resume", str(max(found)[2])]
    for old in [] if found else list(runs.glob("*")):
        (trial_dir / "abandoned").mkdir(exist_ok=True)
        old.rename(trial_dir / "abandoned" / old.name)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    with open(trial_dir / "log.txt", "a") as log:
        print(f"$ {shlex.join(cmd)}", file=log, flush=True)  # before the script's own lines
        kwargs = {"stdout": log, "stderr": subprocess.STDOUT, "stdin": subprocess.DEVNULL, "env": env}
        return subprocess.Popen(cmd, **kwargs, start_new_session=True, preexec_fn=die_with_parent)


def progress_of(log_path: Path) -> str:
    """The last progress line of a script's log (`step 1,024/4,096 | 310 SPS`), or ""."""
    found = PROGRESS.findall(log_path.read_text(errors="replace")) if log_path.is_file() else []
    return found[-1] if found else ""


def write(path: Path, data) -> None:
    """Text, or a dict as JSON, written beside path, then renamed into place: a link there is replaced, not written to."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "x") as f:  # x: never over a file that is there
        f.write(data if isinstance(data, str) else json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def read_json(path: Path) -> Optional[dict]:
    with contextlib.suppress(OSError, ValueError):  # unreadable, or not JSON: None
        return json.loads(path.read_text())


def run_trial(trial: dict, sweep_dir: str) -> dict:
    """A Ray task: run (or resume) the trial's script, write its result.json when it has finished; its result."""
    trial, sweep_dir = Trial(**trial), Path(sweep_dir)
    trial_dir = sweep_dir / "trials" / trial.id
    trial_dir.mkdir(parents=True, exist_ok=True)
    if (sweep_dir / STOP_FILE).exists() or read_result(sweep_dir, trial):
        return read_result(sweep_dir, trial) or {"state": "not started"}  # stopping; or a retry after it finished
    start = time.time()
    proc = start_script(trial_dir, trial.command(trial_dir), trial.threads)
    try:
        while proc.poll() is None and not (sweep_dir / STOP_FILE).exists():
            time.sleep(0.2)
    finally:  # the STOP file, or Ray cancelling the task: the script saves a checkpoint and exits
        stop_group(proc)
    rc = proc.returncode
    if rc == INTERRUPTED and (sweep_dir / STOP_FILE).exists():
        return {"state": "interrupted"}  # no result.json: a --resume continues it from its checkpoint
    result = {"state": "done" if rc == 0 else "failed", "returncode": rc, "seconds": round(time.time() - start, 1)}
    result.update({"command": shlex.join(proc.args), "key": trial.id, "host": socket.gethostname()})
    log = (trial_dir / "log.txt").read_text(errors="replace").splitlines()
    result.update(progress=progress_of(trial_dir / "log.txt"), log_tail="\n".join(log[-TAIL:]) if rc else "")
    write(trial_dir / "result.json", result)  # the marker: a finished trial is never run again
    return result


def read_result(sweep_dir: Path, trial: Trial) -> Optional[dict]:
    """A trial's result.json, if it was written for this very trial (its command's hash is in the id)."""
    r = read_json(sweep_dir / "trials" / trial.id / "result.json")
    return r if isinstance(r, dict) and r.get("key") == trial.id and r.get("state") in ("done", "failed") else None


# ---- the driver: Ray, progress lines, Ctrl-C -----------------------------------------------------------------------
def start_ray(address: Optional[str], cpus_needed: int):
    """Ray's own cluster on this machine (token authentication, 127.0.0.1, a private temp folder), or --address's."""
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")  # `uv run` per worker start: only slower here
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)  # an empty entry: the working folder on sys.path
    kwargs = {"logging_level": "ERROR", "log_to_driver": False}
    temp = None
    if address is None:  # (read when ray is first imported: set before)
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # servers on 127.0.0.1 (the switch is named for others)
        os.environ["RAY_AUTH_MODE"] = "token"
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)  # this cluster's; its workers inherit it
        temp = tempfile.mkdtemp(prefix=f"ray-{os.getuid()}-")  # 0700 (Ray's own is 0777), short: socket paths <= 107 B
        kwargs.update(num_cpus=CORES, include_dashboard=False, _temp_dir=f"{temp}/r", _node_ip_address="127.0.0.1")
    import ray

    try:
        ray.init(address=address or "local", **kwargs)
    except (ConnectionError, RuntimeError) as e:
        raise UserError(f"--address {address}: could not join its Ray cluster ({one_paragraph(str(e), 200)}).") from None
    largest = max((n["Resources"].get("CPU", 0) for n in ray.nodes() if n["Alive"]), default=0)
    if cpus_needed > largest:
        ray.shutdown()
        raise UserError(f"a trial needs {cpus_needed} CPUs but the largest Ray node has {largest:g}: lower --cpus-per-trial.")
    return ray, temp


WORDS = {"done": "done", "failed": "FAILED (exit code {returncode})", "interrupted": "stopped, checkpoint saved"}
WORDS["lost"] = "FAILED: its worker was lost more often than --max-failures allows ({error}; `--resume` tries again)"


def run_grid(sweep_dir: Path, spec: dict) -> None:
    """Run the trials without a result.json as Ray tasks; one whose worker is lost (e.g. with its node) runs again, up to
    --max-failures times, its script resuming from its newest checkpoint. A line per trial event, then the counts."""
    import ray

    trials = [Trial(**t) for t in spec["trials"]]
    states = [r["state"] for t in trials if (r := read_result(sweep_dir, t))]
    todo = [t for t in trials if read_result(sweep_dir, t) is None]
    if states:
        print(f"[sweep] {len(trials) - len(todo)} finished trial(s) kept; {len(todo)} to run (resumed from checkpoints)")
    task = ray.remote(num_cpus=spec["args"]["cpus_per_trial"], max_retries=spec["args"]["max_failures"])(run_trial)
    waiting = {task.remote(asdict(t), str(sweep_dir.absolute())): t for t in {t.id: t for t in todo}.values()}
    since, shown = time.time(), {}
    while waiting:
        finished, _ = ray.wait(list(waiting), timeout=spec["args"]["report_interval"])
        lines = {}
        for ref in finished:
            trial = waiting.pop(ref)
            try:
                result = ray.get(ref)
            except ray.exceptions.RayError as e:
                result = {"state": "lost", "error": one_paragraph(str(e), 150)}
            states.append(result["state"])
            lines[trial.id] = WORDS.get(result["state"], "").format(**result)
        for trial in waiting.values():
            lines[trial.id] = progress_of(sweep_dir / "trials" / trial.id / "log.txt")
        lines = {k: v for k, v in lines.items() if v and v != shown.get(k)}
        if lines:
            shown.update(lines)
            logs = [sweep_dir / "trials" / t.id / "log.txt" for t in waiting.values()]
            running = sum(p.is_file() and p.stat().st_mtime >= since for p in logs)
            done, failed = states.count("done"), states.count("failed") + states.count("lost")
            print("".join(f"[trial {k}] {v}\n" for k, v in lines.items()), end="")
            pending = len(trials) - done - failed - running
            print(f"[sweep] {done}/{len(trials)} done, {running} running, {failed} failed, {pending} pending", flush=True)


# ---- --tune: settings drawn at random from a space, each a point of the grid; the best mean return is named -------
def parse_space(items: list) -> dict:
    """["learning_rate=loguniform:1e-4:1e-2", "gamma=choice:0.95,0.99"] -> {flag: [kind, values]}."""
    space = {}
    for item in items:
        name, _, rest = item.partition("=")
        kind, _, args = rest.partition(":")
        values = [v.strip() for v in args.split(",") if v.strip()] if kind == "choice" else args.split(":")
        try:
            if kind != "choice":
                values = [(int if kind == "int" else float)(x) for x in values]
            ok = kind == "choice" or (len(values) == 2 and -np.inf < values[0] <= values[1] < np.inf)
            ok = ok and (kind != "loguniform" or values[0] > 0)
        except ValueError:
            ok = False
        if not name.strip() or not values or not ok or kind not in ("loguniform", "uniform", "int", "choice"):
            raise UserError(f"--space '{item}': write flag={SPACE_FORMS}")
        space[flag_name(name)] = [kind, values]
    return space


def sample_space(items: list, n: int, seed: int) -> list:
    """n settings drawn at random from the space, each {flag: value as the script gets it}; the first n of n + k
    draws are the n draws (a --resume with a larger --num-samples adds settings)."""
    rng = np.random.default_rng(seed)
    draw = {"uniform": lambda lo, hi: f"{rng.uniform(lo, hi):.6g}", "int": lambda lo, hi: str(rng.integers(lo, hi + 1))}
    draw["loguniform"] = lambda lo, hi: f"{np.exp(rng.uniform(np.log(lo), np.log(hi))):.6g}"
    draw["choice"] = lambda *v: rng.choice(v)
    space = parse_space(items)
    return [{name: str(draw[kind](*values)) for name, (kind, values) in space.items()} for _ in range(n)]


# ---- the summary: per trial its score, per task (its seeds) their mean, std and range ------------------------------
def read_scalars(run_dir: Path, tag: str) -> list:
    """(step, value) pairs of a TensorBoard scalar in a run folder, by step (as TensorBoard shows a resumed run)."""
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(str(run_dir), size_guidance={ea.SCALARS: 0})
    acc.Reload()
    return sorted((e.step, e.value) for e in (acc.Scalars(tag) if tag in acc.Tags()[ea.SCALARS] else []))


METRICS = {"eval": ("eval_last", "the last evaluation's mean return (eval/episodic_return)")}
METRICS["train"] = ("train_last100_mean", "the mean return of the last 100 training episodes (charts/episodic_return)")


def trial_entry(sweep_dir: Path, t: Trial) -> dict:
    """A trial's state and the scores its run folder's TensorBoard files give."""
    marker = read_result(sweep_dir, t) or {"state": "unfinished"}
    e = {"id": t.id, "task": t.task, "seed": t.seed, "state": marker["state"], "log_tail": marker.get("log_tail", "")}
    runs = [p for p in (sweep_dir / "trials" / t.id / "runs").glob("*") if p.is_dir()]
    if len(runs) == 1 and e["state"] == "done":
        train = [value for _, value in read_scalars(runs[0], "charts/episodic_return")][-100:]
        e.update({"train_last100_mean": float(np.mean(train))} if train else {})
        evals = read_scalars(runs[0], "eval/episodic_return")
        e.update({"eval_last": float(evals[-1][1]), "eval_step_last": int(evals[-1][0])} if evals else {})
    return e


def summarize(sweep_dir: Path, spec: dict, metric: str) -> dict:
    """summary.json and summary.md (the table, printed too) from the trials' folders; a --tune's best setting named."""
    key, meaning = METRICS[metric]
    trials = [trial_entry(sweep_dir, Trial(**t)) for t in spec["trials"]]
    rows = []
    for task in dict.fromkeys(e["task"] for e in trials):
        entries = [e for e in trials if e["task"] == task]
        values = np.array([e[key] for e in entries if key in e], dtype=np.float64)
        row = {"task": task, "seeds": len(entries), "n": int(values.size), "per_seed": values.tolist()}
        row["failed"] = [e["seed"] for e in entries if e["state"] == "failed"]
        row["unfinished"] = [e["seed"] for e in entries if e["state"] == "unfinished"]
        if values.size:
            row.update({"mean": float(values.mean()), "std": float(values.std()), "range": [values.min(), values.max()]})
        rows.append(row)
    summary = {"metric": metric, "metric_meaning": meaning, "tasks": rows, "trials": trials}
    columns = ["task", "seeds done / all", "mean ± std", "min, max", "failed seeds"]
    lines = [f"Score: {meaning}, per seed.", "", f"| {' | '.join(columns)} |", "|---" * len(columns) + "|"]
    for r in rows:
        mean = f"{r['mean']:.1f} ± {r['std']:.1f} | [{r['range'][0]:.1f}, {r['range'][1]:.1f}]" if r["n"] else "– | –"
        failed = ", ".join(map(str, r["failed"])) or "–"
        failed += f" (unfinished: {', '.join(map(str, r['unfinished']))})" if r["unfinished"] else ""
        lines.append(f"| {r['task']} | {r['n']} / {r['seeds']} | {mean} | {failed} |")
    failures = [f"[trial {t['id']}] FAILED; last lines of its log:\n{t['log_tail']}" for t in trials if t["state"] == "failed"]
    scored = [r for r in rows if r["n"] and r["n"] == r["seeds"]]
    if spec["args"]["tune"] and scored:
        best = max(scored, key=lambda r: r["mean"])
        trial = next(Trial(**t) for t in spec["trials"] if Trial(**t).task == best["task"])
        command = f"python {trial.shown()}"
        summary["best"] = {"task": best["task"], "mean": best["mean"], "command": command}
        lines += ["", f"[tune] best command line:\n{command}"]
    write(sweep_dir / "summary.json", summary)
    write(sweep_dir / "summary.md", "\n\n".join(["\n".join(lines), *failures]) + "\n")
    print("\n".join(lines), flush=True)
    print("\n\n".join(failures), file=sys.stderr)
    return summary


# ---- command line --------------------------------------------------------------------------------------------------
class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # a flag's error: one paragraph, as the tool's own (argparse prints its usage too)
        raise UserError(f"{message} (see tools/sweep.py --help)")


def parse_args(argv: list) -> tuple:
    """(options, the arguments after `--` or None); what a --resume leaves out is None (sweep.json's value)."""
    parser = Parser(prog="tools/sweep.py", description=__doc__.splitlines()[0], epilog="After --: flags for every trial.")
    add = parser.add_argument
    add("--out", required=True, type=Path, help="the sweep's folder (trials, summary)")
    add("--script", nargs="+", type=find_script, help="training scripts (a path, or a name beside tools/)")
    add("--env-id", nargs="+")
    add("--seeds", nargs="+", type=int, help="(default 1 2 3)")
    add("--grid", action="append", help="flag=v1,v2: one trial per value (repeatable)")
    add("--cpus-per-trial", type=int, help="CPUs reserved and --torch-threads per trial (default 1)")
    add("--address", help="a Ray cluster's HOST:PORT (default: a Ray of its own on this machine)")
    add("--max-failures", type=int, default=3, help="restarts of a trial whose worker is lost")
    add("--report-interval", type=float, default=10.0, help="seconds between a trial's progress lines")
    add("--resume", action="store_true", help="continue the sweep in --out (new seeds or grid values: added)")
    add("--summarize", action="store_true", help="only (re)write the summary of --out")
    add("--metric", choices=sorted(METRICS), help="per-seed score (default: eval if --eval-interval is given)")
    add("--tune", action="store_true", help="search --space (one script, one env id): mean last eval return over --seeds")
    add("--space", action="append", help=f"flag={SPACE_FORMS} (repeatable)")
    add("--num-samples", type=int, help="--tune: settings tried (default 8)")
    add("--search-seed", type=int, help="--tune: the random draws' seed (default 0)")
    extra = argv[argv.index("--") + 1 :] if "--" in argv else None
    return parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv), extra


def sweep_args(ns, extra: Optional[list], old: Optional[dict]) -> dict:
    """The sweep's settings: those given, else sweep.json's (old), else the defaults; each checked."""
    if old is None and not (ns.script and ns.env_id):
        raise UserError("a new sweep needs --script and --env-id (or --resume / --summarize of an existing --out).")
    settings = {**vars(ns), "grid": parse_grid(ns.grid) if ns.grid else None, "extra": extra, "tune": ns.tune or None}
    given = {k: v for k, v in settings.items() if k in ("script", "env_id", *DEFAULTS) and v is not None}
    if old is not None:  # a --resume: a grid sweep gets the trials of new scripts, env ids, seeds or grid values
        grows = ("num_samples", "seeds") if old["tune"] else ("script", "env_id", "seeds", "grid")
        changed = [k for k, v in given.items() if k in old and k not in grows and v != old[k]]
        if changed:
            differ = "; ".join(f"--{k.replace('_', '-')} {given[k]} (the sweep's: {old[k]})" for k in changed)
            raise UserError(f"--resume with {differ}: a sweep's trials share these; start another --out.")
    args = {**DEFAULTS, **(old or {}), **given, "max_failures": ns.max_failures, "report_interval": ns.report_interval}
    evaluates = any(w.startswith("--eval-interval") for w in args["extra"])
    args["metric"] = ns.metric or args.get("metric") or ("eval" if evaluates else "train")
    if args["cpus_per_trial"] < 1 or args["max_failures"] < 0 or not 0 < args["report_interval"] <= 3600:
        raise UserError("--cpus-per-trial must be >= 1, --max-failures >= 0, --report-interval in (0, 3600].")
    if min(args["seeds"], default=-1) < 0 or args["search_seed"] < 0 or len(set(args["seeds"])) < len(args["seeds"]):
        raise UserError(f"--seeds {args['seeds']}, --search-seed {args['search_seed']}: each >= 0, each seed given once.")
    names = [w[2:].split("=", 1)[0] for w in args["extra"] if w.startswith("--")] + list(args["grid"])
    for name in set(SET_BY_SWEEP) & set(names + list(parse_space(args["space"]))):
        raise UserError(f"--{name} is set by the sweep for each trial (--env-id, --seeds, --cpus-per-trial, --out, --resume).")
    if ns.address is None and args["cpus_per_trial"] > CORES:
        raise UserError(f"--cpus-per-trial {args['cpus_per_trial']}: more than this machine's {CORES} cores.")
    if args["tune"]:
        if len(args["script"]) != 1 or len(args["env_id"]) != 1 or args["grid"] or not args["space"]:
            raise UserError("--tune searches one script on one env id over --space (no --grid): give one of each.")
        if not evaluates or args["num_samples"] < 1:
            raise UserError("--tune needs --num-samples >= 1 and, after --, --eval-interval N (its score: evaluations).")
    elif args["space"]:
        raise UserError("--space needs --tune (a grid takes --grid flag=v1,v2).")
    return args


def grid_of(a: dict) -> list:
    grid = [{n: [v] for n, v in s.items()} for s in sample_space(a["space"], a["num_samples"], a["search_seed"])]
    points = grid if a["tune"] else [a["grid"]]
    return [t for p in points for t in expand_grid(a["script"], a["env_id"], a["seeds"], p, a["extra"], a["cpus_per_trial"])]


def load_spec(out: Path) -> dict:
    if not (out / "sweep.json").is_file():
        raise UserError(f"--out {out} holds no sweep (no sweep.json): start one without --resume / --summarize.")
    spec = read_json(out / "sweep.json")  # what the tool reads of it, each of the type the tool wrote
    args, trials = (spec.get("args"), spec.get("trials")) if isinstance(spec, dict) else (None, None)
    kinds = {**{k: type(v) for k, v in DEFAULTS.items()}, "script": list, "env_id": list, "metric": str}
    ok = isinstance(args, dict) and {k: type(args.get(k)) for k in kinds} == kinds and args["metric"] in METRICS
    kinds = {f.name: f.type for f in fields(Trial)}
    ok = ok and type(trials) is list and all(type(t) is dict and dict(zip(t, map(type, t.values()))) == kinds for t in trials)
    if not ok:
        raise UserError(f"{out / 'sweep.json'} is not a sweep this tool wrote (unreadable, or of an older version of it).")
    return spec


def plan(ns, extra: Optional[list], out: Path) -> tuple:
    """(the spec to write, the trials to probe) of a new sweep or a --resume; every check but the probes passed."""
    if ns.resume:
        spec = load_spec(out)
    elif any(out.iterdir()):
        raise UserError(f"--out {out} is not empty: continue its sweep with --resume, or choose another --out.")
    else:
        spec = {"args": None, "trials": []}
    args = sweep_args(ns, extra, spec["args"])
    for t in [Trial(**t) for t in spec["trials"]]:  # a script moved away: its trials' ids (a hash of it) are lost
        digest = hashlib.sha256(Path(t.script).read_bytes()).hexdigest() if Path(t.script).is_file() else None
        if digest is None or (digest != t.checksum and not read_result(out, t)):
            raise UserError(f"{t.script} moved or changed since the sweep started: restore it, or start another --out.")
    known = {t["id"] for t in spec["trials"]}
    new = list({t.id: t for t in grid_of(args) if t.id not in known}.values())  # (--tune may draw a setting twice)
    if new and ns.resume:
        print(f"[sweep] {len(new)} new trial(s) added to the sweep", flush=True)
    return {**spec, "args": args, "trials": spec["trials"] + [asdict(t) for t in new]}, new


def main(argv: Optional[list] = None) -> int:
    ns, extra = parse_args(list(sys.argv[1:] if argv is None else argv))
    out = ns.out
    if ns.summarize:
        spec = load_spec(out)
        summary = summarize(out, spec, ns.metric or spec["args"]["metric"])
        return 0 if all(t["state"] == "done" for t in summary["trials"]) else 1
    if ns.address is not None:
        check_address(ns.address)
    (lock, made), ray, temp = claim(out), None, None  # before any probe: one sweep per folder
    try:
        spec, probes = plan(ns, extra, out)
        check_values(probes)
        ray, temp = start_ray(ns.address, spec["args"]["cpus_per_trial"])
        write(out / "sweep.json", spec)
        (out / STOP_FILE).unlink(missing_ok=True)

        def on_signal(signum, frame):  # Ctrl-C / SIGTERM: each trial's script saves a checkpoint, none starts anew
            print("[sweep] stopping: every running trial saves a checkpoint; `--resume` continues the sweep", flush=True)
            (out / STOP_FILE).touch()

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        where = f"the Ray cluster at {ns.address}" if ns.address else f"Ray on this machine ({CORES} CPUs)"
        cpus = spec["args"]["cpus_per_trial"]
        print(f"[sweep] {len(spec['trials'])} trial(s) in {out}; {cpus} CPU(s) each; {where}", flush=True)
        run_grid(out, spec)
        states = [t["state"] for t in summarize(out, spec, spec["args"]["metric"])["trials"]]
        if (out / STOP_FILE).exists() or "unfinished" in states:
            return INTERRUPTED
        return 1 if "failed" in states else 0
    finally:
        if ray is not None:
            ray.shutdown()
        shutil.rmtree(temp or "/nonexistent", ignore_errors=True)
        os.close(lock)
        for folder in made:  # the folders claim made, if still empty: a refused sweep leaves nothing (never a file)
            with contextlib.suppress(OSError):
                folder.rmdir()


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (UserError, OSError, KeyboardInterrupt) as e:  # bad input, a path, the disk; Ctrl-C before trials start
        print(f"error: {str(e) or 'stopped (Ctrl-C) before any trial started'}", file=sys.stderr)
        sys.exit(INTERRUPTED if isinstance(e, KeyboardInterrupt) else 2)
