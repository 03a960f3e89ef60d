"""sac_continuous_ray.py's dispatch and weight-sync rules on a simulated clock (no Ray, no envs): the driver loop's
harvest -> dispatch -> learn passes with the script's own helpers (pick_worker, pull_due, next_batch_plan,
collection_allowed, updates_due), workers that take a fixed time per env step and a learner that takes a fixed time
per update. In the learner-bound regime (the learner slower than the workers, as on a 2-core machine) the mean weight
staleness must not grow with the number of workers, and every worker must get its share of the batches."""

import bisect

import numpy as np
import pytest

import sac_continuous_ray as sr

STEP_S, UPDATE_S, CALL_S = 140e-6, 8e-3, 1e-3  # a worker's env step, a gradient step, a Ray round trip (measured sizes)


def simulate(workers: int, total: int = 40_000, batch_steps: int = 100, sync_interval: int = 1_000,
             learning_starts: int = 5_000, policy_frequency: int = 2, old_rules: bool = False) -> dict:  # fmt: skip
    """One run of the driver loop on a simulated clock at utd 1. Returns the staleness of every stored batch (actor
    updates between the weights that collected it and the learner's version when it is stored) and each worker's
    batch count. old_rules: the rules before issue 23 (the lowest-numbered free worker; a pull every sync_interval of
    the worker's own env steps), for comparison."""
    t, global_step, grad_steps, actor_updates, dispatched = 0.0, 0, 0, 0, 0
    published_at, published = [0.0], [0]  # the parameter server's versions over time
    free_at = [0.0] * workers  # when each worker has finished the batches queued on it
    in_flight, last_start, started = [0] * workers, [0] * workers, 0
    last_pull, versions, own_steps = [0] * workers, [-1] * workers, [0] * workers  # the driver's / worker's view
    weights = [-1] * workers  # the version each worker acts with (the simulated worker's state)
    pending = []  # (end time, worker, env steps, version acted with)
    lead = workers * batch_steps
    staleness, shares = [], [0] * workers
    while True:
        # harvest: the batches back by now, counted and stored
        for batch in sorted(b for b in pending if b[0] <= t):
            pending.remove(batch)
            _, i, steps, version = batch
            in_flight[i] -= 1
            global_step += steps
            shares[i] += 1
            if version >= 0:
                staleness.append(actor_updates - version)
                versions[i] = max(versions[i], version)
        # dispatch, as main() does
        while True:
            if old_rules:
                free = [i for i in range(workers) if in_flight[i] < sr.MAX_IN_FLIGHT]
                i = free[0] if free else None
            else:
                i = sr.pick_worker(in_flight, last_start, sr.MAX_IN_FLIGHT)
            if i is None:
                break
            steps, random_steps = sr.next_batch_plan(dispatched, total, learning_starts, 1, batch_steps)
            if steps == 0 or not sr.collection_allowed(dispatched, steps, grad_steps, learning_starts, 1.0, lead):
                break
            if actor_updates != published[-1]:
                published_at.append(t)
                published.append(actor_updates)
            acts = steps > random_steps
            if old_rules:
                pull = acts and (weights[i] < 0 or own_steps[i] >= sync_interval)  # (decided when it starts, below)
            else:
                pull = acts and sr.pull_due(global_step, last_pull[i], versions[i], published[-1], sync_interval)
                if pull:
                    last_pull[i], versions[i] = global_step, published[-1]
            start = max(t + CALL_S, free_at[i])
            if acts and (pull or weights[i] < 0):  # the worker pulls the version published when its batch starts
                weights[i] = published[bisect.bisect_right(published_at, start) - 1]
                own_steps[i] = 0
            if old_rules:
                own_steps[i] += steps
            free_at[i] = start + steps * STEP_S
            pending.append((free_at[i] + CALL_S, i, steps, weights[i] if acts else -1))
            in_flight[i] += 1
            started += 1
            last_start[i] = started
            dispatched += steps
        # learn: one update per pass while the workers collect, all that remain at the end
        owed = max(sr.updates_due(global_step, learning_starts, 1.0) - grad_steps, 0)
        if owed > 0:
            n = owed if global_step >= total else 1
            for _ in range(n):
                grad_steps += 1
                if grad_steps % policy_frequency == 0:
                    actor_updates += policy_frequency
            t += n * UPDATE_S
        elif global_step >= total:
            break
        else:
            t = max(t, min(b[0] for b in pending))  # nothing to learn: wait for the next batch
    assert global_step == total and grad_steps == total - learning_starts + 1
    return {"staleness": np.array(staleness), "shares": np.array(shares)}


@pytest.fixture(scope="module")
def runs() -> dict:
    return {n: simulate(n) for n in (1, 2, 4)}


def test_the_learner_is_the_bottleneck_in_this_model():
    # a worker collects a 100-step batch in 14 ms; the learner needs 800 ms for its 100 updates
    assert 100 * UPDATE_S > 10 * 100 * STEP_S


def test_mean_staleness_does_not_grow_with_workers(runs):
    means = {n: float(r["staleness"].mean()) for n, r in runs.items()}
    print("mean staleness (actor updates) at 1 / 2 / 4 workers:", means,
          "max:", {n: int(r["staleness"].max()) for n, r in runs.items()})  # fmt: skip
    assert max(means.values()) <= 1.5 * min(means.values())
    assert all(m <= 2 * 1_000 for m in means.values())  # about one sync interval at most, at utd 1


def test_every_worker_gets_its_share_of_the_batches(runs):
    for n, r in runs.items():
        shares = r["shares"] / r["shares"].sum()
        print(f"{n} workers: shares of the batches {np.round(shares, 3).tolist()}")
        assert np.all(np.abs(shares - 1 / n) <= 0.2 / n), f"{n} workers: {shares}"


def test_the_old_rules_gave_worker_0_most_batches():
    """The rules before: the lowest-numbered free worker took nearly every batch when the learner was the bottleneck,
    and each worker pulled after its own --weight-sync-interval steps (so its weights aged with the number of workers)."""
    old = simulate(4, old_rules=True)
    shares = old["shares"] / old["shares"].sum()
    print(f"old rules, 4 workers: shares {np.round(shares, 3).tolist()}, mean staleness {old['staleness'].mean():.0f}")
    assert shares[0] > 0.5
