"""The Atari env backends side by side: raw env steps/s and the scripts' SPS on each, REPS rounds, medians.

    python benchmarks/env_backends.py --reps 3 --out benchmarks/results/atari_env_backends

Backends: `gymnasium` (make_env's wrapper chain, SyncVectorEnv) and `ale-vector` (ale-py's AtariVectorEnv),
each built by the scripts' own make_vector_env(), so the figures include our adapters' Python work. A backend that is
not installed is skipped and named in the report.

- **raw env steps/s**: a fresh process per (backend, round) makes `--num-envs` envs, steps them `--warmup` times with
  random actions, then times `--env-steps` more vector steps; env steps/s = vector steps * num_envs / seconds.
- **script SPS**: each script in `--scripts` runs with `--env-backend B --total-timesteps N` at two budgets, and the
  marginal steps/s (n2 - n1) / (t2 - t1) removes the start-up costs (imports, env and network creation).
  `--script-flags` is added to every run (e.g. "--torch-threads 1 --env-threads 1").

Each round runs the backends one after the other in the same order, so a drifting machine hits them alike; the
median over rounds is reported, with every round's figure and the ratios to gymnasium. Measure on an otherwise idle
machine: timings taken beside other work are not comparable. Writes <out>.json; prints a table.
"""

import argparse
import datetime
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.run import machine_info  # noqa: E402

BACKENDS = ("gymnasium", "ale-vector")
# Run in a fresh interpreter per measurement: one backend's threads and imports do not slow the next one.
ENV_PROBE = """
import json, sys, time
import numpy as np
sys.path.insert(0, sys.argv[1])
import ppo_atari as P
backend, env_id, num_envs, threads, warmup, steps = sys.argv[2], sys.argv[3], *map(int, sys.argv[4:8])
P.check_atari_env(env_id)
envs = P.make_vector_env(P.Args(env_id=env_id, env_backend=backend, num_envs=num_envs, env_threads=threads), "", 1)
envs.reset(seed=1)
rng = np.random.default_rng(0)
actions = rng.integers(0, envs.single_action_space.n, (warmup + steps, num_envs))
for t in range(warmup):
    envs.step(actions[t])
start = time.perf_counter()
for t in range(warmup, warmup + steps):
    envs.step(actions[t])
seconds = time.perf_counter() - start
envs.close()
print(json.dumps({"env_steps_per_s": steps * num_envs / seconds}))
"""


def installed(backend: str) -> bool:
    probe = {"gymnasium": "import ale_py", "ale-vector": "import ale_py.vector_env"}[backend]
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


def env_steps_per_s(backend: str, env_id: str, num_envs: int, threads: int, warmup: int, steps: int) -> float:
    args = [str(ROOT), backend, env_id, str(num_envs), str(threads), str(warmup), str(steps)]
    proc = subprocess.run([sys.executable, "-c", ENV_PROBE, *args], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"env probe failed for {backend} ({proc.returncode}):\n{proc.stderr[-1500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["env_steps_per_s"]


def script_seconds(script: str, backend: str, env_id: str, steps: int, flags: list) -> float:
    with tempfile.TemporaryDirectory(prefix="env-backends-") as runs_dir:
        cmd = [sys.executable, str(ROOT / script), "--env-id", env_id, "--env-backend", backend, "--total-timesteps",
               str(steps), "--checkpoint-interval", "0", "--no-progress", "--runs-dir", runs_dir, *flags]  # fmt: skip
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "WANDB_MODE": "disabled"})
        seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{shlex.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-1500:]}")
    return seconds


def median(values: list) -> Optional[float]:
    """The median of the rounds that measured something (None: a round whose larger budget was not slower)."""
    valid = [v for v in values if v is not None]
    return statistics.median(valid) if valid else None


def summary(values: list, reference: Optional[list]) -> dict:
    mid, ref = median(values), median(reference or [])
    out = {"median": None if mid is None else round(mid, 1), "per_rep": [None if v is None else round(v, 1) for v in values]}
    if mid is not None and ref:
        out["vs_gymnasium"] = round(mid / ref, 3)
    return out


def fmt(value: Optional[float]) -> str:
    return f"{value:>14,.0f}" if value is not None else f"{'n/a':>14}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env-id", default="BreakoutNoFrameskip-v4")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated, from " + ", ".join(BACKENDS))
    parser.add_argument("--reps", type=int, default=3, help="rounds; the issue asks for at least 3")
    parser.add_argument("--num-envs", type=int, default=8, help="envs of the raw measurement (ppo_atari's default)")
    parser.add_argument("--env-threads", type=int, default=0, help="ale-vector threads (0: one per core)")
    parser.add_argument("--warmup", type=int, default=200, help="vector steps before the raw timing")
    parser.add_argument("--env-steps", type=int, default=5_000, help="timed vector steps of the raw measurement")
    parser.add_argument("--scripts", default="ppo_atari.py,a2c_atari.py", help="comma-separated; empty: no script SPS")
    parser.add_argument("--n1", type=int, default=10_240, help="the smaller budget of the script runs (agent steps)")
    parser.add_argument("--n2", type=int, default=51_200, help="the larger budget")
    parser.add_argument("--script-flags", default="", help="flags added to every script run, as one string")
    parser.add_argument("--out", type=Path, default=None, help="write <out>.json")
    args = parser.parse_args()
    backends = [b for b in args.backends.split(",") if b]
    if not set(backends) <= set(BACKENDS) or args.reps < 1 or args.n2 <= args.n1:
        parser.error(f"--backends from {BACKENDS}, --reps >= 1 and --n2 > --n1")
    skipped = [b for b in backends if not installed(b)]
    backends = [b for b in backends if b not in skipped]
    scripts = [s for s in args.scripts.split(",") if s]
    flags = shlex.split(args.script_flags)

    raw = {b: [] for b in backends}
    sps = {s: {b: [] for b in backends} for s in scripts}
    for rep in range(args.reps):
        for b in backends:
            raw[b].append(env_steps_per_s(b, args.env_id, args.num_envs, args.env_threads, args.warmup, args.env_steps))
            print(f"round {rep + 1}: {b} raw {raw[b][-1]:,.0f} env steps/s", flush=True)
        for s in scripts:
            for b in backends:
                t1 = script_seconds(s, b, args.env_id, args.n1, flags)
                t2 = script_seconds(s, b, args.env_id, args.n2, flags)
                # budgets too close for the noise: no figure rather than a huge one
                sps[s][b].append((args.n2 - args.n1) / (t2 - t1) if t2 > t1 else None)
                print(f"round {rep + 1}: {s} on {b}: {fmt(sps[s][b][-1]).strip()} SPS", flush=True)

    report = {
        "command": shlex.join([sys.executable, *sys.argv]),
        "date": datetime.date.today().isoformat(),
        "env_id": args.env_id,
        "reps": args.reps,
        "skipped_not_installed": skipped,
        "raw_env_steps_per_s": {
            "num_envs": args.num_envs, "env_threads": args.env_threads, "timed_vector_steps": args.env_steps,
            **{b: summary(raw[b], raw.get("gymnasium")) for b in backends},
        },
        "script_sps": {
            "budgets": [args.n1, args.n2], "flags": args.script_flags,
            **{s: {b: summary(sps[s][b], sps[s].get("gymnasium")) for b in backends} for s in scripts},
        },
        "machine": machine_info(sys.executable),
    }  # fmt: skip
    print(f"\n{'':<22}" + "".join(f"{b:>14}" for b in backends))
    print(f"{'raw env steps/s':<22}" + "".join(fmt(median(raw[b])) for b in backends))
    for s in scripts:
        print(f"{s + ' SPS':<22}" + "".join(fmt(median(sps[s][b])) for b in backends))
    if skipped:
        print(f"not installed, skipped: {', '.join(skipped)}")
    if args.out is not None:
        path = args.out.with_suffix(".json")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
