"""Mutant learning tests (marked slow): the learning tests' thresholds must catch a broken algorithm.

Each test copies one script alone into tmp_path, breaks one line of the algorithm (exact text replacement: an edit
that no longer matches the script fails loudly), runs it with the SAME run as the learning test (its PENDULUM_RUN
constant) and asserts that no 10 consecutive episodes average the -300 that the unbroken script reaches (the
unbroken runs stop once they have; a broken copy runs its whole budget and must stay below all along).
"""

import time

import pytest

from tests.conftest import best_last10
from tests.student_copy import copy_alone, run_copy
from tests.test_ppo_continuous_learning import PENDULUM_RUN as PPO_PENDULUM_RUN
from tests.test_sac_continuous_learning import PENDULUM_RUN as SAC_PENDULUM_RUN

THRESHOLD = -300.0  # the learning tests' threshold

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


def run_mutant(tmp_path, script: str, edit: tuple, run_args: list) -> float:
    copy = copy_alone(script, tmp_path / "copy", [edit])
    runs = tmp_path / "runs"
    start = time.time()
    proc = run_copy(copy, *run_args, "--runs-dir", runs, timeout=900)
    assert proc.returncode == 0, proc.stderr
    ret = best_last10(runs)
    print(f"{script} mutant: best mean of 10 consecutive episodes {ret:.1f} in {time.time() - start:.0f} s")
    return ret


@pytest.mark.slow
@pytest.mark.parametrize("name", PPO_MUTANTS)
def test_ppo_pendulum_threshold_catches(tmp_path, name):
    """Measured (seed 1, 102,400 steps, one thread): best mean of 10 consecutive episodes pg_sign_flipped -1,106,
    gae_no_bootstrap -958 (last 10: -1,296 and -1,431); the unbroken script reaches -300 at 59,200 steps and stops."""
    assert run_mutant(tmp_path, "ppo_continuous.py", PPO_MUTANTS[name], PPO_PENDULUM_RUN) < THRESHOLD


@pytest.mark.slow
@pytest.mark.parametrize("name", SAC_MUTANTS)
def test_sac_pendulum_threshold_catches(tmp_path, name):
    """Measured (seed 1, 5k steps, one thread): best mean of 10 consecutive episodes target_never_updates -1,095,
    q_target_no_bootstrap -1,071; the unbroken script reaches -300 at 4,431 steps and stops."""
    assert run_mutant(tmp_path, "sac_continuous.py", SAC_MUTANTS[name], SAC_PENDULUM_RUN) < THRESHOLD
