"""Steps per second of one of our scripts against the reference implementation of the same algorithm, side by side.

    uv run benchmarks/speed_vs_reference.py --setup --cleanrl ../cleanrl        # once: the reference's own venv
    uv run benchmarks/speed_vs_reference.py ppo_continuous.py --cleanrl ../cleanrl --reps 5

The references: CleanRL's scripts (ppo_continuous_action.py, sac_continuous_action.py, ppo_atari.py) from a clone
you make yourself, checked out at CLEANRL_COMMIT:

    git clone https://github.com/vwxyzjn/cleanrl ../cleanrl && git -C ../cleanrl checkout <CLEANRL_COMMIT>

and Stable-Baselines3's `A2C` from PyPI for a2c_atari.py (CleanRL has no Atari A2C; benchmarks/sb3_a2c.py runs it).
They run in their own virtual environment (`--setup` builds it in --reference-dir with pip: the pinned stack of
REFERENCE_PACKAGES, CleanRL's gymnasium 0.29 with MuJoCo 2.3.7, and the Atari ROMs taken from a current ale-py
wheel, since the ale-py 0.8 that gymnasium 0.29 wants ships none). Nothing of the references is copied here.

The method: both commands at default hyperparameters on the same env, each at two budgets (BUDGETS; SAC's both past
its 5,000 random steps, so the difference is learning-phase steps); the marginal rate (n2 - n1) / (t2 - t1) removes
start-up (imports, env creation). The runs alternate ours, reference, ours, reference within a rep, so a machine
that drifts slows both alike; the figure is the median over reps of each, and the ratio is ours / reference of the
medians. Run it on an otherwise idle machine: a 2-core VM varies by ±15 % between reps.
"""

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
CLEANRL_COMMIT = "fe8d8a03c41a7ef5b523e2e354bd01c363e786bb"  # CleanRL's scripts measured here; unchanged since 004f8a0
REFERENCE_PACKAGES = [
    "torch==2.13.0",
    "gymnasium[mujoco,atari]==0.29.1",
    "mujoco==2.3.7",
    "tyro",
    "tensorboard",
    "stable-baselines3==2.3.2",
    "opencv-python-headless",
    "numpy<2",
]
ROMS_FROM = "ale-py==0.12.1"  # a wheel that bundles the Atari ROMs
# script: (env id, n1, n2, the reference: a CleanRL script or "sb3_a2c")
BUDGETS = {
    "ppo_continuous.py": ("HalfCheetah-v4", 4096, 20480, "ppo_continuous_action.py"),
    "sac_continuous.py": ("HalfCheetah-v4", 5500, 7500, "sac_continuous_action.py"),
    "ppo_atari.py": ("BreakoutNoFrameskip-v4", 2048, 10240, "ppo_atari.py"),
    "a2c_atari.py": ("BreakoutNoFrameskip-v4", 4000, 16000, "sb3_a2c"),
}


# ---- the measurement (pure but for the clock and the commands) ----
def marginal_sps(n1: int, n2: int, t1: float, t2: float) -> float:
    """Steps per second between two budgets: the start-up both runs pay cancels out."""
    if t2 <= t1:
        raise ValueError(f"the {n2}-step run ({t2:.2f} s) was not slower than the {n1}-step run ({t1:.2f} s)")
    return (n2 - n1) / (t2 - t1)


def measure(run_ours: Callable[[int], float], run_reference: Callable[[int], float], n1: int, n2: int, reps: int) -> dict:
    """Per rep: ours at n1, the reference at n1, ours at n2, the reference at n2 (each call returns its seconds);
    the marginal rates of every rep, their medians and the ratio of the medians."""
    ours, reference = [], []
    for _ in range(reps):
        a1 = run_ours(n1)
        b1 = run_reference(n1)
        a2 = run_ours(n2)
        b2 = run_reference(n2)
        ours.append(marginal_sps(n1, n2, a1, a2))
        reference.append(marginal_sps(n1, n2, b1, b2))
    ours_sps, reference_sps = statistics.median(ours), statistics.median(reference)
    return {
        "ours_sps": ours_sps,
        "reference_sps": reference_sps,
        "ratio": ours_sps / reference_sps,
        "reps": reps,
        "per_rep": {"ours": ours, "reference": reference},
    }


def timed_command(template: str, env: dict) -> Callable[[int], float]:
    """A runner: the shell command `template` with {steps} filled in, in a fresh temporary folder (its runs/ land
    there); returns its wall time in seconds, or stops with the command's last output if it fails."""

    def run(steps: int) -> float:
        with tempfile.TemporaryDirectory(prefix="speed-") as folder:
            command = template.format(steps=steps)
            start = time.perf_counter()
            proc = subprocess.run(command, shell=True, cwd=folder, env=env, capture_output=True, text=True)
            elapsed = time.perf_counter() - start
        if proc.returncode != 0:
            sys.exit(f"{(proc.stdout + proc.stderr)[-2000:]}\nfailed ({proc.returncode}): {command}")
        return elapsed

    return run


# ---- the commands ----
def reference_python(reference_dir: Path) -> Path:
    return reference_dir / "venv" / "bin" / "python"


def commands(script: str, python: str, cleanrl: Path, reference_dir: Path) -> tuple:
    """(ours, reference) shell templates with {steps}; both at default hyperparameters, on the CPU."""
    env_id, _, _, reference = BUDGETS[script]
    q = shlex.quote
    ours = f"{q(python)} {q(str(ROOT / script))} --env-id {env_id} --total-timesteps {{steps}} --no-cuda"
    ref_python = q(str(reference_python(reference_dir)))
    if reference == "sb3_a2c":
        ref = f"{ref_python} {q(str(ROOT / 'benchmarks' / 'sb3_a2c.py'))} {{steps}} --env-id {env_id}"
    else:
        # CleanRL's scripts import cleanrl_utils from the clone's top level: on the path, wherever the command runs
        script_path = q(str(cleanrl / "cleanrl" / reference))
        ref = (
            f"PYTHONPATH={q(str(cleanrl))} {ref_python} {script_path} --env-id {env_id} --total-timesteps {{steps}} --no-cuda"
        )
    return ours, ref


def check_cleanrl(cleanrl: Path) -> None:
    if not (cleanrl / "cleanrl" / "ppo_continuous_action.py").is_file():
        sys.exit(f"{cleanrl} is not a CleanRL clone: git clone https://github.com/vwxyzjn/cleanrl {cleanrl}")
    head = subprocess.run(["git", "-C", str(cleanrl), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    if head != CLEANRL_COMMIT:
        print(f"note: {cleanrl} is at {head or 'an unknown commit'}, not {CLEANRL_COMMIT}", file=sys.stderr)


def setup(reference_dir: Path) -> None:
    """The reference's virtual environment: REFERENCE_PACKAGES, then the Atari ROMs imported from ROMS_FROM's wheel."""
    venv = reference_dir / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    subprocess.run([*pip, "install", "-q", *REFERENCE_PACKAGES], check=True)
    wheels = reference_dir / "roms-wheel"
    subprocess.run([*pip, "download", "-q", "--no-deps", "-d", str(wheels), ROMS_FROM], check=True)
    (wheel,) = wheels.glob("ale_py-*.whl")
    roms = reference_dir / "roms"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(roms, [name for name in archive.namelist() if name.startswith("ale_py/roms/")])
    subprocess.run([str(venv / "bin" / "ale-import-roms"), str(roms / "ale_py" / "roms")], check=True, capture_output=True)
    print(f"reference environment ready: {reference_python(reference_dir)}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("script", nargs="?", choices=sorted(BUDGETS), help="our script to measure")
    parser.add_argument("--cleanrl", type=Path, help=f"a CleanRL clone at {CLEANRL_COMMIT[:12]}")
    parser.add_argument("--reference-dir", type=Path, default=ROOT / "benchmarks" / "reference", help="its venv")
    parser.add_argument("--setup", action="store_true", help="build the reference's virtual environment, then exit")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--python", default=sys.executable, help="our interpreter (default: this one)")
    parser.add_argument("--ours", help="override our command: a shell template with {steps} (for tests)")
    parser.add_argument("--reference", help="override the reference's command: a shell template with {steps}")
    parser.add_argument("--n1", type=int)
    parser.add_argument("--n2", type=int)
    args = parser.parse_args(argv)
    if args.setup:
        setup(args.reference_dir)
        return 0
    if args.script is None and not (args.ours and args.reference):
        parser.error("name a script (or give both --ours and --reference)")
    ours, reference = args.ours, args.reference
    n1, n2 = args.n1, args.n2
    if args.script:
        _, default_n1, default_n2, _ = BUDGETS[args.script]
        n1, n2 = n1 or default_n1, n2 or default_n2
        if ours is None or reference is None:
            if args.cleanrl is None and BUDGETS[args.script][3] != "sb3_a2c":
                parser.error("--cleanrl: a clone of https://github.com/vwxyzjn/cleanrl")
            if args.cleanrl is not None:
                check_cleanrl(args.cleanrl)
            if not reference_python(args.reference_dir).is_file():
                parser.error(f"no reference environment in {args.reference_dir}: run with --setup first")
            default_ours, default_reference = commands(args.script, args.python, args.cleanrl or Path("."), args.reference_dir)
            ours, reference = ours or default_ours, reference or default_reference
    if not (n1 and n2 and n2 > n1):
        parser.error("--n1 and --n2 with n2 > n1")
    env = {**os.environ, "WANDB_MODE": "disabled"}
    result = measure(timed_command(ours, env), timed_command(reference, env), n1, n2, args.reps)
    for who, command in (("ours", ours), ("reference", reference)):
        rates = ", ".join(f"{x:.0f}" for x in result["per_rep"][who])
        print(f"{who:<10} {result[who + '_sps']:8.1f} SPS (per rep {rates}): {command}")
    print(f"ratio {result['ratio']:.2f} (median of {args.reps} reps each, marginal steps/s between {n1} and {n2} steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
