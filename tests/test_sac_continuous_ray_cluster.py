"""sac_continuous_ray.py on a real two-node Ray cluster started on this machine with `ray start` (a head and a second
node, each its own process group and session, each its own --temp-dir), joined with --ray-address: the workers run on
both nodes, every env step is counted and stored once, a checkpoint resumes, and the run survives losing the second
node. Token authentication is on (RAY_AUTH_MODE=token) with a private HOME holding the token, shared by the nodes
and the script. Teardown kills only the processes these tests started (by process group, then what is left in
their sessions or names their temp dirs) and checks that none is left: never `ray stop`, which ends every Ray
process on the machine.

Why not 127.0.0.1 alone: Ray 2.60 rewrites a loopback --node-ip-address and --address to the machine's own routable
address (ray._private.services.resolve_ip_for_localhost), and its one switch against that,
RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, refuses to start a second node. The nodes therefore advertise the machine's own
address, and the GCS and raylets listen on all interfaces (Ray 2.60 has no setting to bind them to loopback); the
cluster's traffic stays on this machine, between its own processes, and token authentication guards the ports."""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import BASE_ENV, ROOT, only_run_dir, require_ray_marker, scalars, wait_for_updates

pytest.importorskip("ray")
# tests/conftest.py: one Ray test at a time. Slow tier: two `ray start` nodes and two runs take about 100 s of the
# serial Ray group, which sets the default tier's pace on 2 cores.
pytestmark = [pytest.mark.ray, pytest.mark.slow]
psutil = pytest.importorskip("psutil")  # Ray vendors it: ray/thirdparty_files is on sys.path once ray is imported

RAY = str(Path(sys.executable).with_name("ray"))
SMALL = [
    "--env-id",
    "Pendulum-v1",
    "--learning-starts",
    "100",
    "--batch-size",
    "32",
    "--torch-threads",
    "1",
    "--worker-batch-steps",
    "50",
    "--num-rollout-workers",
    "2",
    "--progress",
]
DONE = re.compile(r"done: (\d+) env steps \((\d+) worker restarts\), (\d+) transitions in the buffer, (\d+) gradient updates")
# A lost node is declared dead after ~3 s instead of Ray's default ~30 s (health checks every second, 3 misses)
FAST_FAILURE = '{"health_check_initial_delay_ms": 1000, "health_check_period_ms": 1000, "health_check_failure_threshold": 3}'


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """Two Ray nodes on this machine, and every process they start, tracked so that only they are stopped."""

    def __init__(self, base: Path):
        self.base, self.port = base, free_port()
        self.home, self.nodes, self.temp_dirs = base / "home", [], []
        self.home.mkdir()
        self.env = {**os.environ, **BASE_ENV, "HOME": str(self.home), "RAY_AUTH_MODE": "token", "RAY_USAGE_STATS_ENABLED": "0"}
        # the token every party needs: written to HOME/.ray/auth_token, read by the nodes and the script alike
        subprocess.run([RAY, "get-auth-token", "--generate"], env=self.env, check=True, capture_output=True, timeout=60)
        self.address = f"127.0.0.1:{self.port}"

    def start_node(self, *flags: str, cpus: int = 2) -> subprocess.Popen:
        require_ray_marker("`ray start`, through Cluster.start_node")
        temp_dir = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
        self.temp_dirs.append(temp_dir)
        log = open(self.base / f"node{len(self.nodes)}.log", "w")
        node = subprocess.Popen(
            [RAY, "start", *flags, "--num-cpus", str(cpus), "--block", "--temp-dir", str(temp_dir)],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.nodes.append(node)
        return node

    def wait_for_nodes(self, n: int, timeout: float = 90) -> list:
        """The alive nodes' ids once n have joined (a driver of its own, in a subprocess, with the token)."""
        code = (
            "import ray, time, sys\nray.init(address=sys.argv[1], logging_level='ERROR')\nfor _ in range(300):\n"
            "    alive = [x['NodeID'] for x in ray.nodes() if x['Alive']]\n    if len(alive) >= int(sys.argv[2]): break\n"
            "    time.sleep(0.2)\nprint(' '.join(alive))"
        )
        proc = subprocess.run(
            [sys.executable, "-c", code, self.address, str(n)], env=self.env, capture_output=True, text=True, timeout=timeout
        )
        assert proc.returncode == 0, proc.stderr + self.logs()
        alive = proc.stdout.split()
        assert len(alive) >= n, f"only {alive} joined\n{self.logs()}"
        return alive

    def logs(self) -> str:
        return "".join(p.read_text()[-2000:] for p in sorted(self.base.glob("node*.log")))

    def processes(self, node: int = None) -> list:
        """Processes of the nodes (all, or one): in a node's session (Ray moves its workers into process groups of
        their own, not out of the session), or naming a node's temp dir on their command line or in their env."""
        nodes = self.nodes if node is None else [self.nodes[node]]
        dirs = [str(d) for d in (self.temp_dirs if node is None else [self.temp_dirs[node]])]
        sids = {p.pid for p in nodes}
        found = []
        for proc in psutil.process_iter(["pid"]):
            try:
                if os.getsid(proc.pid) in sids or any(d in " ".join(proc.cmdline()) for d in dirs):
                    found.append(proc.pid)
                elif any(d in value for value in proc.environ().values() for d in dirs):
                    found.append(proc.pid)
            except (psutil.Error, ProcessLookupError, PermissionError):
                continue
        return found

    def kill(self, node: int = None) -> None:
        """SIGKILL a node's process group (or all nodes'), then whatever of theirs is left."""
        for p in self.nodes if node is None else [self.nodes[node]]:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in self.processes(node):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in self.nodes if node is None else [self.nodes[node]]:
            p.wait(timeout=30)


@pytest.fixture(scope="module")
def cluster():
    base = Path(tempfile.mkdtemp(prefix="i23cluster"))
    c = Cluster(base)
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
        )
        c.wait_for_nodes(1)
        c.start_node("--address", c.address)
        c.nodes_alive = c.wait_for_nodes(2)
        yield c
    finally:
        c.kill()
        deadline = time.time() + 60  # generous: it ends as soon as they are gone, and a loaded machine reaps slowly
        while c.processes() and time.time() < deadline:
            time.sleep(0.5)
        left = c.processes()
        for d in [base, *c.temp_dirs]:
            shutil.rmtree(d, ignore_errors=True)
        assert not left, f"processes of the test's Ray nodes left: {left}"


def start_run(cluster: Cluster, *args) -> subprocess.Popen:
    """The script as a driver joining the cluster, in a session of its own (so that it is stopped by id)."""
    cmd = [sys.executable, str(ROOT / "sac_continuous_ray.py"), "--ray-address", cluster.address, *map(str, args)]
    return subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=cluster.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )


def finish(proc: subprocess.Popen, timeout: float = 240) -> tuple:
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # a driver that hung: nothing of it outlives the test
        except ProcessLookupError:
            pass
    return out, err


def worker_nodes(stdout: str) -> list:
    match = re.search(r"pids [\d ]+ on nodes ([0-9a-f ]+)\), .*learner's node ([0-9a-f]+)", stdout)
    assert match, stdout
    return match.group(1).split(), match.group(2)


def test_workers_run_on_both_nodes_every_step_is_stored_once_and_a_checkpoint_resumes(cluster, tmp_path):
    proc = start_run(
        cluster, *SMALL, "--total-timesteps", "2000", "--checkpoint-interval", "1000", "--save-buffer", "--runs-dir", tmp_path
    )
    out, err = finish(proc)
    assert proc.returncode == 0, err + cluster.logs()
    workers, learner = worker_nodes(out)
    assert len(set(workers)) == 2, f"rollout workers on both nodes (SPREAD): {workers}"
    assert learner in workers and {n[:8] for n in cluster.nodes_alive} == set(workers)
    assert tuple(int(x) for x in DONE.search(out).groups()) == (2000, 0, 2000, 1901)
    run_dir = only_run_dir(tmp_path)
    ckpt = run_dir / "checkpoints" / "step_0000001000.pt"
    saved = torch.load(ckpt, weights_only=True)
    assert saved["global_step"] == 1000 and sum(b["size"] for b in saved["replay_buffers"]) == 1000
    for later in (run_dir / "checkpoints").glob("*_0000002000.pt"):  # as if it died after step 1000 (else: a new folder)
        later.unlink()
    resumed = start_run(cluster, "--resume", ckpt, "--total-timesteps", "1600", "--torch-threads", "1")
    out, err = finish(resumed)
    assert resumed.returncode == 0, err
    assert "resumed from" in out and tuple(int(x) for x in DONE.search(out).groups()) == (1600, 0, 1600, 1501)
    assert max(scalars(run_dir, "losses/qf1_loss")) == 1600


def test_losing_the_second_node_mid_run_finishes_on_the_head_and_counts_nothing_twice(cluster, tmp_path):
    """SIGKILL the second node's process group (and its workers) mid-run: its worker's batches in flight fail and
    are collected again, Ray restarts the worker on the head, and the run ends with exactly total_timesteps steps,
    all stored once. (Runs last: it takes the second node away from the module's cluster.)"""
    proc = start_run(cluster, *SMALL, "--total-timesteps", "3000", "--checkpoint-interval", "0", "--runs-dir", tmp_path)
    try:
        wait_for_updates(tmp_path, n=3, timeout=150)  # kill once the learner has started
        cluster.kill(1)
        deadline = time.time() + 60  # SIGKILL lands at once; reaping takes a moment (generous: it ends once they are gone)
        while cluster.processes(1) and time.time() < deadline:
            time.sleep(0.2)
        assert not cluster.processes(1), "every process of the second node is gone"
        out, err = finish(proc)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert proc.returncode == 0, err + cluster.logs()
    steps, restarts, stored, updates = (int(x) for x in DONE.search(out).groups())
    assert (steps, stored, updates) == (3000, 3000, 2901)
    assert restarts >= 1 and "collected again" in err and "is back" in err, err
    back = re.findall(r"rollout worker \d is back \(restarted by Ray, pid \d+, node ([0-9a-f]+)\)", err)
    _, learner = worker_nodes(out)
    assert back and set(back) == {learner}, f"restarted on the head: {back}"
