"""tools/plot.py draws the learning curves of a runs folder: on two real ppo_continuous.py seeds, the PNG it writes is
a PNG, and the curve it draws is the mean over the seeds of what the event files hold, with the bootstrap interval of
that mean; on event files of known values, the mean is over seeds (not over steps) on the steps all seeds cover; a
folder without runs, or without the tag, is refused in one paragraph, exit code 2."""

from pathlib import Path

import numpy as np
import pytest

from tests.conftest import run_script, scalars
from tools.plot import curves

TAG = "charts/episodic_return"
# Pendulum's episodes last 200 steps: with one env, both seeds log a return at 200, 400, ..., 2000
TINY_RUN = ["--env-id", "Pendulum-v1", "--total-timesteps", "2048", "--num-steps", "256", "--num-minibatches", "4"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """A runs folder with two real seeds of one env and exp_name."""
    folder = tmp_path_factory.mktemp("plot") / "runs"
    for seed in (1, 2):
        proc = run_script("ppo_continuous.py", *TINY_RUN, "--seed", seed, "--torch-threads", 1, "--runs-dir", folder)
        assert proc.returncode == 0, proc.stderr[-3000:]
    return folder


def test_plot_writes_a_png_of_the_runs(runs, tmp_path):
    out = tmp_path / "curves.png"
    proc = run_script("tools/plot.py", runs, "--out", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Pendulum-v1 ppo_continuous (seeds [1, 2])" in proc.stdout
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from PIL import Image

    with Image.open(out) as image:
        image.verify()  # a whole, readable PNG
        assert image.size[0] > 300 and image.size[1] > 200


def test_the_curve_is_the_mean_over_seeds_of_the_event_files(runs):
    """The grid hits the episodes' ends (points=10 from 200 to 2000), so the mean and the interval are exact: the mean
    of the two seeds' logged returns; with two seeds the 95 % bootstrap interval spans the two values."""
    seed_dirs = sorted(runs.iterdir())
    logged = [scalars(run_dir, TAG) for run_dir in seed_dirs]
    steps = sorted(logged[0])
    assert steps == sorted(logged[1]) == list(range(200, 2001, 200))
    values = np.array([[seed[step] for step in steps] for seed in logged])
    assert not np.allclose(values[0], values[1]), "two seeds of different curves, or the check has no teeth"
    (curve,) = curves(runs, TAG, smooth=1, points=10).values()
    assert curve["seeds"] == [1, 2]
    np.testing.assert_allclose(curve["steps"], steps)
    np.testing.assert_allclose(curve["mean"], values.mean(axis=0), rtol=1e-6)
    np.testing.assert_allclose(curve["low"], values.min(axis=0), rtol=1e-6)
    np.testing.assert_allclose(curve["high"], values.max(axis=0), rtol=1e-6)
    # the default smoothing: a trailing mean over 10 returns, here all returns so far
    (smoothed,) = curves(runs, TAG, points=10).values()
    np.testing.assert_allclose(smoothed["mean"], (values.cumsum(axis=1) / np.arange(1, 11)).mean(axis=0), rtol=1e-6)


def test_the_mean_is_over_seeds_on_the_steps_they_all_cover(tmp_path):
    """Three seeds of a line through 0 with slopes 1, 2 and 6, over different step ranges: the mean is the line of
    slope 3 on [100, 900], the steps every seed covers. A mean over steps (a flat line), over the runs' union of steps
    or a seed left out gives another curve."""
    from torch.utils.tensorboard import SummaryWriter

    for seed, (slope, first, last) in enumerate([(1, 0, 1000), (2, 100, 900), (6, 50, 1000)], 1):
        writer = SummaryWriter(tmp_path / f"Hopper-v4__sac__{seed}__1700000000")
        for step in range(first, last + 1, 50):
            writer.add_scalar(TAG, slope * step / 100, step)
        writer.close()
    (tmp_path / "notes__not_a_run").mkdir()  # a folder named otherwise: passed over
    (key, curve), *others = curves(tmp_path, TAG, smooth=1, points=9).items()
    assert key == ("Hopper-v4", "sac") and others == [] and curve["seeds"] == [1, 2, 3]
    np.testing.assert_allclose(curve["steps"], np.arange(100, 901, 100))
    np.testing.assert_allclose(curve["mean"], 3 * curve["steps"] / 100)
    assert np.all(curve["low"] < curve["mean"]) and np.all(curve["mean"] < curve["high"])
    assert np.all(curve["low"] >= curve["steps"] / 100 - 1e-9) and np.all(curve["high"] <= 6 * curve["steps"] / 100 + 1e-9)


@pytest.mark.parametrize("case", ["empty folder", "no such folder", "no such tag"])
def test_no_runs_is_one_paragraph_and_exit_2(case, runs, tmp_path):
    folder = {"empty folder": tmp_path, "no such folder": tmp_path / "missing", "no such tag": runs}[case]
    (tmp_path / "Pendulum-v1__ppo__1__1700000000").mkdir()  # a run folder without event files
    tag = "charts/no_such_tag" if case == "no such tag" else TAG
    proc = run_script("tools/plot.py", folder, "--out", tmp_path / "curves.png", "--tag", tag)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.startswith("error: ") and proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr
    assert str(folder) in proc.stderr and tag in proc.stderr
    assert not (tmp_path / "curves.png").exists()
