"""Helpers shared by the tests: run a top-level script as a user would, and read what it logged."""

import ctypes.util
import os
import re
import subprocess
import sys
import time
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


def wait_for_updates(run_dir_parent: Path, n: int = 2, timeout: float = 120) -> None:
    """Wait until the one run under run_dir_parent has logged n learner updates (losses/qf1_loss), or fail."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        events = list(run_dir_parent.glob("*/events.out.tfevents.*"))
        if events and len(scalars(events[0].parent, "losses/qf1_loss")) >= n:
            return
        time.sleep(0.3)
    pytest.fail("the run did not start learning")


def last10_return(runs_dir: Path) -> float:
    """Mean return of the last 10 training episodes of the only run in runs_dir (the learning tests' measure)."""
    steps, values = read_scalars(only_run_dir(runs_dir), "charts/episodic_return")
    assert len(values) >= 10, f"only {len(values)} episodes finished"
    return float(np.mean(values[-10:]))


def best_window_mean(values: np.ndarray, window: int = 10) -> float:
    """The best mean of `window` consecutive values (-inf when there are fewer)."""
    if len(values) < window:
        return -np.inf
    return float(np.convolve(values, np.ones(window) / window, mode="valid").max())


def best_last10(runs_dir: Path) -> float:
    """The best mean of 10 consecutive training episodes of the only run in runs_dir: a learning run's threshold is
    met once this reaches it (the run may then stop, reached_return); a broken copy must stay below it all along."""
    steps, values = read_scalars(only_run_dir(runs_dir), "charts/episodic_return")
    assert len(values) >= 10, f"only {len(values)} episodes finished"
    return best_window_mean(values)


def reached_return(runs_dir: Path, threshold: float):
    """stop_when for a learning run (run_script, run_copy, run_ray): True once 10 consecutive training episodes of
    the run in runs_dir averaged `threshold` or more; the run then gets a Ctrl-C and ends at its iteration's end."""

    def reached() -> bool:
        dirs = [d for d in runs_dir.iterdir() if d.is_dir()] if runs_dir.is_dir() else []
        if len(dirs) != 1:
            return False
        _, values = read_scalars(dirs[0], "charts/episodic_return")
        return best_window_mean(values) >= threshold

    return reached


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
# Tests that start Ray run one at a time, on one worker. Why: an embedded `ray.init()` on a machine where another
# test's `ray start` head is up may join that cluster instead of starting its own, and two Ray instances on 2 cores
# starve each other's timeouts.
RAY_MODULES = {
    "test_sac_continuous_ray_e2e",
    "test_sac_continuous_ray_cluster",
    "test_sac_continuous_ray_learning",
    "test_sweep",
}
RAY_TESTS = {
    "test_sac_keep_best_export_and_replay[sac_continuous_ray]",
    "test_ray_learner_stops_on_a_nan_loss_shuts_ray_down_and_resumes",
    "test_the_readme_ray_examples_run",
}  # elsewhere: tests that start Ray
# Modules whose module-scoped fixture trains a run: their tests stay on one worker, so the run is trained once.
SHARED_RUN_MODULES = {"test_benchmarks", "test_docs", "test_ppo_continuous_e2e", "test_sac_continuous_e2e"}


# Tests of those modules that start no Ray (refused before it starts) and share no Ray run: free to run anywhere.
NO_RAY_TESTS = {
    "test_bad_input_gets_a_short_message",
    "test_unreachable_ray_address_fails_within_30_seconds",
    "test_grid_is_every_script_env_value_and_seed_with_threads_equal_to_cpus_per_trial",
    "test_bad_input_is_refused_in_one_paragraph_before_anything_runs",
    "test_a_trials_id_is_a_hash_of_its_whole_command_and_a_result_is_reused_only_for_it",
    "test_resume_with_new_seeds_or_grid_values_adds_their_trials_and_other_changes_are_refused",
    "test_a_second_sweep_on_a_folder_in_use_is_refused_naming_the_holder",
    "test_an_address_that_is_not_a_ray_head_is_refused_within_30_seconds",
    "test_out_a_file_and_a_corrupt_sweep_json_get_one_paragraph",
    "test_summarize_of_an_empty_grid_and_of_a_tuning_sweep_works",
}


def xdist_group(item: pytest.Item) -> str:
    module = item.module.__name__.rsplit(".", 1)[-1]
    if module in ("test_sac_continuous_ray_e2e", "test_sweep") and item.originalname in NO_RAY_TESTS:
        return ""
    if module in RAY_MODULES or item.name in RAY_TESTS:
        return "ray"
    return module if module in SHARED_RUN_MODULES else ""


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    """Mark the groups above, and put the longest work first (the Ray group, then the learning tests): xdist hands
    out tests in this order, so the workers finish at about the same time instead of one waiting on a late long test."""
    for item in items:
        group = xdist_group(item)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lambda item: 0 if xdist_group(item) == "ray" else 1 if item.get_closest_marker("slow") else 2)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)
