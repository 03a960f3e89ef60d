"""Path flags and env ids of the wrong kind are refused before any work starts: every path
flag (--runs-dir, --resume) times every wrong kind of path, in
every script, gets one short paragraph naming the flag and the path, exit code 2, and nothing is made; an env id of
the other family of scripts names the scripts that take it.

Why one subprocess per script, not per row: each row would pay the script's import (torch, gymnasium: 3-5 s) for
an error that comes before any work. DRIVER imports once, then runs the script file as `__main__` (runpy: its own
`if __name__ == "__main__"` entry, with sys.argv set) once per row, in the row's own folder, and records the exit
code and stderr of each. Two rows also run as a plain `python script.py`, the way a user runs it. An unwritable folder
is made by os.mkdir raising PermissionError in it (what the OS would do), not by chmod: that holds as root too, where
permission bits stop nothing."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import BASE_ENV, ROOT, assert_clean_error, run_script

pytestmark = pytest.mark.xdist_group("test_path_flags")  # one worker: each script's rows share one subprocess


# Runs each row's argv as `python script ...` would, in one process: the imports are paid once.
DRIVER = r"""
import contextlib, io, json, os, runpy, sys, traceback
script, rows_file, out_file = sys.argv[1:4]
real_access, real_mkdir, results = os.access, os.mkdir, []
for row in json.loads(open(rows_file).read()):
    denied = row["deny"]  # a folder os.access must call unwritable (the permission check, testable as root)
    os.access = lambda p, mode, *a, _d=denied, **k: (False if _d and mode & os.W_OK and os.path.realpath(p) == _d
                                                    else real_access(p, mode, *a, **k))
    os.mkdir = lambda p, *a, _d=denied, **k: (_ for _ in ()).throw(PermissionError(13, "Permission denied", p)) if (
        _d and os.path.realpath(os.path.dirname(os.path.abspath(p))) == _d) else real_mkdir(p, *a, **k)
    os.chdir(row["cwd"])
    sys.argv = [script, *row["argv"]]
    err, out, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as e:
            code = 0 if e.code is None else e.code if isinstance(e.code, int) else 1
        except BaseException:
            traceback.print_exc()
            code = 1
    results.append({"returncode": code, "stdout": out.getvalue(), "stderr": err.getvalue()})
os.access, os.mkdir = real_access, real_mkdir
open(out_file, "w").write(json.dumps(results))
"""


def file_at(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("not a checkpoint")  # the path checks do not read it: they come before the checkpoint is loaded
    return path


def folder_at(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


# Each wrong kind of path: build(row folder) -> (the flag's value, the folder to make unwritable or None), and the
# words the message must hold. A folder flag wants a folder it can make and write in; a checkpoint flag, a file.
FOLDER_KINDS = {
    "a file": (lambda r: (file_at(r / "a_file"), None), "cannot hold run folders: File exists"),
    "under a file": (lambda r: (file_at(r / "a_file") / "sub", None), "cannot hold run folders: Not a directory"),
    "not writable": (lambda r: (folder_at(r / "locked"), r / "locked"), "cannot hold run folders: Permission denied"),
}
CHECKPOINT_KINDS = {
    "missing": (lambda r: (r / "missing.pt", None), "does not exist"),
    "a folder": (lambda r: (folder_at(r / "a_folder"), None), "is a folder, not a file"),
    "under a file": (lambda r: (file_at(r / "a_file") / "step.pt", None), "does not exist"),
}  # a checkpoint in a folder this user cannot write resumes into a new run folder (test_resume_folders.py)
FLAGS = {  # flag -> (its kinds, the other flags its rows need)
    "--runs-dir": (FOLDER_KINDS, lambda r: []),
    "--resume": (CHECKPOINT_KINDS, lambda r: []),
}
# ppo_continuous.py: every flag times every kind; the other scripts carry the same shared code: a few rows each
SOME = {
    "ppo_atari.py": [("--runs-dir", "under a file"), ("--resume", "a folder")],
    "a2c_atari.py": [("--runs-dir", "a file"), ("--resume", "missing")],
    "sac_continuous.py": [("--runs-dir", "not writable"), ("--resume", "under a file")],
    "sac_continuous_ray.py": [("--runs-dir", "a file"), ("--resume", "missing")],  # before Ray starts
}
PATH_ROWS = [("ppo_continuous.py", flag, kind) for flag, (kinds, _) in FLAGS.items() for kind in kinds]
PATH_ROWS += [(script, flag, kind) for script, rows in SOME.items() for flag, kind in rows]
# The Ray script's rows name a cluster that is not there: had the check let a row through, it would end on "cannot
# connect" within seconds, instead of starting an embedded Ray.
NO_RAY = ["--ray-address", "127.0.0.1:1"]
WAYS = ("os.access says no",)  # how a row makes its folder unwritable

# An env id of the other family names the scripts that take it.
ATARI_HINT = "is an Atari game: use ppo_atari.py or a2c_atari.py"
CONTINUOUS_HINT = "use ppo_continuous.py, sac_continuous.py or sac_continuous_ray.py"
ENV_ROWS = [
    ("ppo_continuous.py", "BreakoutNoFrameskip-v4", (ATARI_HINT,)),
    ("ppo_continuous.py", "ALE/Pong-v5", (ATARI_HINT,)),
    ("sac_continuous.py", "BreakoutNoFrameskip-v4", (ATARI_HINT,)),
    ("sac_continuous_ray.py", "ALE/Pong-v5", (ATARI_HINT,)),
    ("ppo_atari.py", "HalfCheetah-v4", ("not an Atari id", "continuous-action", CONTINUOUS_HINT)),
    ("a2c_atari.py", "Pendulum-v1", ("not an Atari id", "continuous-action", CONTINUOUS_HINT)),
    ("ppo_atari.py", "CartPole-v1", ("not an Atari id", "continuous-action", CONTINUOUS_HINT)),
]


def row_ids():
    ids = []
    for script, flag, kind in PATH_ROWS:
        ways = WAYS if kind.endswith("not writable") else ("",)
        ids += [(script, flag, kind, way) for way in ways]
    return ids


def tree(folder: Path) -> list:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


class Rows:
    """The selected rows of one script (`pytest -k` selects), run by one DRIVER subprocess the first time a test
    asks for one of them."""

    def __init__(self, base: Path, selected: set):
        self.base, self.selected, self.results = base, selected, {}

    def get(self, script: str, row):
        if script not in self.results:
            self.results[script] = self.run(script)
        return self.results[script][row]

    def run(self, script: str) -> dict:
        specs, rows = [], {}
        chosen = [r for r in [*row_ids(), *ENV_ROWS] if r[0] == script and r in self.selected]
        for n, row in enumerate(chosen):
            folder = folder_at(self.base / script / str(n))
            if len(row) == 4:  # a path row
                _, flag, kind, way = row
                kinds, needs = FLAGS[flag]
                build, words = kinds[kind]
                value, lock = build(folder)
                argv, needles = [*needs(folder), flag, value], [flag, f"'{value}'", words]
                if flag != "--runs-dir":
                    argv += ["--runs-dir", folder / "runs"]  # where a run would go if the flag were let through
            else:  # an env-id row
                _, env_id, needles = row
                argv, lock, way = ["--env-id", env_id, "--runs-dir", folder / "runs"], None, ""
            deny = str(lock.resolve()) if lock is not None and way == "os.access says no" else None
            argv += NO_RAY if script == "sac_continuous_ray.py" else []
            specs.append({"cwd": str(folder), "argv": [str(a) for a in argv], "deny": deny})
            rows[row] = (folder, tree(folder), needles, lock)
        rows_file, out_file = self.base / f"{script}.rows.json", self.base / f"{script}.out.json"
        rows_file.write_text(json.dumps(specs))
        command = [sys.executable, "-c", DRIVER, str(ROOT / script), str(rows_file), str(out_file)]
        proc = subprocess.run(command, cwd=ROOT, env={**os.environ, **BASE_ENV}, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0 and out_file.exists(), proc.stderr
        results = json.loads(out_file.read_text())
        return {
            row: (subprocess.CompletedProcess(spec["argv"], **result), *info)
            for (row, info), spec, result in zip(rows.items(), specs, results)
        }


@pytest.fixture(scope="module")
def rows(request, tmp_path_factory):
    mine = [item for item in request.session.items if getattr(item, "module", None) is request.module]
    selected = {item.callspec.params.get("row") for item in mine if hasattr(item, "callspec")}
    return Rows(tmp_path_factory.mktemp("path_flags"), selected)


def check_row(rows: Rows, row) -> None:
    proc, folder, before, needles, _ = rows.get(row[0], row)
    print(proc.stderr.strip())
    assert_clean_error(proc, *needles)
    assert tree(folder) == before, "the refused command made something"


@pytest.mark.parametrize("row", row_ids(), ids=lambda row: " ".join(part for part in row if part))
def test_path_flag_of_the_wrong_kind_is_refused_before_any_work(rows, row):
    check_row(rows, row)


@pytest.mark.parametrize("row", ENV_ROWS, ids=lambda row: f"{row[0]} {row[1]}")
def test_env_id_of_the_other_family_names_the_scripts_that_take_it(rows, row):
    check_row(rows, row)


@pytest.mark.parametrize("script", ["ppo_continuous.py", "sac_continuous_ray.py"])
def test_a_plain_command_line_is_refused_the_same_way(tmp_path, script):
    """The rows above run under DRIVER; one row here the way a user runs it: `python script.py --runs-dir <a file>`."""
    runs_dir = file_at(tmp_path / "a_file")
    extra = NO_RAY if script == "sac_continuous_ray.py" else []
    proc = run_script(script, "--runs-dir", runs_dir, *extra, timeout=120)
    assert_clean_error(proc, "--runs-dir", f"'{runs_dir}'", "cannot hold run folders: File exists")
    assert tree(tmp_path) == ["a_file"]
