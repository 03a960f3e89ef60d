"""sac_continuous_ray.py's dispatch and weight-sync rules on a simulated clock (no Ray, no envs): the driver loop's
harvest -> dispatch -> learn passes, every dispatch decided by the script's own next_dispatch() (the function main()
calls), workers that take a fixed time per env step and a learner that takes a fixed time per update. In the
learner-bound regime (the learner slower than the workers, as on a 2-core machine) the mean weight staleness must not
grow with the number of workers, and every worker must get its share of the batches; naive rules (old_decide,
passed in as `decide`: the lowest-numbered free worker takes the batch) fail these checks."""

import ast
import bisect
import functools
import inspect
from types import SimpleNamespace

import numpy as np
import pytest

import sac_continuous_ray as sr

STEP_S, UPDATE_S, CALL_S = 140e-6, 8e-3, 1e-3  # a worker's env step, a gradient step, a Ray round trip (measured sizes)


def old_decide(batches, state, args, total: int, lowest_free: bool = True):
    """Naive rules in next_dispatch's place: the lowest-numbered free worker takes the batch (with
    lowest_free=False: pick_worker's, as now), and it pulls after every --weight-sync-interval of its *own* env steps.
    Batch plans and the utd back-pressure as now."""
    plan = sr.next_dispatch(batches, state, args, total)  # None when no worker is free, nothing is left, or held back
    if plan is None:
        return None
    i, steps, random_steps, _ = plan
    if lowest_free:
        i = next(w for w, busy in enumerate(batches.busy) if busy < sr.MAX_IN_FLIGHT)
    return i, steps, random_steps, steps > random_steps and batches.own_steps[i] >= args.weight_sync_interval


def simulate(
    workers: int,
    total: int = 40_000,
    batch_steps: int = 100,
    sync_interval: int = 1_000,
    learning_starts: int = 5_000,
    policy_frequency: int = 2,
    decide=None,
) -> dict:
    """One run of main()'s driver loop on a simulated clock at utd 1, one env per worker; `decide` (default: the
    script's next_dispatch) makes every dispatch decision. Returns the staleness of every stored batch (actor updates
    between the weights that collected it and the learner's version when it is stored), each worker's batch count,
    the fraction of the run's time the learner spent updating and each worker spent collecting, and the most env
    steps dispatched ahead of the learner's updates."""
    decide = decide or sr.next_dispatch  # looked up at call time: a test may replace it
    args = sr.Args(
        total_timesteps=total,
        learning_starts=learning_starts,
        policy_frequency=policy_frequency,
        num_rollout_workers=workers,
        weight_sync_interval=sync_interval,
        worker_batch_steps=batch_steps,
    )
    state = sr.LoopState(updates_start=learning_starts)  # as main() starts a fresh run
    # Batches' bookkeeping (what next_dispatch reads), and each worker's env steps since its last pull (old_decide)
    batches = SimpleNamespace(
        busy=[0] * workers,
        started=0,
        last_start=[0] * workers,
        dispatched=0,
        last_pull=[0] * workers,
        versions=[-1] * workers,
        own_steps=[0] * workers,
    )
    t, learner_time, worker_time, lead = 0.0, 0.0, np.zeros(workers), 0
    published_at, published = [0.0], [0]  # the parameter server's versions over time
    free_at = [0.0] * workers  # when each worker has finished the batches queued on it
    weights = [-1] * workers  # the version each worker acts with (the simulated worker's state)
    pending = []  # (end time, worker, env steps, version acted with)
    staleness, shares = [], [0] * workers
    while True:
        # harvest: the batches back by now, counted and stored (Batches.harvest's bookkeeping)
        for batch in sorted(b for b in pending if b[0] <= t):
            pending.remove(batch)
            _, i, steps, version = batch
            batches.busy[i] -= 1
            state.global_step += steps
            shares[i] += 1
            if version >= 0:
                staleness.append(state.actor_updates - version)
                batches.versions[i] = max(batches.versions[i], version)
        # dispatch, as main() does: the decision from `decide`, then publish and Batches.start's bookkeeping
        while (plan := decide(batches, state, args, total)) is not None:
            i, steps, random_steps, pull = plan
            if state.actor_updates != published[-1]:
                published_at.append(t)
                published.append(state.actor_updates)
            if pull:
                batches.last_pull[i], batches.versions[i] = state.global_step, state.actor_updates
            batches.busy[i] += 1
            batches.started += 1
            batches.last_start[i] = batches.started
            batches.dispatched += steps
            lead = max(lead, batches.dispatched - (learning_starts - 1 + state.grad_steps))  # env steps not yet learned on
            # the simulated worker: it pulls the version published when its batch starts (or its first weights)
            start = max(t + CALL_S, free_at[i])
            if steps > random_steps and (pull or weights[i] < 0):
                weights[i] = published[bisect.bisect_right(published_at, start) - 1]
                batches.own_steps[i] = 0
            batches.own_steps[i] += steps
            free_at[i] = start + steps * STEP_S
            worker_time[i] += steps * STEP_S
            pending.append((free_at[i] + CALL_S, i, steps, weights[i] if steps > random_steps else -1))
        # learn: one update per pass while the workers collect, all that remain at the end
        owed = sr.updates_owed(state, args.utd_ratio, total)
        if owed > 0:
            n = owed if state.global_step >= total else 1
            for _ in range(n):
                state.grad_steps += 1
                if state.grad_steps % policy_frequency == 0:  # delayed: policy_frequency actor updates at a time
                    state.actor_updates += policy_frequency
            t += n * UPDATE_S
            learner_time += n * UPDATE_S
        elif state.global_step >= total:
            break
        else:
            assert pending, "nothing in flight and nothing to learn: the run stalls"
            t = max(t, min(b[0] for b in pending))  # nothing to learn: wait for the next batch
    assert state.global_step == total and state.grad_steps == total - learning_starts + 1
    return {
        "staleness": np.array(staleness),
        "shares": np.array(shares),
        "learner_busy": learner_time / t,
        "worker_busy": worker_time / t,
        "lead": lead,
    }


def check_staleness(runs: dict) -> None:
    """The mean staleness does not grow with the number of workers and stays about one sync interval at most."""
    means = {n: float(r["staleness"].mean()) for n, r in runs.items()}
    maxima = {n: int(r["staleness"].max()) for n, r in runs.items()}
    print(f"mean staleness (actor updates) by workers: { {n: round(m) for n, m in means.items()} }, max: {maxima}")
    assert max(means.values()) <= 1.5 * min(means.values()), f"mean staleness grows with the workers: {means}"
    assert all(m <= 2 * 1_000 for m in means.values()), f"mean staleness past two sync intervals: {means}"


def check_shares(runs: dict) -> None:
    """Each of n workers collects 1/n of the batches, within 20 %."""
    for n, r in runs.items():
        shares = r["shares"] / r["shares"].sum()
        print(f"{n} workers: shares of the batches {np.round(shares, 3).tolist()}")
        assert np.all(np.abs(shares - 1 / n) <= 0.2 / n), f"{n} workers: shares {shares}"


@pytest.fixture(scope="module")
def runs() -> dict:
    return {n: simulate(n) for n in (1, 2, 4)}


@pytest.fixture(scope="module")
def old_runs() -> dict:
    return {n: simulate(n, decide=old_decide) for n in (1, 2, 4)}


@pytest.fixture(scope="module")
def old_pull_runs() -> dict:  # today's worker choice, the old pull rule
    return {n: simulate(n, decide=functools.partial(old_decide, lowest_free=False)) for n in (1, 2, 4)}


def test_the_learner_is_the_bottleneck_in_the_simulated_run(runs):
    """The regime these checks are about, as the simulated runs show it: the learner updates nearly all the time, and
    the workers, held back by the utd ratio (never more than one batch each ahead of the learner), are idle most of it."""
    for n, r in runs.items():
        print(
            f"{n} workers: learner busy {r['learner_busy']:.3f}, workers busy {np.round(r['worker_busy'], 3).tolist()}, "
            f"collection ahead of the learner by {r['lead']} env steps at most"
        )
        assert r["learner_busy"] > 0.9
        assert np.all(r["worker_busy"] < 0.5)
        assert r["lead"] <= n * 100, f"{n} workers: collection ran {r['lead']} env steps ahead of the learner"


def test_mean_staleness_does_not_grow_with_workers(runs):
    check_staleness(runs)


def test_every_worker_gets_its_share_of_the_batches(runs):
    check_shares(runs)


def test_the_old_rules_fail_the_shares_check(old_runs):
    """The share check has teeth: under the naive rules the lowest-numbered free worker takes most batches
    (worker 0 about 90 % of them at 4 workers) when the learner was the bottleneck."""
    with pytest.raises(AssertionError, match="shares"):
        check_shares(old_runs)
    shares = old_runs[4]["shares"] / old_runs[4]["shares"].sum()
    assert shares[0] > 0.5, f"old rules, 4 workers: shares {shares}"


def test_the_old_pull_rule_fails_the_staleness_check(old_pull_runs):
    """The staleness check has teeth: with batches shared round-robin but a pull after every --weight-sync-interval of
    a worker's *own* env steps (the old rule), each of n workers pulls every n intervals of the run, so the mean
    staleness grows with the workers (about 450 / 890 / 1,750 actor updates at 1 / 2 / 4). The shares stay fair:
    each check catches its own rule."""
    with pytest.raises(AssertionError, match="grows with the workers"):
        check_staleness(old_pull_runs)
    assert old_pull_runs[4]["staleness"].mean() > 3 * old_pull_runs[1]["staleness"].mean()
    check_shares(old_pull_runs)


def test_the_simulation_decides_with_the_scripts_function(monkeypatch):
    """Every batch of the simulated run is one that sr.next_dispatch planned (the default `decide` is looked up at call
    time, so a change to the script's function changes the simulation)."""
    plans = []

    def recording(*a):
        plan = real(*a)
        plans.append(plan)
        return plan

    real = sr.next_dispatch
    monkeypatch.setattr(sr, "next_dispatch", recording)
    r = simulate(2, total=4_000, learning_starts=1_000)
    assert sum(p is not None for p in plans) == r["shares"].sum() > 0


def calls_in(node: ast.AST) -> set:
    return {n.func.id for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)} | {
        n.func.attr for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
    }


def test_main_dispatches_through_next_dispatch_only():
    """main() decides each dispatch with next_dispatch (the function simulated above) and applies no rule of its own:
    neither main() nor Batches calls pick_worker, pull_due, next_batch_plan or collection_allowed itself."""
    rules = {"pick_worker", "pull_due", "next_batch_plan", "collection_allowed"}
    main_calls = calls_in(ast.parse(inspect.getsource(sr.main)))
    assert "next_dispatch" in main_calls
    assert not rules & main_calls, f"main() applies a dispatch rule itself: {rules & main_calls}"
    batches_calls = calls_in(ast.parse(inspect.getsource(sr.Batches)))
    assert not rules & batches_calls, f"Batches applies a dispatch rule itself: {rules & batches_calls}"
    assert rules <= calls_in(ast.parse(inspect.getsource(sr.next_dispatch)))
