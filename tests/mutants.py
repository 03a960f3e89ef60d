"""Mutation testing of the default tier: one-line bugs of the kinds RL code is known for, each applied alone to a copy
of the checkout (tracked and untracked-but-not-ignored files), with the few default-tier tests that must catch it run
on the copy (-n 0 -x). A mutant is caught when they fail; one they pass SURVIVED. A mutant whose text does not occur
exactly once in its script cannot be applied: that fails the run too, named (update its text with the script). The
tests are first run on the unmutated copy: they must pass there, or every mutant would look caught.

usage: python -m tests.mutants [-k SUBSTRING] [--jobs N] [--list]   (exit 1: a mutant survived, could not be applied, or
errored). Run by .ci/run's last step (tests/test_mutants.py checks the runner). Measured: 91 mutants, all caught, in
3 min 50 s with --jobs 2 alone on the developers' 2-core machine (18 min while other test runs shared it).

Each entry: (name, old text, new text, tests). Keep `old` a short fragment of an algorithm line (a loss, a GAE or
returns call, normalization, clipping, the optimizer's lr, noise and warm-up, the target entropy, the Ray workers'
weights and seeds), so that edits elsewhere in the script leave it applicable."""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# the tests that catch them (pytest node ids)
UPDATE = "tests/test_update_wiring.py::test_"
UW_PPO = UPDATE + "ppo_continuous_update_sees_the_normalized_rollout_and_the_whole_loss"
UW_PPO_ATARI = UPDATE + "ppo_atari_update_sees_the_policy_that_acted_and_the_whole_loss"
UW_A2C = UPDATE + "a2c_atari_update_is_the_gradient_of_the_whole_loss"
UW_SAC = UPDATE + "sac_continuous_acts_in_the_bounds_with_noise_tunes_alpha_to_minus_a_and_logs_window_means"
WIRING = "tests/test_wiring.py::test_"
W_PPO = WIRING + "ppo_continuous_main_hands_the_loss_the_advantages_and_targets_of_the_rollout"
W_PPO_ATARI = WIRING + "ppo_atari_main_hands_the_loss_the_advantages_and_targets_of_the_games"
W_A2C = WIRING + "a2c_atari_main_hands_the_loss_the_n_step_returns_of_the_games"
W_SAC = WIRING + "sac_continuous_main_stores_the_true_transitions_and_regresses_on_the_soft_q_targets"
W_RAY = WIRING + "sac_continuous_ray_workers_store_the_true_transitions"
RAY_UNITS = "tests/test_sac_continuous_ray_units.py::test_"
RAY_E2E_SEEDS = "tests/test_sac_continuous_ray_e2e.py::test_every_worker_collects_episodes_of_its_own"

LR_LINE = ('optimizer.param_groups[0]["lr"] = lr', "_ = lr")  # the learning-rate line deleted: annealing only logged
NO_CLIP = ("(agent.parameters(), args.max_grad_norm)", '(agent.parameters(), float("inf"))')
VF_DROPPED = ("+ args.vf_coef * v_loss", "+ v_loss")
ENTROPY_SIGN = ("loss = pg_loss - args.ent_coef * entropy", "loss = pg_loss + args.ent_coef * entropy")
ATARI_STORE = "rewards_buf[step], terminations_buf[step], truncations_buf[step] = reward, terminations, truncations"

PPO_CONTINUOUS = [
    (
        "the old log-prob replaced by the new one, detached (ratio always 1)",
        "e_logprobs[mb],",
        "new_logprob.detach(),",
        [UW_PPO],
    ),
    (
        "the final observation left unnormalized",
        "normalize_obs(real_next_raw, norm, args.obs_clip)",
        "real_next_raw.astype(np.float32)",
        [UW_PPO],
    ),
    ("the learning-rate line deleted", *LR_LINE, [UW_PPO]),
    ("the learning rate annealed one iteration early", "lr = annealed(iteration, ", "lr = annealed(iteration + 1, ", [UW_PPO]),
    ("advantages not centred", "(mb_advantages - mb_advantages.mean())", "mb_advantages", [UW_PPO]),
    ("no gradient clipping", *NO_CLIP, [UW_PPO]),
    (
        "reward scaling's episode end from terminations only",
        "s.discounted_return, episode_ended, return_rms",
        "s.discounted_return, terminations, return_rms",
        [UW_PPO],
    ),
    ("vf_coef dropped", *VF_DROPPED, [UW_PPO]),
    ("entropy sign flipped", *ENTROPY_SIGN, [UW_PPO]),
    ("observations never normalized", "norm = obs_rms if args.norm_obs else None", "norm = None", [UW_PPO]),
    (
        "minibatch advantages out of line with the shuffle",
        "mb_advantages = e_advantages[mb]",
        "mb_advantages = e_advantages[mb].flip(0)",
        [UW_PPO],
    ),
    ("value clipping around the returns, not the old values", "e_values[mb],", "e_returns[mb],", [UW_PPO]),
    (
        "log-prob of another sample than the action taken",
        "dist.log_prob(action).cpu()",
        "dist.log_prob(dist.sample()).cpu()",
        [UW_PPO],
    ),
    (
        "terminations and truncations swapped in compute_gae",
        "next_values, terminations_buf, truncations_buf, args.gamma",
        "next_values, truncations_buf, terminations_buf, args.gamma",
        [W_PPO],
    ),
    ("gamma and lambda swapped", "args.gamma, args.gae_lambda", "args.gae_lambda, args.gamma", [W_PPO]),
    ("bootstrap from the next episode's first obs", "if episode_ended.any() else next_obs", "if False else next_obs", [W_PPO]),
    (
        "true_next_obs bypassed",
        "real_next_raw = true_next_obs(s.raw_obs, episode_ended, infos)",
        "real_next_raw = s.raw_obs",
        [W_PPO],
    ),
    (
        "truncation stored as termination",
        "= reward, terminations, truncations",
        "= reward, episode_ended, truncations",
        [W_PPO],
    ),
    ("obs recorded at the previous step", "obs_buf[step] = next_obs", "obs_buf[step - 1] = next_obs", [W_PPO]),
    ("returns = advantages + next values", "returns = advantages + values", "returns = advantages + next_values", [W_PPO]),
]

PPO_ATARI = [
    ("entropy sign flipped", *ENTROPY_SIGN, [UW_PPO_ATARI]),
    (
        "the old log-prob replaced by the new one, detached (ratio always 1)",
        "b_logprobs[idx],",
        "new_logprob.detach(),",
        [UW_PPO_ATARI],
    ),
    (
        "--anneal-clip logged but not applied",
        "clip_coef,\n                        args.clip_vloss",
        "args.clip_coef,\n                        args.clip_vloss",
        [UW_PPO_ATARI],
    ),
    ("the learning-rate line deleted", *LR_LINE, [UW_PPO_ATARI]),
    (
        "minibatch advantages out of line with the shuffle",
        "mb_advantages = b_advantages[idx]",
        "mb_advantages = b_advantages[idx.sort().values]",
        [UW_PPO_ATARI],
    ),
    ("advantages not centred", "(mb_advantages - mb_advantages.mean())", "mb_advantages", [UW_PPO_ATARI]),
    ("no gradient clipping", *NO_CLIP, [UW_PPO_ATARI]),
    ("vf_coef dropped", *VF_DROPPED, [UW_PPO_ATARI]),
    ("old values from the network being trained", "b_values[idx],", "new_values.detach(),", [UW_PPO_ATARI]),
    (
        "bootstrap the window from V(last obs seen), not V(obs after the rollout)",
        "agent(torch.from_numpy(next_obs).to(device))",
        "agent(obs_buf[-1].to(device))",
        [W_PPO_ATARI],
    ),
    (
        "truncation stored as termination",
        ATARI_STORE,
        ATARI_STORE.replace("= reward, terminations,", "= reward, terminations | truncations,"),
        [W_PPO_ATARI],
    ),
    (
        "reset step flag offset by one step",
        "reset_step_buf[step] = episode_ended",
        "reset_step_buf[step - 1] = episode_ended",
        [W_PPO_ATARI],
    ),
    (
        "the step after a truncation not a reset step",
        "episode_ended = terminations | truncations",
        "episode_ended = terminations",
        [W_PPO_ATARI],
    ),
    (
        "terminations and truncations swapped in compute_gae",
        "next_values, terminations_buf, truncations_buf, args.gamma",
        "next_values, truncations_buf, terminations_buf, args.gamma",
        [W_PPO_ATARI],
    ),
    ("lambda missing (gamma passed twice)", "args.gamma, args.gae_lambda", "args.gamma, args.gamma", [W_PPO_ATARI]),
    (
        "returns = advantages + next values",
        "returns = advantages + values_buf.numpy()",
        "returns = advantages + next_values",
        [W_PPO_ATARI],
    ),
    ("reset steps kept in the batch", "flatten(0, 1)[real]", "flatten(0, 1)[: len(real)]", [W_PPO_ATARI]),
    (
        "a lost life not a termination (EpisodicLife)",
        "terminated = terminated or 0 < lives < self.lives",
        "terminated = terminated",
        [W_PPO_ATARI],
    ),
    ("obs recorded at the previous step", "obs_buf[step] = obs = ", "obs_buf[step - 1] = obs = ", [W_PPO_ATARI]),
]

A2C_ATARI = [
    ("entropy sign flipped", *ENTROPY_SIGN, [UW_A2C]),
    ("vf_coef dropped", *VF_DROPPED, [UW_A2C]),
    ("no gradient clipping", *NO_CLIP, [UW_A2C]),
    ("the learning-rate line deleted", *LR_LINE, [UW_A2C]),
    ("advantages not centred", "(advantages - advantages.mean())", "advantages", [UW_A2C]),
    ("entropy summed, not averaged", "entropy = entropy.mean()", "entropy = entropy.sum()", [UW_A2C]),
    (
        "value loss without a gradient",
        "v_loss = (returns - values).pow(2)",
        "v_loss = (returns - values.detach()).pow(2)",
        [UW_A2C],
    ),
    (
        "terminations and truncations swapped in n_step_returns",
        "next_values, terminations_buf, truncations_buf, args.gamma)",
        "next_values, truncations_buf, terminations_buf, args.gamma)",
        [W_A2C],
    ),
    ("gamma applied twice", "truncations_buf, args.gamma)", "truncations_buf, args.gamma**2)", [W_A2C]),
    (
        "n-step return not cut at an episode end",
        "np.where(terminations[t] | truncations[t], next_values[t], returns[t + 1])",
        "returns[t + 1]",
        [W_A2C],
    ),
    (
        "n-step return cut at terminations only",
        "np.where(terminations[t] | truncations[t], next_values[t], returns[t + 1])",
        "np.where(terminations[t], next_values[t], returns[t + 1])",
        [W_A2C],
    ),
    (
        "advantages against no baseline",
        "advantages = b_returns - new_values",
        "advantages = b_returns - new_values.detach() * 0",
        [W_A2C],
    ),
    (
        "truncation stored as termination",
        ATARI_STORE,
        ATARI_STORE.replace("= reward, terminations,", "= reward, terminations | truncations,"),
        [W_A2C],
    ),
    (
        "reset step flag offset by one step",
        "reset_step_buf[step] = episode_ended",
        "reset_step_buf[step - 1] = episode_ended",
        [W_A2C],
    ),
    (
        "bootstrap the window from V(last obs seen), not V(obs after the rollout)",
        "agent(torch.from_numpy(next_obs).to(device))",
        "agent(obs_buf[-1].to(device))",
        [W_A2C],
    ),
    ("reset steps kept in the batch", "flatten(0, 1)[real]", "flatten(0, 1)[: len(real)]", [W_A2C]),
    (
        "the step after a truncation not a reset step",
        "episode_ended = terminations | truncations",
        "episode_ended = terminations",
        [W_A2C],
    ),
]

SAC_TARGET_SAMPLE = 'next_actions, next_log_prob = sample_action(learner, batch["next_obs"])'
SAC_TARGET_Q = 'next_q = q_values(learner.qf_target, batch["next_obs"], next_actions)'
SAC_MIN = "next_q.min(0).values - alpha * next_log_prob"

SAC_CONTINUOUS = [
    (
        "no exploration noise (the rollout acts deterministically)",
        "deterministic=False).cpu()",
        "deterministic=True).cpu()",
        [UW_SAC],
    ),
    (
        "warm-up actions that ignore the action bounds",
        "(uniform * (act_space.high - act_space.low) + act_space.low)",
        "(uniform * 2 - 1)",
        [UW_SAC],
    ),
    ("target entropy 0", "self.target_entropy = -float(act_dim)", "self.target_entropy = 0.0", [UW_SAC]),
    ("the logged critic loss sums never reset", "state.loss_sums.zero_()", "state.loss_sums.mul_(1)", [UW_SAC]),
    ("the logged actor loss sums never reset", "state.actor_sums.zero_()", "state.actor_sums.mul_(1)", [UW_SAC]),
    ("alpha loss sign flipped", "(-learner.log_alpha.exp() * (", "(learner.log_alpha.exp() * (", [UW_SAC]),
    (
        "truncation stored as done",
        "return raw_obs, real_next, rewards, terminations, episode_return",
        "return raw_obs, real_next, rewards, terminations | truncations, episode_return",
        [W_SAC],
    ),
    ("auto-reset obs stored as next obs", "buffer.add(obs, real_next_obs,", "buffer.add(obs, state.raw_obs,", [W_SAC]),
    ("true_next_obs bypassed", "real_next = true_next_obs(raw_obs, ended, infos)", "real_next = raw_obs", [W_SAC]),
    ("final obs looked up at terminations only", "ended = terminations | truncations", "ended = terminations", [W_SAC]),
    (
        "obs after the step stored as obs",
        "buffer.add(obs, real_next_obs,",
        "buffer.add(state.raw_obs, real_next_obs,",
        [W_SAC],
    ),
    ("target: a' drawn for s, not s'", SAC_TARGET_SAMPLE, SAC_TARGET_SAMPLE.replace("next_obs", "obs"), [W_SAC]),
    ("target: Q'(s, a'), not Q'(s', a')", SAC_TARGET_Q, SAC_TARGET_Q.replace('"next_obs"', '"obs"'), [W_SAC]),
    ("target: online critics, not the targets", SAC_TARGET_Q, SAC_TARGET_Q.replace("qf_target", "qf"), [W_SAC]),
    ("target: gamma applied twice", "learner.alpha(), gamma)", "learner.alpha(), gamma * gamma)", [W_SAC]),
    ("target: max of the critics, not min", SAC_MIN, SAC_MIN.replace("min(0)", "max(0)"), [W_SAC]),
    ("target: entropy term's sign flipped", SAC_MIN, SAC_MIN.replace("- alpha", "+ alpha"), [W_SAC]),
    ("target: termination ignored", "rewards + gamma * (1.0 - terminated) *", "rewards + gamma *", [W_SAC]),
    (
        "target: done flags of other rows",
        'soft_q_target(batch["rewards"], batch["terminated"],',
        'soft_q_target(batch["rewards"], batch["terminated"].roll(1),',
        [W_SAC],
    ),
]

SAC_CONTINUOUS_RAY = [
    (
        "workers acting forever on the initial weights (pulled, not loaded)",
        "self.policy.actor.load_state_dict(weights)",
        "self.policy.actor.load_state_dict(self.policy.actor.state_dict())",
        [RAY_UNITS + "worker_acts_through_its_own_actor_module_on_the_pulled_weights"],
    ),
    (
        "every worker seeded alike",
        "args.seed + 1_000 * i + state.global_step",
        "args.seed + state.global_step",
        [RAY_E2E_SEEDS],
    ),
    (
        "worker warm-up actions that ignore the action bounds",
        "(uniform * (self.high - self.low) + self.low)",
        "(uniform * 2 - 1)",
        [RAY_UNITS + "worker_warm_up_actions_are_uniform_over_the_bounds"],
    ),
    (
        "worker acts deterministically (no exploration noise)",
        "deterministic=False).cpu()",
        "deterministic=True).cpu()",
        [RAY_UNITS + "worker_acts_through_its_own_actor_module_on_the_pulled_weights"],
    ),
    (
        "worker's noise not seeded by its seed",
        "torch.manual_seed(seed)  # random actions",
        "torch.manual_seed(0)  # random actions",
        [RAY_UNITS + "worker_acts_through_its_own_actor_module_on_the_pulled_weights"],
    ),
    (
        "one random step too many per batch",
        "if t < num_random:",
        "if t <= num_random:",
        [RAY_UNITS + "worker_acts_randomly_first_then_with_the_weights_it_pulls_when_told"],
    ),
    (
        "a worker told to pull keeps its weights",
        "if t == num_random and (pull or self.version < 0):",
        "if t == num_random and self.version < 0:",
        [RAY_UNITS + "worker_acts_randomly_first_then_with_the_weights_it_pulls_when_told"],
    ),
    (
        "the parameter server sends weights that are not newer",
        "if self.version > have_version else None",
        "if self.version >= have_version else None",
        [RAY_UNITS + "parameter_server_sends_weights_only_when_newer"],
    ),
    (
        "utd schedule one update short",
        "math.floor(utd * (env_steps - first + 1) + 1e-9)",
        "math.floor(utd * (env_steps - first) + 1e-9)",
        [RAY_UNITS + "updates_due_follows_sac_continuous_schedule_at_utd_1"],
    ),
    (
        "random steps not counted from learning_starts",
        "max(learning_starts - dispatched, 0)",
        "max(learning_starts, 0)",
        [RAY_UNITS + "batch_plans_take_exactly_learning_starts_random_steps_and_stop_at_total"],
    ),
    (
        "truncation stored as done",
        "return raw_obs, real_next, rewards, terminations, episode_return",
        "return raw_obs, real_next, rewards, terminations | truncations, episode_return",
        [W_RAY],
    ),
    ("true_next_obs bypassed", "real_next = true_next_obs(raw_obs, ended, infos)", "real_next = raw_obs", [W_RAY]),
    (
        "worker stores the auto-reset obs as next obs",
        "steps.append((obs, real_next_obs,",
        "steps.append((obs, self.raw_obs,",
        [W_RAY],
    ),
    (
        "worker stores the obs after the step",
        "steps.append((obs, real_next_obs,",
        "steps.append((self.raw_obs, real_next_obs,",
        [W_RAY],
    ),
    (
        "shard swaps obs and next obs",
        'self.buffer.add(batch["obs"], batch["next_obs"],',
        'self.buffer.add(batch["next_obs"], batch["obs"],',
        [W_RAY],
    ),
    (
        "worker's episodes restart each batch",
        "        for t in range(num_steps):\n",
        "        self.raw_obs, _ = self.envs.reset()\n        for t in range(num_steps):\n",
        [W_RAY],
    ),
]

MUTANTS = {
    "ppo_continuous.py": PPO_CONTINUOUS,
    "ppo_atari.py": PPO_ATARI,
    "a2c_atari.py": A2C_ATARI,
    "sac_continuous.py": SAC_CONTINUOUS,
    "sac_continuous_ray.py": SAC_CONTINUOUS_RAY,
}


def all_mutants() -> list:
    """(script, name, old, new, tests) for every mutant."""
    return [(script, *m) for script, mutants in MUTANTS.items() for m in mutants]


def unapplicable(root: Path = REPO) -> list:
    """'script: name: found N times' for each mutant whose text does not occur exactly once (or changes nothing)."""
    out = []
    for script, name, old, new, _ in all_mutants():
        count = (root / script).read_text().count(old)
        if count != 1 or old == new:
            out.append(f"{script}: {name!r}: its text occurs {count} times (expected once): {old!r}")
    return out


def copy_checkout(dest: Path) -> None:
    """The files git would commit (tracked, and untracked but not ignored), into dest."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO, capture_output=True, check=True
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        if (REPO / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dest / name)


class Result:
    """A finished pytest run: its exit code and output (pytest's -rf summary and the E lines)."""

    def __init__(self, returncode: int, stdout: str):
        self.returncode, self.stdout = returncode, stdout


def start_pytest(copy: Path, tests: list, out: Path, mutant: tuple = None) -> int:
    """Fork a child that applies `mutant` (script, old, new) to `copy`, runs pytest on `tests` there (-n 0 -x) and
    puts the file back. Why fork: torch, numpy and gymnasium are imported once here, not once per mutant (a third
    of each run on a 2-core machine). The child imports the tests afresh from the copy (its ROOT is the copy)."""
    pid = os.fork()
    if pid:
        return pid
    code = 3
    try:
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.chdir(copy)
        for name in [n for n in sys.modules if n == "tests" or n.startswith("tests.")]:
            del sys.modules[name]  # the runner's own package lives in the checkout, not in the copy
        sys.path[:] = [str(copy)] + [p for p in sys.path if Path(p or ".").resolve() != REPO]
        original = None
        if mutant is not None:
            script, old, new = mutant
            original = (copy / script).read_text()
            (copy / script).write_text(original.replace(old, new))
        try:
            import pytest

            code = int(pytest.main(["-n", "0", "-x", "-q", "-p", "no:cacheprovider", "-rf", *tests]))
        finally:
            if original is not None:
                (copy / script).write_text(original)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def wait(pid: int, out: Path) -> Result:
    _, status = os.waitpid(pid, 0)
    return Result(os.waitstatus_to_exitcode(status), out.read_text(errors="replace"))


def why(proc: Result) -> str:
    """The first failed test and its first error line: which quantity went wrong."""
    failed = re.findall(r"^FAILED (\S+)", proc.stdout, re.M)
    errors = [e.strip() for e in re.findall(r"^E\s+(.+)$", proc.stdout, re.M) if e.strip() != "AssertionError:"]
    return f"{failed[0].split('::')[-1].split(' ')[0] if failed else '?'}: {' | '.join(errors[:2])[:160] or '?'}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-k", default="", help="run only the mutants whose 'script: name' contains this")
    parser.add_argument("--jobs", type=int, default=1, help="mutants run at once, each on its own copy")
    parser.add_argument("--list", action="store_true", help="list the mutants and their tests, run nothing")
    opts = parser.parse_args()
    chosen = [m for m in all_mutants() if opts.k in f"{m[0]}: {m[1]}"]
    if opts.list:
        for script, name, old, new, tests in chosen:
            print(f"{script}: {name} | {' '.join(t.split('::')[-1] for t in tests)}")
        print({script: len(mutants) for script, mutants in MUTANTS.items()})
        return 0
    import gymnasium  # noqa: F401  (imported once, before the forks: see start_pytest)
    import numpy  # noqa: F401
    import torch  # noqa: F401

    problems = [
        f"{s}: {n!r}: its text occurs {(REPO / s).read_text().count(o)} times (expected once): {o!r}"
        for s, n, o, w, _ in chosen
        if (REPO / s).read_text().count(o) != 1 or o == w
    ]
    for p in problems:
        print(f"CANNOT APPLY {p}", flush=True)
    start, caught, survived, errored = time.time(), 0, [], []
    with tempfile.TemporaryDirectory() as tmp:
        copies = [Path(tmp) / f"copy{j}" for j in range(max(opts.jobs, 1))]
        for copy in copies:
            copy_checkout(copy)
        baseline = sorted({t for m in chosen for t in m[4]})
        proc = wait(start_pytest(copies[0], baseline, Path(tmp) / "baseline.out"), Path(tmp) / "baseline.out")
        if proc.returncode != 0:
            print(f"the tests fail on the unmutated checkout (rc {proc.returncode}): {why(proc)}\n{proc.stdout[-3000:]}")
            return 1
        print(f"baseline: {len(baseline)} tests pass unmutated ({time.time() - start:.0f} s)", flush=True)
        todo = [m for m in chosen if (REPO / m[0]).read_text().count(m[2]) == 1 and m[2] != m[3]]
        running = {}  # pid -> (copy, mutant, output file, start time)
        while todo or running:
            free = [c for c in copies if c not in [r[0] for r in running.values()]]
            while todo and free:
                script, name, old, new, tests = mutant = todo.pop(0)
                copy, out = free.pop(0), Path(tmp) / f"{len(todo)}.out"
                running[start_pytest(copy, tests, out, (script, old, new))] = (copy, mutant, out, time.time())
            pid, status = os.wait()
            copy, (script, name, *_), out, t0 = running.pop(pid)
            proc = Result(os.waitstatus_to_exitcode(status), out.read_text(errors="replace"))
            if proc.returncode == 1:
                caught += 1
                verdict = f"caught by {why(proc)}"
            elif proc.returncode == 0:
                survived.append(f"{script}: {name}")
                verdict = "SURVIVED"
            else:
                errored.append(f"{script}: {name}")
                verdict = f"ERROR (pytest exit {proc.returncode}): {proc.stdout[-600:]}"
            print(f"{script:22} | {name:66} | {time.time() - t0:4.0f} s | {verdict}", flush=True)
    print(
        f"\n{len(chosen)} mutants: {caught} caught, {len(survived)} survived, {len(problems)} could not be applied, "
        f"{len(errored)} errored, in {time.time() - start:.0f} s"
    )
    for entry in survived:
        print(f"SURVIVED: {entry}")
    for entry in errored:
        print(f"ERRORED: {entry}")
    for entry in problems:
        print(f"CANNOT APPLY: {entry}")
    return 1 if survived or errored or problems else 0


if __name__ == "__main__":
    sys.exit(main())
