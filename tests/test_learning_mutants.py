"""Mutant learning tests (marked slow): the learning tests' thresholds must catch a broken algorithm.

Each test copies one script alone into tmp_path, breaks one line of the algorithm (exact text replacement: an edit
that no longer matches the script fails loudly), trains it with the SAME run as the learning test (its *_RUN constant:
seed 1, the whole fixed budget) and asserts that the mean return of its LAST 10 training episodes stays below the
learning test's threshold, which the unbroken script's last 10 clear on seeds 1 and 2 (tests/test_*_learning.py).

Bugs that Pendulum cannot tell, each measured once (seed 1; SAC: the first 8,000 steps of a 10,000-step run, which
are the 8,000-step run's: the runs are deterministic on one thread, and nothing in SAC depends on the budget). No test
is kept for them, since it could not fail; the default tier catches each (tests/mutants.py, run by .ci/run's last step,
or the test named):
- SAC's target entropy 0 instead of -|A| (Pendulum: |A| = 1): last 10 -132.8, as the unbroken script's -132.1 (alpha
  0.149 at 8,000 steps against 0.052). tests/mutants.py's "target entropy 0" is caught by tests/test_update_wiring.py::
  test_sac_continuous_acts_in_the_bounds_with_noise_tunes_alpha_to_minus_a_and_logs_window_means (target entropy -1).
- SAC's target entropy +|A|: last 10 -170.9 (alpha grows to 2.56 by 8,000 steps, yet the broad policy still swings
  Pendulum up). Not in tests/mutants.py under that name; the same test_update_wiring test fails on it (seen).
- PPO's observation normalization off: the documented Pendulum recipe runs with --no-norm-obs, so the edit changes
  nothing there. HalfCheetah (default args, normalization on) tells it, so that test is kept below, on the HalfCheetah
  learning test's run. tests/mutants.py's "observations never normalized" is caught in the default tier too, by
  tests/test_update_wiring.py::test_ppo_continuous_update_sees_the_normalized_rollout_and_the_whole_loss.
"""

import time

import pytest

from tests.conftest import last10_return
from tests.student_copy import copy_alone, run_copy
from tests.test_ppo_continuous_learning import HALFCHEETAH_RUN, HALFCHEETAH_THRESHOLD, PENDULUM_THRESHOLD
from tests.test_ppo_continuous_learning import PENDULUM_RUN as PPO_PENDULUM_RUN
from tests.test_sac_continuous_learning import PENDULUM_RUN as SAC_PENDULUM_RUN
from tests.test_sac_continuous_learning import PENDULUM_THRESHOLD as SAC_PENDULUM_THRESHOLD

PPO_MUTANTS = {
    # L^CLIP's sign flipped: the update makes advantaged actions LESS likely
    "pg_sign_flipped": (
        "pg_loss = torch.max(-advantages * ratio, -advantages * torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef)).mean()",
        "pg_loss = -torch.max(-advantages * ratio, -advantages * torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef)).mean()",
    ),
    # no bootstrap: delta_t = r_t - V(s_t), the advantage sees no value beyond the rollout's rewards
    "gae_no_bootstrap": (
        "delta = rewards[t] + gamma * not_terminated[t] * next_values[t] - values[t]",
        "delta = rewards[t] - values[t]",
    ),
    # no ratio clipping: L = -A * ratio, the clip range in effect infinite (10 epochs of 32 minibatches per rollout)
    "no_ratio_clipping": ("torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef)", "ratio"),
}
SAC_MUTANTS = {
    # the target critics never move from their initial weights (Polyak step with tau = 0)
    "target_never_updates": (
        "soft_update(learner.qf_target, learner.qf, args.tau)",
        "soft_update(learner.qf_target, learner.qf, 0.0)",
    ),
    # no bootstrap: y = r, the critic learns only the immediate reward
    "q_target_no_bootstrap": (
        "    return rewards + gamma * (1.0 - terminated) * (next_q",
        "    return rewards + 0.0 * gamma * (1.0 - terminated) * (next_q",
    ),
}
# the observations handed to the agent unnormalized, whatever --norm-obs says
OBS_NORM_OFF = ("norm = obs_rms if args.norm_obs else None", "norm = None")


def run_mutant(tmp_path, script: str, edit: tuple, run_args: list) -> float:
    copy = copy_alone(script, tmp_path / "copy", [edit])
    runs = tmp_path / "runs"
    start = time.time()
    proc = run_copy(copy, *run_args, "--runs-dir", runs, timeout=900)
    assert proc.returncode == 0, proc.stderr
    ret = last10_return(runs)
    print(f"{script} mutant: last-10 training return {ret:.1f} in {time.time() - start:.0f} s")
    return ret


@pytest.mark.slow
@pytest.mark.parametrize("name", PPO_MUTANTS)
def test_ppo_pendulum_threshold_catches(tmp_path, name):
    """Measured (seed 1, 102,400 steps, one thread), last 10 episodes: pg_sign_flipped -1,844.4, gae_no_bootstrap
    -1,626.7, no_ratio_clipping -1,120.8 (32-38 s each); the unbroken script -130.7 (seed 1) and -137.7 (seed 2)."""
    assert run_mutant(tmp_path, "ppo_continuous.py", PPO_MUTANTS[name], PPO_PENDULUM_RUN) < PENDULUM_THRESHOLD


@pytest.mark.slow
def test_ppo_halfcheetah_threshold_catches_observations_never_normalized(tmp_path):
    """Measured (seed 1, 153,600 steps, one thread), last 10 episodes: 90.0, in 163-192 s; the unbroken script 678.9
    (seed 1) and 392.0 (seed 2)."""
    assert run_mutant(tmp_path, "ppo_continuous.py", OBS_NORM_OFF, HALFCHEETAH_RUN) < HALFCHEETAH_THRESHOLD


@pytest.mark.slow
@pytest.mark.parametrize("name", SAC_MUTANTS)
def test_sac_pendulum_threshold_catches(tmp_path, name):
    """Measured (seed 1, 8,000 steps, one thread), last 10 episodes: target_never_updates -1,310.7,
    q_target_no_bootstrap -1,242.4 (122-139 s each); the unbroken script -132.1 (seed 1) and -147.9 (seed 2)."""
    assert run_mutant(tmp_path, "sac_continuous.py", SAC_MUTANTS[name], SAC_PENDULUM_RUN) < SAC_PENDULUM_THRESHOLD
