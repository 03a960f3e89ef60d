"""Run a script as `python SCRIPT ARGS` runs it, in a process forked from a server that has already imported torch,
gymnasium and tyro.

Why: a fresh interpreter spends about 4 s of CPU importing them, and the suite runs a few hundred short scripts on 2
cores. The forked child is otherwise a new process running the file as `__main__`: its own argv, working folder,
environment, `sys.path[0]`, stdout and stderr (files, not a terminal), exit code, non-daemon threads joined and atexit
handlers run at exit. Scripts that start Ray are not run this way (tests.conftest.run_script decides).
"""

import atexit
import contextlib
import io
import os
import pickle
import runpy
import select
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

# ONEFILE_TESTS_FORK=0 runs every script in a fresh interpreter instead (to compare, or to rule the server out).
ENABLED = os.environ.get("ONEFILE_TESTS_FORK", "1") != "0"
POLL_S = 2.0  # how often run_python asks stop_when
# After stop_when's Ctrl-C a run saves at its iteration's end and exits: it gets at least this long for that, past its
# timeout if need be. Why: a run that reached its threshold just before its timeout would otherwise fail as too slow.
CTRL_C_GRACE_S = 120.0
# What the server imports once. Not mujoco: it reads MUJOCO_GL when imported, and a test may set it.
PRELOAD = ["numpy", "torch", "torch.nn", "torch.optim", "gymnasium", "tyro", "torch.utils.tensorboard"]


def send(stream, obj) -> None:
    data = pickle.dumps(obj)
    stream.write(struct.pack("!I", len(data)) + data)
    stream.flush()


def read_exactly(stream, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = stream.read(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def receive(stream):
    return pickle.loads(read_exactly(stream, struct.unpack("!I", read_exactly(stream, 4))[0]))


def exit_code(code) -> int:
    """The exit status `sys.exit(code)` gives a fresh interpreter: None is 0, a non-int is printed and is 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def child(script: str, args: list, cwd: str, env: dict, out_path: str, err_path: str, hidden: list) -> None:
    """The forked child: become `python script *args` started in cwd with env, then exit as the interpreter would."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # stdin: nothing (the server's request pipe is not the script's)
    os.close(devnull)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, out_path), (2, err_path)):
        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(handle, fd)  # the fds too, so that whatever the script starts writes there as well
        os.close(handle)
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", write_through=True)
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace", write_through=True
    )
    sys.argv = [script, *args]
    # `python script` puts the script's folder first on sys.path, and nothing of the test run's own path
    hidden_paths = {str(Path(p).resolve()) for p in hidden}
    sys.path[:] = [str(Path(script).parent)] + [p for p in sys.path if p and str(Path(p).resolve()) not in hidden_paths]
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = exit_code(e.code)
    except BaseException:  # noqa: B036  what the interpreter does with any uncaught exception
        traceback.print_exc()
        code = 1
    threading._shutdown()  # the interpreter's exit: join non-daemon threads, then run the atexit handlers
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def serve() -> None:
    """The server: import PRELOAD, then for each request (one at a time) fork a child, send back its pid, then its exit
    code once it ends. The server never runs torch itself, so every child starts with torch's thread pools unmade."""
    for name in PRELOAD:
        __import__(name)
    requests, replies = os.fdopen(0, "rb", buffering=0), os.fdopen(1, "wb", buffering=0)
    while True:
        try:
            request = receive(requests)
        except EOFError:  # the test process is gone
            return
        pid = os.fork()
        if pid == 0:
            child(*request)  # never returns
        send(replies, pid)
        _, status = os.waitpid(pid, 0)
        send(replies, os.waitstatus_to_exitcode(status))


_server = None


def server() -> subprocess.Popen:
    """This test process's fork server, started on first use."""
    global _server
    if _server is None or _server.poll() is not None:
        root = str(Path(__file__).resolve().parents[1])
        code = f"import sys; sys.path.insert(0, {root!r}); from tests.fork_runner import serve; serve()"
        _server = subprocess.Popen(
            [sys.executable, "-c", code], cwd=root, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0
        )  # unbuffered: select() sees every reply (each child gets its own env)
    return _server


def run_forked(
    script: Path, args: list, cwd: Path, env: dict, timeout: float, hidden: list = (), stop_when=None
) -> subprocess.CompletedProcess:
    """subprocess.run([python, script, *args], capture_output=True, text=True, timeout=timeout), on the fork server."""
    cmd = [sys.executable, str(script), *args]
    proc = server()
    with tempfile.TemporaryDirectory(prefix="forked-run-") as folder:
        out_path, err_path = os.path.join(folder, "stdout"), os.path.join(folder, "stderr")
        send(proc.stdin, (str(script), list(args), str(cwd), dict(env), out_path, err_path, [str(p) for p in hidden]))
        pid = receive(proc.stdout)
        try:
            ready, stopped = wait_or_stop(
                lambda t: bool(select.select([proc.stdout], [], [], t)[0]),
                timeout,
                stop_when,
                lambda: signal_child(pid, signal.SIGINT),
            )
            if not ready:
                signal_child(pid, signal.SIGKILL)
            returncode = receive(proc.stdout)
        except BaseException:  # the exit-code reply is left unread and would answer the next run's request: a new server
            signal_child(pid, signal.SIGKILL)
            proc.kill()
            proc.wait()
            raise
        out, err = (Path(p).read_text(errors="backslashreplace") if os.path.exists(p) else "" for p in (out_path, err_path))
    if not ready:
        raise RunTimeout(cmd, timeout, out, err, stopped)
    return stopped_or_done(subprocess.CompletedProcess(cmd, returncode, out, err), stopped)


def signal_child(pid: int, sig: int) -> None:
    """Signal a forked run; one that ended in the meantime (the server has reaped it) has nothing left to stop."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def run_fresh(
    cmd: list, cwd: Path, env: dict, timeout: float, stop_when=None, started: list = None, **popen
) -> subprocess.CompletedProcess:
    """subprocess.run(cmd, capture_output=True, text=True, timeout=timeout), with run_python's stop_when; `started`
    gets the Popen (to stop what a run left behind, by its id), `popen` goes to Popen (start_new_session=True)."""
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL, **popen
    )
    if started is not None:
        started.append(proc)
    with ThreadPoolExecutor(1) as pool:  # communicate() in a thread: the pipes are drained while we poll
        output = pool.submit(proc.communicate)
        done, stopped = wait_or_stop(
            lambda t: wait_done(output, t), timeout, stop_when, lambda: proc.send_signal(signal.SIGINT)
        )
        if not done:
            proc.kill()
            out, err = output.result()
            raise RunTimeout(cmd, timeout, out, err, stopped)
        out, err = output.result()
    return stopped_or_done(subprocess.CompletedProcess(cmd, proc.returncode, out, err), stopped)


def wait_done(future, seconds: float) -> bool:
    try:
        future.result(timeout=seconds)
    except FutureTimeout:
        return False
    return True


def wait_or_stop(wait, timeout: float, stop_when, interrupt) -> tuple:
    """Call wait(seconds) -> finished? until the run finishes or `timeout` passes, asking stop_when every POLL_S and
    calling interrupt() (a Ctrl-C: the script saves and exits 130 at the end of its iteration) once it holds; from
    then on the run has at least CTRL_C_GRACE_S to exit. Returns (finished, stopped)."""
    deadline, stopped = time.monotonic() + timeout, False
    while True:
        left = deadline - time.monotonic()
        if wait(max(left if stop_when is None or stopped else min(POLL_S, left), 0)):
            return True, stopped
        if time.monotonic() >= deadline:
            return False, stopped
        if not stopped and stop_when():
            interrupt()
            stopped, deadline = True, max(deadline, time.monotonic() + CTRL_C_GRACE_S)


class RunTimeout(subprocess.TimeoutExpired):
    """A run stopped (killed) at its timeout; its message says which wait ran out: the run's own end, or, once
    stop_when had sent its Ctrl-C, the exit that must follow it."""

    def __init__(self, cmd: list, timeout: float, output: str, stderr: str, stopped: bool):
        super().__init__(cmd, timeout, output=output, stderr=stderr)
        self.stopped = stopped

    def __str__(self) -> str:
        script = " ".join(map(str, self.cmd[1:]))
        stderr = "\n".join((self.stderr or "").strip().splitlines()[-5:])
        if self.stopped:
            what = (
                f"did not exit after its Ctrl-C (stop_when held; a run saves at its iteration's end and exits 130) "
                f"within {CTRL_C_GRACE_S:.0f} s of it or the rest of its {self.timeout:.0f} s timeout, whichever is later"
            )
        else:
            what = f"did not end within its timeout of {self.timeout:.0f} s"
        return f"the run {what}; killed: {script}" + (f"\nits stderr ended:\n{stderr}" if stderr else "")


def stopped_or_done(result: subprocess.CompletedProcess, stopped: bool) -> subprocess.CompletedProcess:
    """A run that stop_when ended (Ctrl-C: it saved and exited 130) counts as completed: returncode 0, .stopped True."""
    result.stopped = stopped
    if stopped and result.returncode == 130:
        result.returncode = 0
    return result


def run_python(
    script: Path, args, cwd: Path, env: dict, timeout: float, fork: bool = True, hidden: list = (), stop_when=None
) -> subprocess.CompletedProcess:
    """`python script *args` in cwd with env, output captured: on the fork server when `fork` (and ONEFILE_TESTS_FORK is
    not 0), else in a fresh interpreter. `hidden`: paths kept off a forked run's sys.path (a fresh one never had them).
    `stop_when`: called every POLL_S seconds while the run goes; once it returns True the run gets a Ctrl-C (a
    learning test stops a run that has reached its threshold)."""
    args = [str(a) for a in args]
    if fork and ENABLED:
        return run_forked(script, args, cwd, env, timeout, hidden, stop_when)
    return run_fresh([sys.executable, str(script), *args], cwd, env, timeout, stop_when)
