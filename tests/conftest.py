"""Helpers shared by the tests: run a top-level script as a user would, and read what it logged."""

import contextlib
import ctypes.util
import os
import random
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

# Each pytest-xdist worker shares the machine with another (one per core): its in-process torch work takes one
# thread. Why: torch's default, a thread per core, spins against the other worker's run and slows both many times.
torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.run import read_scalars  # noqa: E402  (the harness's reader: one implementation for both)
from tests.fork_runner import run_python  # noqa: E402

# Why: run under `uv run` (the README's test command), Ray 2.60 starts every worker process through `uv run` too,
# to copy the driver's environment to other machines; on one machine that only re-checks the environment at each
# worker start (measured: a two-node test took 171 s in the suite, 37 s without it). Set before any test imports ray.
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

# Every subprocess run gets these: wandb off unless a test turns it on. MUJOCO_GL is left as a user leaves it: the scripts
# ask for EGL themselves when they render headless (forcing it here failed every MuJoCo test where libEGL is missing).
BASE_ENV = {"WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1"}


def needs_mujoco_rendering():
    """Skip where MuJoCo cannot render: no display and no libEGL (a GPU server without it; the scripts then stop with a
    message, tested in test_ppo_continuous_e2e.py)."""
    if not os.environ.get("DISPLAY") and ctypes.util.find_library("EGL") is None:
        pytest.skip("MuJoCo renders headless through libEGL, which this machine lacks")


def run_script(
    script: str, *args, timeout: float = 300, env: dict = None, cwd: Path = ROOT, stop_when=None
) -> subprocess.CompletedProcess:
    """`python ROOT/script *args` as a user runs it: its exit code, stdout and stderr. A script that may start Ray runs
    in a fresh interpreter; the others on the fork server (tests/fork_runner.py: the same run, without re-importing
    torch each time)."""
    full_env = {**os.environ, **BASE_ENV, **(env or {})}
    full_env = {k: v for k, v in full_env.items() if v is not None}  # env={"VAR": None} unsets VAR
    return run_python(ROOT / script, args, cwd, full_env, timeout, fork="ray" not in Path(script).name, stop_when=stop_when)


def only_run_dir(runs_dir: Path) -> Path:
    dirs = [d for d in runs_dir.iterdir() if d.is_dir()]
    assert len(dirs) == 1, f"expected one run folder in {runs_dir}, found {dirs}"
    return dirs[0]


def scalars(run_dir: Path, tag: str) -> dict:
    """{global_step: value} of one TensorBoard tag (resumed runs: the values TensorBoard shows)."""
    steps, values = read_scalars(run_dir, tag)
    return dict(zip(steps.tolist(), values.tolist()))


def wait_until(reached, timeout: float, what: str, proc: subprocess.Popen = None) -> None:
    """Poll reached() until it holds, before a test acts on a run (a Ctrl-C, a kill). Fails with what went wrong, never
    acts on a run that is elsewhere: "the run did not reach {what} within {timeout} s" (the run `proc`, if given, is
    then killed), or "the run ended (exit code N) before it reached {what}", each with the end of the run's stderr."""
    deadline = time.monotonic() + timeout
    while not reached():
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the run ended (exit code {proc.returncode}) before it reached {what}{stderr_tail(proc)}")
        if time.monotonic() >= deadline:
            kill_run(proc)
            pytest.fail(f"the run did not reach {what} within {timeout:.0f} s{stderr_tail(proc)}")
        time.sleep(0.3)


def kill_run(proc: subprocess.Popen) -> None:
    """SIGKILL a run the test started: its process group too when it leads one of its own (start_new_session)."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        if os.getpgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()


def stderr_tail(proc: subprocess.Popen, lines: int = 20) -> str:
    """The end of a finished (or killed) run's stderr, for a failure message ("" without a run or a pipe)."""
    if proc is None or proc.stderr is None:
        return ""
    try:
        _, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:  # the pipe is held by what the run started (Ray's workers): no end to read
        return "; its stderr is still held open by processes it started"
    err = err.decode(errors="replace") if isinstance(err, bytes) else err or ""
    return "; its stderr ended:\n" + "\n".join(err.strip().splitlines()[-lines:])


def output_after_ctrl_c(proc: subprocess.Popen, timeout: float) -> tuple:
    """(stdout, stderr) of a run sent a Ctrl-C, once it has exited. Fails with "the run did not exit within N s of its
    Ctrl-C" (and kills it) if it does not: a run saves at its iteration's end, then exits 130."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_run(proc)
        pytest.fail(f"the run did not exit within {timeout:.0f} s of its Ctrl-C (it saves, then exits 130){stderr_tail(proc)}")


def wait_for_updates(run_dir_parent: Path, n: int = 2, timeout: float = 120, proc: subprocess.Popen = None) -> None:
    """Wait until the one run under run_dir_parent has logged n learner updates (losses/qf1_loss), or fail (wait_until)."""

    def logged() -> bool:
        events = list(run_dir_parent.glob("*/events.out.tfevents.*"))
        return bool(events) and len(scalars(events[0].parent, "losses/qf1_loss")) >= n

    wait_until(logged, timeout, f"{n} logged learner updates (losses/qf1_loss)", proc)


def last10_return(runs_dir: Path) -> float:
    """Mean return of the last 10 training episodes of the only run in runs_dir: the learning tests' measure, taken
    at the end of the run's whole fixed budget (where the run ends up, not its best stretch on the way)."""
    steps, values = read_scalars(only_run_dir(runs_dir), "charts/episodic_return")
    assert len(values) >= 10, f"only {len(values)} episodes finished"
    return float(np.mean(values[-10:]))


def episode_lines(stdout: str, episodes: int) -> list:
    """The returns of `tools/agent.py eval`'s (or export's) progress lines, `episode k/n: return R` (Atari:
    `game k/n: ...`): one per episode in order, as they finish, and their mean is the summary line's mean."""
    found = re.findall(r"^(?:episode|game) (\d+)/(\d+): return (-?[\d.]+)$", stdout, flags=re.M)
    assert [(int(k), int(n)) for k, n, _ in found] == [(k + 1, episodes) for k in range(episodes)], stdout
    returns = [float(r) for _, _, r in found]
    summary = re.search(r"(-?[\d.]+) \+- [\d.]+ over (\d+) (?:episodes|games)", stdout)
    assert summary and int(summary.group(2)) == episodes, stdout
    assert float(summary.group(1)) == pytest.approx(np.mean(returns), abs=0.01)
    return returns


def assert_clean_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    """A user error: exit code 2, a short message naming the problem, and no traceback wall."""
    assert proc.returncode == 2, f"rc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("error: "), proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 3, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, f"{needle!r} not in {proc.stderr!r}"


# ---- how the suite shares the machine: pytest-xdist workers, one per core (`-n logical` in pyproject.toml) ----
# Tests that start Ray carry the `ray` marker (pyproject.toml) and run one at a time, on one worker (the xdist group
# "ray"). Why: an embedded `ray.init()` on a machine where another test's `ray start` head is up may join that cluster
# instead of starting its own, and two Ray instances on 2 cores starve each other's timeouts. A test that is refused
# before Ray starts carries no marker: it runs anywhere.
# Modules whose module-scoped fixture trains a run: their tests stay on one worker, so the run is trained once.
SHARED_RUN_MODULES = {"test_benchmarks", "test_docs", "test_ppo_continuous_e2e", "test_sac_continuous_e2e"}


def xdist_group(item: pytest.Item) -> str:
    if item.get_closest_marker("ray"):
        return "ray"
    module = item.module.__name__.rsplit(".", 1)[-1]
    return module if module in SHARED_RUN_MODULES else ""


RUNNING = {}  # "item": the test this process runs now (set before its fixtures, so a module fixture sees its first user)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    RUNNING["item"] = item


def require_ray_marker(what: str) -> None:
    """Called by the tests' helpers that start Ray: a test without the marker fails at once, naming the fix, instead of
    running beside another Ray test (xdist gives it any worker)."""
    item = RUNNING.get("item")
    if item is not None and not item.get_closest_marker("ray"):
        pytest.fail(f"{item.nodeid} starts Ray ({what}) but has no @pytest.mark.ray: mark it (tests/conftest.py)")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    """Mark the groups above, and put the longest work first (the Ray group, then the learning tests): xdist hands
    out tests in this order, so the workers finish at about the same time instead of one waiting on a late long test."""
    for item in items:
        group = xdist_group(item)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lambda item: 0 if xdist_group(item) == "ray" else 1 if item.get_closest_marker("slow") else 2)


# ---- what a test changes in this process is put back after it (an in-process main() sets most of these) ----
# Why: the scripts' main() sets process-wide state (seed_everything: python's, numpy's and torch's global RNGs and
# cudnn.deterministic; parse_command_line: torch's thread count; Run.iterations: the SIGINT / SIGTERM handlers, put back
# by Run.close only when the loop ends normally; probe_env: MUJOCO_GL and MuJoCo's warning callback). Left as a test
# leaves them, the next test on the same xdist worker would start from them: a result that depends on the order.
# The signals whose handlers are put back: the scripts' and Ray's, and the usual others (not SIGALRM: pytest-timeout's).
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def flushes_denormals() -> bool:
    """Are float32 subnormals flushed to zero in this thread (FTZ / DAZ, torch.set_flush_denormal)?"""
    return bool((np.array([1e-39], np.float32) * np.float32(1.0))[0] == 0)


def torch_flags() -> dict:
    return {
        "cudnn.deterministic": torch.backends.cudnn.deterministic,
        "cudnn.benchmark": torch.backends.cudnn.benchmark,
        "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
        "cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "deterministic_algorithms": (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
        ),
        "default_dtype": torch.get_default_dtype(),
        "grad_enabled": torch.is_grad_enabled(),
    }


def set_torch_flags(flags: dict) -> None:
    torch.backends.cudnn.deterministic = flags["cudnn.deterministic"]
    torch.backends.cudnn.benchmark = flags["cudnn.benchmark"]
    torch.backends.cudnn.allow_tf32 = flags["cudnn.allow_tf32"]
    torch.backends.cuda.matmul.allow_tf32 = flags["cuda.matmul.allow_tf32"]
    torch.set_float32_matmul_precision(flags["float32_matmul_precision"])
    on, warn_only = flags["deterministic_algorithms"]
    if (on, warn_only) != torch_flags()["deterministic_algorithms"]:  # only then: its first call took 9.6 s (measured)
        torch.use_deterministic_algorithms(on, warn_only=warn_only)
    torch.set_default_dtype(flags["default_dtype"])
    torch.set_grad_enabled(flags["grad_enabled"])


def process_state() -> dict:
    """This process's settings that outlive a test (changed_settings compares two of these)."""
    mujoco = sys.modules.get("mujoco")
    return {
        "torch_threads": torch.get_num_threads(),
        "python_rng": random.getstate(),
        "numpy_rng": np.random.get_state(),
        "torch_rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None,
        "torch_flags": torch_flags(),
        "flush_denormal": flushes_denormals(),
        "signal_handlers": {sig: signal.getsignal(sig) for sig in SIGNALS},
        "environ": {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"},  # pytest sets it per phase
        "cwd": os.getcwd(),
        "argv": list(sys.argv),
        "mujoco_warning": mujoco.get_mju_user_warning() if mujoco else None,
    }


def changed_settings(before: dict, after: dict) -> list:
    """The names of the settings that differ between two process_state()s."""
    equal = {
        "torch_rng": torch.equal,
        "numpy_rng": lambda x, y: x[0] == y[0] and np.array_equal(x[1], y[1]) and x[2:] == y[2:],
        "cuda_rng": lambda x, y: x is None or y is None or all(map(torch.equal, x, y)),
    }
    return [name for name in before if not equal.get(name, lambda x, y: x == y)(before[name], after[name])]


def restore_process_state(saved: dict) -> None:
    if torch.get_num_threads() != saved["torch_threads"]:
        torch.set_num_threads(saved["torch_threads"])
    random.setstate(saved["python_rng"])
    np.random.set_state(saved["numpy_rng"])
    torch.set_rng_state(saved["torch_rng"])
    if saved["cuda_rng"] is not None:
        torch.cuda.set_rng_state_all(saved["cuda_rng"])
    if torch_flags() != saved["torch_flags"]:
        set_torch_flags(saved["torch_flags"])
    if flushes_denormals() != saved["flush_denormal"]:
        torch.set_flush_denormal(saved["flush_denormal"])
    for sig, handler in saved["signal_handlers"].items():
        if handler is not None and signal.getsignal(sig) is not handler:  # None: set outside Python, cannot be put back
            signal.signal(sig, handler)
    for name in os.environ.keys() - saved["environ"].keys() - {"PYTEST_CURRENT_TEST"}:
        del os.environ[name]
    os.environ.update({k: v for k, v in saved["environ"].items() if os.environ.get(k) != v})
    if os.getcwd() != saved["cwd"]:
        os.chdir(saved["cwd"])
    sys.argv[:] = saved["argv"]
    if "mujoco" in sys.modules:
        sys.modules["mujoco"].set_mju_user_warning(saved["mujoco_warning"])


@pytest.fixture(autouse=True)
def process_state_restored():
    """Every test ends with this process as it started (tests/test_process_state.py checks it): the settings in
    process_state(), and the warnings filters (pytest's own catch_warnings does that too, unless its plugin is off)."""
    saved = process_state()
    with warnings.catch_warnings():
        yield
    restore_process_state(saved)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)
