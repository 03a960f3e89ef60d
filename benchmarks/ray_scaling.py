"""Where sac_continuous_ray.py's time goes, and how it scales with rollout workers, on this machine.

    python benchmarks/ray_scaling.py --out benchmarks/results/sac_continuous_ray_scaling [--seconds 45] [--workers 1 2 4]

Part 1, per-part costs (the numbers the README's scaling model rests on), measured in this process and on a small
embedded Ray:
  - a worker's env step + numpy actor, per transition (in-process, no Ray);
  - a worker batch through Ray: collect() on a remote worker, driver round trip, forward to a shard: per batch;
  - the learner's gradient step at batch 256 (critic, and the amortized delayed actor + temperature, + Polyak);
  - sampling: one request of 16 batches of 256 from a shard actor to the driver, per batch;
  - weight sync: the learner publishing to the parameter server plus one worker pull.
Part 2, the script itself, run as a user runs it, one configuration at a time (nothing else should run): the learner
paused (sampling alone), utd 1 and utd 0, with 1, 2 and 4 workers, and sac_continuous.py beside them. Each run gets
SIGINT after --seconds; its rate is the slope of global_step over wall time between the TensorBoard events logged after
the warm-up (the first third of the run, and learning_starts).

Part 3 (--overhead-reps N): sac_continuous.py and sac_continuous_ray.py with 2 workers at utd 1, in turn, N times
each, for the wall-clock ratio at the same env steps (medians).

Writes <out>.json (figures, commands, machine) and prints markdown tables.
"""

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.run import machine_info  # noqa: E402

ENV_ID = "HalfCheetah-v4"
LEARNING_STARTS = 1_000


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def part_costs() -> dict:
    import ray
    import torch

    import sac_continuous_ray as sr

    sr.quiet_mujoco_warnings()
    costs = {}
    obs_dim, act_dim = 17, 6

    # a worker's own cost: env step + its Actor module (no Ray)
    server, weights = sr.ParameterServer(), sr.actor_weights(sr.Actor(obs_dim, act_dim))
    server.publish(weights, 0)
    worker = sr.RolloutWorker(0, ENV_ID, 1, 0, server)
    worker.collect(200, 0)
    costs["worker_step_us"] = median_time(lambda: worker.collect(1_000, 0), 5) / 1_000 * 1e6

    # the learner's gradient step at batch 256 (as the loop runs it, with policy_frequency 2), on every core (the
    # in-process worker above set torch to one thread, as workers do)
    torch.set_num_threads(len(os.sched_getaffinity(0)))

    class A:  # the Args fields Learner reads
        autotune, alpha, policy_lr, q_lr, squash_eps = True, 0.2, 3e-4, 1e-3, 0.0

    learner = sr.Learner(obs_dim, act_dim, -np.ones(act_dim), np.ones(act_dim), A, torch.device("cpu"))
    batch = {
        "obs": torch.randn(256, obs_dim),
        "next_obs": torch.randn(256, obs_dim),
        "actions": torch.rand(256, act_dim),
        "rewards": torch.randn(256),
        "terminated": torch.zeros(256),
    }

    def two_steps():
        for _ in range(2):
            sr.critic_update(learner, batch, 0.99)
            sr.soft_update(learner.qf_target, learner.qf, 0.005)
        for _ in range(2):
            sr.actor_update(learner, batch["obs"], True)

    for _ in range(20):
        two_steps()
    costs["learner_step_ms"] = median_time(lambda: [two_steps() for _ in range(25)], 5) / 50 * 1e3
    costs["learner_threads"] = torch.get_num_threads()

    # through Ray
    ray.init(num_cpus=4, include_dashboard=False, logging_level="WARNING")
    try:
        ps = ray.remote(sr.ParameterServer).options(name="ps", num_cpus=0).remote()
        ray.get(ps.publish.remote(weights, 0))
        remote_worker = ray.remote(sr.RolloutWorker).options(num_cpus=1).remote(0, ENV_ID, 1, 0, "ps")
        shard = ray.remote(sr.BufferShard).options(num_cpus=0).remote(100_000, obs_dim, act_dim, 0)
        steps = 100

        def batch_through_ray():
            batch_ref, stats_ref = remote_worker.collect.options(num_returns=2).remote(steps, 0)
            ray.get(stats_ref)
            ray.get(shard.add.remote(batch_ref))

        for _ in range(10):
            batch_through_ray()
        per_batch = median_time(batch_through_ray, 30)
        costs["ray_batch_of_100_ms"] = per_batch * 1e3
        costs["ray_overhead_per_transition_us"] = (per_batch / steps - costs["worker_step_us"] / 1e6) * 1e6
        costs["bytes_per_transition"] = sr.ReplayBuffer(1, obs_dim, act_dim).nbytes
        for _ in range(40):
            batch_through_ray()  # fill the shard a little

        def driver_harvest():  # the driver's share of a batch: read its stats, forward its ref to the shard
            refs = [remote_worker.collect.options(num_returns=2).remote(steps, 0) for _ in range(20)]
            ray.wait([s for _, s in refs], num_returns=len(refs))
            t0 = time.perf_counter()
            for batch_ref, stats_ref in refs:
                ray.get(stats_ref)
                shard.add.remote(batch_ref)
            elapsed = time.perf_counter() - t0
            ray.get(shard.size.remote())
            return elapsed / len(refs)

        costs["driver_per_batch_ms"] = float(np.median([driver_harvest() for _ in range(5)])) * 1e3
        costs["actor_call_roundtrip_ms"] = median_time(lambda: ray.get(shard.size.remote()), 50) * 1e3
        ready = remote_worker.collect.options(num_returns=2).remote(steps, 0)[0]
        ray.wait([ready])
        costs["shard_add_100_ms"] = median_time(lambda: ray.get(shard.add.remote(ready)), 30) * 1e3
        costs["sample_16x256_ms"] = median_time(lambda: ray.get(shard.sample.remote(16 * 256)), 30) * 1e3
        costs["sample_per_batch_ms"] = costs["sample_16x256_ms"] / 16

        def sync():
            ray.get(ps.publish.remote(weights, int(time.time() * 1e6)))
            ray.get(remote_worker.sync_weights.remote())

        costs["weight_sync_ms"] = median_time(sync, 30) * 1e3
        costs["weights_bytes"] = int(sum(w.nbytes for w in weights.values()))
    finally:
        ray.shutdown()
    return costs


def events_rate(run_dir: Path, min_step: int, skip_fraction: float) -> dict:
    """Slopes of global_step and of the update count over wall time, from the events logged after the warm-up."""
    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(str(run_dir), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    events = [e for e in acc.Scalars("charts/SPS")]
    if not events:
        return {}
    t0 = events[0].wall_time
    span = events[-1].wall_time - t0
    kept = [e for e in events if e.step >= min_step and e.wall_time - t0 >= skip_fraction * span]
    if len(kept) < 3:
        return {}
    steps = np.array([e.step for e in kept], float)
    walls = np.array([e.wall_time for e in kept])
    out = {"env_steps_per_s": float(np.polyfit(walls, steps, 1)[0]), "windows": len(kept)}
    tags = acc.Tags()["scalars"]
    if "charts/updates_per_second" in tags:
        ups = [e.value for e in acc.Scalars("charts/updates_per_second") if e.step >= steps[0]]
        out["updates_per_s"] = float(np.median(ups))
    if "charts/learner_busy" in tags:
        out["learner_busy"] = float(np.median([e.value for e in acc.Scalars("charts/learner_busy") if e.step >= steps[0]]))
    if "charts/update_us_per_step" in tags:  # sac_continuous.py: one update per step in the learning phase
        out["updates_per_s"] = out["env_steps_per_s"]
    return out


def run_for(script: str, flags: list, seconds: float, runs_dir: Path) -> dict:
    cmd = [
        sys.executable,
        str(ROOT / script),
        "--env-id",
        ENV_ID,
        "--total-timesteps",
        "100000000",
        "--runs-dir",
        str(runs_dir),
        "--checkpoint-interval",
        "0",
        "--learning-starts",
        str(LEARNING_STARTS),
        *flags,
    ]
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    time.sleep(seconds)
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    run_dir = next(d for d in runs_dir.iterdir() if d.is_dir())
    return {"command": " ".join(cmd[1:]), **events_rate(run_dir, LEARNING_STARTS + 500, 1 / 3)}


def part_scaling(seconds: float, workers: list) -> list:
    configs = [("sac_continuous.py", "sac_continuous.py (baseline)", [])]
    for batch_steps in (100, 1000):  # the default batch, and one that makes Ray's per-batch cost 10x rarer
        for n in workers:
            configs.append(
                (
                    "sac_continuous_ray.py",
                    f"paused learner, {n} workers, batches of {batch_steps}",
                    [
                        "--num-rollout-workers",
                        str(n),
                        "--pause-learner",
                        "--log-interval",
                        "5000",
                        "--worker-batch-steps",
                        str(batch_steps),
                    ],
                )
            )
    for n in workers:
        configs.append(("sac_continuous_ray.py", f"utd 1, {n} workers", ["--num-rollout-workers", str(n)]))
    for n in workers[:2]:
        configs.append(
            (
                "sac_continuous_ray.py",
                f"utd 0 (async), {n} workers",
                ["--num-rollout-workers", str(n), "--utd-ratio", "0", "--log-interval", "1000"],
            )
        )
    rows = []
    for script, label, flags in configs:
        with tempfile.TemporaryDirectory() as tmp:
            result = run_for(script, flags, seconds, Path(tmp))
        rows.append({"config": label, **result})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def part_overhead(seconds: float, reps: int) -> dict:
    """sac_continuous.py and sac_continuous_ray.py (2 workers, utd 1) in turn, `reps` times each: the learning-phase
    rates, their medians, and the wall-clock ratio (ray time / single-process time for the same env steps)."""
    runs = {"sac_continuous.py": [], "sac_continuous_ray.py, 2 workers, utd 1": []}
    for _ in range(reps):
        for label, script, flags in (
            ("sac_continuous.py", "sac_continuous.py", []),
            ("sac_continuous_ray.py, 2 workers, utd 1", "sac_continuous_ray.py", ["--num-rollout-workers", "2"]),
        ):
            with tempfile.TemporaryDirectory() as tmp:
                runs[label].append(run_for(script, flags, seconds, Path(tmp)).get("env_steps_per_s"))
            print(label, runs[label][-1], flush=True)
    medians = {label: float(np.median(rates)) for label, rates in runs.items()}
    base, ray_rate = medians.values()
    return {"rates": runs, "medians": medians, "wall_clock_ratio": base / ray_rate}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=45.0)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--skip-costs", action="store_true")
    parser.add_argument("--skip-scaling", action="store_true")
    parser.add_argument("--overhead-reps", type=int, default=0, help="also run part 3 (overhead) this many times")
    args = parser.parse_args()
    report = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "env_id": ENV_ID,
        "machine": machine_info(sys.executable),
    }
    if not args.skip_costs:
        report["costs"] = part_costs()
        print(json.dumps(report["costs"], indent=1), flush=True)
    if not args.skip_scaling:
        report["scaling"] = part_scaling(args.seconds, args.workers)
        print("\n| configuration | env steps/s | updates/s | learner busy |\n|---|---|---|---|")
        for row in report["scaling"]:
            ups = row.get("updates_per_s")
            busy = row.get("learner_busy")
            print(
                f"| {row['config']} | {row.get('env_steps_per_s', float('nan')):.0f} | "
                f"{'-' if ups is None else f'{ups:.0f}'} | {'-' if busy is None else f'{busy:.2f}'} |"
            )
    if args.overhead_reps:
        report["overhead"] = part_overhead(args.seconds, args.overhead_reps)
        print(json.dumps(report["overhead"], indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
