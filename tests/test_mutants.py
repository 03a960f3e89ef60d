"""The mutant list (tests/mutants.py): every mutant applies (default tier, instant: a line the lead or a student
rewrote shows here first, named). The whole run, which checks that the default tier catches every one, is the last step
of .ci/run, `python -m tests.mutants --jobs 2`, on its own: its two test processes at once beside the slow tier's Ray
tests slowed those past their waits (a CI run)."""

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
