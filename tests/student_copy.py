"""A student's copy of one script: the file alone in an empty folder, with the edits a student makes first.

The student-edit tests (tests/test_student_edits_*.py) use it: every edit either keeps the script correct (the acting
path computes what the edited module computes, an update moves every parameter) or stops the run at once with a
message naming what to change."""

import importlib.util
import os
import subprocess
import sys
import uuid
from pathlib import Path

from tests.conftest import BASE_ENV, ROOT
from tests.fork_runner import run_python


def copy_alone(script: str, folder: Path, edits: list) -> Path:
    """Copy ROOT/script into `folder` (which must be empty: nothing else of the project travels with it) and apply
    `edits`, a list of (old, new) exact replacements; each `old` must occur exactly once, so an edit that no longer
    matches the script fails loudly instead of testing the unedited file."""
    folder.mkdir(parents=True, exist_ok=True)
    assert not any(folder.iterdir()), f"{folder} is not empty"
    text = (ROOT / script).read_text()
    for old, new in edits:
        count = text.count(old)
        assert count == 1, f"the edit's text occurs {count} times in {script} (expected once): {old!r}"
        text = text.replace(old, new)
    path = folder / script
    path.write_text(text)
    return path


def import_copy(path: Path):
    """Import the copied script as a module of its own (its `if __name__ == "__main__"` block does not run)."""
    name = f"student_{path.stem}_{uuid.uuid4().hex[:8]}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


def run_copy(path: Path, *args, timeout: float = 300, env: dict = None, stop_when=None) -> subprocess.CompletedProcess:
    """Run the copy as a user would, from its own folder (the project root is not on its path)."""
    full_env = {**os.environ, **BASE_ENV, **(env or {})}
    full_env.pop("PYTHONPATH", None)
    return run_python(
        path, args, path.parent, full_env, timeout, fork="ray" not in path.name, hidden=[ROOT], stop_when=stop_when
    )


def main_in_process(module, argv: list, monkeypatch) -> None:
    """module.main() in this process with sys.argv = [script, *argv] (wandb off). What main() sets for the whole process
    (torch's threads, the global RNGs, the Ctrl-C / SIGTERM handlers, ...) is put back after the test by
    tests/conftest.py's process_state_restored, whatever main() did with it."""
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setattr(sys, "argv", [Path(module.__file__).name, *map(str, argv)])
    module.main()
