"""Learning test (marked slow): a threshold that a broken critic target or entropy term misses.

Each run trains its whole fixed budget and is judged by the mean return of its LAST 10 training episodes (last10_return).

SAC_CONTINUOUS_SCRIPT=/path/to/copy runs it against a modified copy of the script (to show that it fails when the
algorithm is broken, e.g. with the bootstrap term dropped from soft_q_target, or the entropy term's sign flipped).
"""

import os

import pytest

from tests.conftest import last10_return, run_script

SCRIPT = os.environ.get("SAC_CONTINUOUS_SCRIPT", "sac_continuous.py")
# The learning test's whole run; tests/test_learning_mutants.py runs broken copies with it. 8,000 steps (40 episodes),
# not 5,000: at 5,000 the last 10 episodes still held the end of learning (-258.8 seed 1, -256.0 seed 2).
PENDULUM_RUN = [
    "--env-id",
    "Pendulum-v1",
    "--total-timesteps",
    "8000",
    "--learning-starts",
    "500",
    "--seed",
    "1",
    "--torch-threads",
    "1",
    "--checkpoint-interval",
    "0",
]
PENDULUM_THRESHOLD = -300.0  # of the last 10 episodes' mean return; the random policy scores -1,200 to -1,500


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])  # two seeds: one lucky or unlucky seed decides nothing
def test_pendulum_reaches_minus_300(tmp_path, seed):
    """Default hyperparameters, 500 random steps first. Measured (one thread), the last 10 training episodes of the
    whole 8,000 steps: -132.1 (seed 1), -147.9 (seed 2). Single episodes still fall to between -250 and -1,200 now
    and then: the same runs' last 10 at 6,000 / 7,000 / 9,000 / 10,000 steps were -268.5 / -239.4 / -134.2 / -134.6
    (seed 1) and -253.0 / -153.1 / -207.2 / -263.8 (seed 2)."""
    proc = run_script(SCRIPT, *PENDULUM_RUN, "--seed", seed, "--runs-dir", tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr
    last10 = last10_return(tmp_path)
    print(f"sac_continuous.py on Pendulum-v1, seed {seed}: last-10 return {last10:.1f}")
    assert last10 >= PENDULUM_THRESHOLD, f"last-10 training return {last10:.1f}"
