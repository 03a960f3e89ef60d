"""Every script reads as a teaching reference: one skeleton in all five, the algorithm first (Args, env, networks,
helpers, a short main()), then a `# === Plumbing` banner with what the algorithm does not need. This test prints,
per script, the banner's line number, main()'s length and the Atari pair's diff size, and fails past the budgets."""

import ast
import difflib
import re

import pytest

from tests.conftest import ROOT, run_script

# script: (the banner's line number at most, main()'s length at most), in lines as `ruff format` writes them (test_format).
BUDGETS = {
    "ppo_continuous.py": (430, 150),
    "ppo_atari.py": (412, 150),
    "a2c_atari.py": (379, 150),
    "sac_continuous.py": (458, 150),
    "sac_continuous_ray.py": (904, 150),
}
# The "Honest lines" ceilings (whole file, above the banner), formatted; the issue's targets are 760/400, 790/410,
# 770/380, 830/460 and 1,350/900, and 250 for the generic plumbing block every script carries.
ISSUE_BUDGETS = {
    "ppo_continuous.py": (1107, 430),
    "ppo_atari.py": (1086, 412),
    "a2c_atari.py": (1051, 379),
    "sac_continuous.py": (1202, 458),
    "sac_continuous_ray.py": (1779, 904),
}
PLUMBING_BUDGET = 499  # + the one boundary, signals from the first line, checkpoints checked as input
SWEEP_BUDGET = 600  # tools/sweep.py, formatted: the issue's ceiling (a ceiling, not a target)
ATARI_DIFF_BUDGET = 250  # lines that differ between ppo_atari.py and a2c_atari.py (diff's < and > lines)
BANNER = re.compile(r"^# === Plumbing")
# the sections, in reading order, as the first line of each (a regex on the line)
SKELETON = [r'^"""', r"^import |^from ", r"^class Args", r"^def make_env", r"^def main\(", r"^# === Plumbing"]


def layout(script: str) -> dict:
    text = (ROOT / script).read_text()
    lines = text.splitlines()
    banner = [i for i, line in enumerate(lines, 1) if BANNER.match(line)]
    tree = ast.parse(text)
    main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
    return {
        "banner": banner,
        "main": main.end_lineno - main.lineno + 1,
        "main_line": main.lineno,
        "lines": lines,
        "tree": tree,
    }


@pytest.mark.parametrize("script", sorted(BUDGETS))
def test_algorithm_first_then_one_banner_within_budget(script):
    info = layout(script)
    banner_budget, main_budget = BUDGETS[script]
    whole, above = ISSUE_BUDGETS[script]
    print(
        f"{script}: {len(info['lines'])} lines (ceiling {whole}), banner at line {info['banner']} (ceiling {above}), "
        f"main() {info['main']} lines"
    )
    assert len(info["banner"]) == 1, f"{script}: exactly one '# === Plumbing' banner, found {info['banner']}"
    assert info["banner"][0] <= banner_budget, f"{script}: banner at line {info['banner'][0]} > {banner_budget}"
    assert info["main"] <= main_budget, f"{script}: main() is {info['main']} lines > {main_budget}"
    assert info["main_line"] < info["banner"][0], "main() sits above the banner"
    assert len(info["lines"]) <= whole and info["banner"][0] <= above, f"{script}: past the issue's ceilings"
    start, end = (info["lines"].index(f"# --- {edge}shared: plumbing ---") for edge in ("", "end "))
    assert end - start + 1 <= PLUMBING_BUDGET, f"the plumbing block is {end - start + 1} lines > {PLUMBING_BUDGET}"


@pytest.mark.parametrize("script", sorted(BUDGETS))
def test_one_skeleton_in_every_script(script):
    """Docstring (with a map of the sections), imports, Args, make_env, main(), banner: present and in this order."""
    lines = layout(script)["lines"]
    first = [next((i for i, line in enumerate(lines) if re.match(pattern, line)), None) for pattern in SKELETON]
    assert None not in first, f"{script}: a section is missing: {dict(zip(SKELETON, first))}"
    assert first == sorted(first), f"{script}: sections out of order: {dict(zip(SKELETON, first))}"
    docstring = ast.get_docstring(layout(script)["tree"])
    for name in ("Args", "main()", "Plumbing"):
        assert name in docstring, f"{script}: the module docstring's map does not name {name}"


def test_atari_pair_differs_only_in_the_algorithm():
    a, b = ((ROOT / name).read_text().splitlines() for name in ("ppo_atari.py", "a2c_atari.py"))
    changed = sum(
        1 for line in difflib.unified_diff(a, b, lineterm="", n=0) if line[:1] in "+-" and not line.startswith(("+++", "---"))
    )
    print(f"diff ppo_atari.py a2c_atari.py: {changed} changed lines")
    assert changed <= ATARI_DIFF_BUDGET


def test_sweep_tool_within_budget_and_free_of_benchmarks():
    """tools/sweep.py as formatted (test_format checks it is): at most SWEEP_BUDGET lines; no import of benchmarks/."""
    text = (ROOT / "tools" / "sweep.py").read_text()
    lines = len(text.splitlines())
    print(f"tools/sweep.py: {lines} lines (ceiling {SWEEP_BUDGET})")
    assert lines <= SWEEP_BUDGET, f"tools/sweep.py is {lines} lines > {SWEEP_BUDGET}"
    nodes = list(ast.walk(ast.parse(text)))
    imported = [a.name for n in nodes if isinstance(n, ast.Import) for a in n.names]
    imported += [n.module or "" for n in nodes if isinstance(n, ast.ImportFrom)]
    assert not [m for m in imported if m.split(".")[0] == "benchmarks"], imported


@pytest.mark.parametrize("script", sorted(BUDGETS))
def test_help_lists_no_derived_fields(script):
    """Derived fields (batch sizes, iteration counts) are not flags: --help shows only what a user can set."""
    proc = run_script(script, "--help", timeout=120)
    assert proc.returncode == 0, proc.stderr
    for derived in ("--batch-size", "--minibatch-size", "--num-iterations"):
        if derived == "--batch-size" and script.startswith("sac"):
            continue  # SAC's batch size is the replay sample size: a real flag
        assert derived not in proc.stdout, f"{script} --help lists the derived field {derived}"
