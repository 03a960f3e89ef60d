"""Student edits to sac_continuous.py (and a subset to sac_continuous_ray.py), each applied to a copy of the script
alone in an empty folder (tests/student_copy.py). Every edit either keeps the script correct (acting computes what
the edited Actor computes, and a short real run moves every parameter tensor) or stops the run at once with a
message naming what to change. How these checks fail on the scripts before issue 31: docs/sac_continuous.md, "Tests"."""

import numpy as np
import pytest
import torch

from tests.conftest import assert_clean_error, best_last10, reached_return
from tests.student_copy import copy_alone, import_copy, run_copy
from tests.test_sac_continuous_learning import PENDULUM_RUN

SCRIPT = "sac_continuous.py"
ACTOR = """        self.net = nn.Sequential(
            nn.Linear(obs_dim, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 2 * act_dim)
        )"""
LAST = "nn.Linear(HIDDEN, 2 * act_dim)"
CRITIC = """    return nn.Sequential(
        nn.Linear(obs_dim + act_dim, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 1)
    )"""
# SimBa / BRO-style: a LayerNorm after each hidden layer of the critic (learnable scale and shift: more parameters)
CRITIC_LAYERNORM = CRITIC.replace(
    "nn.Linear(obs_dim + act_dim, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU()",
    "nn.Linear(obs_dim + act_dim, HIDDEN), nn.LayerNorm(HIDDEN), nn.ReLU(), "
    "nn.Linear(HIDDEN, HIDDEN), nn.LayerNorm(HIDDEN), nn.ReLU()",
)
Q_ZERO_GRAD, ACTOR_ZERO_GRAD = "learner.q_optimizer.zero_grad()", "learner.actor_optimizer.zero_grad()"
LOSS = "actor_loss = (alpha * log_prob - q).mean()"


def zero_grad(form: str) -> list:
    return [
        (Q_ZERO_GRAD, f"learner.q_optimizer.zero_grad({form})"),
        (ACTOR_ZERO_GRAD, f"learner.actor_optimizer.zero_grad({form})"),
    ]


# edit -> (old, new) replacements; each must leave the script correct
WORKING_EDITS = {
    "unedited": [],
    "activation Tanh": [(ACTOR, ACTOR.replace("nn.ReLU()", "nn.Tanh()"))],
    "hidden size 64": [("HIDDEN = 256", "HIDDEN = 64")],
    "one more hidden layer": [(ACTOR, ACTOR.replace(LAST, "nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), " + LAST))],
    "LayerNorm": [
        (ACTOR, ACTOR.replace("nn.Linear(obs_dim, HIDDEN), ", "nn.Linear(obs_dim, HIDDEN), nn.LayerNorm(HIDDEN), "))
    ],
    "critic LayerNorm": [(CRITIC, CRITIC_LAYERNORM)],
    "zero_grad(set_to_none=True)": zero_grad("set_to_none=True"),
    "zero_grad(set_to_none=False)": zero_grad("set_to_none=False"),
    "extra loss term": [(LOSS, LOSS + " + 1e-3 * sum((p**2).sum() for p in learner.actor.parameters())")],
}
# edit -> (replacements, what the message must name); each must stop the run before any update
STOPPING_EDITS = {
    "first layer widened alone": (
        [(ACTOR, ACTOR.replace("nn.Linear(obs_dim, HIDDEN)", "nn.Linear(obs_dim, 128)"))],
        ("Actor", "input size"),
    ),
    "output size hard-coded": ([(ACTOR, ACTOR.replace(LAST, "nn.Linear(HIDDEN, 4)"))], ("Actor", "2 * act_dim = 2")),
    "critic without the action": (
        [(CRITIC, CRITIC.replace("obs_dim + act_dim", "obs_dim"))],
        ("q_network", "obs_dim + act_dim = 4"),
    ),
}

OBS_DIM, ACT_DIM = 17, 6  # HalfCheetah's sizes for the in-process check; the real run is Pendulum's (3, 1)
LRS = {"actor": 3e-4, "qf": 1e-3, "qf_target": 1e-3}  # --policy-lr, --q-lr (the targets follow the critics)
# 200 steps, updates from step 100 on: 101 gradient steps and 100 actor updates, then a checkpoint at step 200
STEPS = 101
SHORT_RUN = [
    "--env-id",
    "Pendulum-v1",
    "--total-timesteps",
    200,
    "--learning-starts",
    100,
    "--batch-size",
    32,
    "--checkpoint-interval",
    200,
    "--seed",
    1,
    "--torch-threads",
    1,
    "--no-progress",
]


def trained_like(actor: torch.nn.Module) -> None:
    """Weights as after some training: non-zero biases, a non-tiny output layer (seeded)."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in actor.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=generator))


def expected_actions(module, actor, obs: np.ndarray, noise, scale: torch.Tensor, bias: torch.Tensor) -> np.ndarray:
    """The training path's math: the edited Actor module, then squashed_gaussian (noise None: the mean, noise 0)."""
    with torch.no_grad():
        mean, log_std = actor(torch.from_numpy(obs).float())
        noise = torch.zeros_like(mean) if noise is None else noise
        return module.squashed_gaussian(mean, log_std, noise, scale, bias)[0].numpy()


def check_acting(module, obs_dim: int, act_dim: int) -> None:
    """Acting (the rollout's Policy.act, and the evaluated Policy) matches the edited Actor within 1e-5 on 64
    fixed observations, with noise and without."""
    torch.manual_seed(0)
    actor = module.Actor(obs_dim, act_dim)
    trained_like(actor)
    obs = np.random.default_rng(1).normal(size=(64, obs_dim)) * 3  # float64, as MuJoCo returns them
    noise = torch.randn(64, act_dim, generator=torch.Generator().manual_seed(2))
    scale, bias = torch.full((act_dim,), 2.0), torch.linspace(-0.5, 0.5, act_dim)
    acting = module.Policy(actor, bias - scale, bias + scale).act(obs, noise)
    np.testing.assert_allclose(acting, expected_actions(module, actor, obs, noise, scale, bias), rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        evaluated = module.Policy(actor, bias - scale, bias + scale)(torch.from_numpy(obs)).numpy()
    np.testing.assert_allclose(evaluated, expected_actions(module, actor, obs, None, scale, bias), rtol=1e-5, atol=1e-5)


def initial_learner(module, obs_dim: int, act_dim: int, low: float, high: float, seed: int = 1):
    """The learner main() starts from: seeded, then Learner (nothing between draws from torch's RNG)."""
    module.seed_everything(seed, True)
    bounds = np.full(act_dim, low, np.float32), np.full(act_dim, high, np.float32)
    return module.Learner(obs_dim, act_dim, *bounds, module.Args(), torch.device("cpu"))


def assert_every_tensor_moved(edit: str, trained: dict, initial, steps: int) -> None:
    """Every parameter tensor of the three networks changed, by no more than `steps` Adam steps can move it."""
    for network, lr in LRS.items():
        before = getattr(initial, network).state_dict()
        assert trained[network].keys() == before.keys(), network
        for name, value in before.items():
            moved = (trained[network][name] - value).abs().max().item()
            assert moved > 0, f"{edit}: {network}.{name} did not change in {steps} gradient steps"
            assert moved < 3 * lr * steps, f"{edit}: {network}.{name} moved {moved:.3g}: not this run's initial weights"
    assert not torch.equal(trained["log_alpha"], initial.log_alpha.detach()), f"{edit}: the temperature did not move"


@pytest.mark.parametrize("edit", WORKING_EDITS)
def test_edit_keeps_acting_and_training_correct(edit, tmp_path):
    path = copy_alone(SCRIPT, tmp_path / "student", WORKING_EDITS[edit])
    script = import_copy(path)
    check_acting(script, OBS_DIM, ACT_DIM)  # (1) acting computes the edited Actor

    # (2) a real run: its gradient steps change every parameter tensor of the actor, the critics and their targets
    proc = run_copy(path, *SHORT_RUN, "--runs-dir", tmp_path / "runs", timeout=180)
    assert proc.returncode == 0, proc.stderr
    (checkpoint,) = (tmp_path / "runs").rglob("step_*.pt")
    ckpt = torch.load(checkpoint, weights_only=True, map_location="cpu")
    assert ckpt["run_state"]["grad_steps"] == STEPS and ckpt["run_state"]["actor_updates"] == STEPS - 1
    assert_every_tensor_moved(edit, ckpt["learner"], initial_learner(script, 3, 1, -2.0, 2.0), STEPS)


@pytest.mark.parametrize("edit", STOPPING_EDITS)
def test_edit_that_cannot_run_stops_with_a_message(edit, tmp_path):
    edits, needles = STOPPING_EDITS[edit]
    path = copy_alone(SCRIPT, tmp_path / "student", edits)
    proc = run_copy(path, *SHORT_RUN, "--runs-dir", tmp_path / "runs", timeout=60)
    assert_clean_error(proc, *needles)
    assert not list((tmp_path / "runs").rglob("*.pt")), "no update may run"


RAY_EDITS = [
    "unedited",
    "activation Tanh",
    "LayerNorm",
    "critic LayerNorm",
    "zero_grad(set_to_none=True)",
    "zero_grad(set_to_none=False)",
]


@pytest.mark.parametrize("edit", RAY_EDITS)
def test_edit_keeps_the_ray_copy_acting_and_training_correct(edit, tmp_path):
    """sac_continuous_ray.py, in-process (no Ray): a rollout worker acts through its own Actor on the weights it
    pulled, as the edited learner's Actor computes; the shared gradient_step moves every parameter tensor."""
    path = copy_alone("sac_continuous_ray.py", tmp_path / "student", WORKING_EDITS[edit])
    script = import_copy(path)
    check_acting(script, OBS_DIM, ACT_DIM)
    learner = initial_learner(script, 3, 1, -2.0, 2.0)
    trained_like(learner.actor)
    server = script.ParameterServer()
    server.publish(script.actor_weights(learner.actor), 0)
    worker = script.RolloutWorker(0, "Pendulum-v1", 1, 7, server)
    batch, stats = worker.collect(16, 0, True)
    noise = torch.from_numpy(np.random.default_rng([7, 1]).standard_normal((16, 1)))  # the worker's generator
    expected = expected_actions(script, learner.actor, batch["obs"], noise.float(), worker.policy.scale, worker.policy.bias)
    np.testing.assert_allclose(batch["actions"], expected, rtol=1e-5, atol=1e-5)

    learner, initial = initial_learner(script, 3, 1, -2.0, 2.0), initial_learner(script, 3, 1, -2.0, 2.0)
    shard = script.BufferShard(64, 3, 1, seed=0)
    shard.add(batch)
    for step in range(1, 5):
        script.gradient_step(learner, shard.sample(16), step, script.Args())
    trained = {network: getattr(learner, network).state_dict() for network in LRS} | {"log_alpha": learner.log_alpha}
    assert_every_tensor_moved(edit, trained, initial, 4)


def test_critic_layernorm_trains_and_each_critic_is_called_on_its_own(tmp_path):
    """The LayerNorm critic edit, in-process on the copy: a few gradient steps train the LayerNorm's own scale and shift
    (critics and targets), and the critic values every loss reads (q_values) are the two edited q_network instances
    called one by one."""
    script = import_copy(copy_alone(SCRIPT, tmp_path / "student", WORKING_EDITS["critic LayerNorm"]))
    learner, initial = (initial_learner(script, OBS_DIM, ACT_DIM, -1.0, 1.0) for _ in range(2))
    assert sum(isinstance(m, torch.nn.LayerNorm) for m in learner.qf.modules()) == 4  # 2 per critic
    g = torch.Generator().manual_seed(3)
    for step in range(1, 5):
        batch = {
            "obs": torch.randn(32, OBS_DIM, generator=g),
            "next_obs": torch.randn(32, OBS_DIM, generator=g),
            "actions": torch.rand(32, ACT_DIM, generator=g) * 2 - 1,
            "rewards": torch.randn(32, generator=g),
            "terminated": torch.zeros(32),
        }
        script.gradient_step(learner, batch, step, script.Args())
    trained = {network: getattr(learner, network).state_dict() for network in LRS} | {"log_alpha": learner.log_alpha}
    assert_every_tensor_moved("critic LayerNorm", trained, initial, 4)  # the LayerNorms' weights and biases too
    obs, actions = torch.randn(64, OBS_DIM, generator=g), torch.rand(64, ACT_DIM, generator=g) * 2 - 1
    with torch.no_grad():
        for critics in (learner.qf, learner.qf_target):
            one_by_one = torch.stack([critic(torch.cat([obs, actions], -1)).squeeze(-1) for critic in critics])
            torch.testing.assert_close(script.q_values(critics, obs, actions), one_by_one, rtol=0, atol=0)


@pytest.mark.slow
@pytest.mark.parametrize("edit", ["activation Tanh", "hidden size 64", "critic LayerNorm"])
def test_edited_copy_learns_pendulum(edit, tmp_path):
    """The unedited script's Pendulum recipe and threshold (tests/test_sac_continuous_learning.py)."""
    path = copy_alone(SCRIPT, tmp_path / "student", WORKING_EDITS[edit])
    proc = run_copy(
        path, *PENDULUM_RUN, "--runs-dir", tmp_path / "runs", timeout=600, stop_when=reached_return(tmp_path / "runs", -300)
    )
    assert proc.returncode == 0, proc.stderr
    assert best_last10(tmp_path / "runs") >= -300
