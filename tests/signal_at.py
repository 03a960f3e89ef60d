"""Run a script as `python SCRIPT ARGS` runs it, and signal it at a chosen moment of its start-up:

    python tests/signal_at.py FILE:QUALNAME[@INNER] INT|TERM pid|group SCRIPT ARGS...

At the first call of the function QUALNAME defined in a file whose path ends with FILE (`sac_continuous_ray.py:
connect_ray`, `ray/_private/node.py:Node.start_raylet`), the signal goes to this process (`pid`, as `kill PID` sends
it) or to its whole process group (`group`, as a terminal's Ctrl-C): at once, in that call; with @INNER, once the main
thread, inside that call, is in the function INNER (its innermost Python frame: e.g. `Worker.get_objects`, where
`ray.get` waits in Ray's C++ code). Why: a test of a signal at a moment of start-up must hit that moment, not guess it
with a sleep. Just before it signals, it prints where the main thread is, `signal_at: SIGINT in a > b > c` (its
innermost frames, outermost first), so that the test can check the moment was the one it asked for.
"""

import os
import runpy
import signal
import sys
import threading
import time


def frames_of(thread_id: int) -> list:
    """The qualified names of a thread's frames, innermost first, this file's own left out."""
    frame, names = sys._current_frames()[thread_id], []
    while frame is not None:
        if frame.f_code.co_filename != __file__:
            names.append(frame.f_code.co_qualname)
        frame = frame.f_back
    return names


def main() -> None:
    where, signame, target, script, *args = sys.argv[1:]
    place, _, inner = where.partition("@")
    file, _, qualname = place.rpartition(":")
    sig, main_thread = getattr(signal, f"SIG{signame}"), threading.get_ident()

    def send() -> None:
        print(f"signal_at: SIG{signame} in {' > '.join(reversed(frames_of(main_thread)[:8]))}", file=sys.stderr, flush=True)
        if target == "group":
            os.killpg(0, sig)
        else:
            os.kill(os.getpid(), sig)

    def send_once_inner() -> None:  # a thread's: the main thread is busy in the call (or blocked in C code)
        while frames_of(main_thread)[0] != inner:
            time.sleep(0.005)
        send()

    def profile(frame, event, arg) -> None:
        code = frame.f_code
        if event == "call" and code.co_qualname == qualname and code.co_filename.endswith(file):
            sys.setprofile(None)
            if inner:
                threading.Thread(target=send_once_inner, daemon=True).start()
            else:
                send()

    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    sys.setprofile(profile)
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
