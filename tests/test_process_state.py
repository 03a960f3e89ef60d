"""What an in-process main() sets for the whole process does not reach the next test: tests/conftest.py's autouse
fixture process_state_restored puts it back. Two tests, run in this order on one worker: the first changes the
settings (through main(), as test_wiring.py and test_non_finite.py do) and checks that they did change; the second
checks that they are back. Without the fixture the second fails, naming each setting that leaked."""

import os
import signal

import pytest
import torch

from tests.conftest import ROOT, changed_settings, process_state
from tests.student_copy import import_copy, main_in_process

pytestmark = pytest.mark.xdist_group("test_process_state")  # one worker, in this order: the second reads the first
BEFORE = {}  # the first test's settings at its start


class Crash(Exception):
    """Stands for a run that fails inside its loop (an edited loss, a library error): Run.close never runs."""


def test_an_in_process_main_changes_process_wide_settings(tmp_path, monkeypatch):
    BEFORE.update(process_state())
    ppo = import_copy(ROOT / "ppo_continuous.py")
    flags = ["--env-id", "tests.fake_envs:Counting-v0", "--num-envs", 1, "--num-steps", 8, "--num-minibatches", 1]
    flags += ["--total-timesteps", 64, "--seed", 7, "--torch-threads", 3, "--no-progress", "--checkpoint-interval", 0]
    # 1. a headless --capture-video: probe_env sets MUJOCO_GL and MuJoCo's warning callback, parse_command_line the
    # threads, seed_everything the RNGs and cudnn; then the Counting env cannot render and main() stops
    os.environ.pop("DISPLAY", None)  # not monkeypatch: its own undo would hide a leak
    os.environ.pop("MUJOCO_GL", None)
    with pytest.raises(TypeError, match="render_mode"):
        main_in_process(ppo, [*flags, "--capture-video", "--runs-dir", tmp_path / "video"], monkeypatch)
    # 2. a run that fails in its first update: its Ctrl-C / SIGTERM handlers stay installed
    monkeypatch.setattr(ppo, "ppo_losses", lambda *args: (_ for _ in ()).throw(Crash()))
    with pytest.raises(Crash):
        main_in_process(ppo, [*flags, "--runs-dir", tmp_path / "crash"], monkeypatch)
    assert signal.getsignal(signal.SIGINT).__name__ == "on_signal"
    torch.set_flush_denormal(True)  # what a library may set at import (flush-to-zero): the fixture puts that back too
    changed = set(changed_settings(BEFORE, process_state()))
    expected = {"torch_threads", "python_rng", "numpy_rng", "torch_rng", "torch_flags", "signal_handlers", "environ"}
    assert expected | {"flush_denormal", "mujoco_warning"} <= changed  # else the next test would prove nothing
    assert "MUJOCO_GL" in os.environ and torch.get_num_threads() == 3 and torch.backends.cudnn.deterministic


def test_the_settings_main_changed_are_back_for_the_next_test():
    if not BEFORE:
        pytest.skip("reads what test_an_in_process_main_changes_process_wide_settings changed: run the module")
    leaked = changed_settings(BEFORE, process_state())
    assert not leaked, f"process-wide settings left by the previous test's main(): {leaked}"
