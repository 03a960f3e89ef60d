"""The plumbing every script shares (below its `# === Plumbing` banner): flag rules, progress off a terminal,
torch's threads, run folders, and start-up where Linux-only modules are missing. The shared block is the same text in
every script (test_shared_blocks.py), so it is tested once, through ppo_continuous.py; what each script declares
itself (its FLAG_RULES) is checked per script."""

import dataclasses
import importlib
import json
import os
import signal
import subprocess
import sys
import typing

import pytest
import torch

import ppo_continuous as ppo
from tests.conftest import BASE_ENV, ROOT, require_ray_marker

SCRIPTS = ["ppo_continuous", "ppo_atari", "a2c_atari", "sac_continuous", "sac_continuous_ray"]
NUMBERS = (int, float)


def is_number_flag(f: dataclasses.Field) -> bool:
    """An int / float / Optional[number] field that is a command-line flag (derived fields are init=False)."""
    if not f.init or f.type is bool:
        return False
    args = typing.get_args(f.type)
    return f.type in NUMBERS or (bool(args) and all(a in NUMBERS or a is type(None) for a in args))


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_numeric_flag_has_a_range_rule(name):
    module = importlib.import_module(name)
    fields = {f.name: f for f in dataclasses.fields(module.Args)}
    numeric = {n for n, f in fields.items() if is_number_flag(f)}
    assert numeric, "the Args of every script have numeric flags"
    rules = {
        flag: rule
        for table in (module.RUN_RULES, module.FLAG_RULES)
        for rule, flags in table.items()
        for flag in flags.split()
    }
    missing = numeric - rules.keys()
    assert not missing, f"{name}: numeric flags without a rule in FLAG_RULES or RUN_RULES: {sorted(missing)}"
    assert rules.keys() <= fields.keys(), "a rule names a flag that does not exist"
    assert set(rules.values()) <= module.RULES.keys()
    module.check_flags(module.Args(), module.FLAG_RULES)  # the defaults pass their own rules


def test_check_flags_names_the_flag_and_the_rule():
    for flag, bad, rule in [
        ("learning_rate", 0.0, "> 0"),
        ("gamma", 1.5, "in [0, 1]"),
        ("num_envs", 0, ">= 1"),
        ("ent_coef", -0.1, ">= 0"),
        ("target_kl", -1.0, "> 0"),
    ]:
        with pytest.raises(ppo.UserError) as info:  # Args.__post_init__ checks: tyro makes the Args
            ppo.Args(**{flag: bad})
        message = str(info.value)
        assert f"--{flag.replace('_', '-')} must be {rule}, not {bad}" in message and "\n" not in message
    ppo.Args(target_kl=None)  # an unset optional passes
    with pytest.raises(ppo.UserError, match="--exp-name is 300 bytes long: it names the run's folder; at most 200"):
        ppo.Args(exp_name="x" * 300)  # before: 'File name too long' from the folder's mkdir


def progress_run(tmp_path, progress: bool = True):
    """A Run on a bare loop state, for its progress line."""

    @dataclasses.dataclass
    class State:
        global_step: int = 0
        iteration: int = 0

    args = ppo.Args(env_id="Pendulum-v1", total_timesteps=1000, num_steps=64, runs_dir=str(tmp_path), progress=progress)
    args.num_iterations = 3
    run = ppo.Run(args, "ppo_continuous", None, {"obs_shape": [3], "act_shape": [1]}, log_every=1)
    run.attach(State(), None)
    return run


def test_progress_prints_a_line_every_30_s_and_the_last_state(capsys, tmp_path):
    run = progress_run(tmp_path)
    capsys.readouterr()
    for iteration in run.iterations(run.state, 3):
        run.state.global_step = 250 * iteration
        run.recent_returns = [-3.25] if iteration > 1 else []
    lines = capsys.readouterr().out.splitlines()  # the first window's line, then (within 30 s) only the last state
    assert len(lines) == 2 and "250/1,000" in lines[0] and "n/a" in lines[0]
    assert "750/1,000" in lines[1] and "-3.2" in lines[1] and "SPS" in lines[1]
    run.close()
    quiet = progress_run(tmp_path, progress=False)
    list(quiet.iterations(quiet.state, 2))
    assert "step" not in capsys.readouterr().out
    quiet.close()


def parse(monkeypatch, *flags) -> "ppo.Args":
    monkeypatch.setattr(sys, "argv", ["ppo_continuous.py", *flags])
    return ppo.parse_command_line(ppo.Args)[0]


def test_torch_threads_0_is_the_usable_cores_and_a_flag_fixes_them(monkeypatch, tmp_path):
    """0: a thread per core this process may use (taskset / cgroups: os.sched_getaffinity), on macOS / Windows (no
    sched_getaffinity) per core of the machine; --torch-threads N: N; ppo_continuous's default is 1 (measured faster)."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 5, 7}, raising=False)
    parse(monkeypatch, "--runs-dir", str(tmp_path))
    assert torch.get_num_threads() == 1
    parse(monkeypatch, "--runs-dir", str(tmp_path), "--torch-threads", "0")
    assert torch.get_num_threads() == 3
    parse(monkeypatch, "--runs-dir", str(tmp_path), "--torch-threads", "2")
    assert torch.get_num_threads() == 2
    monkeypatch.delattr(os, "sched_getaffinity")
    monkeypatch.setattr(os, "cpu_count", lambda: 5)
    parse(monkeypatch, "--runs-dir", str(tmp_path), "--torch-threads", "0")
    assert torch.get_num_threads() == 5


def test_two_runs_started_in_the_same_second_get_two_folders(tmp_path, monkeypatch):
    """The run folder is made exclusively: a second run with the same env, name and seed in the same second (a
    sweep, a job array) gets `<name>-2`, never the first one's folder, args.json or checkpoints."""
    monkeypatch.setattr(ppo.time, "time", lambda: 1_700_000_000.0)
    args = ppo.Args(env_id="Pendulum-v1", total_timesteps=100, num_steps=64, runs_dir=str(tmp_path), progress=False)
    args.num_iterations = 3
    runs = [ppo.Run(args, "ppo_continuous", None, {"obs_shape": [3], "act_shape": [1]}, log_every=10) for _ in range(3)]
    for run in runs:
        run.writer.close()
    names = [run.dir.name for run in runs]
    assert names == [
        "Pendulum-v1__ppo_continuous__1__1700000000",
        "Pendulum-v1__ppo_continuous__1__1700000000-2",
        "Pendulum-v1__ppo_continuous__1__1700000000-3",
    ]
    assert all((run.dir / "args.json").is_file() for run in runs) and len(list(tmp_path.iterdir())) == 3


@pytest.mark.parametrize("name", ["ppo_continuous"])
def test_a_run_starts_without_the_linux_only_modules(tmp_path, name):
    """A whole short run with os.sched_getaffinity and `resource` taken away, as on macOS / Windows."""
    code = (
        "import os, sys, runpy; del os.sched_getaffinity; sys.modules['resource'] = None; "
        f"sys.argv = [{name!r}] + sys.argv[1:]; runpy.run_path({str(ROOT / (name + '.py'))!r}, run_name='__main__')"
    )
    flags = [
        "--env-id",
        "Pendulum-v1",
        "--num-steps",
        "128",
        "--num-minibatches",
        "4",
        "--update-epochs",
        "1",
        "--total-timesteps",
        "256",
        "--runs-dir",
        str(tmp_path),
    ]
    proc = subprocess.run(
        [sys.executable, "-c", code, *flags],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, **BASE_ENV},
    )
    assert proc.returncode == 0, proc.stderr
    assert list(tmp_path.glob("*/events.out.tfevents.*"))


def test_a_log_window_with_no_new_step_logs_no_phase_timing(tmp_path, monkeypatch):
    """A stop (or the Ray driver's last pass) can end a log window in which global_step did not move: SPS is still
    logged, a per-step timing is not (it would divide by zero)."""

    @ppo.dataclass
    class State:
        global_step: int = 0
        iteration: int = 0

    args = ppo.Args(env_id="Pendulum-v1", total_timesteps=100, num_steps=64, runs_dir=str(tmp_path), progress=False)
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
            run.stop_requested = True  # as Ctrl-C would: this window has no new step
    assert run.stopped and state.iteration == 2
    assert ("charts/update_us_per_step", 10) in logged and ("charts/SPS", 10) in logged
    assert [step for tag, step in logged if tag == "charts/update_us_per_step"] == [10]
    assert logged.count(("charts/SPS", 10)) == 2  # the first window and the stopped, empty one
    run.writer.close()


def test_args_json_records_the_flags_and_what_they_resolved_to(tmp_path):
    """args.json: every flag, and "compute": the device and torch's threads the run started with."""
    cmd = [
        sys.executable,
        str(ROOT / "ppo_continuous.py"),
        "--env-id",
        "Pendulum-v1",
        "--num-steps",
        "64",
        "--num-minibatches",
        "2",
        "--total-timesteps",
        "64",
        "--runs-dir",
        str(tmp_path),
        "--torch-threads",
        "1",
    ]
    proc = subprocess.run(cmd, env={**os.environ, **BASE_ENV}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = tmp_path.iterdir()
    record = json.loads((run_dir / "args.json").read_text())
    assert record["compute"] == {"device": "cuda" if torch.cuda.is_available() else "cpu", "torch_threads": 1}  # --cuda
    assert record["num_steps"] == 64 and record["env_id"] == "Pendulum-v1" and record["batch_size"] == 64


@pytest.mark.parametrize("script", ["ppo_continuous", "ppo_atari", "sac_continuous_ray"])
def test_the_printed_resume_command_runs_this_script_with_this_python(script, monkeypatch, tmp_path):
    """The resume hint: this interpreter, the script's path (relative under the current folder), the checkpoint's
    path, each quoted so that a space keeps it one argument when pasted."""
    module = importlib.import_module(script)
    monkeypatch.chdir(ROOT)
    ckpt = tmp_path / "my runs" / "step_0000000100.pt"
    assert module.resume_command(ckpt) == f"{sys.executable} {script}.py --resume '{ckpt}'"
    monkeypatch.chdir(tmp_path)
    assert module.resume_command(ckpt) == f"{sys.executable} {ROOT / script}.py --resume '{ckpt}'"


def test_xdist_keeps_the_ray_marked_tests_on_one_worker(tmp_path):
    """The Ray tests must never run beside each other: they carry the `ray` marker, tests/conftest.py's hook turns it
    into xdist_group("ray"), and pyproject's `--dist loadgroup` must then send the whole group to one worker (pytest
    9.2 stopped honouring it with xdist 3.8, and the groups split silently). A small session of its own with that hook,
    2 workers: the four marked tests share one."""
    (tmp_path / "conftest.py").write_text("from tests.conftest import pytest_collection_modifyitems  # noqa: F401\n")
    (tmp_path / "test_groups.py").write_text(
        "import os, time, pytest\n"
        "@pytest.mark.parametrize('n', range(4))\n"
        "@pytest.mark.ray\n"
        "def test_grouped(n):\n"
        "    time.sleep(0.3)\n"
        "    open(f'worker_{n}', 'w').write(os.environ['PYTEST_XDIST_WORKER'])\n"
        "@pytest.mark.parametrize('n', range(4))\n"
        "def test_free(n):\n"
        "    time.sleep(0.3)\n"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-n",
            "2",
            "--dist",
            "loadgroup",
            "-o",
            "addopts=",
            "-o",
            "markers=ray",
            "--strict-markers",
            "test_groups.py",
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    workers = {(tmp_path / f"worker_{n}").read_text() for n in range(4)}
    assert len(workers) == 1, f"the group ran on {sorted(workers)}"


def test_a_test_that_starts_ray_without_the_marker_fails_naming_the_fix():
    """The helpers that start Ray (run_ray, start_ray_run, Cluster.start_node) ask require_ray_marker first: a test
    that forgot @pytest.mark.ray fails at once instead of running beside another Ray test."""
    with pytest.raises(pytest.fail.Exception, match="starts Ray .* but has no @pytest.mark.ray"):
        require_ray_marker("a Ray start")


def test_the_run_holds_the_signals_in_its_loop_and_ignores_them_once_closed(tmp_path):
    """Ray's ray.init installs its own SIGTERM handler before the loop: the Run's handler holds during the loop and its
    final save; close() then ignores both signals, so one arriving during the process's exit (where Python would put
    back the default action, which kills) cannot turn the exit code 130 into a death by signal."""
    own = lambda signum, frame: None  # noqa: E731  (stands for Ray's handler)
    before = {sig: signal.signal(sig, own) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        run = progress_run(tmp_path, progress=False)
        next(run.iterations(run.state, 3))
        assert all(signal.getsignal(sig) == run.on_signal for sig in before)
        run.close()
        assert all(signal.getsignal(sig) == signal.SIG_IGN for sig in before)
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
