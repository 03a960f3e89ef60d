"""Learning test (marked slow): a threshold that a broken critic target or entropy term misses.

SAC_CONTINUOUS_SCRIPT=/path/to/copy runs it against a modified copy of the script (to show that it fails when the
algorithm is broken, e.g. with the bootstrap term dropped from soft_q_target, or the entropy term's sign flipped).
"""

import os

import pytest

from tests.conftest import best_last10, reached_return, run_script

SCRIPT = os.environ.get("SAC_CONTINUOUS_SCRIPT", "sac_continuous.py")
# The learning test's whole run; tests/test_learning_mutants.py runs broken copies with it.
PENDULUM_RUN = [
    "--env-id",
    "Pendulum-v1",
    "--total-timesteps",
    "5000",
    "--learning-starts",
    "500",
    "--seed",
    "1",
    "--torch-threads",
    "1",
    "--checkpoint-interval",
    "0",
]


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])  # two seeds: one lucky or unlucky seed decides nothing
def test_pendulum_reaches_minus_300(tmp_path, seed):
    """Default hyperparameters, 500 random steps first. Measured (one thread): the mean of the last 10 training
    episodes at 5k steps is -180 (seed 1) and -225 (seed 2); the random policy scores -1,200 to -1,500. 5k steps
    take about 50 s on one thread of the 2-core development machine. The run stops (Ctrl-C) once 10 consecutive
    episodes average -300: the threshold is met then; broken copies run the whole budget without meeting it."""
    proc = run_script(
        SCRIPT, *PENDULUM_RUN, "--seed", seed, "--runs-dir", tmp_path, timeout=600, stop_when=reached_return(tmp_path, -300)
    )
    assert proc.returncode == 0, proc.stderr
    assert best_last10(tmp_path) >= -300
