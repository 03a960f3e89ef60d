"""Code every script carries (errors, seeding, env-state capture, checkpoints, logging) sits between
`# --- shared: NAME ---` and `# --- end shared: NAME ---` markers. Same-named blocks must be identical text in all
top-level scripts, so copies cannot drift: edit one copy, then `python tools/sync_shared.py <that script>` copies it
to the others (the tool holds the marker grammar, extract_blocks, that these tests use)."""

import shutil

import pytest

from tests.conftest import ROOT
from tools.sync_shared import HINT, describe, differing_blocks, extract_blocks, load_blocks, scripts_in

SCRIPTS = scripts_in(ROOT)
# every script carries this block: the plumbing below the banner (runs, checkpoints, flag checks, errors, seeding)
REQUIRED = {"plumbing"}
# the SAC scripts: sac_continuous_ray.py distributes sac_continuous.py's algorithm, so it carries it verbatim
SAC_PARTS = {"sac-algorithm", "sac-run", "episode-boundaries", "continuous"}
# ...and each family its own: MuJoCo/classic-control scripts capture simulator state, use same-step autoreset and
# evaluate on a plain env; the Atari scripts share the preprocessing, the Nature CNN, the next-step autoreset targets
# (`atari`) and the run plumbing (`atari-run`); the on-policy scripts share the initialization, explained variance and
# the schedules.
ON_POLICY = {"layer-init", "diagnostics-and-schedules"}
FAMILY = {
    "ppo_continuous.py": {"env-state", "episode-boundaries", "ppo", "continuous", *ON_POLICY},
    "sac_continuous.py": {"env-state", *SAC_PARTS},
    "sac_continuous_ray.py": SAC_PARTS,
    "ppo_atari.py": {"atari", "atari-run", "ppo", *ON_POLICY},
    "a2c_atari.py": {"atari", "atari-run", *ON_POLICY},
}


def test_extractor_catches_broken_markers():
    ok = "x\n# --- shared: a ---\nbody\n# --- end shared: a ---\n"
    assert extract_blocks(ok) == {"a": "body"}
    for broken in (
        "# --- shared: a ---\nbody\n",  # unclosed
        "# --- shared: a ---\n# --- shared: b ---\n# --- end shared: b ---\n# --- end shared: a ---\n",  # nested
        "# --- shared: a ---\n# --- end shared: b ---\n",  # mismatched
        ok + ok,  # repeated
        "# --- shared a ---\n",  # malformed
    ):
        with pytest.raises(ValueError):
            extract_blocks(broken)


def test_scripts_exist_and_carry_the_required_blocks():
    assert {"ppo_continuous.py", "sac_continuous.py", "sac_continuous_ray.py", "ppo_atari.py", "a2c_atari.py"} <= {
        p.name for p in SCRIPTS
    }
    for script in SCRIPTS:
        blocks = extract_blocks(script.read_text())
        missing = (REQUIRED | FAMILY.get(script.name, set())) - blocks.keys()
        assert not missing, f"{script.name} lacks shared blocks {sorted(missing)}"


def assert_copies_identical(folder) -> None:
    """The check: every same-named block is identical text in all the folder's scripts, or fail naming each block
    that differs, the scripts holding each version, and the tool that copies one edited copy to the others."""
    differing = differing_blocks(load_blocks(folder))
    if differing:
        raise AssertionError("\n".join(describe(name, groups) for name, groups in differing.items()) + f"\n{HINT}")


def test_same_named_blocks_are_identical_across_scripts():
    assert_copies_identical(ROOT)


def test_differing_copies_are_detected(tmp_path):
    """The check above, run on copies of the scripts where one script's copy of a block differs: it must fail and
    name that block and the scripts on both sides."""
    for script in SCRIPTS:
        shutil.copy(script, tmp_path / script.name)
    carriers = sorted(name for name, blocks in load_blocks(tmp_path).items() if "plumbing" in blocks)
    edited = tmp_path / "ppo_atari.py"
    text = edited.read_text()
    assert text.count("# --- shared: plumbing ---\n") == 1
    edited.write_text(text.replace("# --- shared: plumbing ---\n", "# --- shared: plumbing ---\nSEED_OFFSET = 1\n"))
    with pytest.raises(AssertionError) as failure:
        assert_copies_identical(tmp_path)
    report = str(failure.value).splitlines()
    (line,) = [line for line in report if "'plumbing'" in line]
    assert line.startswith("shared block 'plumbing' differs between ")
    for script in carriers:
        assert script in line, f"{script} is not named in {line!r}"
    assert line.endswith(" and ppo_atari.py"), line  # the edited copy, alone in its version
    assert "python tools/sync_shared.py" in report[-1]
