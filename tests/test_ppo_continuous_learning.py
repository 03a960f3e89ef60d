"""Learning tests (marked slow): thresholds that a broken policy gradient, advantage or normalization misses.

How they were shown to fail when the algorithm is broken: each mutation below was applied to a copy of the script and
these tests were run against it with PPO_CONTINUOUS_SCRIPT=/path/to/copy (results in the README, "Tests"):
the policy-gradient sign flipped in ppo_losses, the bootstrap term dropped from compute_gae's delta, and
normalize_obs dividing by the variance instead of the standard deviation.
"""

import os

import pytest

from tests.conftest import best_last10, reached_return, run_script

SCRIPT = os.environ.get("PPO_CONTINUOUS_SCRIPT", "ppo_continuous.py")
# The documented Pendulum recipe (README): short horizon, no normalization (see the README for why).
PENDULUM_RECIPE = [
    "--env-id",
    "Pendulum-v1",
    "--num-envs",
    "4",
    "--num-steps",
    "1024",
    "--gamma",
    "0.9",
    "--learning-rate",
    "1e-3",
    "--no-norm-reward",
    "--no-norm-obs",
    "--no-clip-vloss",
]
# The learning test's whole run (budget, seed, one thread); tests/test_learning_mutants.py runs broken copies with it.
# 102,400 steps (25 iterations; the learning rate anneals over them): seed 1 reaches -300 at 59,200.
PENDULUM_RUN = [*PENDULUM_RECIPE, "--total-timesteps", "102400", "--seed", "1", "--torch-threads", "1"]


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])  # two seeds: one lucky or unlucky seed decides nothing
def test_pendulum_recipe_reaches_minus_300(tmp_path, seed):
    """Measured (seed 1, one thread): 10 consecutive episodes average -300 at 59,200 steps (about 30 s), the last 10
    of the whole run -134; random play is about -1,200."""
    proc = run_script(
        SCRIPT, *PENDULUM_RUN, "--seed", seed, "--runs-dir", tmp_path, timeout=600, stop_when=reached_return(tmp_path, -300)
    )
    assert proc.returncode == 0, proc.stderr
    assert best_last10(tmp_path) >= -300  # met once 10 consecutive episodes average -300: the run stops there


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_halfcheetah_default_args_learn(tmp_path, seed):
    """Default args (observation and reward normalization on). Measured at 153,600 steps, one thread: seed 1 passes
    400 before the end; seed 2's best mean of 10 consecutive episodes is 327 (the same 327.07 on the build before
    this one: its slow start, not a regression); the untrained policy scores about -300. Both must reach 300."""
    proc = run_script(
        SCRIPT,
        "--env-id",
        "HalfCheetah-v4",
        "--total-timesteps",
        "153600",
        "--seed",
        seed,
        "--torch-threads",
        "1",
        "--runs-dir",
        tmp_path,
        timeout=600,
        stop_when=reached_return(tmp_path, 300),
    )
    assert proc.returncode == 0, proc.stderr
    assert best_last10(tmp_path) >= 300
