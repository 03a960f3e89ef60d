"""The plumbing every script shares (below its `# === Plumbing` banner): flag rules, resume conflicts, progress
off a terminal, torch's threads shared among runs, and start-up where Linux-only modules are missing. The shared
blocks are the same text in every script (test_shared_blocks.py), so they are tested once, through
ppo_continuous.py; what each script declares itself (its FLAG_RULES) is checked per script."""

import dataclasses
import importlib
import json
import os
import subprocess
import sys
import typing

import pytest
import torch

import ppo_continuous as ppo
from tests.conftest import BASE_ENV, ROOT

SCRIPTS = ["ppo_continuous", "ppo_atari", "a2c_atari", "sac_continuous", "sac_continuous_ray"]
NUMBERS = (int, float)


def is_number_flag(f: dataclasses.Field) -> bool:
    """An int / float / Optional[number] field that is a command-line flag (derived fields are Suppress[...])."""
    if "Suppress" in str(f.type) or f.type is bool:
        return False
    args = typing.get_args(f.type)
    return f.type in NUMBERS or (bool(args) and all(a in NUMBERS or a is type(None) for a in args))


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_numeric_flag_has_a_range_rule(name):
    module = importlib.import_module(name)
    fields = {f.name: f for f in dataclasses.fields(module.Args)}
    numeric = {n for n, f in fields.items() if is_number_flag(f)}
    assert numeric, "the Args of every script have numeric flags"
    missing = numeric - module.FLAG_RULES.keys()
    assert not missing, f"{name}: numeric flags without a rule in FLAG_RULES: {sorted(missing)}"
    assert module.FLAG_RULES.keys() <= fields.keys(), "a rule names a flag that does not exist"
    assert set(module.FLAG_RULES.values()) <= module.RULES.keys()
    module.check_flags(module.Args(), module.FLAG_RULES)  # the defaults pass their own rules


def test_check_flags_names_the_flag_and_the_rule():
    for flag, bad, rule in [("learning_rate", 0.0, "> 0"), ("gamma", 1.5, "in [0, 1]"), ("num_envs", 0, ">= 1"),
                            ("ent_coef", -0.1, ">= 0"), ("target_kl", -1.0, "> 0")]:  # fmt: skip
        with pytest.raises(ppo.UserError) as info:
            ppo.check_flags(ppo.Args(**{flag: bad}), ppo.FLAG_RULES)
        message = str(info.value)
        assert f"--{flag.replace('_', '-')} must be {rule}, not {bad}" in message and "\n" not in message
    ppo.check_flags(ppo.Args(target_kl=None), ppo.FLAG_RULES)  # an unset optional passes


def test_progress_off_a_terminal_prints_plain_lines_with_an_eta(capsys, monkeypatch):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False)
    progress = ppo.Progress(True, total=1000, every_s=0.0)
    progress.update(250, sps=50.0, recent_return=None, recent_sps=50.0)
    progress.update(500, sps=500.0, recent_return=-3.25, recent_sps=25.0)  # e.g. SAC once its updates begin
    progress.close()
    lines = capsys.readouterr().out.splitlines()
    assert "\r" not in "".join(lines) and len(lines) == 3
    assert "250/1,000" in lines[0] and "n/a" in lines[0] and "ETA 00:00:15" in lines[0]  # 750 steps at 50 SPS
    # the ETA follows the last window's speed (500 steps at 25 SPS), not the average since the start
    assert "500/1,000" in lines[1] and "-3.2" in lines[1] and "500 SPS" in lines[1] and "ETA 00:00:20" in lines[1]
    assert lines[2] == lines[1]  # the closing line repeats the last state
    quiet = ppo.Progress(False, total=1000, every_s=0.0)
    quiet.update(500, 50.0, None, 50.0)
    quiet.close()
    assert capsys.readouterr().out == ""


def test_progress_waits_its_interval_off_a_terminal(capsys, monkeypatch):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False)
    progress = ppo.Progress(True, total=1000, every_s=3600.0)
    for step in range(100, 1001, 100):
        progress.update(step, 100.0, None, 100.0)
    assert capsys.readouterr().out == ""  # within the interval: nothing yet...
    progress.close()
    assert "1,000/1,000" in capsys.readouterr().out  # ...and the closing line


def test_threads_are_shared_among_live_runs(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    for pid in (os.getpid(), os.getppid(), dead.pid):
        (tmp_path / str(pid)).write_text("0")
    (tmp_path / "not-a-pid").touch()
    before = torch.get_num_threads()
    cores = ppo.usable_cores()
    try:
        assert ppo.live_runs(tmp_path) == (2, 0)  # this process and its parent; the dead one's entry is removed
        assert not (tmp_path / str(dead.pid)).exists()
        assert ppo.share_threads(0, tmp_path) == max(1, cores // 2) == torch.get_num_threads()
        assert ppo.share_threads(3, tmp_path) == 3 == torch.get_num_threads()  # --torch-threads N is fixed
        (tmp_path / str(os.getppid())).write_text("1")  # the other run holds one core (--torch-threads 1)...
        assert ppo.live_runs(tmp_path) == (1, 1)
        assert ppo.share_threads(0, tmp_path) == max(1, cores - 1)  # ...so this one takes what is left, not every core
        (tmp_path / str(os.getppid())).write_text(str(cores + 5))  # more than the machine has: one thread still
        assert ppo.share_threads(0, tmp_path) == 1
        (tmp_path / str(os.getppid())).unlink()
        assert ppo.share_threads(0, tmp_path) == cores  # alone again: every core
        assert ppo.live_runs(tmp_path / "missing") == (1, 0)
    finally:
        torch.set_num_threads(before)


def test_register_run_leaves_an_entry_named_by_the_pid_holding_its_thread_count(tmp_path):
    code = ("import os, sys, pathlib; sys.path.insert(0, sys.argv[2]); import ppo_continuous as p; "
            "f = pathlib.Path(sys.argv[1]); p.register_run(f, 3); "
            "print(os.getpid(), sorted((x.name, x.read_text()) for x in f.iterdir()))")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path), str(ROOT)], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    pid, listing = proc.stdout.strip().split(" ", 1)
    assert listing == f"[('{pid}', '3')]"  # while it runs: one entry, its pid, holding its --torch-threads
    assert list(tmp_path.iterdir()) == [], "the entry is removed when the run exits"


def test_platform_fallbacks(monkeypatch):
    """macOS and Windows start: no os.sched_getaffinity there, no `resource` on Windows, ru_maxrss in bytes on macOS."""
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    assert ppo.usable_cores() == (os.cpu_count() or 1)
    monkeypatch.setitem(sys.modules, "resource", None)  # `import resource` raises ImportError
    assert ppo.peak_rss_mb() is None
    monkeypatch.delitem(sys.modules, "resource")

    class Usage:
        ru_maxrss = 3 * 2**20

    import resource

    monkeypatch.setattr(resource, "getrusage", lambda who: Usage())
    monkeypatch.setattr(sys, "platform", "darwin")
    assert ppo.peak_rss_mb() == pytest.approx(3.0)  # bytes on macOS
    monkeypatch.setattr(sys, "platform", "linux")
    assert ppo.peak_rss_mb() == pytest.approx(3 * 1024)  # KiB on Linux


@pytest.mark.parametrize("name", ["ppo_continuous"])
def test_a_run_starts_without_the_linux_only_modules(tmp_path, name):
    """A whole short run with os.sched_getaffinity and `resource` taken away, as on macOS / Windows."""
    code = ("import os, sys, runpy; del os.sched_getaffinity; sys.modules['resource'] = None; "
            f"sys.argv = [{name!r}] + sys.argv[1:]; runpy.run_path({str(ROOT / (name + '.py'))!r}, run_name='__main__')")  # fmt: skip
    flags = ["--env-id", "Pendulum-v1", "--num-steps", "128", "--num-minibatches", "4", "--update-epochs", "1",
             "--total-timesteps", "256", "--runs-dir", str(tmp_path)]  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code, *flags], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, **BASE_ENV})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "peak RSS" not in proc.stdout  # nothing to report without `resource`
    assert list(tmp_path.glob("*/events.out.tfevents.*"))


def test_a_log_window_with_no_new_step_logs_no_phase_timing(tmp_path, monkeypatch):
    """A stop (or the Ray driver's last pass) can end a log window in which global_step did not move: SPS is still
    logged, a per-step timing is not (it would divide by zero)."""

    @ppo.dataclass
    class State:
        global_step: int = 0
        iteration: int = 0

    args = ppo.Args(env_id="Pendulum-v1", total_timesteps=100, runs_dir=str(tmp_path), progress=False)
    args.num_iterations = 3
    run = ppo.Run(args, "ppo_continuous", None, {"obs_shape": [3], "act_shape": [1]}, log_every=10)
    state = State()
    run.attach(state, None)
    logged = []
    monkeypatch.setattr(run.writer, "add_scalar", lambda tag, value, step: logged.append((tag, step)))
    for iteration in run.iterations(state, args.num_iterations):
        with run.timer("update"):
            pass
        if iteration == 1:
            state.global_step = 10
        if iteration == 2:
            run.stop.requested = True  # as Ctrl-C would: this window has no new step
    assert run.stopped and state.iteration == 2
    assert ("charts/update_us_per_step", 10) in logged and ("charts/SPS", 10) in logged
    assert [step for tag, step in logged if tag == "charts/update_us_per_step"] == [10]
    assert logged.count(("charts/SPS", 10)) == 2  # the first window and the stopped, empty one
    run.writer.close()


def test_args_json_records_what_the_flags_resolved_to_and_a_thread_change_is_said(tmp_path):
    """args.json's "compute": dtype, device, env backend and torch's starting threads. When a second run of these
    scripts starts mid-run (an entry with a live pid in the runs folder), the run gives up a core and says so."""
    if ppo.usable_cores() < 2:
        pytest.skip("needs 2 cores: with one, sharing leaves the thread count at 1")
    temp = tmp_path / "tmp"
    (temp / "onefile-rl-runs").mkdir(parents=True)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        cmd = [sys.executable, str(ROOT / "ppo_continuous.py"), "--env-id", "Pendulum-v1", "--num-envs", "1",
               "--num-steps", "64", "--total-timesteps", "64000", "--runs-dir", str(tmp_path / "runs"),
               "--checkpoint-interval", "0"]  # fmt: skip
        proc = subprocess.Popen(cmd, env={**os.environ, **BASE_ENV, "TMPDIR": str(temp)}, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)  # fmt: skip
        lines = []
        for line in proc.stdout:  # the run starts alone (2 threads); then a second run appears
            lines.append(line)
            if line.startswith("run: "):
                (temp / "onefile-rl-runs" / str(other.pid)).touch()
            if "torch threads" in line:
                break
        proc.kill()
        proc.wait()
    finally:
        other.kill()
    assert any(line.startswith("torch threads 2 -> 1 at step ") for line in lines), "".join(lines)
    (run_dir,) = (tmp_path / "runs").iterdir()
    record = json.loads((run_dir / "args.json").read_text())
    assert record["compute"] == {"dtype": "float32", "device": "cpu", "env_backend": "gymnasium", "torch_threads": 2}


def test_a_fallback_corrects_the_compute_record_of_a_fresh_run_only(tmp_path):
    """args.json says what the run computes in: a set-up that falls back (the Atari trunk's --bf16 on a trunk it
    cannot serve) rewrites "compute"; a resumed run leaves the first start's args.json as it was."""
    args = ppo.Args(env_id="Pendulum-v1", total_timesteps=100, runs_dir=str(tmp_path), progress=False)
    args.num_iterations = 3
    run = ppo.Run(args, "ppo_continuous", None, {"obs_shape": [3], "act_shape": [1]}, log_every=10)
    record = json.loads((run.dir / "args.json").read_text())
    run.note_compute(dtype="bfloat16-then-off")
    assert json.loads((run.dir / "args.json").read_text()) == {**record, "compute": {**record["compute"],
                                                                                     "dtype": "bfloat16-then-off"}}
    run.writer.close()
    run.args_json = None  # what a resumed run holds
    run.note_compute(dtype="float32")
    assert json.loads((run.dir / "args.json").read_text())["compute"]["dtype"] == "bfloat16-then-off"


@pytest.mark.parametrize("script", ["ppo_continuous", "ppo_atari", "sac_continuous_ray"])
def test_printed_commands_start_the_way_this_run_was_started(script, monkeypatch, tmp_path):
    """The resume hint and the model card's command: `uv run [--extra X]` when uv runs the script from the project's
    .venv (from outside the project folder with --project), else this interpreter with the script's path."""
    module = importlib.import_module(script)
    extra = {"ppo_atari": " --extra atari", "sac_continuous_ray": " --extra ray"}.get(script, "")
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("UV", raising=False)
    assert module.launch_command(script) == f"{sys.executable} {script}.py"
    monkeypatch.setenv("UV", "/somewhere/uv")
    monkeypatch.setattr(sys, "prefix", str(ROOT / ".venv"))
    assert module.launch_command(script) == f"uv run{extra} {script}.py"
    monkeypatch.chdir(tmp_path)
    assert module.launch_command(script) == f"uv run --project {ROOT}{extra} {ROOT / script}.py"
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "other-env"))  # uv running another environment
    assert module.launch_command(script) == f"{sys.executable} {ROOT / script}.py"
    card = module.reproduce_command(script, {"seed": 7}, module.Args)
    assert card.startswith(f"{sys.executable} {ROOT / script}.py ") and "--seed 7" in card


def test_xdist_groups_reach_the_scheduler(request):
    """--dist loadgroup keeps a group (the Ray tests; a module's shared trained run) on one worker by renaming each
    item's nodeid through `item._nodeid` (xdist 3.8); pytest 9.2 stopped reading it, and the groups silently split."""
    original = request.node._nodeid
    try:
        request.node._nodeid = original + "@ray"
        assert request.node.nodeid.endswith("@ray")
    finally:
        request.node._nodeid = original
