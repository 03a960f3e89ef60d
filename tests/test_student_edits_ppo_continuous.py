"""Student edits to ppo_continuous.py, each applied to a copy of the script alone in an empty folder
(tests/student_copy.py). Every edit either keeps the script correct (the rollout samples the edited policy, and one
real update moves every parameter tensor) or stops the run at once with a message naming what to change
(docs/ppo_continuous.md, "Editing the script")."""

import numpy as np
import pytest
import torch

from tests.conftest import assert_clean_error, last10_return
from tests.student_copy import copy_alone, import_copy, main_in_process, run_copy
from tests.test_ppo_continuous_learning import PENDULUM_RUN, PENDULUM_THRESHOLD

SCRIPT = "ppo_continuous.py"
ACTOR = """        self.actor_mean = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, act_dim), std=0.01),
        )
"""
HIDDEN = "            layer_init(nn.Linear(64, 64)),\n            nn.Tanh(),\n"
LOSS = "loss = pg_loss - args.ent_coef * entropy + args.vf_coef * v_loss"
ZERO_GRAD = "optimizer.zero_grad()"
LOGSTD = "        self.actor_logstd = nn.Parameter(torch.zeros(1, act_dim))\n"
DIST = "        return Independent(Normal(self.actor_mean(x), self.actor_logstd.exp(), validate_args=False), 1)\n"


def state_std(bias: float) -> list:
    """The std as a second head, a function of the state, its log started at `bias`."""
    head = (
        "        self.actor_logstd = nn.Sequential(layer_init(nn.Linear(obs_dim, 64)), nn.Tanh(),\n"
        f"                                          layer_init(nn.Linear(64, act_dim), std=0.01, bias_const={bias}))\n"
    )
    return [(LOGSTD, head), (DIST, DIST.replace("self.actor_logstd.exp()", "self.actor_logstd(x).exp()"))]


# started at std e^-1, away from the unedited e^0: a rollout sampling the unedited policy would show
STATE_STD = state_std(-1.0)
# a tanh-squashed Gaussian scaled to Pendulum's bounds (+-2); torch's TransformedDistribution adds the log-prob
# correction log|d a / d u| = log(2 (1 - tanh(u)^2)) itself
SQUASHED = [
    (
        DIST,
        "        base = Independent(Normal(self.actor_mean(x), self.actor_logstd.exp(), validate_args=False), 1)\n"
        "        squash = [torch.distributions.TanhTransform(cache_size=1), torch.distributions.AffineTransform(0.0, 2.0)]\n"
        "        return torch.distributions.TransformedDistribution(base, squash)\n",
    )
]
# the same squashing with torch's other nesting: Independent outside the transform (torch has no mean for either)
TANH_INDEPENDENT = [
    (
        DIST,
        "        base = Normal(self.actor_mean(x), self.actor_logstd.exp())\n"
        "        squashed = torch.distributions.TransformedDistribution(base, [torch.distributions.TanhTransform()])\n"
        "        return Independent(squashed, 1)\n",
    )
]
# dropout in the actor: each forward pass is another policy, so the rollout's log-probs must be those of the pass that
# acted, and evaluation must run in eval mode (dropout off)
DROPOUT = [(ACTOR, ACTOR.replace(HIDDEN, HIDDEN + "            nn.Dropout(0.1),\n"))]

# edit -> (old, new) replacements; each must leave the script correct
WORKING_EDITS = {
    "unedited, plain zero_grad()": [],
    "activation ReLU": [(ACTOR, ACTOR.replace("nn.Tanh()", "nn.ReLU()"))],
    "width 128": [(ACTOR, ACTOR.replace("64", "128"))],
    "one more hidden layer": [(ACTOR, ACTOR.replace(HIDDEN, HIDDEN * 2))],
    "LayerNorm": [(ACTOR, ACTOR.replace(HIDDEN, "            nn.LayerNorm(64),\n" + HIDDEN))],
    "zero_grad(set_to_none=True)": [(ZERO_GRAD, "optimizer.zero_grad(set_to_none=True)")],
    "zero_grad(set_to_none=False)": [(ZERO_GRAD, "optimizer.zero_grad(set_to_none=False)")],
    "extra loss term": [(LOSS, LOSS + " + 1e-3 * sum((p**2).sum() for p in agent.actor_mean.parameters())")],
    "state-dependent std": STATE_STD,
    "tanh-squashed Gaussian": SQUASHED,
    "tanh-squashed Gaussian under Independent": TANH_INDEPENDENT,
    "dropout in the actor": DROPOUT,
}
# edit -> (replacements, what the message must name); each must stop the run before any update
STOPPING_EDITS = {
    "first layer widened alone": (
        [(ACTOR, ACTOR.replace("Linear(obs_dim, 64)", "Linear(obs_dim, 128)"))],
        ("cannot be multiplied", "at line", "of ppo_continuous.py"),  # torch's words, where the student's Agent runs
    ),
    "action size hard-coded": (
        [(ACTOR, ACTOR.replace("Linear(64, act_dim)", "Linear(64, 2)"))],
        ("could not broadcast", "at line"),
    ),
}

OBS_DIM, ACT_DIM = 17, 6  # HalfCheetah's sizes for the in-process check; the real run is Pendulum's (3, 1)
# one iteration of 64 steps: 2 epochs x 2 minibatches = 4 Adam steps, then a checkpoint of the updated agent
LR, ADAM_STEPS = 3e-4, 4
ONE_UPDATE = [
    "--env-id",
    "Pendulum-v1",
    "--num-envs",
    1,
    "--num-steps",
    64,
    "--num-minibatches",
    2,
    "--update-epochs",
    2,
    "--total-timesteps",
    64,
    "--checkpoint-interval",
    64,
    "--learning-rate",
    LR,
    "--seed",
    1,
    "--torch-threads",
    1,
    "--no-progress",
]


def rollout_samples(script, monkeypatch, tmp_path, steps: int = 512) -> tuple:
    """main() of the copy, in-process, for one iteration on Pendulum without normalization: the observations the
    policy saw and the actions it chose (as envs.step received them), with the weights of the run's start."""
    seen, chosen = [], []
    real_step = script.gym.vector.SyncVectorEnv.step

    def recording_step(envs, actions):
        chosen.append(np.array(actions))
        out = real_step(envs, actions)
        seen.append(out[0].copy())
        return out

    real_reset = script.gym.vector.SyncVectorEnv.reset
    monkeypatch.setattr(script.gym.vector.SyncVectorEnv, "step", recording_step)
    monkeypatch.setattr(
        script.gym.vector.SyncVectorEnv,
        "reset",
        lambda envs, **kw: (lambda out: (seen.append(out[0].copy()), out)[1])(real_reset(envs, **kw)),
    )
    main_in_process(
        script,
        [
            "--env-id",
            "Pendulum-v1",
            "--num-steps",
            steps,
            "--num-minibatches",
            2,
            "--update-epochs",
            1,
            "--total-timesteps",
            steps,
            "--no-norm-obs",
            "--no-norm-reward",
            "--torch-threads",
            1,
            "--runs-dir",
            tmp_path,
            "--checkpoint-interval",
            0,
            "--no-progress",
        ],
        monkeypatch,
    )
    return np.concatenate(seen[:steps]).astype(np.float32), np.concatenate(chosen)


@pytest.mark.parametrize("edit", ["unedited, plain zero_grad()", "state-dependent std", "tanh-squashed Gaussian"])
def test_rollout_samples_the_edited_policy(edit, tmp_path, monkeypatch):
    """The actions main()'s rollout sends to the env are samples of the (edited) Agent.distribution: their mean
    log-likelihood under it matches that of fresh samples of it (-entropy), within sampling noise. A rollout that
    samples another distribution (a hand-written copy of the unedited policy) scores lower by their KL divergence."""
    script = import_copy(copy_alone(SCRIPT, tmp_path / "student", WORKING_EDITS[edit]))
    obs, actions = rollout_samples(script, monkeypatch, tmp_path / "runs")
    script.seed_everything(1, True)  # main(): seed, then Agent(obs_dim, act_dim); nothing between draws from torch
    agent = script.Agent(3, 1)
    with torch.no_grad():
        dist = agent.distribution(torch.from_numpy(obs))
        inside = np.abs(actions[:, 0]) < 2.0  # Pendulum clips to +-2; a clipped action has no density to compare
        taken = dist.log_prob(torch.from_numpy(np.clip(actions, -1.999, 1.999)))[torch.from_numpy(inside)].mean()
        fresh = torch.stack([dist.log_prob(dist.sample()) for _ in range(20)])  # (20, steps)
        fresh = fresh[(fresh.isfinite()) & (dist.sample().abs()[..., 0] < 2.0).expand(20, -1)].mean()
    assert abs(float(taken) - float(fresh)) < 0.15, (
        f"{edit}: log-likelihood of the rollout's actions {taken:.3f}, of the policy's own samples {fresh:.3f}"
    )


@pytest.mark.parametrize("edit", WORKING_EDITS)
def test_edit_keeps_training_correct(edit, tmp_path):
    """A real run of the copy: exit 0, and one update changes every parameter tensor, by no more than its Adam steps
    can move it."""
    path = copy_alone(SCRIPT, tmp_path / "student", WORKING_EDITS[edit])
    script = import_copy(path)
    proc = run_copy(path, *ONE_UPDATE, "--runs-dir", tmp_path / "runs", timeout=120)
    assert proc.returncode == 0, proc.stderr
    (checkpoint,) = (tmp_path / "runs").rglob("step_*.pt")
    trained = torch.load(checkpoint, weights_only=True, map_location="cpu")["model"]
    script.seed_everything(1, True)  # main(): seed, then Agent(obs_dim, act_dim); nothing between draws from torch
    initial = script.Agent(3, 1).state_dict()
    assert trained.keys() == initial.keys()
    # Adam moves a trained tensor by ~LR per step; the rebuilt orthogonal init may differ from the run's by ~1e-7
    # (a QR on other threads), so "changed" means by more than LR / 10, and never by more than 4 steps could move it.
    moved = {name: (trained[name] - before).abs().max().item() for name, before in initial.items()}
    unchanged = [name for name, m in moved.items() if m <= LR / 10]
    assert not unchanged, f"{edit}: unchanged by an update: {unchanged}"
    assert all(m < 10 * LR * ADAM_STEPS for m in moved.values()), f"{edit}: not this run's initial weights: {moved}"


@pytest.mark.parametrize("edit", STOPPING_EDITS)
def test_edit_that_cannot_run_stops_with_a_message(edit, tmp_path):
    edits, needles = STOPPING_EDITS[edit]
    path = copy_alone(SCRIPT, tmp_path / "student", edits)
    proc = run_copy(path, *ONE_UPDATE, "--runs-dir", tmp_path / "runs", timeout=60)
    assert_clean_error(proc, *needles)
    assert not list((tmp_path / "runs").rglob("*.pt")), "no update may run"


# The learning runs: the state-dependent std starts at std 1, as the unedited policy (started at e^-1 it explores less:
# -552 best 10 episodes by 102,400 steps, seed 1, against -117 started at 1)
LEARNING_EDITS = {
    "activation ReLU": WORKING_EDITS["activation ReLU"],
    "width 128": WORKING_EDITS["width 128"],
    "state-dependent std": state_std(0.0),
    "tanh-squashed Gaussian": SQUASHED,
}


@pytest.mark.slow
@pytest.mark.parametrize("edit", LEARNING_EDITS)
def test_edited_copy_learns_pendulum(edit, tmp_path):
    """The unedited script's Pendulum run and threshold (tests/test_ppo_continuous_learning.py): the whole budget,
    judged by the last 10 episodes. Measured (seed 1): ReLU -129.9, width 128 -160.0, state-dependent std -131.4,
    tanh-squashed Gaussian -130.5 (34-48 s each); the unedited script -130.7."""
    path = copy_alone(SCRIPT, tmp_path / "student", LEARNING_EDITS[edit])
    proc = run_copy(path, *PENDULUM_RUN, "--runs-dir", tmp_path / "runs", timeout=600)
    assert proc.returncode == 0, proc.stderr
    last10 = last10_return(tmp_path / "runs")
    print(f"{edit}: last-10 training return {last10:.1f}")
    assert last10 >= PENDULUM_THRESHOLD, f"last-10 training return {last10:.1f}"


def test_tanh_under_independent_evaluates_the_squashed_mean(tmp_path):
    """Independent(TransformedDistribution(Normal(mu, sigma), [TanhTransform()]), 1): a run with in-training and final
    evaluation ends well, and the Policy that evaluates it (tools/agent.py's too: policy_from_checkpoint) plays
    tanh(mu) of the normalized observation (torch has no mean for the transformed distribution)."""
    path = copy_alone(SCRIPT, tmp_path / "student", TANH_INDEPENDENT)
    script = import_copy(path)
    flags = ("--save-model", "--eval-interval", 64, "--eval-episodes", 1)
    proc = run_copy(path, *ONE_UPDATE, *flags, "--runs-dir", tmp_path / "runs", timeout=120)
    assert proc.returncode == 0, proc.stderr
    (final,) = (tmp_path / "runs").rglob("final_*.pt")
    ckpt = torch.load(final, weights_only=True, map_location="cpu")
    policy = script.policy_from_checkpoint(ckpt).eval()
    obs = torch.randn(16, 3, dtype=torch.float64) * 3
    with torch.no_grad():
        x = torch.clamp((obs - policy.obs_mean) / policy.obs_std, -10.0, 10.0).float()
        expected = torch.tanh(policy.agent.actor_mean(x))  # inside Pendulum's bounds (+-2): no clipping
        assert torch.allclose(policy(obs), expected, atol=1e-6), (policy(obs), expected)


def run_recorded(script, monkeypatch, tmp_path, argv: list) -> dict:
    """main() of the copy in-process on Pendulum, minibatches in rollout order (torch.randperm: the identity),
    recording: "acted", log pi(a|s) of each rollout action under the very distribution it was sampled from; "old",
    the old log-probs each ppo_losses call received; "events", in order, ("update", agent.training) per minibatch and
    ("eval", policy.training, the same action twice for one observation) per evaluation."""
    rec = {"acted": [], "old": [], "events": []}
    real_distribution, real_losses, real_evaluate = script.Agent.distribution, script.ppo_losses, script.evaluate

    def distribution(agent, x):
        dist = real_distribution(agent, x)
        if torch.is_grad_enabled():  # the update
            rec["events"].append(("update", agent.training))
        elif x.shape[0] == 1:  # the rollout (one env) or evaluation: record what the rollout samples
            real_sample = dist.sample

            def sample(*args):
                action = real_sample(*args)
                rec["acted"].append(dist.log_prob(action).clone())
                return action

            dist.sample = sample
        return dist

    def losses(new_logprob, old_logprob, *rest):
        rec["old"].append(old_logprob.detach().clone())
        return real_losses(new_logprob, old_logprob, *rest)

    def evaluate(policy, env, *args, **kwargs):
        obs = torch.as_tensor(env.reset(seed=0)[0], dtype=torch.float32).unsqueeze(0)
        with torch.no_grad():
            rec["events"].append(("eval", policy.training, torch.equal(policy(obs), policy(obs))))
        return real_evaluate(policy, env, *args, **kwargs)

    monkeypatch.setattr(script.Agent, "distribution", distribution)
    monkeypatch.setattr(script, "ppo_losses", losses)
    monkeypatch.setattr(script, "evaluate", evaluate)
    monkeypatch.setattr(torch, "randperm", lambda n, **kw: torch.arange(n, device=kw.get("device")))
    fixed = ["--env-id", "Pendulum-v1", "--torch-threads", 1, "--no-progress", "--checkpoint-interval", 0, "--no-cuda"]
    main_in_process(script, [*fixed, *argv, "--runs-dir", tmp_path], monkeypatch)
    return rec


def test_dropout_rollout_keeps_the_log_probs_of_the_policy_that_acted(tmp_path, monkeypatch):
    """With dropout in the actor, each forward pass draws another mask: the old log-probs the update's ratio divides
    by must be those of the distribution each action was sampled from, kept at sampling time. Before, main()
    recomputed them after the rollout in one batched pass, under other masks."""
    script = import_copy(copy_alone(SCRIPT, tmp_path / "student", DROPOUT))
    steps = ["--num-steps", 128, "--num-minibatches", 1, "--update-epochs", 1, "--total-timesteps", 128]
    rec = run_recorded(script, monkeypatch, tmp_path / "runs", steps)
    acted, (old,) = torch.cat(rec["acted"]), rec["old"]  # one minibatch: the whole rollout, in order
    assert acted.shape == old.shape == (128,)
    assert torch.equal(old, acted), f"{(old - acted).abs().max():.2e} from the acting policy's log-probs"


def test_dropout_evaluation_runs_in_eval_mode(tmp_path, monkeypatch):
    """With dropout in the actor, every evaluation (every --eval-interval, and the final one of --save-model) plays
    the network in eval mode, deterministic as tools/agent.py's, and the update after an evaluation trains in train
    mode again. Before, in-training evaluation played with dropout on."""
    script = import_copy(copy_alone(SCRIPT, tmp_path / "student", DROPOUT))
    steps = ["--num-steps", 64, "--num-minibatches", 2, "--update-epochs", 1, "--total-timesteps", 128]
    rec = run_recorded(
        script, monkeypatch, tmp_path / "runs", [*steps, "--eval-interval", 64, "--eval-episodes", 1, "--save-model"]
    )
    evals = [event for event in rec["events"] if event[0] == "eval"]
    assert len(evals) >= 2 and all(event == ("eval", False, True) for event in evals), evals
    first_eval = rec["events"].index(evals[0])
    updates_after = [event for event in rec["events"][first_eval:] if event[0] == "update"]
    assert updates_after and all(event == ("update", True) for event in updates_after), rec["events"]
