"""Mutation runner for tests/test_wiring.py (not a test itself): applies one edit of the kind RL code is known for to
main() (or a helper it calls) in a copy of the checkout's tracked files, runs tests/test_wiring.py on the copy, and
prints which test caught each mutant. A mutant whose text no longer occurs in its script is reported NOT APPLIED:
update it with the script. Last run: 46 mutants, 46 caught (each by a value check, not a crash).

usage: python tests/wiring_mutants.py [substring of mutant names to run] | --list-stale"""

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYTHON = Path(sys.executable)  # the interpreter that runs this script (uv run ...)

GAE_CALL = "advantages = compute_gae(rewards_buf, values, next_values, terminations_buf, truncations_buf,"
NSTEP_CALL = "returns = n_step_returns(rewards_buf, next_values, terminations_buf, truncations_buf, args.gamma)"
NEXT_TARGETS = "next_values, real = next_step_targets(values, last_value.cpu().numpy(), reset_step_buf)"
LAST_VALUE = "_, last_value = agent(torch.from_numpy(next_obs).to(device))"
STORE_FLAGS = "terminations_buf[step], truncations_buf[step] = terminations, truncations"
LIFE = "terminated = terminated or 0 < lives < self.lives"
ROLLOUT = '        with run.timer("rollout"):\n            for step in range(args.num_steps):'
SAC_ADD = "buffer.add(obs, real_next_obs, actions, rewards, terminations)"
ENV_STEP_RETURN = "return raw_obs, real_next, rewards, terminations, episode_return, episode_length, finished"
TARGET_SAMPLE = 'next_actions, next_log_prob = sample_action(learner, batch["next_obs"])'
TARGET_Q = 'next_q = q_values(learner.qf_target, batch["next_obs"], next_actions)'

ATARI = [  # (name, old, new), applied to ppo_atari.py or a2c_atari.py (those that hold `old`)
    (
        "bootstrap the window from V(last obs seen), not V(obs after the rollout)",
        LAST_VALUE,
        "_, last_value = agent(obs_buf[-1].to(device))",
    ),
    (
        "next_values = values (V(s_t) for V(s_t+1))",
        NEXT_TARGETS,
        "next_values, real = values, next_step_targets(values, last_value.cpu().numpy(), reset_step_buf)[1]",
    ),
    (
        "helper next_step_targets: window bootstrap from values[-1]",
        "next_values = np.concatenate([values[1:], last_value[None]], axis=0)",
        "next_values = np.concatenate([values[1:], values[-1:]], axis=0)",
    ),
    (
        "truncation stored as termination",
        STORE_FLAGS,
        "terminations_buf[step], truncations_buf[step] = terminations | truncations, truncations",
    ),
    ("truncation not stored at all", STORE_FLAGS, "terminations_buf[step], truncations_buf[step] = terminations, False"),
    ("reset step flag offset by one step", "reset_step_buf[step] = episode_ended", "reset_step_buf[step - 1] = episode_ended"),
    (
        "the step after a truncation not marked a reset step",
        "episode_ended = terminations | truncations",
        "episode_ended = terminations",
    ),
    ("episode_ended not carried into the next iteration", ROLLOUT, "        episode_ended[:] = False\n" + ROLLOUT),
    ("reward written to the previous step", "rewards_buf[step] = reward", "rewards_buf[step - 1] = reward"),
    ("obs recorded at the previous step", "obs_buf[step] = obs_t", "obs_buf[step - 1] = obs_t"),
    (
        "reset steps kept in the returns (no [valid])",
        "b_returns = torch.from_numpy(returns.reshape(-1)).to(device)[valid]",
        "b_returns = torch.from_numpy(returns.reshape(-1)).to(device)[: len(valid)]",
    ),
    ("EpisodicLife: a lost life is not a termination (the wrapper main() relies on)", LIFE, "terminated = terminated"),
    # ppo_atari only
    (
        "PPO: terminations and truncations swapped in compute_gae",
        GAE_CALL,
        "advantages = compute_gae(rewards_buf, values, next_values, truncations_buf, terminations_buf,",
    ),
    (
        "PPO: lambda missing (gamma passed twice)",
        "truncations_buf, args.gamma, args.gae_lambda\n",
        "truncations_buf, args.gamma, args.gamma\n",
    ),
    ("PPO: returns = advantages + next_values", "returns = advantages + values", "returns = advantages + next_values"),
    (
        "PPO: advantages of the reset steps kept (no [valid])",
        "b_advantages = torch.from_numpy(advantages.reshape(-1)).to(device)[valid]",
        "b_advantages = torch.from_numpy(advantages.reshape(-1)).to(device)[: len(valid)]",
    ),
    # a2c_atari only
    (
        "A2C: terminations and truncations swapped in n_step_returns",
        NSTEP_CALL,
        "returns = n_step_returns(rewards_buf, next_values, truncations_buf, terminations_buf, args.gamma)",
    ),
    (
        "A2C: gamma applied twice",
        NSTEP_CALL,
        "returns = n_step_returns(rewards_buf, next_values, terminations_buf, truncations_buf, args.gamma ** 2)",
    ),
    (
        "A2C helper: n-step return not cut at an episode end",
        "future = np.where(episode_ended[t], next_values[t], returns[t + 1])",
        "future = returns[t + 1]",
    ),
    (
        "A2C helper: cut only at terminations (a truncation sums the next episode's return)",
        "future = np.where(episode_ended[t], next_values[t], returns[t + 1])",
        "future = np.where(terminations[t], next_values[t], returns[t + 1])",
    ),
    (
        "A2C: advantages against the returns' own values",
        "advantages = b_returns - new_values",
        "advantages = b_returns - new_values.detach() * 0",
    ),
]

SAC = [  # applied to sac_continuous.py
    (
        "truncation stored as done (env_step)",
        ENV_STEP_RETURN,
        "return raw_obs, real_next, rewards, terminations | truncations, episode_return, episode_length, finished",
    ),
    ("auto-reset obs stored as next_obs", SAC_ADD, "buffer.add(obs, state.raw_obs, actions, rewards, terminations)"),
    ("true_next_obs bypassed in env_step", "real_next = true_next_obs(raw_obs, ended, infos)", "real_next = raw_obs"),
    ("final obs looked up at terminations only", "ended = terminations | truncations", "ended = terminations"),
    ("obs after the step stored as obs", SAC_ADD, "buffer.add(state.raw_obs, real_next_obs, actions, rewards, terminations)"),
    ("actions of the other env stored", SAC_ADD, "buffer.add(obs, real_next_obs, actions[::-1], rewards, terminations)"),
    ("target: a' drawn for s, not s'", TARGET_SAMPLE, 'next_actions, next_log_prob = sample_action(learner, batch["obs"])'),
    ("target: Q'(s, a') not Q'(s', a')", TARGET_Q, 'next_q = q_values(learner.qf_target, batch["obs"], next_actions)'),
    ("target: online critics, not the targets", TARGET_Q, 'next_q = q_values(learner.qf, batch["next_obs"], next_actions)'),
    ("target: gamma applied twice", "learner.alpha(), gamma)", "learner.alpha(), gamma * gamma)"),
    (
        "target: max of the critics, not min",
        "next_q.min(0).values - alpha * next_log_prob",
        "next_q.max(0).values - alpha * next_log_prob",
    ),
    (
        "target: entropy term's sign flipped",
        "next_q.min(0).values - alpha * next_log_prob",
        "next_q.min(0).values + alpha * next_log_prob",
    ),
    ("target: termination ignored", "return rewards + gamma * (1.0 - terminated) *", "return rewards + gamma *"),
    (
        "target: done flags of other rows (terminated rolled by one)",
        'y = soft_q_target(batch["rewards"], batch["terminated"],',
        'y = soft_q_target(batch["rewards"], batch["terminated"].roll(1),',
    ),
]

RAY = [  # applied to sac_continuous_ray.py
    (
        "truncation stored as done (env_step)",
        ENV_STEP_RETURN,
        "return raw_obs, real_next, rewards, terminations | truncations, episode_return, episode_length, finished",
    ),
    ("true_next_obs bypassed in env_step", "real_next = true_next_obs(raw_obs, ended, infos)", "real_next = raw_obs"),
    (
        "worker stores the auto-reset obs as next_obs",
        "steps.append((obs, real_next_obs, actions, rewards, terminations))",
        "steps.append((obs, self.raw_obs, actions, rewards, terminations))",
    ),
    (
        "worker stores the obs after the step",
        "steps.append((obs, real_next_obs, actions, rewards, terminations))",
        "steps.append((self.raw_obs, real_next_obs, actions, rewards, terminations))",
    ),
    (
        "shard swaps obs and next_obs",
        'self.buffer.add(batch["obs"], batch["next_obs"],',
        'self.buffer.add(batch["next_obs"], batch["obs"],',
    ),
    (
        "worker's episodes restart each batch",
        "        for t in range(num_steps):\n",
        "        self.raw_obs, _ = self.envs.reset()\n        for t in range(num_steps):\n",
    ),
]


PPO_CONTINUOUS = [  # the test that was there before (tests/test_wiring.py's first): checked again here
    (
        "terminations and truncations swapped in compute_gae",
        "compute_gae(rewards_buf, values, next_values, terminations_buf, truncations_buf, args.gamma,",
        "compute_gae(rewards_buf, values, next_values, truncations_buf, terminations_buf, args.gamma,",
    ),
    (
        "bootstrap value from the wrong step: V(s_t) of the obs seen, not V(s_t+1)",
        "next_values = agent.get_value(torch.from_numpy(next_obs_buf).to(device))",
        "next_values = agent.get_value(obs)",
    ),
    ("bootstrap from the next episode's first obs", "if episode_ended.any() else next_obs", "if False else next_obs"),
    (
        "truncation stored as termination",
        "rewards_buf[step], terminations_buf[step], truncations_buf[step] = reward, terminations, truncations",
        "rewards_buf[step], terminations_buf[step], truncations_buf[step] = reward, episode_ended, truncations",
    ),
    (
        "gamma and lambda swapped",
        "truncations_buf, args.gamma,\n                                     args.gae_lambda)",
        "truncations_buf, args.gae_lambda,\n                                     args.gamma)",
    ),
    (
        "reward written to the previous step",
        "rewards_buf[step], terminations_buf[step], truncations_buf[step] = reward, terminations, truncations",
        "rewards_buf[step - 1], terminations_buf[step], truncations_buf[step] = reward, terminations, truncations",
    ),
    ("obs recorded after the step", "obs_buf[step] = next_obs", "obs_buf[step - 1] = next_obs"),
]


def mutants() -> list:
    out = [("ppo_continuous.py", *m) for m in PPO_CONTINUOUS]
    for script in ("ppo_atari.py", "a2c_atari.py"):
        text = (REPO / script).read_text()
        out += [
            (script, n, o, m)
            for n, o, m in ATARI
            if text.count(o) == 1
            and not (n.startswith("PPO") and script != "ppo_atari.py")
            and not (n.startswith("A2C") and script != "a2c_atari.py")
        ]
    out += [("sac_continuous.py", *m) for m in SAC] + [("sac_continuous_ray.py", *m) for m in RAY]
    return out


def main() -> None:
    if "--list-stale" in sys.argv:
        for script, name, old, new in mutants():
            n = (REPO / script).read_text().count(old)
            if n != 1:
                print(script, "|", name, "|", n, "|", old[:100].replace("\n", "\\n"))
        return
    pattern = sys.argv[1] if len(sys.argv) > 1 else ""
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "repo"
        for name in files:
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, copy / name)
        rows = []
        for script, name, old, new in mutants():
            if pattern not in f"{script} {name}":
                continue
            original = (REPO / script).read_text()
            count = original.count(old)
            if count != 1:
                rows.append((script, name, f"NOT APPLIED (text found {count} times)"))
                print(f"{script:22} | {name:70} | {rows[-1][2]}", flush=True)
                continue
            (copy / script).write_text(original.replace(old, new))
            proc = subprocess.run(
                [str(PYTHON), "-m", "pytest", "-n", "0", "-q", "-p", "no:cacheprovider", "-rf", "tests/test_wiring.py"],
                cwd=copy,
                capture_output=True,
                text=True,
            )
            (copy / script).write_text(original)
            failed = sorted(set(re.findall(r"^FAILED tests/test_wiring.py::(\S+)", proc.stdout, re.M)))
            errors = re.findall(r"^ERROR .*", proc.stdout, re.M)
            caught = ", ".join(f.replace("test_", "").split("_main")[0].split("_workers")[0] for f in failed)
            kinds = sorted(set(re.findall(r"^E\s+(\w+(?:Error|Exception)):", proc.stdout, re.M)))  # why it failed
            caught += f" ({', '.join(kinds)})" if kinds else ""
            rows.append((script, name, f"caught by {caught}" if failed else "MISSED" + (f" {errors}" if errors else "")))
            print(f"{script:22} | {name:70} | {rows[-1][2]}", flush=True)
    missed = sum("MISSED" in r[2] or "NOT" in r[2] for r in rows)
    print(f"\n{len(rows)} mutants, {len(rows) - missed} caught, {missed} missed or not applied")


if __name__ == "__main__":
    main()
