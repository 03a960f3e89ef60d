"""The mutant list (tests/mutants.py): every mutant applies (default tier, instant: a line the lead or a student
rewrote shows here first, named), and the whole run catches every one (slow tier: `python -m tests.mutants`)."""

import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.mutants import MUTANTS, all_mutants, unapplicable


def test_every_mutant_applies_exactly_once_and_names_tests_that_exist():
    assert unapplicable() == []
    for script, mutants in MUTANTS.items():
        assert len(mutants) >= 15, f"{script}: {len(mutants)} mutants, fewer than 15"
    for script, name, old, new, tests in all_mutants():
        assert tests, f"{script}: {name}: no test to catch it"
        for node in tests:
            path, _, test = node.partition("::")
            assert f"def {test}(" in (ROOT / path).read_text(), f"{script}: {name}: no test {node}"


@pytest.mark.slow
@pytest.mark.timeout(3600)  # the whole list: longer than one test's 900 s
def test_the_default_tier_catches_every_mutant():
    """Runs each mutant on a copy of the checkout with its targeted default-tier tests (about 15-30 minutes)."""
    proc = subprocess.run([sys.executable, "-m", "tests.mutants", "--jobs", "2"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
