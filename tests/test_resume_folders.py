"""Nothing a user saved is ever overwritten by a resume or a signal. The shared plumbing is the same text in every
script (test_shared_blocks.py): it is tested here through ppo_continuous.py, on Pendulum runs of a few iterations.

- A resume continues in its checkpoint's run folder only when nothing of that run came after it; from an older
  checkpoint (later ones exist), from a file outside a run folder, or from a folder this user cannot write, it starts a
  new run folder under --runs-dir and says so: every file already saved stays byte for byte.
- --keep-best never replaces a better best.pt, whichever checkpoint a resume starts from.
- A SIGTERM or a second Ctrl-C during the final save leaves a complete checkpoint and no temporary file."""

import hashlib
import os
import shutil
import signal
from pathlib import Path

import pytest
import torch

import ppo_continuous as ppo
from tests.conftest import assert_clean_error, only_run_dir, run_script, scalars
from tests.student_copy import copy_alone, main_in_process, run_copy

SCRIPT = "ppo_continuous.py"
SMALL = [
    "--env-id",
    "Pendulum-v1",
    "--num-envs",
    "1",
    "--num-steps",
    "64",
    "--num-minibatches",
    "2",
    "--update-epochs",
    "1",
    "--torch-threads",
    "1",
    "--no-progress",
]


def contents(folder: Path) -> dict:
    """Every file under folder and a hash of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A run of 4 iterations with a checkpoint after each (64 steps): step_64 ... step_256, and --keep-best."""
    runs = tmp_path_factory.mktemp("runs")
    proc = run_script(
        SCRIPT,
        *SMALL,
        "--total-timesteps",
        "256",
        "--checkpoint-interval",
        "64",
        "--keep-checkpoints",
        "10",
        "--keep-best",
        "--runs-dir",
        runs,
    )
    assert proc.returncode == 0, proc.stderr
    return only_run_dir(runs)


def test_resuming_an_older_checkpoint_starts_a_new_folder_and_leaves_the_run_as_it_was(finished_run, tmp_path):
    run = tmp_path / "runs" / finished_run.name
    shutil.copytree(finished_run, run)
    before = contents(run)
    proc = run_script(
        SCRIPT,
        "--resume",
        run / "checkpoints" / "step_0000000128.pt",
        "--total-timesteps",
        "320",
        "--checkpoint-interval",
        "64",
        "--keep-checkpoints",
        "1",
        "--torch-threads",
        "1",
        "--no-progress",
        "--runs-dir",
        tmp_path / "runs",
    )
    assert proc.returncode == 0, proc.stderr
    assert "saved later in its folder (step_0000000192.pt, step_0000000256.pt" in proc.stdout
    assert contents(run) == before  # nothing pruned, replaced or appended: not even the TensorBoard events
    branch = tmp_path / "runs" / f"{finished_run.name}-2"
    assert sorted(p.name for p in (branch / "checkpoints").glob("step_*.pt")) == ["step_0000000320.pt"]
    assert set(scalars(branch, "losses/value_loss")) == {192, 256, 320}  # the new part only, from step 128 on
    assert (branch / "args.json").is_file()


def test_a_checkpoint_outside_a_run_folder_resumes_into_a_new_one_under_runs_dir(finished_run, tmp_path):
    downloads = tmp_path / "Downloads"
    downloads.mkdir()
    shutil.copy(finished_run / "checkpoints" / "step_0000000256.pt", downloads / "x.pt")
    proc = run_script(
        SCRIPT,
        "--resume",
        downloads / "x.pt",
        "--total-timesteps",
        "320",
        "--torch-threads",
        "1",
        "--no-progress",
        "--runs-dir",
        tmp_path / "runs",
    )
    assert proc.returncode == 0, proc.stderr
    assert "is not in a run folder" in proc.stdout and str(tmp_path / "runs") in proc.stdout
    assert sorted(p.name for p in downloads.iterdir()) == ["x.pt"]  # nothing written or pruned beside it
    assert only_run_dir(tmp_path / "runs").name == finished_run.name


def test_a_resume_never_takes_its_runs_dir_from_the_checkpoint(finished_run, tmp_path):
    """A checkpoint shared by a colleague names their --runs-dir: without --runs-dir, the new run folder goes under this
    user's default (./runs), and nothing is made where the checkpoint's runs_dir points."""
    (tmp_path / "work").mkdir()
    shutil.copy(finished_run / "checkpoints" / "step_0000000256.pt", tmp_path / "x.pt")
    before = sorted(finished_run.parent.iterdir())
    proc = run_script(
        SCRIPT, "--resume", tmp_path / "x.pt", "--total-timesteps", "320", "--no-progress", cwd=tmp_path / "work"
    )
    assert proc.returncode == 0, proc.stderr
    assert sorted(finished_run.parent.iterdir()) == before
    assert only_run_dir(tmp_path / "work" / "runs").name == finished_run.name


def test_the_newest_checkpoint_of_a_writable_run_folder_continues_in_it(finished_run, tmp_path):
    run = tmp_path / "runs" / finished_run.name
    shutil.copytree(finished_run, run)
    args = ppo.Args(resume=str(run / "checkpoints" / "step_0000000256.pt"), runs_dir=str(tmp_path / "runs"))
    ckpt = ppo.load_checkpoint(args.resume)
    assert ppo.resume_folder(args, ckpt) == run.resolve()


def test_the_printed_resume_command_finishes_the_run_as_it_was_started(finished_run, tmp_path):
    """`--resume X` alone (what Ctrl-C prints) keeps the run's --total-timesteps, --checkpoint-interval and --keep-best:
    before, a flag a resume may change but left out took the script's default (a 256-step run resumed to 1,000,000)."""
    run = tmp_path / "runs" / finished_run.name
    shutil.copytree(finished_run, run)
    proc = run_script(
        SCRIPT, "--resume", run / "checkpoints" / "step_0000000128.pt", "--runs-dir", tmp_path / "runs", timeout=90
    )
    assert proc.returncode == 0, proc.stderr
    branch = tmp_path / "runs" / f"{finished_run.name}-2"  # an older checkpoint: a new folder
    assert max(scalars(branch, "losses/value_loss")) == 256
    assert sorted(p.name for p in (branch / "checkpoints").glob("*.pt")) == [
        "best.pt",
        "step_0000000192.pt",
        "step_0000000256.pt",
    ]


def test_a_run_folder_this_user_cannot_write_gets_a_new_folder(finished_run, tmp_path, monkeypatch, capsys):
    """Checked through os.access (what the script asks), so that it holds as root too, where chmod stops nothing."""
    run = tmp_path / "runs" / finished_run.name
    shutil.copytree(finished_run, run)
    args = ppo.Args(resume=str(run / "checkpoints" / "step_0000000256.pt"), runs_dir=str(tmp_path / "runs"))
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p).resolve() == run.resolve() else real(p, mode))
    assert ppo.resume_folder(args, ppo.load_checkpoint(args.resume)) is None
    assert "cannot write" in capsys.readouterr().out


def test_keep_best_never_replaces_a_better_best_pt_from_an_older_checkpoint(finished_run, tmp_path):
    """An evaluation after the last checkpoint kept a better agent (best.pt: 100), then the run died. Resuming that
    checkpoint (best score lower) must not let a worse agent replace best.pt."""
    run = tmp_path / "runs" / finished_run.name
    shutil.copytree(finished_run, run)
    best = run / "checkpoints" / "best.pt"
    state = torch.load(best, weights_only=True)
    state["run_state"]["best_score"] = 100.0
    torch.save(state, best)
    before = best.read_bytes()
    proc = run_script(
        SCRIPT,
        "--resume",
        run / "checkpoints" / "step_0000000256.pt",
        "--total-timesteps",
        "448",
        "--checkpoint-interval",
        "64",
        "--keep-best",
        "--torch-threads",
        "1",
        "--no-progress",
    )
    assert proc.returncode == 0, proc.stderr
    assert best.read_bytes() == before
    assert torch.load(run / "checkpoints" / "step_0000000448.pt", weights_only=True)["run_state"]["best_score"] == 100.0


@pytest.mark.parametrize("kind", ["final", "interrupted"])
def test_a_signal_during_the_final_save_leaves_a_complete_checkpoint_and_no_temporary_file(kind, tmp_path, monkeypatch):
    """The signal is sent from inside torch.save, while the checkpoint is being written: SIGTERM (Slurm's second
    one) during --save-model's final save; a second Ctrl-C during the save that the first one asked for."""
    real_save, sent = torch.save, []

    def save_and_signal(state, f, *a, **k):
        if kind == "interrupted" and not sent:  # the first Ctrl-C, during the periodic save: the run stops after it
            sent.append(os.kill(os.getpid(), signal.SIGINT))
        elif Path(getattr(f, "name", "")).name.startswith(f".{kind}_"):  # the final save
            sent.append(os.kill(os.getpid(), signal.SIGTERM if kind == "final" else signal.SIGINT))
        return real_save(state, f, *a, **k)

    monkeypatch.setattr(torch, "save", save_and_signal)
    flags = [*SMALL, "--total-timesteps", "6400", "--checkpoint-interval", "128", "--runs-dir", tmp_path]
    if kind == "final":
        main_in_process(
            ppo,
            [
                *flags[:-4],
                "--total-timesteps",
                "128",
                "--save-model",
                "--eval-episodes",
                "1",
                "--checkpoint-interval",
                "0",
                "--runs-dir",
                tmp_path,
            ],
            monkeypatch,
        )
    else:
        try:
            main_in_process(ppo, flags, monkeypatch)
        except KeyboardInterrupt:  # caught here: left to pytest, it would end the whole session
            pytest.fail("the second Ctrl-C interrupted the save of the interrupted checkpoint")
        except SystemExit as stop:
            assert stop.code == 130
    ckpts = only_run_dir(tmp_path) / "checkpoints"
    assert len(sent) == (1 if kind == "final" else 2)
    (saved,) = ckpts.glob(f"{kind}_*.pt")
    assert torch.load(saved, weights_only=True)["global_step"] == 128  # complete: it loads
    assert sorted(p.name for p in ckpts.iterdir() if p.name.startswith(".")) == []  # no temporary file left


def test_exp_name_cannot_leave_runs_dir(tmp_path):
    for name in ("../escaped", "..", "a/b"):
        proc = run_script(SCRIPT, *SMALL, "--exp-name", name, "--runs-dir", tmp_path / "runs", timeout=120)
        assert proc.returncode == 2 and "--exp-name" in proc.stderr and "plain name" in proc.stderr, proc.stderr
    assert not (tmp_path / "runs").exists() and sorted(p.name for p in tmp_path.iterdir()) == []


NARROWER = [
    (
        "layer_init(nn.Linear(64, 64)),\n            nn.Tanh(),\n            layer_init(nn.Linear(64, 1), std=1.0)",
        "layer_init(nn.Linear(64, 32)),\n            nn.Tanh(),\n            layer_init(nn.Linear(32, 1), std=1.0)",
    )
]


def test_a_checkpoint_an_edited_script_no_longer_fits_is_refused_and_leaves_nothing_behind(finished_run, tmp_path):
    """A student narrows the critic, then resumes: one paragraph naming the part and torch's size mismatch, exit 2; the
    run folder stays byte for byte and --runs-dir gains nothing (the folder made at the start is removed again)."""
    run = tmp_path / "runs" / finished_run.name
    shutil.copytree(finished_run, run)
    before = contents(run)
    student = copy_alone(SCRIPT, tmp_path / "student", NARROWER)
    for checkpoint in ("step_0000000128.pt", "step_0000000256.pt"):  # older (a new folder) and newest (in place)
        proc = run_copy(
            student,
            "--resume",
            run / "checkpoints" / checkpoint,
            "--total-timesteps",
            "320",
            "--torch-threads",
            "1",
            "--no-progress",
            "--runs-dir",
            tmp_path / "runs",
            timeout=120,
        )
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert "does not fit this script's model (size mismatch for critic." in proc.stderr, proc.stderr
        assert contents(run) == before and sorted(p.name for p in (tmp_path / "runs").iterdir()) == [finished_run.name]


def test_an_edit_refused_at_start_leaves_no_run_folder(tmp_path):
    """A new run whose edited Agent cannot act stops at its first step, in one paragraph; its run folder is gone again."""
    student = copy_alone(
        SCRIPT,
        tmp_path / "student",
        [("layer_init(nn.Linear(64, act_dim), std=0.01)", "layer_init(nn.Linear(64, act_dim + 1), std=0.01)")],
    )
    proc = run_copy(student, *SMALL, "--total-timesteps", "128", "--runs-dir", tmp_path / "runs", timeout=120)
    assert proc.returncode == 2 and "could not broadcast" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "runs").exists()  # the --runs-dir it created too


def test_eval_episodes_needs_no_check_against_memory_the_evaluation_does_not_grow_with_it():
    """Why --eval-episodes has no up-front check (--num-envs and the replay buffer have): evaluation plays its episodes
    one after another on one env, so its memory is the same for 2 episodes and for 20 (only the time grows)."""
    import tracemalloc

    import gymnasium as gym

    def peak(episodes: int) -> int:
        policy = torch.nn.Linear(3, 1)
        tracemalloc.start()
        returns = ppo.evaluate(policy, gym.make("Pendulum-v1"), episodes, seed=0)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert len(returns) == episodes
        return peak

    peak(1)  # warm-up: first-call allocations (imports, caches) are not the evaluation's
    assert peak(20) < peak(2) + 64 * 1024


def test_a_run_folder_has_one_writer_a_second_resume_is_refused(finished_run, tmp_path):
    """A run holds an exclusive lock (flock) on its args.json until it ends: a second --resume of the same run folder
    while one runs is refused at once in one paragraph naming the folder and the holder's pid, and changes nothing in
    it. The race is forced: this test holds the lock, as the first resume would."""
    import fcntl

    run = tmp_path / "runs" / finished_run.name
    shutil.copytree(finished_run, run)
    before = contents(run)
    newest = run / "checkpoints" / "step_0000000256.pt"
    with open(run / "args.json") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        proc = run_script(SCRIPT, "--resume", newest, "--total-timesteps", "320", "--runs-dir", tmp_path / "runs")
    assert_clean_error(proc, f"run folder '{run.resolve()}' is being written by process {os.getpid()}:")
    assert contents(run) == before
    # the lock goes with the run that held it: the same resume now continues in the folder
    proc = run_script(SCRIPT, "--resume", newest, "--total-timesteps", "320", "--runs-dir", tmp_path / "runs")
    assert proc.returncode == 0, proc.stderr
    assert (run / "checkpoints" / "step_0000000320.pt").is_file()
