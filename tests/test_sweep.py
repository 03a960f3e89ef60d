"""tools/sweep.py: the grid and its CPU / thread assignment, bad input refused before anything runs, the sweep's own
Ray (token authentication, 127.0.0.1, a private temp folder), a tiny sweep whose summary holds the numbers each trial
logged (a failing trial marked, the others unharmed), and a Ctrl-C mid-sweep whose --resume runs nothing twice. Slow
tier: benchmarks/run.py through the tool, a two-node cluster that loses a node mid-trial, a tiny --tune study, and one
stopped with Ctrl-C and resumed. Every sweep runs in a session of its own and is stopped by process group; its Ray
head is the tool's own (on 127.0.0.1), stopped by the tool."""

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import BASE_ENV, ROOT, assert_clean_error, output_after_ctrl_c, scalars, wait_until
from tools.sweep import DEFAULTS, expand_grid, flag_args, parse_args, parse_grid, plan, start_script

SWEEP = str(ROOT / "tools" / "sweep.py")
TINY = [
    "--total-timesteps",
    "256",
    "--num-steps",
    "64",
    "--num-minibatches",
    "2",
    "--eval-interval",
    "128",
    "--eval-episodes",
    "1",
]


def sweep_env(**extra) -> dict:
    return {**os.environ, **BASE_ENV, "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0", **extra}


def start_sweep(*args, env: dict = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, SWEEP, *map(str, args)],
        cwd=ROOT,
        env=env or sweep_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )


def finish(proc: subprocess.Popen, timeout: float = 600) -> tuple:
    try:
        return proc.communicate(timeout=timeout)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # a hung driver: nothing of it outlives the test
        except ProcessLookupError:
            pass


def finish_while_writing(proc: subprocess.Popen, folder: Path, stall: float = 240) -> tuple:
    """The driver's (stdout, stderr) once it has exited, waiting as long as something under `folder` keeps changing
    (progress lines, checkpoints): a loaded runner is slow, not wrong. Fails once nothing changed for `stall` s."""

    def newest() -> float:
        stamps = []
        for p in folder.rglob("*"):
            with contextlib.suppress(FileNotFoundError):  # why: a checkpoint's temporary file, renamed meanwhile
                stamps.append(p.stat().st_mtime)
        return max(stamps, default=0.0)

    seen, since = newest(), time.monotonic()
    try:
        while True:
            try:
                return proc.communicate(timeout=20)  # why safe to repeat: communicate() keeps what it read before
            except subprocess.TimeoutExpired:
                if (latest := newest()) != seen:  # one walk of the folder per poll
                    seen, since = latest, time.monotonic()
                elif time.monotonic() - since > stall:
                    pytest.fail(f"the sweep wrote nothing under {folder} for {stall:.0f} s (hung, not slow)")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # nothing of the driver outlives the test


def ctrl_c_once_saved(proc: subprocess.Popen, folder: Path, pattern: str) -> tuple:
    """Ctrl-C at a terminal (SIGINT to the driver's process group) once a file matching `pattern` exists under `folder`
    (a trial's checkpoint); the driver's (stdout, stderr) once it has exited. Nothing of it outlives the test."""
    try:
        wait_until(lambda: bool(list(folder.glob(pattern))), 300, f"a file {pattern} under {folder}", proc)
        os.killpg(proc.pid, signal.SIGINT)
        return output_after_ctrl_c(proc, 300)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_sweep(*args, timeout: float = 600, env: dict = None) -> subprocess.CompletedProcess:
    proc = start_sweep(*args, env=env)
    out, err = finish(proc, timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run_dir_of(trial: Path) -> Path:
    dirs = list((trial / "runs").iterdir())
    assert len(dirs) == 1, f"one run folder per trial: {dirs}"
    return dirs[0]


# ---- the grid ---------------------------------------------------------------------------------------------------


def test_grid_is_every_script_env_value_and_seed_with_threads_equal_to_cpus_per_trial(tmp_path):
    grid = parse_grid(["learning_rate=3e-4,1e-3", "--norm-adv=true,false,true"])
    assert grid == {"learning-rate": ["3e-4", "1e-3"], "norm-adv": ["true", "false"]}  # names as flags, no repeats
    script = str(ROOT / "ppo_continuous.py")
    trials = expand_grid([script], ["Pendulum-v1", "Hopper-v4"], [1, 2], grid, ["--total-timesteps", "9"], 3)
    assert len(trials) == 2 * 2 * 2 * 2 and len({t.id for t in trials}) == 16
    cmd = trials[3].command(tmp_path / "t")  # script, env, grid point, seed: the innermost loop is the seed
    assert cmd[cmd.index("--torch-threads") + 1] == "3" and cmd[cmd.index("--runs-dir") + 1] == str(tmp_path / "t" / "runs")
    assert cmd[cmd.index("--seed") + 1] == "2" and cmd[-3:] == ["--learning-rate", "3e-4", "--no-norm-adv"]
    assert trials[0].task == trials[1].task != trials[2].task  # the seeds of a grid point are one task
    assert flag_args([["gamma", "0.9"], ["anneal-lr", "False"]]) == ["--gamma", "0.9", "--no-anneal-lr"]


def test_a_trial_resumes_from_its_newest_checkpoint_and_at_one_step_from_the_one_ctrl_c_saved(tmp_path):
    """Ctrl-C at an iteration that also wrote a periodic checkpoint leaves step_N.pt and interrupted_N.pt side by side
    (a slow-tier CI run resumed from step_N.pt: the names' order, not the save's); the resume takes interrupted_N.pt."""
    checkpoints = tmp_path / "runs" / "run" / "checkpoints"
    checkpoints.mkdir(parents=True)
    for name in ("step_0000000768.pt", "interrupted_0000001024.pt", "step_0000001024.pt", "best.pt"):
        (checkpoints / name).touch()
    start_script(tmp_path, [sys.executable, "-c", "pass"], 1).wait(timeout=60)
    assert (tmp_path / "log.txt").read_text().split()[-1] == str(checkpoints / "interrupted_0000001024.pt")
    (checkpoints / "step_0000001280.pt").touch()  # a later step wins, whatever its kind
    start_script(tmp_path, [sys.executable, "-c", "pass"], 1).wait(timeout=60)
    assert (tmp_path / "log.txt").read_text().splitlines()[-1].split()[-1] == str(checkpoints / "step_0000001280.pt")


def test_a_trials_id_is_a_hash_of_its_whole_command_and_a_result_is_reused_only_for_it(tmp_path):
    """Regression: ids left out the flags after `--`, and any result.json in a trial folder was taken as done."""
    script = tmp_path / "train.py"
    script.write_text("print('v1')\n")
    (a,) = expand_grid([str(script)], ["Pendulum-v1"], [1], {}, ["--total-timesteps", "1024"], 1)
    (b,) = expand_grid([str(script)], ["Pendulum-v1"], [1], {}, ["--total-timesteps", "2048"], 1)
    (c,) = expand_grid([str(script)], ["Pendulum-v1"], [1], {}, ["--total-timesteps", "1024"], 2)
    script.write_text("print('v2')\n")
    (d,) = expand_grid([str(script)], ["Pendulum-v1"], [1], {}, ["--total-timesteps", "1024"], 1)
    assert len({a.id, b.id, c.id, d.id}) == 4  # a flag after --, the threads, the script's text: another trial
    from tools.sweep import read_result

    (tmp_path / "trials" / a.id).mkdir(parents=True)
    (tmp_path / "trials" / a.id / "result.json").write_text(json.dumps({"state": "done", "key": b.id}))
    assert read_result(tmp_path, a) is None  # a result written for another command is not this trial's


def write_sweep(out: Path, seeds: list, extra: list, script: str = "ppo_continuous.py") -> dict:
    """A sweep.json as the tool writes it, its trials finished (no Ray: what --resume plans is checked before Ray)."""
    ns, _ = parse_args(["--out", str(out), "--script", script, "--env-id", "Pendulum-v1", "--seeds", *map(str, seeds)])
    out.mkdir(parents=True)
    spec, _ = plan(ns, extra, out)
    for t in spec["trials"]:
        (out / "trials" / t["id"]).mkdir(parents=True)
        (out / "trials" / t["id"] / "result.json").write_text(json.dumps({"state": "done", "key": t["id"], "returncode": 0}))
    (out / "sweep.json").write_text(json.dumps(spec))
    return spec


def test_resume_with_new_seeds_or_grid_values_adds_their_trials_and_other_changes_are_refused(tmp_path):
    """Regression: `--resume --grid ... --seeds 5 6 -- --total-timesteps 4096` ran nothing: the new trials were dropped."""
    out = tmp_path / "sweep"
    old = write_sweep(out, [1], ["--total-timesteps", "1024"])
    argv = ["--out", str(out), "--resume", "--seeds", "5", "6", "--grid", "learning_rate=1e-3,3e-4"]
    spec, new = plan(*parse_args([*argv, "--", "--total-timesteps", "1024"]), out)
    assert len(new) == 4 and {t.seed for t in new} == {5, 6}  # probed, then run
    assert spec["trials"][:1] == old["trials"] and len(spec["trials"]) == 5  # the finished trial kept
    proc = run_sweep(*argv, "--", "--total-timesteps", "4096", timeout=120)
    assert_clean_error(proc, "--resume with --extra", "4096", "1024", "another --out")
    assert json.loads((out / "sweep.json").read_text()) == old and not (out / "sweep.lock").exists()


# ---- bad input: one paragraph, exit 2, nothing run or written ---------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


BAD = {
    "unknown script": (["--script", "dqn.py"], [], ["unknown script 'dqn.py'", "no such .py file"]),
    "unknown grid flag": (["--grid", "learning_rat=1e-3"], [], ["refused by the script", "--learning-rat"]),
    "unknown flag after --": ([], ["--num-stepz", "64"], ["refused by the script", "--num-stepz"]),
    "a script that exits without training": ([], ["--help"], ["exited (code 0) without starting a training run"]),
    "a flag the sweep sets": ([], ["--seed", "3"], ["--seed is set by the sweep"]),
    "bad value": (["--grid", "gamma=0.99,2"], [], ["--gamma 2", "refused by the script", "--gamma must be in [0, 1]"]),
    "too many CPUs": (["--cpus-per-trial", "4096"], [], ["--cpus-per-trial 4096", "cores"]),
    "unreachable address": (["--address", "127.0.0.1:PORT"], [], ["--address 127.0.0.1:", "no Ray head answers"]),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_refused_in_one_paragraph_before_anything_runs(case, tmp_path):
    args, extra, needles = BAD[case]
    args = [a.replace("PORT", str(free_port())) for a in args]
    if "--script" not in args:
        args = ["--script", "ppo_continuous.py", *args]
    out = tmp_path / "sweep"
    proc = run_sweep("--out", out, *args, "--env-id", "Pendulum-v1", "--seeds", "1", "--", *TINY, *extra, timeout=120)
    assert_clean_error(proc, *needles)
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr  # one paragraph
    assert not out.exists(), "refused before anything was written"


def test_a_second_sweep_on_a_folder_in_use_is_refused_naming_the_holder(tmp_path):
    """Regression: two sweeps on one --out both ran, into one trial folder. This test holds the lock (an flock on the
    folder itself, as a running sweep does: the race forced); the second sweep names this process as the holder."""
    import fcntl

    out = tmp_path / "sweep"
    out.mkdir()
    folder = os.open(out, os.O_RDONLY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX | fcntl.LOCK_NB)
        proc = run_sweep("--out", out, "--script", "ppo_continuous.py", "--env-id", "Pendulum-v1", "--", *TINY, timeout=60)
        assert_clean_error(proc, f"--out {out} is in use by another sweep (pid {os.getpid()})")
        assert list(out.iterdir()) == []  # nothing written
    finally:
        os.close(folder)


# ---- what is not the tool's: never deleted, truncated or written through --------------------------------------------


def test_a_users_sweep_lock_in_out_is_never_deleted_or_truncated(tmp_path):
    """Issue (tools never touch what they did not make): the tool's lock was <out>/sweep.lock, opened with O_CREAT,
    truncated, and unlinked at the end: a user's file of that name was emptied, then deleted, even by a refused sweep.
    The lock is now an flock on the folder: a file named sweep.lock is the user's, like any other."""
    out = tmp_path / "sweep"
    out.mkdir()
    (out / "sweep.lock").write_text("mine\n")
    base = ["--script", "ppo_continuous.py", "--env-id", "Pendulum-v1", "--seeds", "1"]
    # refused by its probe (the old tool), or as a folder that is not empty
    proc = run_sweep("--out", out, *base, "--grid", "learning_rat=1e-3", "--", *TINY, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert [p.name for p in out.iterdir()] == ["sweep.lock"] and (out / "sweep.lock").read_text() == "mine\n"
    (out / "notes.txt").write_text("mine too\n")
    proc = run_sweep("--out", out, *base, "--", *TINY, timeout=120)
    assert_clean_error(proc, f"--out {out} is not empty")
    assert (out / "sweep.lock").read_text() == "mine\n" and (out / "notes.txt").read_text() == "mine too\n"
    # a sweep's folder with the user's sweep.lock in it: a refused --resume leaves it
    resumed = tmp_path / "resumed"
    old = write_sweep(resumed, [1], ["--total-timesteps", "1024"])
    (resumed / "sweep.lock").write_text("mine\n")
    proc = run_sweep("--out", resumed, "--resume", "--", "--total-timesteps", "4096", timeout=120)
    assert_clean_error(proc, "--resume with --extra")
    assert (resumed / "sweep.lock").read_text() == "mine\n" and json.loads((resumed / "sweep.json").read_text()) == old


DROPS_A_FILE = """import os, sys
open(os.environ["SWEEP_TEST_DROP"], "w").write("the user's\\n")  # a file put into --out while the sweep checks its input
print("error: this script refuses every command")
sys.exit(2)
"""


def test_a_refused_sweep_removes_only_the_empty_folders_it_made(tmp_path):
    """A refused sweep removed its --out with shutil.rmtree, with whatever had been put into it meanwhile (here: by the
    probed script, while the tool checked its input). Now it removes the folders it made, each only if empty."""
    script = tmp_path / "drops.py"
    script.write_text(DROPS_A_FILE)
    out = tmp_path / "a" / "b" / "sweep"
    env = sweep_env(SWEEP_TEST_DROP=str(out / "notes.txt"))
    proc = run_sweep("--out", out, "--script", script, "--env-id", "X", "--seeds", "1", env=env, timeout=120)
    assert_clean_error(proc, "refused by the script", "this script refuses every command")
    assert (out / "notes.txt").read_text() == "the user's\n" and list(out.iterdir()) == [out / "notes.txt"]
    # refused with nothing put into it: the three folders it made are gone, not the one that was there
    out = tmp_path / "c" / "d" / "sweep"
    proc = run_sweep("--out", out, "--script", "ppo_continuous.py", "--env-id", "X", "--seeds", "1", "1", timeout=120)
    assert proc.returncode == 2 and not (tmp_path / "c").exists() and tmp_path.is_dir(), proc.stderr


def test_summaries_are_written_whole_never_through_a_link_or_over_a_file_of_another_name(tmp_path):
    """summary.md was written in place (through a link: into the file it points at) and every JSON file by way of
    <name>.tmp (a user's summary.tmp was renamed over summary.json, i.e. deleted). Now each file is written whole
    under a name of its own (O_EXCL) and renamed into place: a link there is replaced, never followed."""
    out = tmp_path / "sweep"
    write_sweep(out, [1], ["--total-timesteps", "1024"])
    mine = tmp_path / "mine.md"
    mine.write_text("my notes\n")
    (out / "summary.md").symlink_to(mine)
    for name in ("summary.tmp", "sweep.tmp"):
        (out / name).write_text("mine\n")
    proc = run_sweep("--out", out, "--summarize", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert mine.read_text() == "my notes\n" and not (out / "summary.md").is_symlink()
    assert "| task |" in (out / "summary.md").read_text() and json.loads((out / "summary.json").read_text())["trials"]
    assert (out / "summary.tmp").read_text() == "mine\n" and (out / "sweep.tmp").read_text() == "mine\n"
    assert not list(out.glob(".*.tmp")), "no temporary file left"


# Each case is refused before any probe; the command also carries a grid flag the script refuses, so a tool that misses
# the case stops at its probe (with another message) instead of running a sweep.
BAD_FLAGS = {
    "a seed twice": (["--seeds", "1", "1"], ["--seeds [1, 1]", "each seed given once"]),
    "a negative --search-seed": (
        ["--tune", "--space", "gamma=uniform:0.9:0.99", "--search-seed", "-1"],
        ["--search-seed -1", "each >= 0"],
    ),
    "an infinite --space bound": (["--tune", "--space", "gamma=uniform:0.9:inf"], ["--space 'gamma=uniform:0.9:inf'"]),
    "a NaN --report-interval": (["--report-interval", "nan"], ["--report-interval in (0, 3600]"]),
    "a --grid flag twice": (["--grid", "gamma=0.9", "--grid", "gamma=0.99"], ["--grid 'gamma=0.99'", "each flag once"]),
    "a value argparse refuses": (["--seeds", "one"], ["argument --seeds: invalid int value: 'one'"]),
    "an unknown flag": (["--sedes", "1"], ["unrecognized arguments: --sedes 1"]),
    "no --out": (["--out"], ["argument --out: expected one argument"]),
    "an --out through a file": (["--out", "FILE/sub"], ["Not a directory", "FILE/sub"]),
    "an --out name too long": (["--out", "TMP/" + "x" * 300], ["File name too long"]),
}


@pytest.mark.parametrize("case", list(BAD_FLAGS))
def test_every_bad_flag_or_path_is_refused_in_one_paragraph_before_any_probe(case, tmp_path):
    """Issue (tools never touch what they did not make): argparse's usage block and error, tracebacks for an --out
    through a file or a name too long, and --seeds 1 1, --search-seed -1, an inf bound, --report-interval nan, a grid
    flag given twice all accepted (the sweep ran, or failed later in a traceback)."""
    args, needles = BAD_FLAGS[case]
    (tmp_path / "file").write_text("mine\n")
    args = [str(a).replace("FILE", str(tmp_path / "file")).replace("TMP", str(tmp_path)) for a in args]
    needles = [n.replace("FILE", str(tmp_path / "file")) for n in needles]
    out = tmp_path / "sweep"
    common = ["--script", "ppo_continuous.py", "--env-id", "Pendulum-v1", "--grid", "learning_rat=1e-3"]
    proc = run_sweep("--out", out, *common, *args, "--", *TINY, timeout=120)
    assert_clean_error(proc, *needles)
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr  # one paragraph
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"] and (tmp_path / "file").read_text() == "mine\n"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into any folder")
def test_an_out_this_user_cannot_write_is_refused_before_any_probe(tmp_path):
    out = tmp_path / "sweep"
    out.mkdir()
    out.chmod(0o555)
    try:
        proc = run_sweep("--out", out, "--script", "ppo_continuous.py", "--env-id", "Pendulum-v1", "--", *TINY, timeout=60)
        assert_clean_error(proc, f"--out {out} is not writable")
    finally:
        out.chmod(0o755)


SLEEPS = """import os, pathlib, time
pathlib.Path(os.environ["SWEEP_TEST_STARTED"]).touch()
time.sleep(120)
"""


def test_ctrl_c_while_the_input_is_checked_ends_in_one_paragraph_and_leaves_no_folder(tmp_path):
    """Ctrl-C at a terminal (SIGINT to the driver's process group) while a probe runs: a KeyboardInterrupt traceback
    (and the probe's). Now: one paragraph, exit 130, the folder it made removed, nothing of it left running."""
    (tmp_path / "sleeps.py").write_text(SLEEPS)
    started, out = tmp_path / "started", tmp_path / "sweep"
    env = sweep_env(SWEEP_TEST_STARTED=str(started))
    proc = start_sweep("--out", out, "--script", tmp_path / "sleeps.py", "--env-id", "X", "--seeds", "1", env=env)
    try:
        wait_until(started.exists, 60, "the probe's start", proc)
        os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = output_after_ctrl_c(proc, 60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130 and stderr.startswith("error: stopped (Ctrl-C)"), stdout + stderr
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert not out.exists()


@pytest.mark.slow  # about 20 s: gRPC's handshake wait
def test_an_address_that_is_not_a_ray_head_is_refused_within_30_seconds(tmp_path):
    """Regression: an HTTP server as --address hung in ray.init for 300 s and more, after writing sweep.json."""
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1"], stdout=subprocess.PIPE, text=True
    )
    try:
        port = int(re.search(r"port (\d+)", server.stdout.readline()).group(1))
        out = tmp_path / "sweep"
        args = ["--out", out, "--address", f"127.0.0.1:{port}", "--script", "ppo_continuous.py", "--env-id", "Pendulum-v1"]
        proc = run_sweep(*args, "--", *TINY, timeout=60)  # the tool's own handshake gives up after 20 s, not ray.init
        assert_clean_error(proc, f"--address 127.0.0.1:{port}: no Ray head answers there")
        assert not out.exists()
    finally:
        server.kill()
        server.wait()


def test_out_a_file_and_a_corrupt_sweep_json_get_one_paragraph(tmp_path):
    """Regression: FileExistsError and JSONDecodeError tracebacks."""
    (tmp_path / "file").write_text("mine\n")
    proc = run_sweep("--out", tmp_path / "file", "--script", "ppo_continuous.py", "--env-id", "Pendulum-v1", timeout=60)
    assert_clean_error(proc, "is a file, not a folder")
    assert (tmp_path / "file").read_text() == "mine\n"
    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / "sweep.json").write_text('{"trials": [')
    for flag in ("--resume", "--summarize"):
        proc = run_sweep("--out", tmp_path / "sweep", flag, timeout=60)
        assert_clean_error(proc, "sweep.json is not a sweep this tool wrote")
    assert (tmp_path / "sweep" / "sweep.json").read_text() == '{"trials": ['


def test_resume_after_the_script_moved_gets_one_paragraph(tmp_path):
    """A --resume whose script was moved away (or deleted) ended in a FileNotFoundError traceback."""
    (tmp_path / "scripts").mkdir()
    script = tmp_path / "scripts" / "ppo_continuous.py"
    shutil.copy(ROOT / "ppo_continuous.py", script)
    out = tmp_path / "sweep"
    old = write_sweep(out, [1], ["--total-timesteps", "1024"], script=str(script))
    script.rename(tmp_path / "moved.py")
    proc = run_sweep("--out", out, "--resume", timeout=120)
    assert_clean_error(proc, f"{script} moved or changed since the sweep started")
    assert json.loads((out / "sweep.json").read_text()) == old


def malformed_specs(valid: dict) -> dict:
    """sweep.json files of the right JSON but not of the tool's shape: what a hand edit or another version leaves."""
    trial = valid["trials"][0]
    return {
        "no args": {"args": {}, "trials": []},
        "args of another type": {**valid, "args": {**valid["args"], "seeds": "1 2"}},
        "an unknown metric": {**valid, "args": {**valid["args"], "metric": "best"}},
        "a trial not an object": {**valid, "trials": [1]},
        "a trial without its fields": {**valid, "trials": [{"id": trial["id"]}]},
        "a trial with a field of another type": {**valid, "trials": [{**trial, "seed": "1"}]},
        "a trial with a field more": {**valid, "trials": [{**trial, "note": "x"}]},
    }


def test_a_sweep_json_of_another_shape_gets_one_paragraph_from_resume_and_summarize(tmp_path):
    """Only its top-level types were checked: a missing key or a field of another type ended in a KeyError or
    TypeError traceback."""
    valid = write_sweep(tmp_path / "valid", [1], ["--total-timesteps", "1024"])
    for name, spec in malformed_specs(valid).items():
        out = tmp_path / name.replace(" ", "-")
        out.mkdir()
        (out / "sweep.json").write_text(json.dumps(spec))
        for flag in ("--resume", "--summarize"):
            proc = run_sweep("--out", out, flag, timeout=120)
            assert_clean_error(proc, "sweep.json is not a sweep this tool wrote")
        assert json.loads((out / "sweep.json").read_text()) == spec and [p.name for p in out.iterdir()] == ["sweep.json"]


def test_a_result_json_of_another_shape_is_not_taken_as_a_finished_trial(tmp_path):
    """A result.json that was JSON but not an object (or had no state) ended --summarize in an AttributeError or
    KeyError traceback; now such a trial counts as unfinished (its --resume runs it)."""
    out = tmp_path / "sweep"
    spec = write_sweep(out, [1, 2, 3], ["--total-timesteps", "1024"])
    ids = [t["id"] for t in spec["trials"]]
    (out / "trials" / ids[0] / "result.json").write_text("[1, 2]")
    (out / "trials" / ids[1] / "result.json").write_text(json.dumps({"key": ids[1]}))
    proc = run_sweep("--out", out, "--summarize", timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    states = {t["id"]: t["state"] for t in json.loads((out / "summary.json").read_text())["trials"]}
    assert states == {ids[0]: "unfinished", ids[1]: "unfinished", ids[2]: "done"}
    assert "(unfinished: 1, 2)" in proc.stdout


def test_summarize_of_an_empty_grid_and_of_a_tuning_sweep_works(tmp_path):
    """Regression: ZeroDivisionError in `plot` for an empty grid (`--grid "learning_rate= ,"` was accepted) and a study."""
    proc = run_sweep(
        "--out", tmp_path / "s", "--script", "ppo_continuous.py", "--env-id", "Pendulum-v1", "--grid", "learning_rate= ,"
    )
    assert_clean_error(proc, "--grid 'learning_rate= ,'")
    args = {**DEFAULTS, "script": [], "env_id": [], "metric": "eval"}  # every key a sweep.json holds
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "sweep.json").write_text(json.dumps({"args": args, "trials": []}))
    proc = run_sweep("--out", tmp_path / "empty", "--summarize", timeout=60)
    assert proc.returncode == 0 and "| task |" in proc.stdout, proc.stdout + proc.stderr
    assert json.loads((tmp_path / "empty" / "summary.json").read_text())["tasks"] == []
    (tmp_path / "tune").mkdir()
    (tmp_path / "tune" / "sweep.json").write_text(json.dumps({"args": {**args, "tune": True}, "trials": []}))
    proc = run_sweep("--out", tmp_path / "tune", "--summarize", timeout=60)
    assert proc.returncode == 0 and "| task |" in proc.stdout, proc.stdout + proc.stderr  # no setting finished: no best


SPY = """import json, os, sys
from pathlib import Path
runs = Path(sys.argv[len(sys.argv) - sys.argv[::-1].index("--runs-dir")]) / "spy"  # (the probe's is the last)
runs.mkdir(parents=True)
raylet = Path(f"/proc/{os.environ.get('RAY_RAYLET_PID', 'self')}/cmdline").read_bytes().decode().split(chr(0))
temp = next((a.split("=", 1)[1] for a in raylet if a.startswith("--temp_dir=")), "")
listening = [line.split()[1] for name in ("/proc/net/tcp", "/proc/net/tcp6") for line in open(name).readlines()[1:]]
seen = {"env": dict(os.environ), "raylet": raylet, "temp": temp, "listening": listening}
seen["modes"] = [os.stat(p).st_mode & 0o777 for p in (temp, os.path.dirname(temp))] if temp else None
(runs / "args.json").write_text(json.dumps(seen))
"""


@pytest.mark.slow  # a Ray of its own and a trial (about a minute of the serial Ray group): the default tier stays under 10 min
@pytest.mark.ray
def test_the_sweeps_own_ray_has_token_auth_a_private_temp_folder_and_listens_on_127_0_0_1(tmp_path):
    """Regression: the sweep turned Ray's token authentication off (RAY_AUTH_MODE=disabled) and put an empty entry on
    PYTHONPATH. A stand-in script (it makes its run folder, so the probe passes) records what a trial sees: its env,
    its Ray node's command line and the listening sockets, while the sweep's Ray runs. The user's env asks for the
    opposite (auth disabled, an empty PYTHONPATH entry)."""
    (tmp_path / "spy.py").write_text(SPY)
    out = tmp_path / "sweep"
    env = sweep_env(RAY_AUTH_MODE="disabled", PYTHONPATH=f"{ROOT}{os.pathsep}")
    proc = run_sweep("--out", out, "--script", tmp_path / "spy.py", "--env-id", "X", "--seeds", "1", env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (found,) = out.glob("trials/*/runs/spy/args.json")
    seen = json.loads(found.read_text())
    assert seen["env"]["RAY_AUTH_MODE"] == "token" and len(seen["env"].get("RAY_AUTH_TOKEN", "")) >= 32
    assert seen["env"]["RAY_AUTH_TOKEN"] not in json.dumps(dict(os.environ))  # a token of this cluster's own
    assert "" not in seen["env"].get("PYTHONPATH", "").split(os.pathsep) or not seen["env"].get("PYTHONPATH")
    # Ray makes its temp folder 0777: it is inside one of this user's own, 0700, removed at the end
    private = Path(seen["temp"]).parent
    assert private.name.startswith(f"ray-{os.getuid()}-") and seen["modes"][1] == 0o700, seen["modes"]
    assert not private.exists(), "the sweep removes its Ray temp folder"
    assert "--node_ip_address=127.0.0.1" in seen["raylet"]
    (gcs,) = {a.split("=", 1)[1] for a in seen["raylet"] if a.startswith("--gcs-address=")} or {""}
    host, port = gcs.rsplit(":", 1)
    assert host == "127.0.0.1"
    bound = {a.rsplit(":", 1)[0] for a in seen["listening"] if int(a.rsplit(":", 1)[1], 16) == int(port)}
    assert bound and bound <= {"0100007F", "0000000000000000FFFF00000100007F"}, bound  # 127.0.0.1 only


# ---- a tiny sweep end to end --------------------------------------------------------------------------------------


@pytest.mark.slow  # 8 Ray trials, about 2 minutes of the serial Ray group: the default tier stays under 10 minutes
@pytest.mark.ray
def test_a_tiny_sweep_summarizes_each_trials_own_scalars_and_marks_a_failing_trial(tmp_path):
    """2 seeds x num_minibatches 2,3 x num_steps 64,96: (64, 3) passes the value check (each value is probed, not
    each combination) but the script refuses it at start: those trials fail with their log's last lines, the
    others finish; the JSON and the table hold the numbers each trial's TensorBoard files hold."""
    out = tmp_path / "sweep"
    proc = run_sweep(
        "--out",
        out,
        "--script",
        "ppo_continuous.py",
        "--env-id",
        "Pendulum-v1",
        "--seeds",
        "1",
        "2",
        "--grid",
        "num_steps=64,96",
        "--grid",
        "num_minibatches=2,3",
        "--report-interval",
        "1",
        "--",
        *TINY,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr  # some trials failed
    summary = json.loads((out / "summary.json").read_text())
    trials = {t["id"]: t for t in summary["trials"]}
    assert len(trials) == 8
    failed = sorted(t for t, e in trials.items() if e["state"] == "failed")
    assert failed == sorted(t for t in trials if "num-steps=64_num-minibatches=3" in t), failed
    for trial_id in failed:
        assert "must divide the batch size" in trials[trial_id]["log_tail"]  # the script's own words
        assert f"[trial {trial_id}] FAILED (exit code 2)" in proc.stdout
        assert "must divide the batch size" in proc.stderr
    for trial_id, entry in trials.items():
        if trial_id in failed:
            continue
        assert entry["state"] == "done"
        run_dir = run_dir_of(out / "trials" / trial_id)
        evals, train = scalars(run_dir, "eval/episodic_return"), scalars(run_dir, "charts/episodic_return")
        assert entry["eval_last"] == pytest.approx(evals[max(evals)]) and entry["eval_step_last"] == max(evals)
        if train:  # (192 steps of num_steps 96 end no 200-step episode)
            assert entry["train_last100_mean"] == pytest.approx(np.mean(list(train.values())[-100:]))
        else:
            assert "train_last100_mean" not in entry
        assert json.loads((run_dir / "args.json").read_text())["compute"]["torch_threads"] == 1  # --cpus-per-trial 1
        assert f"[trial {trial_id}] done" in proc.stdout
    # per task: the mean of its seeds' final evaluations (the score, as --eval-interval is given)
    table = (out / "summary.md").read_text()
    for row in summary["tasks"]:
        seeds = [e for e in trials.values() if e["task"] == row["task"] and e["state"] == "done"]
        if "num-minibatches=3" in row["task"] and "num-steps=64" in row["task"]:
            assert row["n"] == 0 and row["failed"] == [1, 2] and f"| {row['task']} | 0 / 2 | – |" in table
            continue
        assert row["per_seed"] == [e["eval_last"] for e in seeds] and row["n"] == 2
        assert row["mean"] == pytest.approx(np.mean(row["per_seed"]))
        assert f"| {row['task']} | 2 / 2 | {row['mean']:.1f} ± {row['std']:.1f} |" in table
    assert re.search(r"^\[sweep\] 6/8 done, 0 running, 2 failed, 0 pending", proc.stdout, re.M), proc.stdout
    # --summarize rewrites the same numbers from what is on disk
    again = run_sweep("--out", out, "--summarize", timeout=120)
    assert again.returncode == 1 and json.loads((out / "summary.json").read_text())["tasks"] == summary["tasks"]


@pytest.mark.slow  # two Ray starts, about 100 s: the default tier stays under 10 minutes
@pytest.mark.ray
def test_the_benchmark_harness_runs_its_seeds_as_a_sweep_and_resumes_it(tmp_path):
    """benchmarks/run.py runs this project's scripts through the tool: the seeds are trials of one sweep in
    <out>_runs/sweep/ (--torch-threads N given to the harness becomes --cpus-per-trial N), its JSON reads each trial's
    run folder; run again, it resumes that sweep and reruns nothing (the same run folders, unchanged)."""
    out = tmp_path / "bench" / "pendulum"
    command = [
        sys.executable,
        str(ROOT / "benchmarks" / "run.py"),
        "--script",
        "ppo_continuous.py",
        "--env-id",
        "Pendulum-v1",
        "--seeds",
        "1",
        "2",
        "--total-timesteps",
        "256",
        "--out",
        str(out),
        "--parallel",
        "2",
        "--",
        "--num-steps",
        "64",
        "--num-minibatches",
        "2",
        "--torch-threads",
        "1",
    ]
    proc = subprocess.run(
        command, cwd=ROOT, env=sweep_env(), capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "--cpus-per-trial 1" in proc.stdout and "[sweep] 2/2 done" in proc.stdout
    report = json.loads(out.with_suffix(".json").read_text())
    sweep = out.parent / "pendulum_runs" / "sweep"
    for entry in report["per_seed"]:
        run_dir = out.parent / entry["run_dir"]
        assert entry["status"] == "ok" and run_dir.parent.parent.parent == sweep / "trials"
        assert json.loads((run_dir / "args.json").read_text())["compute"]["torch_threads"] == 1
        assert entry["last100_mean"] == pytest.approx(np.mean(list(scalars(run_dir, "charts/episodic_return").values())))
        assert (out.parent / entry["log"]).read_text().startswith("$ ")  # the trial's own log (its command first), linked
    before = {p: p.stat().st_mtime_ns for p in sweep.rglob("events.out.*")}
    again = subprocess.run(
        command, cwd=ROOT, env=sweep_env(), capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL
    )
    assert again.returncode == 0 and "--resume" in again.stdout, again.stdout + again.stderr
    assert {p: p.stat().st_mtime_ns for p in sweep.rglob("events.out.*")} == before  # nothing ran twice
    assert json.loads(out.with_suffix(".json").read_text())["per_seed"] == report["per_seed"]
    (task,) = report["sweep_summary"]  # the sweep's summary of the same seeds: its mean is the harness's
    assert task["mean"] == pytest.approx(report["summary"]["last100_mean"]["mean"], abs=0.01)


# ---- Ctrl-C and --resume ------------------------------------------------------------------------------------------


@pytest.mark.slow  # ~130 s of the default tier's serial Ray group (its wall time, 9.5 of 10 minutes): CI's slow tier runs it
@pytest.mark.ray
def test_ctrl_c_saves_the_running_trial_and_resume_runs_nothing_twice(tmp_path):
    """One trial at a time (2 CPUs each on 2 cores): 256 steps (finishes), 6,016 (Ctrl-C once it has a checkpoint),
    384 (never starts). --resume keeps the first untouched, resumes the second from its interrupted checkpoint in its
    run folder, and runs the third."""
    out = tmp_path / "sweep"
    cpus = str(min(2, len(os.sched_getaffinity(0))))
    proc = start_sweep(
        "--out",
        out,
        "--script",
        "ppo_continuous.py",
        "--env-id",
        "Pendulum-v1",
        "--seeds",
        "1",
        "--cpus-per-trial",
        cpus,
        "--grid",
        "total_timesteps=256,6016,384",
        "--report-interval",
        "1",
        "--",
        "--num-steps",
        "64",
        "--num-minibatches",
        "2",
        "--checkpoint-interval",
        "256",
    )
    trials = out / "trials"
    out1, err1 = ctrl_c_once_saved(proc, trials, "*total-timesteps=6016*/runs/*/checkpoints/step_*.pt")
    assert proc.returncode == 130, out1 + err1
    first, second, third = (next(trials.glob(f"*total-timesteps={n}_*")) for n in (256, 6016, 384))
    assert json.loads((first / "result.json").read_text())["state"] == "done"
    assert not (second / "result.json").exists()
    interrupted = list(second.glob("runs/*/checkpoints/interrupted_*.pt"))
    assert len(interrupted) == 1, list(second.rglob("*.pt"))
    assert not (third / "runs").exists(), "the third trial never started"
    kept = {p: p.stat().st_mtime_ns for p in first.rglob("*")}
    run_dir = run_dir_of(second)

    proc = run_sweep("--out", out, "--resume", "--report-interval", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 finished trial(s) kept; 2 to run" in proc.stdout
    assert {p: p.stat().st_mtime_ns for p in first.rglob("*")} == kept, "the finished trial is untouched"
    assert run_dir_of(second) == run_dir and f"(resumed from {interrupted[0]})" in (second / "log.txt").read_text()
    assert max(scalars(run_dir, "charts/SPS")) == 6016 and not (second / "abandoned").exists()
    assert json.loads((third / "result.json").read_text())["state"] == "done"
    assert all(t["state"] == "done" for t in json.loads((out / "summary.json").read_text())["trials"])


# ---- slow tier: a cluster that loses a node, and a tiny --tune study ----------------------------------------------


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.timeout(1800)  # a slow runner is waited for as long as the trials write (finish_while_writing)
def test_a_node_lost_mid_trial_its_trial_finishes_on_the_other_node_from_its_checkpoint(tmp_path):
    """Two nodes of 1 CPU (tests/test_sac_continuous_ray_cluster.py's Cluster: its own sessions and temp dirs,
    stopped by process group), two trials of 1 CPU: one per node. The second node is SIGKILLed once both trials have
    a checkpoint; Ray runs its trial again on the head, which resumes it from its newest checkpoint in the same folder.
    Why 1 CPU: a trial runs --torch-threads = its CPUs; two trials of 2 threads on a 2-core runner, beside another
    slow test, trained at 24 SPS in a CI run (OpenMP threads waiting on each other) and missed a fixed 600 s."""
    from tests.test_sac_continuous_ray_cluster import FAST_FAILURE, Cluster

    c = Cluster(tmp_path)
    out = tmp_path / "sweep"
    proc = None
    try:
        c.start_node(
            "--head",
            "--port",
            str(c.port),
            "--node-ip-address",
            "127.0.0.1",
            "--include-dashboard",
            "false",
            "--system-config",
            FAST_FAILURE,
            cpus=1,
        )
        c.wait_for_nodes(1)
        c.start_node("--address", c.address, cpus=1)
        c.wait_for_nodes(2)
        proc = start_sweep(
            "--out",
            out,
            "--address",
            c.address,
            "--script",
            "ppo_continuous.py",
            "--env-id",
            "Pendulum-v1",
            "--seeds",
            "1",
            "2",
            "--cpus-per-trial",
            "1",
            "--report-interval",
            "1",
            "--",
            "--total-timesteps",
            "8000",
            "--num-steps",
            "64",
            "--num-minibatches",
            "2",
            "--checkpoint-interval",
            "128",
            env={**c.env, "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"},
        )
        # Why per trial: two checkpoints of one trial (the second not even started) made the kill lose a trial
        # with nothing to resume from (a CI run); and a trial that finished first has nothing left to resume.
        # Why 8,000 steps: what is left after the kill runs one trial after the other on the head's 2 CPUs; with
        # 16,000, a CI run beside the mutant run trained at 26 SPS and passed its 600 s.
        saved = lambda: {p.parts[-5] for p in out.glob("trials/*/runs/*/checkpoints/step_*.pt")}  # noqa: E731
        wait_until(lambda: len(saved()) >= 2, 300, "a checkpoint of each of its 2 trials", proc)
        assert not list(out.glob("trials/*/result.json")), "a trial finished before the kill: raise --total-timesteps"
        c.kill(1)
        stdout, stderr = finish_while_writing(proc, out)
    finally:
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        c.kill()
    assert proc.returncode == 0, stdout + stderr + c.logs()
    resumed = []
    for trial in sorted((out / "trials").iterdir()):
        assert json.loads((trial / "result.json").read_text())["state"] == "done"
        run_dir = run_dir_of(trial)
        assert max(scalars(run_dir, "charts/SPS")) == 8000
        if "(resumed from" in (trial / "log.txt").read_text():
            resumed.append(trial.name)
    assert len(resumed) == 1, f"the lost node's trial, and only it, resumed from its checkpoint: {resumed}"


@pytest.mark.slow
@pytest.mark.ray
def test_a_tiny_tune_study_scores_each_setting_by_its_seeds_and_prints_the_best_command(tmp_path):
    """3 settings drawn from the space, 2 seeds each: 6 grid trials; a setting's score is the mean of its seeds' last
    evaluations, read back here from their files; the best is printed as a command line."""
    out = tmp_path / "tune"
    proc = run_sweep(
        "--out",
        out,
        "--tune",
        "--script",
        "ppo_continuous.py",
        "--env-id",
        "Pendulum-v1",
        "--seeds",
        "1",
        "2",
        "--space",
        "learning_rate=loguniform:1e-4:1e-2",
        "--space",
        "gamma=choice:0.95,0.99",
        "--num-samples",
        "3",
        "--report-interval",
        "1",
        "--",
        *TINY,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["tasks"]) == 3 and all(r["n"] == 2 for r in summary["tasks"])
    best = summary["best"]
    assert best["mean"] == max(r["mean"] for r in summary["tasks"])
    ids = [t["id"] for t in summary["trials"] if t["task"] == best["task"]]
    evals = [scalars(run_dir_of(out / "trials" / i), "eval/episodic_return") for i in ids]
    assert best["mean"] == pytest.approx(np.mean([e[max(e)] for e in evals]))
    assert f"[tune] best command line:\n{best['command']}\n" in proc.stdout
    (flags,) = {
        tuple(map(tuple, t["flags"])) for t in json.loads((out / "sweep.json").read_text())["trials"] if t["id"] in ids
    }
    assert f"--learning-rate {flags[0][1]} --gamma {flags[1][1]}" in best["command"]


@pytest.mark.slow
@pytest.mark.ray
def test_a_tune_study_stopped_with_ctrl_c_resumes_its_settings_from_their_checkpoints(tmp_path):
    """Ctrl-C once a setting's seed has a checkpoint: the driver exits 130; --resume runs the same settings (drawn
    again from --search-seed), the stopped one from its interrupted checkpoint, and names the best."""
    out = tmp_path / "tune"
    proc = start_sweep(
        "--out",
        out,
        "--tune",
        "--script",
        "ppo_continuous.py",
        "--env-id",
        "Pendulum-v1",
        "--seeds",
        "1",
        "--space",
        "learning_rate=loguniform:1e-4:1e-2",
        "--num-samples",
        "2",
        "--report-interval",
        "1",
        "--",
        "--total-timesteps",
        "4096",
        "--num-steps",
        "64",
        "--num-minibatches",
        "2",
        "--eval-interval",
        "512",
        "--eval-episodes",
        "1",
        "--checkpoint-interval",
        "256",
    )
    out1, err1 = ctrl_c_once_saved(proc, out, "trials/*/runs/*/checkpoints/step_*.pt")
    assert proc.returncode == 130, out1 + err1
    interrupted = list(out.glob("trials/*/runs/*/checkpoints/interrupted_*.pt"))
    assert interrupted, list(out.rglob("*.pt"))
    proc = run_sweep("--out", out, "--resume", "--report-interval", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[tune] best command line:" in proc.stdout
    log = (interrupted[0].parents[3] / "log.txt").read_text()
    assert f"(resumed from {interrupted[0]})" in log, log
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["tasks"]) == 2 and all(t["state"] == "done" for t in summary["trials"]), summary
