"""sac_continuous_ray.py's own parts, in-process (no Ray): the utd schedule, the updates owed and back-pressure, batch
plans, shard sampling, the actor classes (rollout worker, parameter server, buffer shard) called directly, the shards'
checkpoint part, and a driver loop ended by `run.last`."""

import os
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest
import torch

import sac_continuous_ray as sr


def test_updates_due_follows_sac_continuous_schedule_at_utd_1():
    # sac_continuous.py: one update per env step, the first at global_step == learning_starts
    assert [sr.updates_due(s, 100, 1.0) for s in (0, 99, 100, 101, 600)] == [0, 0, 1, 2, 501]
    assert sr.updates_due(600, 100, 0.5) == 250 and sr.updates_due(600, 100, 2.0) == 1002
    assert sr.updates_due(5, 0, 1.0) == 5  # learning_starts 0: the first update once one transition is stored


def test_collection_leads_the_learner_by_a_bounded_amount():
    # 2 workers x 100-step batches: collection may run 200 env steps ahead of the updates it makes due
    lead = 200
    assert sr.collection_allowed(0, 100, 0, 1000, 1.0, lead)  # random phase: no updates due yet
    assert sr.collection_allowed(1000, 100, 0, 1000, 1.0, lead)  # due at 900 steps: 0 updates, done
    assert not sr.collection_allowed(1200, 100, 0, 1000, 1.0, lead)  # due at 1100: 101 updates, none done
    assert sr.collection_allowed(1200, 100, 101, 1000, 1.0, lead)
    assert sr.collection_allowed(10**9, 100, 0, 0, 0.0, lead)  # utd 0: asynchronous, never held back


def test_batch_plans_take_exactly_learning_starts_random_steps_and_stop_at_total():
    dispatched, random_total, plans = 0, 0, []
    while True:
        steps, random_steps = sr.next_batch_plan(dispatched, 1000, 250, 4, 30)  # 4 envs per worker
        if steps == 0:
            break
        plans.append(steps)
        random_total += random_steps * 4
        dispatched += steps * 4
    assert dispatched == 1000 and max(plans) == 30
    assert random_total == 252  # ceil(250 / 4) vector steps: the first 250 env steps are all random
    assert sr.next_batch_plan(998, 1000, 0, 4, 30) == (0, 0)  # never past total


def test_shard_sample_counts_follow_the_shard_sizes():
    torch.manual_seed(0)
    counts = np.array([sr.shard_sample_counts([100, 300, 0], 256) for _ in range(200)])
    assert (counts.sum(1) == 256).all() and (counts[:, 2] == 0).all()  # an empty shard serves nothing
    assert counts[:, 1].mean() / 256 == pytest.approx(0.75, abs=0.01)
    assert sr.shard_sample_counts([5], 7) == [7]


def test_parameter_server_sends_weights_only_when_newer():
    server = sr.ParameterServer()
    assert server.pull(-1) is None  # nothing published yet
    server.publish([np.ones(2)], 4)
    weights, version = server.pull(-1)
    assert version == 4 and np.array_equal(weights[0], np.ones(2))
    assert server.pull(4) is None and server.pull(3) is not None


def worker_for(env_id: str, num_envs: int = 1) -> tuple:
    server = sr.ParameterServer()
    server.publish(sr.actor_weights(sr.Actor(2, 1)), 0)
    return sr.RolloutWorker(0, env_id, num_envs, 1, server), server


def test_worker_batches_store_termination_not_truncation_and_the_true_final_obs():
    """Counting-v0 truncates at 7 steps, CountingTerminates-v0 terminates at 5; obs = [t, episode]."""
    import tests.fake_envs  # noqa: F401  (registers the ids)

    for env_id, length, terminal in (("Counting-v0", 7, False), ("CountingTerminates-v0", 5, True)):
        worker, _ = worker_for(env_id)
        batch, stats = worker.collect(20, 3)
        assert batch["obs"].shape == (20, 2) and batch["actions"].shape == (20, 1) and stats["steps"] == 20
        obs, next_obs = batch["obs"], batch["next_obs"]
        assert (next_obs[:, 0] == obs[:, 0] + 1).all(), "every transition is within one episode (t -> t + 1)"
        assert (next_obs[:, 1] == obs[:, 1]).all(), "never a next obs from the next episode"
        ends = next_obs[:, 0] == length
        assert ends.sum() == 20 // length
        assert (batch["terminated"] == (ends & terminal)).all()  # a truncation is not terminal
        assert [ep for ep in stats["episodes"]] == [(float(length), length)] * (20 // length)


def test_worker_acts_randomly_first_then_with_the_weights_it_pulls_when_told():
    server, weights = sr.ParameterServer(), sr.actor_weights(sr.Actor(3, 1))
    worker = sr.RolloutWorker(0, "Pendulum-v1", 2, 1, server)  # 2 envs: 2 env steps per vector step
    _, stats = worker.collect(5, 5)
    assert stats["version"] == -1 and worker.version == -1  # random actions only: no pull
    server.publish(weights, 7)
    _, stats = worker.collect(4, 0, False)  # no weights yet: the first policy step pulls all the same
    assert stats["version"] == 7 and worker.version == 7
    server.publish(weights, 9)
    _, stats = worker.collect(2, 0, False)  # not told to pull: acts with what it has
    assert stats["version"] == 7 and worker.version == 7
    batch, stats = worker.collect(2, 1, True)  # told to pull: before its first policy step (after the random one)
    assert stats["version"] == 9 and worker.version == 9
    assert batch["actions"].shape == (4, 1) and np.abs(batch["actions"]).max() <= 2.0  # Pendulum's bounds


def test_worker_acts_through_its_own_actor_module_on_the_pulled_weights():
    """The worker loads the published weights into an Actor of the script's class and acts through it and
    squashed_gaussian (Policy.act, as in sac_continuous.py): no second copy of the network's math."""
    torch.manual_seed(3)
    actor = sr.Actor(3, 1)
    server = sr.ParameterServer()
    server.publish(sr.actor_weights(actor), 5)
    worker = sr.RolloutWorker(0, "Pendulum-v1", 1, 1, server)
    batch, stats = worker.collect(3, 0, True)
    assert stats["version"] == 5 and type(worker.policy.actor) is sr.Actor
    torch.testing.assert_close(list(worker.policy.actor.parameters()), list(actor.parameters()), rtol=0, atol=0)
    torch.manual_seed(1)  # the worker's seed: its noise came from torch's RNG, seeded after its Policy was made
    for t in range(3):
        expected = sr.Policy(actor, worker.low, worker.high).act(batch["obs"][t : t + 1])
        np.testing.assert_allclose(batch["actions"][t : t + 1], expected, rtol=1e-6, atol=1e-6)
    with torch.no_grad():  # sampled, not the deterministic tanh(mean) * 2 (Pendulum's bounds): exploration noise
        deterministic = torch.tanh(actor(torch.as_tensor(batch["obs"]))[0]).numpy() * 2.0
    assert np.abs(batch["actions"] - deterministic).min() > 1e-4, "the worker acts deterministically: no exploration noise"


def test_a_worker_without_weights_waits_for_a_late_publisher():
    """A fresh worker (or one whose parameter server came back empty) waits for the first publish, instead of acting
    on an empty weights list (the "not enough values to unpack" crash)."""
    import threading

    server = sr.ParameterServer()
    worker = sr.RolloutWorker(0, "Pendulum-v1", 1, 1, server)
    assert server.version == -1  # nothing published
    late = threading.Timer(0.5, server.publish, (sr.actor_weights(sr.Actor(3, 1)), 3))
    start = time.monotonic()
    late.start()
    batch, stats = worker.collect(3, 0, True)
    late.join()
    assert time.monotonic() - start >= 0.45 and stats["version"] == 3 and batch["actions"].shape == (3, 1)
    assert server.version == 3


def test_dispatch_goes_round_robin_and_pulls_count_global_steps():
    # fewest batches in flight first, then the worker whose last batch started longest ago
    assert sr.pick_worker([1, 0, 0], [5, 3, 4], 2) == 1
    assert sr.pick_worker([1, 1, 1], [5, 3, 4], 2) == 1
    assert sr.pick_worker([2, 2], [1, 2], 2) is None
    starts, in_flight, last = [], [0, 0, 0], [0, 0, 0]
    for n in range(1, 7):  # one batch at a time comes back at once (learner-bound): every worker takes its turn
        i = sr.pick_worker(in_flight, last, 2)
        starts.append(i)
        last[i] = n
    assert starts == [0, 1, 2, 0, 1, 2]
    # a pull needs a newer version and --weight-sync-interval env steps, over all workers, since the worker's last
    assert sr.pull_due(1000, 0, 5, 6, 1000) and not sr.pull_due(999, 0, 5, 6, 1000)
    assert not sr.pull_due(5000, 0, 6, 6, 1000)  # current: nothing to pull


def test_buffer_shard_adds_worker_batches_and_samples_them():
    import tests.fake_envs  # noqa: F401

    worker, _ = worker_for("Counting-v0")
    shard = sr.BufferShard(16, 2, 1, seed=0)
    batch, _ = worker.collect(10, 10)
    assert shard.add(batch) == 10
    assert shard.add(worker.collect(10, 10)[0]) == 16  # wraps around at capacity
    sample = shard.sample(64)
    assert sample["obs"].shape == (64, 2) and sample["terminated"].dtype == torch.float32
    assert torch.equal(sample["next_obs"][:, 0], sample["obs"][:, 0] + 1)  # whole transitions
    restored = sr.BufferShard(16, 2, 1, seed=0)
    assert restored.load_state_dict(shard.state_dict()) == 16


def test_unreachable_ray_address_fails_fast_and_clearly(monkeypatch):
    """Fast: refused by the script's socket probe, before ray.init, which retries an unreachable address for minutes
    (checked as that, not in seconds: a loaded machine's clock decides nothing)."""
    ray = pytest.importorskip("ray")
    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("ray.init tried the unreachable address"))
    with pytest.raises(sr.UserError, match="cannot connect to 127.0.0.1:1"):
        sr.connect_ray("127.0.0.1:1", 2)
    with pytest.raises(sr.UserError, match="cannot connect"):
        sr.connect_ray("ray://localhost:notaport", 2)


def test_updates_owed_follow_the_schedule_and_async_owes_one_at_a_time():
    s = sr.LoopState(global_step=600, updates_start=100, grad_steps=450)
    assert sr.updates_owed(s, 1.0, total=1000) == 501 - 450
    s.grad_steps = 600
    assert sr.updates_owed(s, 1.0, total=1000) == 0  # ahead of the schedule: nothing owed (never negative)
    s.updates_base = 200  # a resume without a buffer: a new schedule on top of the updates already made
    assert sr.updates_owed(s, 1.0, total=1000) == 200 + 501 - 600
    # utd 0 (asynchronous): one at a time, from updates_start on and while env steps are still being collected
    assert [sr.updates_owed(sr.LoopState(global_step=g, updates_start=100), 0.0, 1000) for g in (99, 100, 999, 1000)] == [
        0,
        1,
        1,
        0,
    ]


def test_shard_states_save_every_shard_only_with_save_buffer():
    import tests.fake_envs  # noqa: F401

    worker, _ = worker_for("Counting-v0")
    shards = [sr.BufferShard(16, 2, 1, seed=i) for i in range(2)]
    shards[0].add(worker.collect(5, 5)[0])
    shards[1].add(worker.collect(3, 3)[0])
    assert sr.ShardStates(shards, save=False).state_dict() is None  # the checkpoint then holds no buffer
    states = sr.ShardStates(shards, save=True).state_dict()
    assert [state["size"] for state in states] == [5, 3]
    restored = [sr.BufferShard(16, 2, 1, seed=i) for i in range(2)]
    sr.ShardStates(restored, save=True).load_state_dict(states)
    assert [shard.size() for shard in restored] == [5, 3]
    assert torch.equal(restored[1].state_dict()["obs"], states[1]["obs"])
    sr.ShardStates(restored, save=True).load_state_dict(None)  # a checkpoint saved without the buffer: nothing to load
    assert [shard.size() for shard in restored] == [5, 3]


def test_run_ends_the_loop_after_the_pass_marked_last(tmp_path):
    """The driver loop has no fixed number of passes: it sets run.last on its final pass, which then ends a log window
    (the last updates are logged) and is the last the loop yields."""
    args = sr.Args(env_id="Pendulum-v1", runs_dir=str(tmp_path), progress=False, checkpoint_interval=0)
    args.num_iterations = sys.maxsize
    run = sr.Run(args, sr.SCRIPT_NAME, None, {"obs_shape": [3], "act_shape": [1]}, log_every=100)
    s = sr.LoopState()
    run.attach(s, None)
    logged = []
    for _ in run.iterations(s, args.num_iterations):
        s.global_step += 30
        run.last = s.global_step >= 150
        if run.log_due():
            logged.append(s.global_step)
    run.close()
    assert s.iteration == 5 and s.global_step == 150 and not run.stopped
    assert logged == [120, 150]  # the window that crossed 100, then the final one


@pytest.mark.parametrize("lost_shard", [False, True])
def test_a_task_error_ends_the_run_with_a_checkpoint_one_paragraph_and_exit_1(tmp_path, capsys, lost_shard):
    """Any Ray task error the loop does not repair (here an exception raised in an actor's code, or a lost shard):
    an `interrupted` checkpoint (without the buffer when a shard was lost), one paragraph, exit code 1."""
    ray_exceptions = pytest.importorskip("ray.exceptions")
    args = sr.Args(env_id="Pendulum-v1", runs_dir=str(tmp_path), progress=False, checkpoint_interval=0, save_buffer=True)
    args.num_iterations = sys.maxsize
    run = sr.Run(args, sr.SCRIPT_NAME, None, {"obs_shape": [3], "act_shape": [1]}, log_every=100)
    shard = sr.BufferShard(16, 3, 1, seed=0)
    states = sr.ShardStates([shard], save=True)
    s = sr.LoopState()
    run.attach(s, None, replay_buffers=states)
    capsys.readouterr()
    error = sr.ShardLost(0, ray_exceptions.RayActorError()) if lost_shard else ray_exceptions.RayError("ValueError: boom")
    with pytest.raises(SystemExit) as exit_info:
        with sr.stop_on_task_error(run, states):
            for _ in run.iterations(s, args.num_iterations):
                s.global_step += 50
                if s.global_step == 150:
                    raise error
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "--resume" in lines[0], err
    assert ("replay buffer shard 0 died" in err) == lost_shard and ("boom" in err) != lost_shard
    ckpt = torch.load(next(run.ckpt_dir.glob("interrupted_*.pt")), weights_only=True)
    assert ckpt["global_step"] == 150
    assert (ckpt["replay_buffers"] is None) == lost_shard  # a lost shard's data cannot be saved


def test_more_workers_than_the_cluster_has_cpus_is_refused_at_once(monkeypatch):
    """Each rollout worker takes one CPU: on a cluster with fewer, the extra workers would wait forever for a CPU. A
    fake ray module stands for a cluster of 3 CPUs (the check needs nothing else from Ray)."""
    calls = []
    fake = types.SimpleNamespace(
        init=lambda **kw: calls.append("init"),
        shutdown=lambda: calls.append("shutdown"),
        cluster_resources=lambda: {"CPU": 3.0},
    )
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.setattr(sr.socket, "create_connection", lambda *a, **k: types.SimpleNamespace(close=lambda: None))
    assert sr.connect_ray("10.0.0.1:6379", 3) is fake  # fits
    with pytest.raises(sr.UserError, match=r"--num-rollout-workers 4: .* has 3; give at most 3"):
        sr.connect_ray("10.0.0.1:6379", 4)
    assert calls == ["init", "init", "shutdown"]  # the refused run leaves the cluster


def test_shards_the_machine_cannot_hold_are_refused_before_ray_starts(tmp_path, monkeypatch):
    """The shards live on the driver's node: --buffer-size past its memory is refused, and with --save-buffer past the
    free disk under --runs-dir (two copies while a checkpoint is written), before Ray or a run folder starts."""
    import shutil

    from tests.student_copy import main_in_process

    monkeypatch.setattr(sr, "connect_ray", lambda *a: pytest.fail("Ray started before the sizes were checked"))
    flags = ["--env-id", "Pendulum-v1", "--runs-dir", tmp_path / "runs"]
    memory = r"--buffer-size 100,000,000,000: the replay buffer needs .* at most [\d,]+ fit"
    with pytest.raises(sr.UserError, match=memory):
        main_in_process(sr, [*flags, "--buffer-size", 10**11], monkeypatch)
    monkeypatch.setattr(sr.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**12, 10**12 - 50e6, 50e6))
    with pytest.raises(sr.UserError, match=r"--buffer-size 1,000,000 needs 0\.\d GiB of disk with --save-buffer"):
        main_in_process(sr, [*flags, "--buffer-size", 10**6, "--save-buffer"], monkeypatch)
    assert not (tmp_path / "runs").exists()
    with pytest.raises(pytest.fail.Exception, match="Ray started"):  # without --save-buffer the disk is not asked
        main_in_process(sr, [*flags, "--buffer-size", 10**6], monkeypatch)


def test_worker_warm_up_actions_are_uniform_over_the_bounds():
    """WiringBounds-v0 acts in [0.5, 3]: a worker's random actions lie inside and spread over most of it (not drawn
    in [-1, 1] as if every Box were symmetric)."""
    import tests.fake_envs  # noqa: F401  (registers WiringBounds-v0)

    worker = sr.RolloutWorker(0, "tests.fake_envs:WiringBounds-v0", 2, 1, sr.ParameterServer())
    batch, stats = worker.collect(20, 20)
    actions = batch["actions"]
    assert stats["version"] == -1 and actions.shape == (40, 1)
    assert actions.min() >= 0.5 and actions.max() <= 3.0, f"warm-up actions outside the bounds [0.5, 3]: {actions.ravel()}"
    assert actions.max() - actions.min() > 1.5, f"warm-up actions not spread over the bounds [0.5, 3]: {actions.ravel()}"


def test_the_embedded_ray_has_its_own_token_a_private_temp_folder_and_listens_on_127_0_0_1(monkeypatch):
    """Without --ray-address the script starts a Ray of its own: token authentication on with a token of this cluster's
    (no other local user can submit code that runs as you), servers on 127.0.0.1, a temp folder of this user's (mode
    0700, not a shared /tmp/ray), and no empty PYTHONPATH entry (it would put the working folder on the workers'
    sys.path). A fake ray module records what ray.init would get."""
    seen = {}
    fake = types.SimpleNamespace(init=lambda **kw: seen.update(kw, env=dict(os.environ)), cluster_resources=lambda: {"CPU": 2})
    monkeypatch.setitem(sys.modules, "ray", fake)
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # what this script set before: a user's setting is not kept either
    monkeypatch.setenv("PYTHONPATH", f"{os.sep}opt{os.pathsep}")
    assert sr.connect_ray(None, 2) is fake
    env = seen["env"]
    assert env["RAY_AUTH_MODE"] == "token" and len(env["RAY_AUTH_TOKEN"]) >= 32
    assert env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"  # the switch that keeps Ray's servers on 127.0.0.1
    assert "" not in env["PYTHONPATH"].split(os.pathsep)
    private = Path(seen["_temp_dir"]).parent
    assert private.is_dir() and private.stat().st_mode & 0o777 == 0o700 and private.name.startswith(f"ray-{os.getuid()}-")
    token = env["RAY_AUTH_TOKEN"]
    assert sr.connect_ray(None, 2) is fake and seen["env"]["RAY_AUTH_TOKEN"] != token  # a token per cluster
