"""Student edits to ppo_atari.py and a2c_atari.py, each applied to a copy of the script alone in an empty folder
(tests/student_copy.py). Every edit either keeps the script correct (the network as main() sets it up, in channels-last
memory, computes what the edited plain module computes, and one real update moves every parameter tensor) or stops
the run at once with a message naming what to change."""

import pytest
import torch

from tests.conftest import assert_clean_error, run_script
from tests.student_copy import copy_alone, import_copy, run_copy

pytest.importorskip("ale_py")

TRUNK = """        self.network = nn.Sequential(
            layer_init(nn.Conv2d(4, 32, 8, stride=4)),
            nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)),
            nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)),
            nn.ReLU(),
            nn.Flatten(),
            layer_init(nn.Linear(64 * 7 * 7, 512)),
            nn.ReLU(),
        )
"""
FIRST_CONV = "            layer_init(nn.Conv2d(4, 32, 8, stride=4)),\n"
AGENT = "class Agent(nn.Module):\n"
# a trunk that subclasses nn.Sequential with a forward of its own: it adds a learned offset (0.5 at the start)
SEQUENTIAL_SUBCLASS = """class Trunk(nn.Sequential):
    def __init__(self, *layers):
        super().__init__(*layers)
        self.offset = nn.Parameter(torch.full((512,), 0.5))

    def forward(self, x):
        return super().forward(x) + self.offset


"""
# a trunk that is not a Sequential; a view() to flatten needs contiguous memory (channels-last is not)
CUSTOM_TRUNK = """class Trunk(nn.Module):
    def __init__(self):
        super().__init__()
        self.convs = nn.ModuleList([layer_init(nn.Conv2d(4, 32, 8, stride=4)), layer_init(nn.Conv2d(32, 64, 4, stride=2)),
                                    layer_init(nn.Conv2d(64, 64, 3, stride=1))])
        self.hidden = layer_init(nn.Linear(64 * 7 * 7, 512))

    def forward(self, x):
        for conv in self.convs:
            x = torch.relu(conv(x))
        return torch.relu(self.hidden(FLATTEN))


"""
LOSS = "loss = pg_loss - args.ent_coef * entropy + args.vf_coef * v_loss"
ZERO_GRAD = "optimizer.zero_grad()"


def trunk_class(source: str, flatten: str) -> list:
    return [(AGENT, source.replace("FLATTEN", flatten) + AGENT), (TRUNK, "        self.network = Trunk()\n")]


# edit -> (old, new) replacements; each must leave the script correct
WORKING_EDITS = {
    "unedited": [],
    "activation Tanh": [(TRUNK, TRUNK.replace("nn.ReLU()", "nn.Tanh()"))],
    "channels 32 -> 16": [(TRUNK, TRUNK.replace("Conv2d(4, 32", "Conv2d(4, 16").replace("Conv2d(32, 64", "Conv2d(16, 64"))],
    "Sequential subclass with its own forward": [
        (AGENT, SEQUENTIAL_SUBCLASS + AGENT),
        (TRUNK, TRUNK.replace("nn.Sequential(", "Trunk(")),
    ],
    "custom module trunk": trunk_class(CUSTOM_TRUNK, "torch.flatten(x, 1)"),
    "BatchNorm2d": [(TRUNK, TRUNK.replace(FIRST_CONV, FIRST_CONV + "            nn.BatchNorm2d(32),\n"))],
    "zero_grad(set_to_none=False)": [(ZERO_GRAD, "optimizer.zero_grad(set_to_none=False)")],
    "extra loss term": [(LOSS, LOSS + " + 1e-4 * sum((p**2).sum() for p in agent.network.parameters())")],
}
# The same function on channels-last memory, within 1e-5 of the output's scale; in training mode BatchNorm2d sums its
# batch statistics in another order there (float32 rounding, measured ~5e-5 of the scale).
RTOL = {"BatchNorm2d": 2e-4}
# Both scripts share the network and its set-up (shared blocks): the trunk edits run on ppo_atari.py; what the
# algorithm sections differ in (Adam or RMSpropTF, the loop around zero_grad and the loss) runs on both.
A2C_EDITS = ("unedited", "Sequential subclass with its own forward", "zero_grad(set_to_none=False)", "extra loss term")
CASES = [("ppo_atari.py", edit) for edit in WORKING_EDITS] + [("a2c_atari.py", edit) for edit in A2C_EDITS]
SLOW = {"activation Tanh", "BatchNorm2d"}  # a run each (~10 s), paths the rest also take

OBS_SHAPE, NUM_ACTIONS = (4, 84, 84), 4  # Breakout
# One update and a checkpoint of the updated agent: PPO 16 steps in 2 minibatches (2 Adam steps), A2C 5 steps (1 step)
ONE_UPDATE = {
    "ppo_atari.py": (["--num-steps", 16, "--num-minibatches", 2, "--update-epochs", 1, "--learning-rate", 2.5e-4], 2, 2.5e-4),
    "a2c_atari.py": (["--num-steps", 5, "--log-interval", 1, "--learning-rate", 7e-4], 1, 7e-4),
}
COMMON = ["--env-id", "BreakoutNoFrameskip-v4", "--num-envs", 1, "--seed", 1, "--torch-threads", 1, "--no-progress"]


def one_update(script: str) -> list:
    args, _, _ = ONE_UPDATE[script]
    steps = args[args.index("--num-steps") + 1]
    return [*COMMON, *args, "--total-timesteps", steps, "--checkpoint-interval", steps]


SET_UP = "Agent(num_actions).to(device, memory_format=torch.channels_last)"  # main()'s line that makes the network


def set_up_as_main_does(script, path) -> torch.nn.Module:
    """The Agent as main() makes it (its line checked in the copy): channels-last memory; the run computes with it."""
    assert SET_UP in path.read_text()
    return script.Agent(NUM_ACTIONS).to(memory_format=torch.channels_last)


def close_to_scale(got: torch.Tensor, expected: torch.Tensor, rtol: float) -> bool:
    return (got - expected).abs().max().item() <= rtol * expected.abs().max().item()


@pytest.mark.parametrize("script, edit", [pytest.param(*case, marks=[pytest.mark.slow] * (case[1] in SLOW)) for case in CASES])
def test_edit_keeps_acting_and_training_correct(script, edit, tmp_path):
    path = copy_alone(script, tmp_path / "student", WORKING_EDITS[edit])
    student = import_copy(path)

    # (1) the network as the run sets it up computes the edited plain module, within 1e-5 of the output's scale
    torch.manual_seed(0)
    agent = set_up_as_main_does(student, path)
    with torch.no_grad():  # weights as after some training: non-zero biases, logits far from 0
        for p in agent.parameters():
            p.mul_(1 + 0.2 * torch.randn_like(p)).add_(0.01 * torch.randn_like(p))
    plain = student.Agent(NUM_ACTIONS)
    plain.load_state_dict(agent.state_dict())
    frames = torch.randint(0, 256, (64, *OBS_SHAPE), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for name, got, expected in zip(("logits", "value"), agent(frames), plain(frames)):
            assert got.dtype == torch.float32 and close_to_scale(got, expected, RTOL.get(edit, 1e-5)), f"{edit}: {name}"
    # ...and the Policy that evaluation plays acts with it: the most likely action of the same logits
    with torch.no_grad():
        assert torch.equal(student.Policy(agent)(frames), plain(frames)[0].argmax(-1)), edit

    # (2) a real run: one update changes every parameter tensor, by no more than its optimizer steps can move it
    _, optimizer_steps, lr = ONE_UPDATE[script]
    proc = run_copy(path, *one_update(script), "--runs-dir", tmp_path / "runs", timeout=120)
    assert proc.returncode == 0, proc.stderr
    (checkpoint,) = (tmp_path / "runs").rglob("step_*.pt")
    trained = torch.load(checkpoint, weights_only=True, map_location="cpu")["model"]
    student.seed_everything(1, True)  # main(): seed, then Agent(num_actions); nothing between draws from torch
    initial = student.Agent(NUM_ACTIONS)
    assert trained.keys() == initial.state_dict().keys()
    for name, before in initial.named_parameters():
        moved = (trained[name] - before.detach()).abs().max().item()
        assert moved > 0, f"{edit}: {name} did not change in an update"
        assert moved < 10 * lr * optimizer_steps, f"{edit}: {name} moved {moved:.3g}: not this run's initial weights"


@pytest.mark.parametrize("script", ["ppo_atari.py", "a2c_atari.py"])
def test_the_unedited_zero_grad_sets_the_gradients_to_none(script, tmp_path):
    """So the unedited runs above cover zero_grad(set_to_none=True), and the edit above set_to_none=False: main()'s
    own call, as written (no argument), after a step of main()'s optimizer (Adam in PPO, RMSpropTF in A2C), leaves
    no gradient tensor behind (None, not zeros)."""
    path = copy_alone(script, tmp_path / "student", [])
    student = import_copy(path)
    assert path.read_text().count(f"{ZERO_GRAD}\n") == 1  # main()'s call, without arguments
    agent = student.Agent(NUM_ACTIONS)
    optimizer = (
        torch.optim.Adam(agent.parameters(), lr=2.5e-4, eps=1e-5)
        if script == "ppo_atari.py"
        else (student.RMSpropTF(agent.parameters(), lr=7e-4, alpha=0.99, eps=1e-5))
    )
    _, logprob, _, value = agent.get_action_and_value(torch.randint(0, 256, (8, *OBS_SHAPE), dtype=torch.uint8))
    (logprob.sum() + value.sum()).backward()
    optimizer.step()
    assert all(p.grad is not None for p in agent.parameters())
    optimizer.zero_grad()
    assert all(p.grad is None for p in agent.parameters())


@pytest.mark.parametrize("script", ["ppo_atari.py", "a2c_atari.py"])
def test_channels_that_no_longer_fit_the_linear_stop_with_a_message(script, tmp_path):
    """The last convolution's channels 64 -> 32 without the Linear's input: the first rollout step stops the run with
    torch's sizes and the line of the script that ran the network (run_cli), before any update."""
    edits = [(TRUNK, TRUNK.replace("Conv2d(64, 64, 3", "Conv2d(64, 32, 3"))]
    path = copy_alone(script, tmp_path / "student", edits)
    proc = run_copy(path, *one_update(script), "--runs-dir", tmp_path / "runs", timeout=60)
    assert_clean_error(proc, "shapes cannot be multiplied", "(1x1568 and 3136x512)", "RuntimeError at line")
    assert not list((tmp_path / "runs").rglob("*.pt")), "no update may run"


def test_a_trunk_that_flattens_with_view_stops_with_a_message(tmp_path):
    """A custom trunk that flattens with .view(): its input is the convolutions' channels-last output, which .view()
    cannot flatten; the run stops at its first step, naming the trunk's line and (torch) what to write instead."""
    path = copy_alone("ppo_atari.py", tmp_path / "student", trunk_class(CUSTOM_TRUNK, "x.view(x.shape[0], -1)"))
    proc = run_copy(path, *one_update("ppo_atari.py"), "--runs-dir", tmp_path / "runs", timeout=60)
    assert_clean_error(proc, "view size is not compatible", "Use .reshape(...) instead", "x.view(x.shape[0], -1)")
    assert not list((tmp_path / "runs").rglob("*.pt")), "no update may run"


@pytest.mark.slow
def test_a_checkpoint_of_other_shapes_stops_with_a_message(tmp_path):
    """A checkpoint of the unedited script, resumed or evaluated by a copy whose first convolution has 16 channels."""
    original = copy_alone("a2c_atari.py", tmp_path / "original", [])
    assert run_copy(original, *one_update("a2c_atari.py"), "--runs-dir", tmp_path / "runs", timeout=120).returncode == 0
    (checkpoint,) = (tmp_path / "runs").rglob("step_*.pt")
    edits = [(TRUNK, TRUNK.replace("Conv2d(4, 32", "Conv2d(4, 16").replace("Conv2d(32, 64", "Conv2d(16, 64"))]
    edited = copy_alone("a2c_atari.py", tmp_path / "student", edits)
    # --total-timesteps: a resume keeps the finished run's, which leaves nothing to do (told before the shapes are met)
    proc = run_copy(edited, "--resume", checkpoint, "--total-timesteps", 10, "--torch-threads", 1, "--no-progress", timeout=60)
    assert_clean_error(proc, "does not fit this script's model (size mismatch for network.", "torch.Size([64, 16, 4, 4])")
    proc = run_script("tools/agent.py", "eval", checkpoint, "--script", edited, timeout=120)
    assert_clean_error(proc, "does not fit a2c_atari.py as it is now")
