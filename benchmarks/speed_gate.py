"""Old against new: each script's marginal throughput in two checkouts, side by side (the `sps.py` tool of the
shared tools, which alternates A, B, A, B and reports the median ratio). Run it alone on the machine.

    python benchmarks/speed_gate.py --old ../baseline --sps ../shared/tools/sps.py --reps 5 [--only ppo_continuous]

Each script runs at two budgets with its default hyperparameters (the SAC scripts with a shorter random-action
warm-up so that both budgets include gradient steps); the printed ratio is new / old."""

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# script: (extra flags, n1, n2, flags the OLD checkout needs to run the same math as the new default)
SETUPS = {
    "ppo_continuous": ("--env-id HalfCheetah-v4", 4096, 20480, ""),
    "ppo_atari": ("--env-id BreakoutNoFrameskip-v4", 1024, 5120, ""),
    "a2c_atari": ("--env-id BreakoutNoFrameskip-v4", 800, 4800, ""),
    "sac_continuous": ("--env-id HalfCheetah-v4 --learning-starts 200", 400, 1400, "--no-bf16"),
    "sac_continuous_ray": ("--env-id HalfCheetah-v4 --learning-starts 200", 600, 2600, "--no-bf16"),
}


def command(checkout: Path, script: str, extra: str) -> str:
    flags, _, _, _ = SETUPS[script]
    return (
        f"{sys.executable} {checkout / (script + '.py')} {flags} {extra} --total-timesteps {{steps}} "
        f"--runs-dir {{dir}} --checkpoint-interval 0"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, required=True, help="the old checkout (e.g. a git worktree)")
    parser.add_argument("--sps", type=Path, required=True, help="the sps.py tool")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--min-ratio", type=float, default=0.95)
    parser.add_argument("--only", nargs="*", default=list(SETUPS), choices=list(SETUPS))
    ns = parser.parse_args()
    failed = []
    for script in ns.only:
        _, n1, n2, old_extra = SETUPS[script]
        proc = subprocess.run(
            [
                sys.executable,
                str(ns.sps),
                "--a",
                command(ROOT, script, ""),
                "--b",
                command(ns.old.resolve(), script, old_extra),
                "--n1",
                str(n1),
                "--n2",
                str(n2),
                "--reps",
                str(ns.reps),
                "--min-ratio",
                str(ns.min_ratio),
                "--label",
                f"{script} new/old",
            ],
            cwd=ROOT,
        )
        if proc.returncode != 0:
            failed.append(script)
        sys.stdout.flush()
    print("below the gate:", failed or "none")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
