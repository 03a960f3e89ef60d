"""sac_continuous_ray.py run as a user runs it (subprocess, embedded local Ray on this machine): tags, the utd
ratio, checkpoints, a rollout worker killed mid-run, resume, evaluation, bad input, Ctrl-C, an unreachable cluster."""

import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

from tests.conftest import (
    BASE_ENV,
    ROOT,
    assert_clean_error,
    episode_lines,
    only_run_dir,
    output_after_ctrl_c,
    require_ray_marker,
    run_script,
    scalars,
    wait_for_updates,
)
from tests.fork_runner import run_fresh, run_python

pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")  # Ray vendors it: ray/thirdparty_files is on sys.path once ray is imported

SCRIPT = "sac_continuous_ray.py"
# Short runs that reach the update: a small batch, an early learning_starts, one learner thread.
SMALL = ["--learning-starts", "100", "--batch-size", "32", "--torch-threads", "1", "--worker-batch-steps", "50"]
LOSS_TAGS = [
    "losses/qf1_values",
    "losses/qf2_values",
    "losses/qf1_loss",
    "losses/qf2_loss",
    "losses/qf_loss",
    "losses/actor_loss",
    "losses/alpha",
    "losses/alpha_loss",
]
CHART_TAGS = [
    "charts/episodic_return",
    "charts/episodic_length",
    "charts/SPS",
    "charts/env_steps_per_second",
    "charts/updates_per_second",
    "charts/weight_staleness",
    "charts/weight_staleness_max",
    "charts/learner_busy",
    "charts/worker_restarts",
]
DONE = re.compile(r"done: (\d+) env steps \((\d+) worker restarts\), (\d+) transitions in the buffer, (\d+) gradient updates")


def session_pids(sid: int) -> list:
    """The processes in the session a run was started in (its own: start_new_session). Ray's worker processes sit in
    process groups of their own, but stay in that session."""
    return [int(pid) for pid in subprocess.run(["pgrep", "-s", str(sid)], capture_output=True, text=True).stdout.split()]


def lingering(sid: int, grace_s: float = 60.0) -> list:
    """The processes still in a finished run's session after up to `grace_s` seconds. Why wait: the driver has exited,
    but Ray's workers and daemons take a moment to notice and exit (on a loaded 2-core machine more than a second);
    a process that leaked stays, and is returned. Why so long: it returns as soon as the session is empty, so the grace
    costs a passing run nothing, and a loaded runner must not turn a slow exit into a reported leak."""
    deadline = time.time() + grace_s
    while (left := session_pids(sid)) and time.time() < deadline:
        time.sleep(0.5)
    return left


def stop_session(sid: int) -> None:
    """SIGKILL whatever is left of a run this test started in a session of its own, and nothing else."""
    for pid in session_pids(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def ray_command(*args, script: str = SCRIPT) -> list:
    require_ray_marker(f"{os.path.basename(script)}, through run_ray / start_ray_run")
    return [sys.executable, str(ROOT / script), *map(str, args)]


def start_ray_run(*args, script: str = SCRIPT) -> subprocess.Popen:
    """The script in a session of its own (so that everything Ray starts for it can be found, and stopped, by id)."""
    return subprocess.Popen(
        ray_command(*args, script=script),
        cwd=ROOT,
        env={**os.environ, **BASE_ENV},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )


def run_ray(*args, timeout: float = 300, script: str = SCRIPT, stop_when=None) -> subprocess.CompletedProcess:
    """run_script for runs that start Ray: a timed-out or crashed run leaves no Ray process behind."""
    started = []
    try:
        return run_fresh(
            ray_command(*args, script=script),
            ROOT,
            {**os.environ, **BASE_ENV},
            timeout,
            stop_when,
            started,
            start_new_session=True,
        )
    finally:
        if started:
            stop_session(started[0].pid)


def done_line(stdout: str) -> tuple:
    match = DONE.search(stdout)
    assert match, stdout
    return tuple(int(x) for x in match.groups())


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    """One 1,000-step run on 2 workers that the tests below read and resume: checkpoints at 500 and 1,000 with the
    buffer, an evaluation every 500 steps, the final checkpoint and its evaluation."""
    runs = tmp_path_factory.mktemp("runs")
    proc = run_ray(
        "--env-id",
        "Pendulum-v1",
        *SMALL,
        "--num-rollout-workers",
        "2",
        "--total-timesteps",
        "1000",
        "--checkpoint-interval",
        "500",
        "--eval-interval",
        "500",
        "--eval-episodes",
        "1",
        "--save-model",
        "--save-buffer",
        "--runs-dir",
        runs,
    )
    assert proc.returncode == 0, proc.stderr
    return only_run_dir(runs), proc


@pytest.mark.ray
def test_two_workers_reach_the_update_hold_the_utd_ratio_and_log_every_tag(saved_run):
    run_dir, proc = saved_run
    assert "ray: 2 rollout workers x 1 envs" in proc.stdout and "36.0 MB" in proc.stdout
    progress = [line for line in proc.stdout.splitlines() if "ETA" in line]  # off a terminal: plain lines
    assert progress and "1,000/1,000" in progress[-1], proc.stdout
    # every env step counted once and stored once; utd 1: one update per step from learning_starts (100) on
    assert done_line(proc.stdout) == (1000, 0, 1000, 901)
    for tag in LOSS_TAGS + CHART_TAGS + ["eval/episodic_return"]:
        assert scalars(run_dir, tag), f"tag {tag} missing"
    assert all(np.isfinite(list(scalars(run_dir, tag).values())).all() for tag in LOSS_TAGS)
    assert max(scalars(run_dir, "losses/qf1_loss")) == 1000  # the last window is logged after the last updates
    lengths = scalars(run_dir, "charts/episodic_length")
    assert set(lengths.values()) == {200.0}  # Pendulum's time limit
    assert 4 <= len(lengths) <= 5  # 1000 steps over 2 workers, 200-step episodes (5 when one worker took 600)
    assert sorted(scalars(run_dir, "eval/episodic_return")) == [500, 1000]  # the evaluator's, then the final one
    ckpt_dir = run_dir / "checkpoints"
    assert sorted(p.name for p in ckpt_dir.iterdir()) == ["final_0000001000.pt", "step_0000000500.pt", "step_0000001000.pt"]
    ckpt = torch.load(ckpt_dir / "final_0000001000.pt", weights_only=True, map_location="cpu")
    assert ckpt["script"] == "sac_continuous_ray" and ckpt["global_step"] == 1000
    assert {"learner", "run_state", "rng_states", "args", "replay_buffers"} <= ckpt.keys()
    assert {"actor", "qf", "qf_target", "actor_optimizer", "q_optimizer", "log_alpha", "alpha_optimizer"} <= ckpt[
        "learner"
    ].keys()
    assert ckpt["run_state"]["grad_steps"] == 901 and sum(b["size"] for b in ckpt["replay_buffers"]) == 1000
    learner = ckpt["learner"]
    assert learner["log_alpha"].item() < 0 and not torch.equal(learner["qf"]["0.0.weight"], learner["qf_target"]["0.0.weight"])


@pytest.mark.slow  # HalfCheetah on two sharded workers: about 30 s of the serial Ray group
@pytest.mark.ray
def test_halfcheetah_with_sharded_buffer_and_two_envs_per_worker(tmp_path):
    """MuJoCo (float64 obs, 6-d actions), 2 shards, 2 envs per worker, utd 0.5, the default batch of 256."""
    proc = run_ray(
        "--env-id",
        "HalfCheetah-v4",
        "--learning-starts",
        "300",
        "--torch-threads",
        "1",
        "--total-timesteps",
        "600",
        "--buffer-size",
        "2000",
        "--num-buffer-shards",
        "2",
        "--envs-per-worker",
        "2",
        "--utd-ratio",
        "0.5",
        "--worker-batch-steps",
        "25",
        "--save-model",
        "--save-buffer",
        "--eval-episodes",
        "1",
        "--runs-dir",
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "settotalmass" not in proc.stderr + proc.stdout
    assert "Token authentication" not in proc.stderr  # the embedded cluster listens on 127.0.0.1 only: no token, no warning
    assert done_line(proc.stdout) == (600, 0, 600, 150)  # floor(0.5 * 301)
    ckpt = torch.load(next((only_run_dir(tmp_path) / "checkpoints").glob("final_*.pt")), weights_only=True)
    sizes = [shard["size"] for shard in ckpt["replay_buffers"]]
    assert sum(sizes) == 600 and min(sizes) >= 100  # worker i -> shard i % 2, batches of 2 envs x 25 steps
    obs = torch.cat([shard["obs"] for shard in ckpt["replay_buffers"]])
    assert obs.shape == (600, 17) and obs.abs().sum(1).gt(0).all()


def actor_pid(sid: int, name: str, timeout: float = 120) -> int:
    """The pid of the run's Ray actor of class `name` (Ray titles an actor's process `ray::<Class>...`)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for pid in session_pids(sid):
            try:
                if psutil.Process(pid).cmdline()[0].startswith(f"ray::{name}"):
                    return pid
            except (psutil.Error, IndexError):
                continue
        time.sleep(0.3)
    pytest.fail(f"no {name} process in the run's session within {timeout:.0f} s")


@pytest.mark.slow  # about 90 s of the serial Ray group
@pytest.mark.ray
def test_a_killed_worker_and_parameter_server_come_back_and_no_step_is_counted_twice(tmp_path):
    """SIGKILL one rollout worker's process mid-run, then the parameter server's (one run for both: each Ray start
    costs the suite tens of seconds). Ray restarts the worker: its batch in flight is dropped and collected again, the
    step count only rises. Ray restarts the server empty: the driver publishes the weights to it again, and workers
    that pull meanwhile act on with the weights they have. The run ends with exactly total_timesteps steps, all in the
    buffer once."""
    proc = start_ray_run(
        "--env-id",
        "Pendulum-v1",
        *SMALL,
        "--total-timesteps",
        "3000",
        "--checkpoint-interval",
        "0",
        "--weight-sync-interval",
        "100",
        "--runs-dir",
        tmp_path,
    )
    try:
        for line in proc.stdout:
            if line.startswith("ray:"):
                pid = int(re.search(r"pids (\d+) (\d+)", line).group(1))
                break
        else:
            pytest.fail(f"no worker pids printed: {proc.stderr.read()}")
        listening = {c.laddr.ip for c in psutil.Process(pid).net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}
        assert listening <= {"127.0.0.1", "::ffff:127.0.0.1"}, f"the embedded Ray listens on 127.0.0.1 only: {listening}"
        server_pid = actor_pid(proc.pid, "ParameterServer")
        wait_for_updates(tmp_path)  # kill once the learner has started
        os.kill(pid, signal.SIGKILL)
        wait_for_updates(tmp_path, n=6)
        os.kill(server_pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=300)
    finally:
        stop_session(proc.pid)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    steps, restarts, stored, updates = done_line(out)
    assert (steps, restarts, stored, updates) == (3000, 1, 3000, 2901), err
    assert "rollout worker 0 is back" in err and "parameter server is back" in err, err
    run_dir = only_run_dir(tmp_path)
    logged = scalars(run_dir, "charts/worker_restarts")
    assert max(logged.values()) == 1 and max(logged) == 3000
    returns = scalars(run_dir, "charts/episodic_return")
    assert len(returns) >= 12  # 15 episodes of 200 steps, less those cut short by the kill and at the end


@pytest.mark.slow  # about 30 s of the serial Ray group
@pytest.mark.ray
def test_a_killed_buffer_shard_ends_the_run_with_a_checkpoint_and_one_paragraph(tmp_path):
    """A shard holds the only copy of its transitions and is not restarted: losing it stops the run with an
    `interrupted` checkpoint (learner and counters, no buffer), one paragraph on stderr, exit code 1, and no Ray
    process left behind."""
    proc = start_ray_run(
        "--env-id",
        "Pendulum-v1",
        *SMALL,
        "--total-timesteps",
        "100000",
        "--checkpoint-interval",
        "0",
        "--save-buffer",
        "--runs-dir",
        tmp_path,
    )
    try:
        pid = actor_pid(proc.pid, "BufferShard")
        wait_for_updates(tmp_path)
        os.kill(pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
        leftovers = lingering(proc.pid)
    finally:
        stop_session(proc.pid)
    assert proc.returncode == 1, err
    assert not leftovers, f"processes left in the run's session: {leftovers}"
    assert "Traceback" not in err, err
    error = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "replay buffer shard" in error[0] and "--resume" in error[0], err
    ckpts = list((only_run_dir(tmp_path) / "checkpoints").glob("interrupted_*.pt"))
    assert len(ckpts) == 1
    state = torch.load(ckpts[0], weights_only=True)  # resumes as a checkpoint saved without its buffer (tested below)
    assert state["replay_buffers"] is None and 200 <= state["global_step"] < 100000
    assert state["run_state"]["grad_steps"] > 0 and state["learner"]["log_alpha"].item() < 0


@pytest.mark.slow  # about 45 s of the serial Ray group
@pytest.mark.ray
def test_resume_with_buffer_continues_the_counters_and_the_curve(tmp_path, saved_run):
    run_dir = tmp_path / saved_run[0].name
    shutil.copytree(saved_run[0], run_dir)
    for later in (run_dir / "checkpoints").glob("*_0000001000.pt"):  # as if it died after step 500 (else: a new folder)
        later.unlink()
    ckpt_path = run_dir / "checkpoints" / "step_0000000500.pt"
    saved = torch.load(ckpt_path, weights_only=True)
    proc = run_ray(
        "--resume",
        ckpt_path,
        "--total-timesteps",
        "1100",
        "--num-rollout-workers",
        "1",
        "--torch-threads",
        "1",
        "--save-model",
        "--eval-episodes",
        "1",
    )
    assert proc.returncode == 0, proc.stderr
    assert "resumed from" in proc.stdout and "buffer starts empty" not in proc.stderr
    assert "ray: 1 rollout workers" in proc.stdout  # the cluster layout may change on resume
    steps, _, stored, updates = done_line(proc.stdout)
    assert (steps, stored) == (1100, 1100)  # the checkpoint's 500 transitions + 600 new ones
    assert updates == 1001  # the schedule continues: one per step from learning_starts (100) to 1100
    assert 0 < saved["run_state"]["grad_steps"] <= 401  # (the learner may trail collection at a checkpoint)
    final = torch.load(run_dir / "checkpoints" / "final_0000001100.pt", weights_only=True)
    assert final["run_state"]["grad_steps"] == 1001 and final["run_state"]["actor_updates"] == 1000
    events = sorted(run_dir.glob("events.out.tfevents.*"))
    assert len(events) == 2
    new_steps = sorted(scalars(events[-1], "losses/qf1_loss"))
    assert new_steps[0] > 500 and new_steps[-1] == 1100  # appended to the same curve, after the checkpoint
    # the first window after the resume averages its own updates (not all since the run began): alpha near the saved one
    first_alpha = min(scalars(events[-1], "losses/alpha").items())[1]
    assert first_alpha == pytest.approx(saved["learner"]["log_alpha"].exp().item(), rel=0.3)
    assert min(scalars(run_dir, "losses/qf1_loss")) < 500  # the earlier part is kept


@pytest.mark.slow  # about 35 s of the serial Ray group
@pytest.mark.ray
def test_resume_without_buffer_warns_and_refills_before_updating(tmp_path, saved_run):
    run_dir = tmp_path / saved_run[0].name
    shutil.copytree(saved_run[0], run_dir)
    ckpt_path = run_dir / "checkpoints" / "step_0000000500.pt"
    ckpt = torch.load(ckpt_path, weights_only=True)
    ckpt["replay_buffers"] = None  # as saved without --save-buffer
    torch.save(ckpt, ckpt_path)
    for later in (run_dir / "checkpoints").glob("*_0000001000.pt"):  # as if it died after step 500
        later.unlink()
    proc = run_ray("--resume", ckpt_path, "--total-timesteps", "800", "--torch-threads", "1")
    assert proc.returncode == 0, proc.stderr
    assert "buffer starts empty" in proc.stderr and "step 600" in proc.stderr
    # 300 new transitions in the buffer; updates resume at step 600 (learning_starts 100 after the checkpoint)
    assert done_line(proc.stdout)[2:] == (300, ckpt["run_state"]["grad_steps"] + 201)


# The tests below start no Ray (refused before it starts, or no Ray needed): they run on the fork server, beside the
# other workers' tests (tests/conftest.py: not in the "ray" group).
def run_refused(*args, timeout: float = 120) -> subprocess.CompletedProcess:
    return run_python(ROOT / SCRIPT, args, ROOT, {**os.environ, **BASE_ENV}, timeout)


@pytest.mark.ray
def test_resume_refuses_a_fixed_flag_set_to_another_value(saved_run):
    ckpt = saved_run[0] / "checkpoints" / "step_0000000500.pt"
    proc = run_refused("--resume", ckpt, "--total-timesteps", "1100", "--batch-size", "64")
    assert_clean_error(proc, "--batch-size 64 conflicts with the checkpoint", "trained with 32")


@pytest.mark.ray
def test_eval_checkpoint_is_deterministic_and_logged(saved_run):
    ckpt = saved_run[0] / "checkpoints" / "final_0000001000.pt"
    outs = [run_script("tools/agent.py", "eval", ckpt, "--episodes", "2") for _ in range(2)]
    for out in outs:
        assert out.returncode == 0, out.stderr
        assert "over 2 episodes" in out.stdout
        episode_lines(out.stdout, 2)  # progress: a line per episode
    assert outs[0].stdout == outs[1].stdout
    assert list(scalars(saved_run[0] / "eval" / ckpt.stem, "eval/episodic_return")) == [1000]


@pytest.mark.parametrize(
    "flags, needles",
    [
        (["--env-id", "tests.fake_envs:DiscreteCounting-v0"], ["Discrete(2)", "continuous"]),
        (["--env-id", "NoSuchEnv-v0"], ["unknown environment id", "NoSuchEnv-v0"]),
        (["--total-timesteps", "1000", "--learning-starts", "2000"], ["learning_starts (2000)", "total_timesteps (1000)"]),
        (["--batch-size", "512", "--buffer-size", "100"], ["batch_size (512)", "buffer_size 100"]),
        (["--num-buffer-shards", "3", "--num-rollout-workers", "2"], ["num_buffer_shards (3)"]),
        (["--num-rollout-workers", "0"], ["--num-rollout-workers must be >= 1, not 0"]),
        (["--utd-ratio", "-1"], ["--utd-ratio must be >= 0, not -1.0"]),
        (["--utd-ratio", "inf"], ["--utd-ratio must be finite"]),
        (["--resume", "does/not/exist.pt"], ["does not exist"]),
    ],
)
def test_bad_input_gets_a_short_message(tmp_path, flags, needles):
    proc = run_refused(*flags, "--runs-dir", tmp_path)
    assert_clean_error(proc, *needles)
    assert not any(tmp_path.iterdir()), "nothing is written for a rejected run"


@pytest.mark.ray
def test_a_checkpoint_of_another_script_is_refused(tmp_path, saved_run):
    ckpt = torch.load(saved_run[0] / "checkpoints" / "step_0000000500.pt", weights_only=True)
    ckpt["script"] = "sac_continuous"
    other = tmp_path / "run" / "checkpoints" / "sac.pt"
    other.parent.mkdir(parents=True)
    torch.save(ckpt, other)
    assert_clean_error(run_refused("--resume", other, "--total-timesteps", "1000"), "sac_continuous.py")


def test_unreachable_ray_address_is_refused_before_ray_tries_it(tmp_path):
    """Refused by the script's own socket probe ("cannot connect to HOST:PORT (<the OS's reason>)"), not by ray.init,
    which retries an unreachable address for minutes (its failure reads "could not join a Ray cluster"). The probe's
    message is the behaviour checked, not the seconds: run_refused's timeout only stops a run that hangs."""
    proc = run_refused("--env-id", "Pendulum-v1", "--ray-address", "127.0.0.1:1", "--runs-dir", tmp_path)
    assert_clean_error(proc, "--ray-address 127.0.0.1:1: cannot connect to 127.0.0.1:1 (", "refused")
    assert "could not join" not in proc.stderr
    assert not any(tmp_path.iterdir()), "nothing is written for a run that could not start"


@pytest.mark.slow  # about 70 s of the serial Ray group
@pytest.mark.ray
def test_ctrl_c_saves_shuts_ray_down_and_resumes_with_the_learner_paused(tmp_path):
    """SIGINT to the whole process group, as a terminal's Ctrl-C: the driver saves and exits 130, no Ray process is
    left behind, and the checkpoint resumes. The resumed run has --pause-learner (a flag a resume may change): it only
    collects, with no gradient update. (One test for both: each Ray start costs the suite tens of seconds.)"""
    proc = start_ray_run(
        "--env-id",
        "Pendulum-v1",
        *SMALL,
        "--total-timesteps",
        "10000000",
        "--checkpoint-interval",
        "0",
        "--save-buffer",
        "--runs-dir",
        tmp_path,
    )
    try:
        wait_for_updates(tmp_path, n=2, timeout=300, proc=proc)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = output_after_ctrl_c(proc, 120)
        leftovers = lingering(proc.pid)  # Ray's workers included: they sit in process groups of their own
    finally:  # a run that ignored the signal, or left processes behind, must not outlive the test
        stop_session(proc.pid)
    assert proc.returncode == 130, err
    assert not leftovers, f"processes left in the run's session: {leftovers}"
    ckpts = list((only_run_dir(tmp_path) / "checkpoints").glob("interrupted_*.pt"))
    assert len(ckpts) == 1, err
    state = torch.load(ckpts[0], weights_only=True)
    step = state["global_step"]
    assert step >= 200 and sum(b["size"] for b in state["replay_buffers"]) == step  # every counted step is stored
    assert state["run_state"]["grad_steps"] <= step - 100 + 1
    resumed = run_ray("--resume", ckpts[0], "--total-timesteps", step + 200, "--torch-threads", "1", "--pause-learner")
    assert resumed.returncode == 0, resumed.stderr
    assert "learner paused" in resumed.stdout
    assert done_line(resumed.stdout) == (step + 200, 0, step + 200, state["run_state"]["grad_steps"])
    assert max(scalars(only_run_dir(tmp_path), "losses/qf1_loss")) <= step  # no update logged after the resume


@pytest.mark.ray
def test_every_worker_collects_episodes_of_its_own(saved_run):
    """The two workers are seeded apart (their envs and their random actions): no transition of the saved buffer
    occurs twice. Seeded alike, their first batches would be the same steps, stored twice."""
    run_dir, _ = saved_run
    ckpt = torch.load(run_dir / "checkpoints" / "final_0000001000.pt", weights_only=True, map_location="cpu")
    rows = np.concatenate([np.concatenate([b["obs"], b["actions"]], 1) for b in ckpt["replay_buffers"]])
    assert len(rows) == 1000
    assert len(np.unique(rows, axis=0)) == len(rows), "transitions stored twice: the workers are seeded alike"


# ---- Ray stays within the machine: workers within its CPUs, a bounded restart loop, a start-up that can be stopped ----
@pytest.mark.ray
def test_more_workers_than_the_clusters_cpus_are_refused_before_any_worker_starts(tmp_path):
    """One worker more than this machine's CPUs: refused once Ray says how many it has, before any worker starts,
    with one paragraph and exit code 2; the run's new folder goes, and nothing Ray started is left. (It used to start
    them all, on a Ray given a CPU per worker: 100 workers on 2 cores were killed for memory and restarted in a loop.)"""
    workers = (os.cpu_count() or 1) + 1
    proc = start_ray_run(
        "--env-id", "Pendulum-v1", *SMALL, "--total-timesteps", "200", "--num-rollout-workers", workers, "--runs-dir", tmp_path
    )
    try:
        out, err = proc.communicate(timeout=180)
        leftovers = lingering(proc.pid)
    finally:
        stop_session(proc.pid)
    assert_clean_error(subprocess.CompletedProcess([], proc.returncode, out, err), f"--num-rollout-workers {workers}: ")
    cpus = int(re.search(r"has (\d+); give at most", err).group(1))
    assert cpus < workers and "ray:" not in out, out  # no worker started (the start-up line names their pids)
    assert not any(tmp_path.iterdir()), "the refused run's folder is removed"
    assert not leftovers, f"processes left in the run's session: {leftovers}"


def lines_of(stream) -> queue.Queue:
    """A stream's lines as a thread reads them (a test waits for one with a timeout, never blocks on the pipe)."""
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in stream], daemon=True).start()
    return lines


def next_match(lines: queue.Queue, pattern: str, timeout: float, seen: list) -> re.Match:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            seen.append(lines.get(timeout=max(deadline - time.monotonic(), 0.01)))
        except queue.Empty:
            break
        if match := re.search(pattern, seen[-1]):
            return match
    pytest.fail(f"no line matching {pattern!r} within {timeout:.0f} s; the run printed:\n{''.join(seen[-30:])}")


@pytest.mark.slow  # about 100 s of the serial Ray group
@pytest.mark.ray
def test_a_worker_killed_again_and_again_ends_the_run_with_a_checkpoint_and_one_paragraph(tmp_path):
    """SIGKILL rollout worker 0 each time Ray brings it back, as a machine short of memory does: after
    MAX_WORKER_RESTARTS restarts Ray lets it die, and the driver saves an `interrupted` checkpoint, says so in one
    paragraph and exits 2, leaving no Ray process behind. (With restarts unbounded it came back for ever.)"""
    from sac_continuous_ray import MAX_WORKER_RESTARTS

    proc = start_ray_run(
        "--env-id", "Pendulum-v1", *SMALL, "--total-timesteps", "1000000", "--checkpoint-interval", "0", "--runs-dir", tmp_path
    )
    seen_out, seen_err = [], []
    try:
        out_lines, err_lines = lines_of(proc.stdout), lines_of(proc.stderr)
        pid = int(next_match(out_lines, r"^ray: .*pids (\d+) ", 180, seen_out).group(1))
        wait_for_updates(tmp_path, proc=proc)  # kill once the learner has started
        for restart in range(MAX_WORKER_RESTARTS):
            os.kill(pid, signal.SIGKILL)
            pid = int(next_match(err_lines, r"rollout worker 0 is back \(restarted by Ray, pid (\d+)", 120, seen_err).group(1))
        os.kill(pid, signal.SIGKILL)  # one death more than Ray restarts
        proc.wait(timeout=120)
        leftovers = lingering(proc.pid)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the run went on after worker 0's last death:\n{''.join(seen_err[-20:])}")
    finally:
        stop_session(proc.pid)
    time.sleep(1)  # the reader threads take the pipes' last lines
    err = "".join(seen_err + list(err_lines.queue))
    assert proc.returncode == 2, err
    assert not leftovers, f"processes left in the run's session: {leftovers}"
    assert "Traceback" not in err, err
    error = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "rollout worker 0" in error[0] and "--resume" in error[0], err
    ckpts = list((only_run_dir(tmp_path) / "checkpoints").glob("interrupted_*.pt"))
    assert len(ckpts) == 1 and str(ckpts[0]) in error[0], err
    state = torch.load(ckpts[0], weights_only=True)
    assert state["run_state"]["grad_steps"] > 0 and state["run_state"]["worker_restarts"] <= MAX_WORKER_RESTARTS


@pytest.mark.ray
@pytest.mark.parametrize(
    "where, sig, target",
    [
        ("sac_continuous_ray.py:probe_env", "INT", "group"),  # before the run's folder exists
        ("sac_continuous_ray.py:connect_ray", "TERM", "pid"),  # the folder exists; Ray not started
        # the slow tier: 15-35 s each of the serial Ray group
        pytest.param("ray/_private/node.py:Node.start_raylet", "INT", "group", marks=pytest.mark.slow),  # in ray.init
        ("sac_continuous_ray.py:Learner.__init__", "TERM", "pid"),  # Ray up (and its own SIGTERM handler in place)
        pytest.param("sac_continuous_ray.py:Batches.__init__@Worker.get_objects", "INT", "group", marks=pytest.mark.slow),
    ],
)
def test_a_signal_at_any_moment_of_start_up_ends_cleanly(tmp_path, where, sig, target):
    """Ctrl-C (SIGINT to the process group) or SIGTERM (to the driver) at a chosen moment of start-up, before the
    first iteration ends (tests/signal_at.py sends it there and says where it was): no traceback, one line, exit
    code 130, no run folder left, no Ray process left. (It used to print a KeyboardInterrupt traceback, or exit 15
    through Ray's own SIGTERM handler, leaving the run's folder behind.)"""
    proc = start_ray_run(
        where,
        sig,
        target,
        ROOT / SCRIPT,
        "--env-id",
        "Pendulum-v1",
        *SMALL,
        "--runs-dir",
        tmp_path,
        script="tests/signal_at.py",
    )
    try:
        out, err = proc.communicate(timeout=180)
        leftovers = lingering(proc.pid)
    finally:
        stop_session(proc.pid)
    moment = [line for line in err.splitlines() if line.startswith("signal_at:")]
    function, _, inner = where.partition(":")[2].partition("@")
    assert len(moment) == 1 and function in moment[0] and moment[0].endswith(inner), err  # signalled where asked
    assert proc.returncode == 130, f"rc={proc.returncode}\n{err}"
    assert "Traceback" not in err, err
    assert [line for line in err.splitlines() if line.startswith("interrupted")], err
    assert not any(tmp_path.iterdir()), "nothing is left of a run stopped before its first iteration ended"
    assert not leftovers, f"processes left in the run's session: {leftovers}"
