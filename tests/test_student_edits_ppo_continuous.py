"""Student edits to ppo_continuous.py, each applied to a copy of the script alone in an empty folder
(tests/student_copy.py). Every edit either keeps the script correct (the rollout's acting path computes what the
edited actor_mean computes, and one real update moves every parameter tensor) or stops the run at once with a
message naming what to change. What they found in the earlier build: docs/ppo_continuous.md, "Editing the script"."""

import numpy as np
import pytest
import torch

from tests.conftest import assert_clean_error, best_last10, reached_return
from tests.student_copy import copy_alone, import_copy, run_copy
from tests.test_ppo_continuous_learning import PENDULUM_RUN

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
FALLBACK = "acting: through the torch module"

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
}
# the edits the mirror cannot compute: the run must say so, once, and act through the module
FALLS_BACK = {"LayerNorm": "(the numpy mirror does not know LayerNorm)"}
# edit -> (replacements, what the message must name); each must stop the run before any update
STOPPING_EDITS = {
    "first layer widened alone": ([(ACTOR, ACTOR.replace("Linear(obs_dim, 64)", "Linear(obs_dim, 128)"))],
                                  ("actor_mean", "input size")),  # fmt: skip
    "action size hard-coded": ([(ACTOR, ACTOR.replace("Linear(64, act_dim)", "Linear(64, 2)"))],
                               ("actor_mean", "act_dim")),  # fmt: skip
}

OBS_DIM, ACT_DIM = 17, 6  # HalfCheetah's sizes for the in-process check; the real run is Pendulum's (3, 1)
# one iteration of 64 steps: 2 epochs x 2 minibatches = 4 Adam steps, then a checkpoint of the updated agent
LR, ADAM_STEPS = 3e-4, 4
ONE_UPDATE = ["--env-id", "Pendulum-v1", "--num-envs", 1, "--num-steps", 64, "--num-minibatches", 2,
              "--update-epochs", 2, "--total-timesteps", 64, "--checkpoint-interval", 64, "--learning-rate", LR,
              "--seed", 1, "--torch-threads", 1, "--no-progress"]  # fmt: skip


def acting_function(module, actor, obs_dim: int, act_dim: int):
    """What main() calls: once at set-up (the check), then once per rollout with the current weights."""
    return module.acting_path(actor, obs_dim, act_dim)


@pytest.mark.parametrize("edit", WORKING_EDITS)
def test_edit_keeps_acting_and_training_correct(edit, tmp_path, capsys):
    path = copy_alone(SCRIPT, tmp_path / "student", WORKING_EDITS[edit])
    script = import_copy(path)

    # (1) the acting path computes the edited actor_mean, within 1e-5, on 64 fixed observations
    torch.manual_seed(0)
    agent = script.Agent(OBS_DIM, ACT_DIM)
    acting = acting_function(script, agent.actor_mean, OBS_DIM, ACT_DIM)
    printed = capsys.readouterr().out
    with torch.no_grad():  # weights as after some training: non-zero biases, a non-tiny output layer
        for p in agent.parameters():
            p.add_(0.3 * torch.randn_like(p))
    obs = np.random.default_rng(1).normal(size=(64, OBS_DIM)).astype(np.float32) * 3
    with torch.no_grad():
        expected = agent.actor_mean(torch.from_numpy(obs)).numpy()
    np.testing.assert_allclose(acting(agent.actor_mean)(obs), expected, rtol=1e-5, atol=1e-5)
    assert printed.count(FALLBACK) == (1 if edit in FALLS_BACK else 0), printed

    # (2) a real run: one update changes every parameter tensor, by no more than its Adam steps can move it
    proc = run_copy(path, *ONE_UPDATE, "--runs-dir", tmp_path / "runs", timeout=120)
    assert proc.returncode == 0, proc.stderr
    fallback_lines = [line for line in proc.stdout.splitlines() if line.startswith(FALLBACK)]
    assert fallback_lines == ([f"{FALLBACK} {FALLS_BACK[edit]}"] if edit in FALLS_BACK else []), proc.stdout
    (checkpoint,) = (tmp_path / "runs").rglob("step_*.pt")
    trained = torch.load(checkpoint, weights_only=True)["model"]
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


@pytest.mark.slow
@pytest.mark.parametrize("edit", ["activation ReLU", "width 128"])
def test_edited_copy_learns_pendulum(edit, tmp_path):
    """The unedited script's Pendulum run and threshold (tests/test_ppo_continuous_learning.py). Measured (seed 1):
    -300 reached at 50,400 steps (ReLU) and 65,600 (width 128), the unedited copy at 59,200."""
    path = copy_alone(SCRIPT, tmp_path / "student", WORKING_EDITS[edit])
    proc = run_copy(path, *PENDULUM_RUN, "--runs-dir", tmp_path / "runs", timeout=600,
                    stop_when=reached_return(tmp_path / "runs", -300))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert best_last10(tmp_path / "runs") >= -300
