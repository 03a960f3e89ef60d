"""tools/agent.py on bad and shared places: it reads checkpoints with the script's own load_checkpoint; --force never
replaces a run or anything the tool did not export (nor what a link in an export points at); two exports to one --out
never both succeed; a link or a file as --out, malformed checkpoints, every bad flag, a --script that is not one of
this project's, and Ctrl-C end in one paragraph; an eval's video never writes over a file; a checkpoint outside a run
folder is evaluated and exported beside itself."""

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest
import torch

from tests.conftest import BASE_ENV, ROOT, needs_mujoco_rendering, only_run_dir, run_script
from tools import agent as tool

EXPORTED = {"policy.pt2", "model.pt", "config.json", "README.md"}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny finished ppo_continuous run (its folder: args.json, checkpoints/, an event file)."""
    runs = tmp_path_factory.mktemp("runs")
    proc = run_script(
        "ppo_continuous.py",
        "--env-id",
        "Pendulum-v1",
        "--num-steps",
        64,
        "--num-minibatches",
        2,
        "--total-timesteps",
        64,
        "--save-model",
        "--eval-episodes",
        1,
        "--torch-threads",
        1,
        "--no-progress",
        "--runs-dir",
        runs,
    )
    assert proc.returncode == 0, proc.stderr
    return only_run_dir(runs)


@pytest.fixture
def run_dir(trained, tmp_path):
    """A copy of the trained run, in runs/ of this test's folder."""
    return shutil.copytree(trained, tmp_path / "runs" / trained.name)


def checkpoint_of(run_dir):
    (ckpt,) = (run_dir / "checkpoints").glob("final_*.pt")
    return ckpt


def files(folder) -> dict:
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def refused(capsys, *argv) -> str:
    """tools/agent.py with argv: exit code 2 and one paragraph on stderr, which is returned."""
    with pytest.raises(SystemExit) as code:
        tool.main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert code.value.code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    return err


def test_eval_reads_the_checkpoint_with_the_scripts_load_checkpoint(run_dir, tmp_path, capsys):
    """The tool has no loader of its own: an edit to the script's load_checkpoint is what the tool meets."""
    source = (ROOT / "ppo_continuous.py").read_text()
    edited, count = re.subn(
        r"(def load_checkpoint\(.*\n)", r'\1    raise UserError("read by the edited load_checkpoint")\n', source
    )
    assert count == 1
    copy = tmp_path / "edited" / "ppo_continuous.py"
    copy.parent.mkdir()
    copy.write_text(edited)
    err = refused(capsys, "eval", checkpoint_of(run_dir), "--episodes", 1, "--script", copy)
    assert "read by the edited load_checkpoint" in err


def test_force_never_replaces_a_run_a_folder_it_did_not_export_or_the_checkpoints_folder(run_dir, capsys):
    ckpt, before = checkpoint_of(run_dir), files(run_dir.parent)
    assert {p.name for p in run_dir.iterdir()} >= {"args.json", "checkpoints"}
    assert list(run_dir.glob("events.out.tfevents*"))
    for out in (run_dir, run_dir.parent, run_dir / "checkpoints"):  # the run, every run, the checkpoint's own folder
        err = refused(capsys, "export", ckpt, "--out", out, "--force", "--episodes", 1)
        assert "not a folder this tool exported" in err
    assert "the checkpoint itself" in err
    mine = run_dir.parent.parent / "mine"
    mine.mkdir()
    (mine / "README.md").write_text("my notes")  # a name an export has too, but no config.json of the tool
    (mine / "config.json").write_text('{"mine": true}')
    assert "its config.json does not say so" in refused(capsys, "export", ckpt, "--out", mine, "--force", "--episodes", 1)
    assert (mine / "README.md").read_text() == "my notes"
    assert files(run_dir.parent) == before
    # an earlier export is what --force replaces; a file put into it makes it the user's folder again
    out = run_dir.parent.parent / "agent"
    tool.main(["export", str(ckpt), "--out", str(out), "--episodes", "1"])
    assert json.loads((out / "config.json").read_text())["exported_by"] == tool.EXPORTED_BY
    (out / "model.pt").write_bytes(b"old")
    tool.main(["export", str(ckpt), "--out", str(out), "--episodes", "1", "--force"])
    assert {p.name for p in out.iterdir()} == EXPORTED and (out / "model.pt").read_bytes() != b"old"
    (out / "notes.txt").write_text("mine")
    assert "it holds notes.txt" in refused(capsys, "export", ckpt, "--out", out, "--force", "--episodes", 1)
    assert (out / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in out.parent.iterdir()) == ["agent", "mine", "runs"]  # no temporary folder left


def test_a_link_or_a_file_as_out_gets_one_paragraph(run_dir, capsys):
    ckpt, top = checkpoint_of(run_dir), run_dir.parent.parent
    target = top / "empty"
    target.mkdir()
    link = top / "link"
    link.symlink_to(target, target_is_directory=True)
    plain = top / "file.txt"
    plain.write_text("keep")
    for out in (link, plain):
        for force in ([], ["--force"]):
            assert "is a link or a file" in refused(capsys, "export", ckpt, "--out", out, *force, "--episodes", 1)
    assert link.is_symlink() and not any(target.iterdir()) and plain.read_text() == "keep"
    assert sorted(p.name for p in top.iterdir()) == ["empty", "file.txt", "link", "runs"]


def test_two_exports_to_one_new_out_never_both_succeed(run_dir, monkeypatch, capsys):
    """The race forced: while the first export writes its model card (its folder complete, not yet moved into place),
    a second export to the same --out runs to the end. The first then finds --out taken: one paragraph, exit 2, and
    the second's export stays as it was."""
    ckpt, out = checkpoint_of(run_dir), run_dir.parent.parent / "agent"
    real_card, done = tool.model_card, []

    def card_with_a_second_export(*args):
        if not done:
            done.append(True)
            tool.main(["export", str(ckpt), "--out", str(out), "--episodes", "1", "--force"])
        return real_card(*args)

    monkeypatch.setattr(tool, "model_card", card_with_a_second_export)
    assert (out / "config.json").exists() is False
    err = refused(capsys, "export", ckpt, "--out", out, "--episodes", 1)
    assert "exists and is not empty" in err
    assert done and {p.name for p in out.iterdir()} == EXPORTED
    second = files(out)
    # with --force both may succeed, one after the other: the later replaces the earlier whole, never a mix
    done.clear()
    tool.main(["export", str(ckpt), "--out", str(out), "--episodes", "1", "--force"])
    assert {p.name for p in out.iterdir()} == EXPORTED and files(out).keys() == second.keys()
    assert sorted(p.name for p in out.parent.iterdir()) == ["agent", "runs"]  # no temporary folder left


def test_a_checkpoint_outside_a_run_folder_is_evaluated_and_exported_beside_itself(run_dir, capsys):
    folder = run_dir.parent.parent / "some" / "dir"
    folder.mkdir(parents=True)
    ckpt = folder / "x.pt"
    shutil.copy(checkpoint_of(run_dir), ckpt)
    tool.main(["eval", str(ckpt), "--episodes", "1"])
    tool.main(["export", str(ckpt), "--episodes", "1"])
    assert list((folder / "eval" / "x").glob("events.out.tfevents*"))
    assert {p.name for p in (folder / "export" / "x").iterdir()} == EXPORTED
    assert sorted(p.name for p in folder.parent.iterdir()) == ["dir"]  # nothing two levels up
    # in a run folder: the run's eval/ and export/, as before
    tool.main(["eval", str(checkpoint_of(run_dir)), "--episodes", "1"])
    assert list((run_dir / "eval" / checkpoint_of(run_dir).stem).glob("events.out.tfevents*"))


@pytest.mark.parametrize(
    "edit, needle",
    [
        (lambda c: c.pop("global_step"), "global_step (int)"),
        (lambda c: c.pop("run_name"), "run_name (str)"),
        (lambda c: c.update(args=["Pendulum-v1"]), "args (dict)"),
        (lambda c: c["args"].update(seed="1"), "args.seed (int)"),
        (lambda c: c["args"].pop("env_id"), "args.env_id (str)"),
        (lambda c: c.update(model=[1, 2]), "or is malformed ("),
        (lambda c: c.update(obs_rms=3), "checkpoint field obs_rms"),
        (lambda c: c["args"].pop("obs_clip"), "or is malformed ("),
    ],
)
def test_a_malformed_checkpoint_ends_in_one_paragraph(run_dir, capsys, edit, needle):
    ckpt = torch.load(checkpoint_of(run_dir), weights_only=True)
    edit(ckpt)
    bad = run_dir / "checkpoints" / "bad.pt"
    torch.save(ckpt, bad)
    before = files(run_dir)
    for command in ("eval", "export"):
        assert needle in refused(capsys, command, bad, "--episodes", 1)
    assert files(run_dir) == before  # nothing written


# ---- bad input of every kind: one paragraph; what the tool did not make: never written over ------------------------


@pytest.mark.parametrize(
    "argv, needle",
    [
        ([], "the following arguments are required: command"),
        (["evaluate", "CKPT"], "invalid choice: 'evaluate'"),
        (["eval"], "the following arguments are required: checkpoint"),
        (["eval", "CKPT", "--episodes", "0"], "--episodes 0: give 1 or more"),
        (["eval", "CKPT", "--episodes", "ten"], "argument --episodes: invalid int value: 'ten'"),
        (["export", "CKPT", "--frce"], "unrecognized arguments: --frce"),
        (["export", "CKPT", "--out", "RUN/args.json/agent"], "goes through a file"),
        (["export", "CKPT", "--out", "RUN/" + "x" * 300], "File name too long"),  # (one paragraph before too)
    ],
)
def test_every_bad_flag_ends_in_one_paragraph(run_dir, capsys, argv, needle):
    """argparse printed its usage block, then its error (and --episodes 0 the same): now one paragraph, exit 2."""
    ckpt, before = checkpoint_of(run_dir), files(run_dir.parent)
    argv = [a.replace("CKPT", str(ckpt)).replace("RUN", str(run_dir)) for a in argv]
    assert needle in refused(capsys, *argv)
    assert files(run_dir.parent) == before  # nothing written


NOT_SCRIPTS = {
    "not a Python file": ("notes.txt", "print('hi')\n", "is not a Python file"),
    "a syntax error": ("broken.py", "def (:\n", "could not be imported (SyntaxError"),
    "an import it lacks": ("lacks.py", "import no_such_module_here\n", "could not be imported (ModuleNotFoundError"),
    "not a script of this project": ("other.py", "x = 1\n", "it has no UserError, Args, load_checkpoint"),
}


@pytest.mark.parametrize("case", list(NOT_SCRIPTS))
def test_a_script_that_is_not_one_of_this_projects_ends_in_one_paragraph(run_dir, tmp_path, capsys, case):
    """--script naming a file that does not import, or is not a script of this project: AttributeError, SyntaxError
    and ModuleNotFoundError tracebacks."""
    name, text, needle = NOT_SCRIPTS[case]
    (tmp_path / name).write_text(text)
    for command in ("eval", "export"):
        assert needle in refused(capsys, command, checkpoint_of(run_dir), "--episodes", 1, "--script", tmp_path / name)


def test_ctrl_c_during_eval_or_export_ends_in_one_paragraph_and_leaves_no_half_export(run_dir):
    """Ctrl-C at a terminal (SIGINT to the tool's process group) during its episodes: a KeyboardInterrupt traceback.
    Now one paragraph, exit code 130; the export's temporary folder goes with it."""
    ckpt = checkpoint_of(run_dir)
    for command in ("eval", "export"):
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "tools" / "agent.py"), command, str(ckpt), "--episodes", "100000"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env={**os.environ, **BASE_ENV},
            start_new_session=True,
        )
        try:
            assert proc.stdout.readline().startswith("episode 1/100000: return"), proc.stderr.read()
            os.killpg(proc.pid, signal.SIGINT)
            _, stderr = proc.communicate(timeout=120)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        assert proc.returncode == 130 and stderr.startswith("error: stopped (Ctrl-C)"), stderr
        assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert list((run_dir / "export").iterdir()) == []  # no export, and no temporary folder


def test_force_replaces_an_earlier_export_whole_and_never_what_a_link_in_it_points_at(run_dir, capsys):
    """Verified (this held before): a link put into an earlier export goes with the export, its target stays."""
    ckpt, top = checkpoint_of(run_dir), run_dir.parent.parent
    out, mine = top / "agent", top / "mine.pt"
    tool.main(["export", str(ckpt), "--out", str(out), "--episodes", "1"])
    mine.write_bytes(b"mine")
    (out / "model.pt").unlink()
    (out / "model.pt").symlink_to(mine)
    tool.main(["export", str(ckpt), "--out", str(out), "--episodes", "1", "--force"])
    assert mine.read_bytes() == b"mine" and not (out / "model.pt").is_symlink()
    (out / "replay.mp4").symlink_to(top / "runs", target_is_directory=True)  # a link to a folder: not an export's file
    assert "it holds replay.mp4" in refused(capsys, "export", ckpt, "--out", out, "--force", "--episodes", 1)
    assert (top / "runs").is_dir() and files(run_dir) and (out / "replay.mp4").is_symlink()


@pytest.fixture(scope="module")
def trained_mujoco(tmp_path_factory):
    """A tiny finished ppo_continuous run on a MuJoCo env (its videos render headless through EGL)."""
    runs = tmp_path_factory.mktemp("mujoco_runs")
    args = ["--num-steps", 64, "--num-minibatches", 2, "--total-timesteps", 64, "--save-model", "--eval-episodes", 1]
    proc = run_script("ppo_continuous.py", "--env-id", "InvertedPendulum-v5", *args, "--no-progress", "--runs-dir", runs)
    assert proc.returncode == 0, proc.stderr
    return only_run_dir(runs)


def test_an_eval_video_never_writes_over_the_files_of_a_videos_folder(trained_mujoco, tmp_path):
    """gymnasium's RecordVideo writes rl-video-episode-0.mp4 over the file of that name in its folder: a second
    `eval --capture-video` replaced the first's video, and a user's file of that name. Each eval now records into a
    folder that was not there: <run>/eval/<checkpoint>/videos, else videos-2, videos-3, ..."""
    needs_mujoco_rendering()
    run_dir = shutil.copytree(trained_mujoco, tmp_path / "runs" / trained_mujoco.name)
    ckpt, env = checkpoint_of(run_dir), {"MUJOCO_GL": None, "DISPLAY": None}
    videos = run_dir / "eval" / ckpt.stem / "videos"
    videos.mkdir(parents=True)
    (videos / "rl-video-episode-0.mp4").write_bytes(b"mine")
    for _ in range(2):
        proc = run_script("tools/agent.py", "eval", ckpt, "--episodes", "1", "--capture-video", env=env)
        assert proc.returncode == 0, proc.stderr
    assert [p.name for p in videos.iterdir()] == ["rl-video-episode-0.mp4"]
    assert (videos / "rl-video-episode-0.mp4").read_bytes() == b"mine"
    for name in ("videos-2", "videos-3"):
        assert [p.name for p in (videos.parent / name).glob("*.mp4")] == ["rl-video-episode-0.mp4"], name
