"""One format, checked: every Python file is as `ruff format` writes it (line length 127, CleanRL's) and passes `ruff
check` (pycodestyle errors incl. E501, pyflakes: unused imports and names); no `fmt: skip` / `fmt: off`, no line-length
`noqa`. The line budgets in test_layout.py count these formatted lines, so packing can never meet them."""

import re
import subprocess
import sys

from tests.conftest import ROOT

PYTHON_FILES = sorted(p for p in ROOT.rglob("*.py") if not {".venv", ".venv-cpu", "results"} & set(p.parts))


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_every_file_is_formatted():
    proc = ruff("format", "--check", "--diff", ".")
    assert proc.returncode == 0, f"not as `ruff format` writes them (run `ruff format .`):\n{proc.stdout[-3000:]}"


def test_every_file_passes_the_lint_rules():
    proc = ruff("check", ".")
    assert proc.returncode == 0, f"`ruff check .` found:\n{proc.stdout[-3000:]}"


def test_no_formatter_escapes():
    escapes = re.compile("#" + r"\s*fmt:\s*(skip|off)|noqa:[^#\n]*E501")  # split: this line is no escape itself
    found = []
    for path in PYTHON_FILES:
        lines = path.read_text().splitlines()
        found += [f"{path.relative_to(ROOT)}:{n}" for n, line in enumerate(lines, 1) if escapes.search(line)]
    assert not found, f"formatter escapes: {found}"
