"""Learning test (marked slow): sac_continuous_ray.py with 2 rollout workers learns Pendulum-v1.

The run trains its whole fixed budget and is judged by the mean return of its LAST 10 training episodes (last10_return).

SAC_CONTINUOUS_RAY_SCRIPT=/path/to/copy runs it against a modified copy of the script (to show that it fails when the
algorithm is broken, e.g. with the bootstrap term dropped from soft_q_target).
"""

import os

import pytest

from tests.conftest import last10_return
from tests.test_sac_continuous_ray_e2e import run_ray  # a session of its own: whatever Ray leaves is stopped by id

pytest.importorskip("ray")
pytestmark = pytest.mark.ray  # tests/conftest.py: one Ray test at a time
SCRIPT = os.environ.get("SAC_CONTINUOUS_RAY_SCRIPT", "sac_continuous_ray.py")


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])  # two seeds: one lucky or unlucky seed decides nothing
def test_pendulum_with_two_workers_reaches_minus_300(tmp_path, seed):
    """Default hyperparameters and utd ratio 1, 1,000 random steps first, 2 workers on the embedded Ray. Measured
    (seed 1, one learner thread, 2-core machine): last-10 training return -122 at 10k steps; the random policy scores
    -1,200 to -1,500. 12k, not 8k: the workers run asynchronously, so the
    data depends on timing, and at 8k one run of the suite, with other work on the machine, ended at -321. Since it
    runs the whole 12k (no stop at the threshold), its last 10 at 12k has not been measured yet: the test prints it."""
    proc = run_ray(
        "--env-id",
        "Pendulum-v1",
        "--total-timesteps",
        "12000",
        "--learning-starts",
        "1000",
        "--num-rollout-workers",
        "2",
        "--seed",
        seed,
        "--torch-threads",
        "1",
        "--checkpoint-interval",
        "0",
        "--runs-dir",
        tmp_path,
        timeout=600,
        script=SCRIPT,
    )
    assert proc.returncode == 0, proc.stderr
    last10 = last10_return(tmp_path)
    print(f"sac_continuous_ray.py on Pendulum-v1, seed {seed}: last-10 return {last10:.1f}")
    assert last10 >= -300, f"last-10 training return {last10:.1f}"
