"""The fork server (tests/fork_runner.py) runs a script as a fresh `python SCRIPT ARGS` does: same exit code, stdout and
stderr, working folder, environment, sys.path, atexit handlers and thread joins, and a timeout that stops it."""

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, output_after_ctrl_c, wait_until
from tests import fork_runner
from tests.fork_runner import run_forked, run_python

PROBE = """
import atexit, os, sys, threading, time
atexit.register(lambda: print("atexit ran"))
threading.Thread(target=lambda: (time.sleep(0.2), print("thread joined"))).start()
print("argv", sys.argv[1:], "cwd", os.getcwd(), "env", os.environ.get("PROBE_VALUE"), "stdin", sys.stdin.read())
print("path0", sys.path[0], "root on path", any(p and os.path.samefile(p, ROOT) for p in sys.path if os.path.isdir(p)))
print("to stderr", file=sys.stderr)
if sys.argv[1] == "raise":
    raise ValueError("boom")
if sys.argv[1] == "sleep":
    time.sleep(60)
sys.exit(int(sys.argv[1]) if sys.argv[1].isdigit() else sys.argv[1])
"""


@pytest.fixture
def probe(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(f"ROOT = {str(ROOT)!r}\n" + PROBE)
    return script


def fresh(script, args, cwd, env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(script), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize("args", [["0"], ["3"], ["raise"], ["a message"]])
def test_a_forked_run_reads_like_a_fresh_interpreters(probe, tmp_path, args):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PROBE_VALUE": "set"}
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    want, got = fresh(probe, args, cwd, env), run_forked(probe, args, cwd, env, timeout=60, hidden=[ROOT])
    assert got.returncode == want.returncode
    assert got.stdout == want.stdout
    assert "thread joined\natexit ran" in got.stdout and "root on path False" in got.stdout
    if args == ["raise"]:  # the traceback's frames differ (runpy's are on the forked one's stack); its end does not
        assert got.stderr.splitlines()[-1] == want.stderr.splitlines()[-1] == "ValueError: boom"
        assert got.stderr.startswith("to stderr\nTraceback (most recent call last):")
    else:
        assert got.stderr == want.stderr


def test_a_forked_run_that_runs_past_its_timeout_is_killed(probe, tmp_path):
    """Killed at its timeout, not left to end its 60 s sleep (which would run its atexit handler): checked by what
    it printed, not by the seconds the test took (the fork server's first start is in them)."""
    with pytest.raises(subprocess.TimeoutExpired) as caught:
        run_forked(probe, ["sleep"], tmp_path, dict(os.environ), timeout=2)
    assert "argv ['sleep']" in caught.value.output and "atexit ran" not in caught.value.output
    assert "the run did not end within its timeout of 2 s; killed" in str(caught.value)
    assert run_forked(probe, ["0"], tmp_path, dict(os.environ), timeout=60).returncode == 0  # the server goes on


STOPPABLE = """
import signal, sys, time
signal.signal(signal.SIGINT, lambda *_: (print("saved on ctrl-c", flush=True), sys.exit(130)))
for step in range(600):
    print("step", step, flush=True)
    open("progress", "w").write(str(step))
    time.sleep(0.1)
sys.exit(0)
"""


@pytest.mark.parametrize("fork", [True, False], ids=["forked", "fresh"])
def test_stop_when_sends_ctrl_c_once_it_holds_and_the_stopped_run_counts_as_done(tmp_path, fork):
    """A learning test's early stop: run_python asks stop_when every POLL_S; once True the run gets SIGINT, and its
    exit 130 (saved on Ctrl-C) reads as 0 with .stopped set."""
    script = tmp_path / "stoppable.py"
    script.write_text(STOPPABLE)
    progress = tmp_path / "progress"
    reached = lambda: progress.exists() and int(progress.read_text() or 0) >= 5  # noqa: E731
    proc = run_python(script, [], tmp_path, dict(os.environ), timeout=120, fork=fork, stop_when=reached)
    assert proc.returncode == 0 and proc.stopped and "saved on ctrl-c" in proc.stdout, proc
    steps = [int(line.split()[1]) for line in proc.stdout.splitlines() if line.startswith("step")]
    assert 5 <= steps[-1] < 599, "stopped by the Ctrl-C, after stop_when held and before the run's end"


SLOW_TO_SAVE = """
import signal, sys, time
save_s = float(sys.argv[1])  # -1: the Ctrl-C is ignored
signal.signal(signal.SIGINT, lambda *_: save_s >= 0 and (time.sleep(save_s), sys.exit(130)))
time.sleep(60)
"""


@pytest.mark.parametrize("fork", [True, False], ids=["forked", "fresh"])
def test_a_slow_save_after_the_ctrl_c_gets_its_grace_and_a_run_that_goes_on_fails_saying_so(tmp_path, fork, monkeypatch):
    """stop_when holds at the first poll (2 s), just before the 3 s timeout. A run that takes 2 s to save after its
    Ctrl-C still has CTRL_C_GRACE_S (here 60 s) to exit; a run that ignores the Ctrl-C is killed, and the error says
    that the wait after the Ctrl-C ran out (not a bare "timed out")."""
    script = tmp_path / "slow_to_save.py"
    script.write_text(SLOW_TO_SAVE)
    monkeypatch.setattr(fork_runner, "CTRL_C_GRACE_S", 60.0)
    proc = run_python(script, ["2"], tmp_path, dict(os.environ), timeout=3, fork=fork, stop_when=lambda: True)
    assert proc.returncode == 0 and proc.stopped, proc  # exit 130 at about 4 s: a Ctrl-C stop counts as done
    monkeypatch.setattr(fork_runner, "CTRL_C_GRACE_S", 1.0)
    with pytest.raises(subprocess.TimeoutExpired, match="the run did not exit after its Ctrl-C") as caught:
        run_python(script, ["-1"], tmp_path, dict(os.environ), timeout=3, fork=fork, stop_when=lambda: True)
    assert caught.value.stopped


ENDS_ALONE = """
import time
time.sleep(3)  # past the first poll (POLL_S = 2 s), so stop_when is asked while the run still goes
open("ended", "w").write("")
"""


def test_a_run_that_ends_while_stop_when_decides_is_no_error_and_the_server_stays_in_step(tmp_path):
    """The race of a learning test whose run finishes just as it reaches the threshold: by the time stop_when says
    stop, the server has reaped the child, so the Ctrl-C finds no process. That must not raise, and the server's
    reply (the exit code) must still be read, or the next run would take it for its pid."""
    script = tmp_path / "ends_alone.py"
    script.write_text(ENDS_ALONE)

    def ended_and_reaped() -> bool:
        deadline = time.monotonic() + 30
        while not (tmp_path / "ended").exists() and time.monotonic() < deadline:  # bounded: a crashed run fails below
            time.sleep(0.05)
        time.sleep(1.0)  # the child exits and the server reaps it
        return True

    proc = run_forked(script, [], tmp_path, dict(os.environ), timeout=60, stop_when=ended_and_reaped)
    assert proc.returncode == 0 and proc.stopped, proc
    again = run_forked(script, [], tmp_path, dict(os.environ), timeout=60)
    assert again.returncode == 0 and not again.stopped, again  # the next run reads its own replies


def test_a_stop_when_that_raises_leaves_the_next_run_its_own_replies(tmp_path, probe):
    """Any error between a run's start and its exit code (here stop_when raising) would leave that reply unread, and
    the next run would read it as its pid: the server is replaced instead."""
    script = tmp_path / "stoppable.py"
    script.write_text(STOPPABLE)

    def broken() -> bool:
        raise RuntimeError("stop_when failed")

    with pytest.raises(RuntimeError, match="stop_when failed"):
        run_forked(script, [], tmp_path, dict(os.environ), timeout=60, stop_when=broken)
    again = run_forked(probe, ["3"], tmp_path, dict(os.environ), timeout=60)
    assert again.returncode == 3 and "argv ['3']" in again.stdout, again


def popen(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_ctrl_c_tests_wait_that_runs_out_fails_with_what_it_waited_for():
    """tests/conftest.py's waits before and after a Ctrl-C: each fails naming what did not happen (the run killed),
    never goes on to signal a run that is elsewhere."""
    never = lambda: False  # noqa: E731
    run = popen("import time; time.sleep(60)")
    with pytest.raises(pytest.fail.Exception, match="the run did not reach 3 logged iterations within 1 s"):
        wait_until(never, 1, "3 logged iterations", run)
    assert run.wait(timeout=30) == -signal.SIGKILL
    ended = popen("import sys; print('boom', file=sys.stderr); sys.exit(3)")
    with pytest.raises(pytest.fail.Exception, match=r"ended \(exit code 3\) before it reached 3 logged(.|\n)*boom"):
        wait_until(never, 60, "3 logged iterations", ended)
    stuck = popen("import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(60)")
    with pytest.raises(pytest.fail.Exception, match="the run did not exit within 1 s of its Ctrl-C"):
        output_after_ctrl_c(stuck, 1)
    assert stuck.wait(timeout=30) == -signal.SIGKILL
