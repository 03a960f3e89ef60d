"""Throughput of a script alone and with a second copy running beside it (the way seeds are run side by side).

For each of `--reps` rounds: the command alone at two budgets, then two copies at once at the same two budgets;
the marginal steps/s (n2 - n1) / (t2 - t1) removes start-up cost. Prints the medians and the ratios the project's
defaults are held to: two at once, each keeps >= 80 % of its alone speed.

    python benchmarks/concurrency.py --n1 4096 --n2 20480 --reps 3 -- \
        python ppo_continuous.py --env-id HalfCheetah-v4 --total-timesteps {steps} --runs-dir {dir}
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
import time


def launch(command: list, steps: int) -> subprocess.Popen:
    folder = tempfile.mkdtemp(prefix="concurrency-")
    args = [word.format(steps=steps, dir=folder) for word in command]
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def timed(command: list, steps: int, copies: int) -> list:
    start = time.perf_counter()
    procs = [launch(command, steps) for _ in range(copies)]
    times = []
    for proc in procs:
        _, err = proc.communicate()
        if proc.returncode != 0:
            sys.exit(f"command failed ({proc.returncode}):\n{err[-1500:]}")
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    argv = sys.argv[1:]
    split = argv.index("--")
    parser = argparse.ArgumentParser()
    parser.add_argument("--n1", type=int, required=True)
    parser.add_argument("--n2", type=int, required=True)
    parser.add_argument("--reps", type=int, default=3)
    ns, command = parser.parse_args(argv[:split]), argv[split + 1 :]
    alone, together = [], []
    for _ in range(ns.reps):
        a1, a2 = timed(command, ns.n1, 1)[0], timed(command, ns.n2, 1)[0]
        alone.append((ns.n2 - ns.n1) / (a2 - a1))
        t1, t2 = timed(command, ns.n1, 2), timed(command, ns.n2, 2)
        together.append([(ns.n2 - ns.n1) / (b - a) for a, b in zip(t1, t2)])
    alone_sps = statistics.median(alone)
    each = [statistics.median(run[i] for run in together) for i in range(2)]
    print(f"alone: {alone_sps:.0f} SPS (per rep {[round(x) for x in alone]})")
    print(f"two at once: {each[0]:.0f} and {each[1]:.0f} SPS (per rep {[[round(x) for x in r] for r in together]})")
    print(f"two at once / alone: {each[0] / alone_sps:.2f} and {each[1] / alone_sps:.2f}")


if __name__ == "__main__":
    main()
