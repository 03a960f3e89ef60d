"""Code every script carries (errors, seeding, env-state capture, checkpoints, logging) sits between
`# --- shared: NAME ---` and `# --- end shared: NAME ---` markers. Same-named blocks must be identical text in all
top-level scripts, so copies cannot drift."""

import re
from itertools import combinations
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p for p in ROOT.glob("*.py"))
START = re.compile(r"^# --- shared: (?P<name>[\w-]+) ---$")
END = re.compile(r"^# --- end shared: (?P<name>[\w-]+) ---$")
# every script carries these blocks: the plumbing below the banner (errors, flag checks, seeding, checkpoints, the
# run's bookkeeping, keep-best, the export of a trained agent, torch's threads)
REQUIRED = {"errors", "validation", "seeding", "checkpoint", "run", "keep-best", "export", "threads"}
# the SAC scripts: sac_continuous_ray.py distributes sac_continuous.py's parts, so it must carry them verbatim
SAC_PARTS = {"sac-env", "sac-networks", "sac-replay-buffer", "sac-parameters", "sac-learner", "sac-rollout",
             "sac-evaluation", "sac-export", "sac-run"}  # fmt: skip
# ...and each family its own: MuJoCo/classic-control scripts capture simulator state and use same-step autoreset;
# the Atari scripts share the preprocessing, both backends, the Nature CNN and the run plumbing; the on-policy
# scripts share the initialization, explained variance and the schedules.
ON_POLICY = {"layer-init", "diagnostics-and-schedules"}
FAMILY = {
    "ppo_continuous.py": {"env-state", "episode-boundaries", "gae", "ppo-losses", *ON_POLICY},
    "sac_continuous.py": {"env-state", "episode-boundaries", *SAC_PARTS},
    "sac_continuous_ray.py": {"episode-boundaries", *SAC_PARTS},
    "ppo_atari.py": {"atari-make-env", "nature-cnn", "next-step-autoreset", "atari-wrappers", "atari-run", "gae",
                     "ppo-losses", *ON_POLICY},  # fmt: skip
    "a2c_atari.py": {"atari-make-env", "nature-cnn", "next-step-autoreset", "atari-wrappers", "atari-run", *ON_POLICY},
}


def extract_blocks(text: str) -> dict:
    """{name: block text}; raises ValueError on unclosed, nested, mismatched or repeated markers."""
    blocks, current, lines = {}, None, []
    for number, line in enumerate(text.splitlines(), 1):
        start, end = START.match(line), END.match(line)
        if start:
            if current is not None:
                raise ValueError(f"line {number}: block '{start['name']}' starts inside block '{current}'")
            if start["name"] in blocks:
                raise ValueError(f"line {number}: block '{start['name']}' appears twice")
            current, lines = start["name"], []
        elif end:
            if end["name"] != current:
                raise ValueError(f"line {number}: end of '{end['name']}' but the open block is '{current}'")
            blocks[current], current = "\n".join(lines), None
        elif current is not None:
            lines.append(line)
        elif "--- shared" in line or "--- end shared" in line:
            raise ValueError(f"line {number}: malformed marker {line!r}")
    if current is not None:
        raise ValueError(f"block '{current}' is never closed")
    return blocks


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


def test_same_named_blocks_are_identical_across_scripts():
    blocks = {script.name: extract_blocks(script.read_text()) for script in SCRIPTS}
    for (a, blocks_a), (b, blocks_b) in combinations(blocks.items(), 2):
        for name in blocks_a.keys() & blocks_b.keys():
            assert blocks_a[name] == blocks_b[name], f"shared block '{name}' differs between {a} and {b}"


def test_differing_copies_are_detected():
    a = extract_blocks("# --- shared: seeding ---\nrandom.seed(seed)\n# --- end shared: seeding ---\n")
    b = extract_blocks("# --- shared: seeding ---\nrandom.seed(seed + 1)\n# --- end shared: seeding ---\n")
    assert a["seeding"] != b["seeding"]
