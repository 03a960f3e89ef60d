"""Tests of the benchmark tools on synthetic data: the harness (run.py, on fake TensorBoard runs and tiny fake training
scripts), the summary table and figure (summary.py), the monitor converter (sb3_monitor.py), update_ab.py and
simulator_divergence.py."""

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from torch.utils.tensorboard import SummaryWriter

REPO = Path(__file__).resolve().parents[1]
HARNESS = REPO / "benchmarks" / "run.py"
ENV_ID = "Fake-v0"
EXP_NAME = "fake"
NUM_EPISODES = 150
SEED_OFFSETS = {1: 0.0, 2: 10.0}  # seed 2 returns are seed 1 returns + 10


def load_harness():
    spec = importlib.util.spec_from_file_location("benchmarks_run_under_test", HARNESS)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up in sys.modules
    spec.loader.exec_module(module)
    return module


bench = load_harness()

# A fake training script that follows the contract: it parses the contract args (ignoring unknown ones) and writes
# `charts/episodic_return` (value = episode index + seed) to DIR/<run_name>/. It fails with exit code 3 when its
# seed equals --fail-seed. It uses tensorboard's own event writer (no torch import) to keep the tests fast.
FAKE_TRAIN = textwrap.dedent("""
    import argparse, sys, time
    from pathlib import Path

    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    parser = argparse.ArgumentParser()
    parser.add_argument("--env-id")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--total-timesteps", type=int)
    parser.add_argument("--exp-name")
    parser.add_argument("--runs-dir")
    parser.add_argument("--episodes", type=int, default=5)
    parser.add_argument("--fail-seed", type=int, default=None)
    args, _ = parser.parse_known_args()
    print(f"fake training seed {args.seed}", flush=True)
    if args.seed == args.fail_seed:
        print("boom: fake failure", flush=True)
        sys.exit(3)
    run_name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"
    writer = EventFileWriter(str(Path(args.runs_dir) / run_name))
    for episode in range(args.episodes):
        step = (episode + 1) * args.total_timesteps // args.episodes
        value = Summary.Value(tag="charts/episodic_return", simple_value=float(episode + args.seed))
        writer.add_event(Event(wall_time=time.time(), step=step, summary=Summary(value=[value])))
    writer.close()
    """)


@pytest.fixture(scope="module")
def runs_out(tmp_path_factory) -> Path:
    """`<out>` prefix whose `<out>_runs/` holds two fake seeds of 150 episodes with known returns."""
    out = tmp_path_factory.mktemp("bench") / "fake_result"
    runs_dir = out.parent / f"{out.name}_runs"
    for seed, offset in SEED_OFFSETS.items():
        run_dir = runs_dir / f"{ENV_ID}__{EXP_NAME}__{seed}__1700000000"
        writer = SummaryWriter(str(run_dir))
        for episode in range(NUM_EPISODES):
            writer.add_scalar("charts/episodic_return", episode + offset, (episode + 1) * 100)
        writer.add_scalar("charts/SPS", 1000.0, NUM_EPISODES * 100)
        writer.close()
        # events in a subfolder must not be mixed into the training curve
        nested = SummaryWriter(str(run_dir / "eval" / "nested"))
        nested.add_scalar("charts/episodic_return", -1e6, 5)
        nested.close()
        (run_dir / "checkpoints").mkdir()
    return out


def run_dir_of(out: Path, seed: int) -> Path:
    return out.parent / f"{out.name}_runs" / f"{ENV_ID}__{EXP_NAME}__{seed}__1700000000"


def harness_args(out: Path, script: str, seeds: list[int]) -> list[str]:
    return [
        "--script",
        script,
        "--env-id",
        ENV_ID,
        "--exp-name",
        EXP_NAME,
        "--seeds",
        *map(str, seeds),
        "--total-timesteps",
        "1000",
        "--out",
        str(out),
    ]


def write_script(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# ---------------------------------------------------------------------------------------------------------------------
# Pure functions
# ---------------------------------------------------------------------------------------------------------------------


def test_read_scalars_in_step_order_ignoring_subfolders(runs_out):
    steps, values = bench.read_scalars(run_dir_of(runs_out, 2), "charts/episodic_return")
    np.testing.assert_array_equal(steps, (np.arange(NUM_EPISODES) + 1) * 100)
    np.testing.assert_array_equal(values, np.arange(NUM_EPISODES) + 10.0)


def test_read_scalars_missing_tag_is_empty(runs_out):
    steps, values = bench.read_scalars(run_dir_of(runs_out, 1), "no/such_tag")
    assert len(steps) == 0 and len(values) == 0


def test_summarize_seed_hand_computed(runs_out):
    summary = bench.summarize_seed(*bench.read_scalars(run_dir_of(runs_out, 1), "charts/episodic_return"))
    # values are 0..149: the last 100 are 50..149 (mean 99.5), the last 10 are 140..149 (mean 144.5)
    assert summary == {"last100_mean": 99.5, "last10_mean": 144.5, "num_episodes": 150, "final_step": 15000}


def test_summarize_seed_fewer_episodes_than_window():
    summary = bench.summarize_seed(np.array([1, 2, 3]), np.array([1.0, 2.0, 6.0]))
    assert summary == {"last100_mean": 3.0, "last10_mean": 3.0, "num_episodes": 3, "final_step": 3}
    with pytest.raises(ValueError):
        bench.summarize_seed(np.zeros(0), np.zeros(0))


def test_summarize_seeds_population_std():
    summary = bench.summarize_seeds(
        [{"last100_mean": 99.5, "last10_mean": 144.5}, {"last100_mean": 109.5, "last10_mean": 154.5}]
    )
    assert summary["num_seeds"] == 2 and summary["std_ddof"] == 0
    assert summary["last100_mean"] == {"mean": 104.5, "std": 5.0}
    assert summary["last10_mean"] == {"mean": 149.5, "std": 5.0}
    assert bench.summarize_seeds([])["last100_mean"] is None


def test_moving_average_and_mean_curve():
    np.testing.assert_allclose(bench.moving_average(np.array([2.0, 4.0, 6.0, 8.0]), 2), [2.0, 3.0, 5.0, 7.0])
    curves = [(np.array([0, 10]), np.array([0.0, 10.0])), (np.array([0, 5, 10]), np.array([10.0, 10.0, 10.0]))]
    grid, mean = bench.mean_curve(curves, window=1, num_points=3)
    np.testing.assert_allclose(grid, [0.0, 5.0, 10.0])
    np.testing.assert_allclose(mean, [5.0, 7.5, 10.0])


def test_machine_helpers():
    assert bench.cpu_model("processor\t: 0\nmodel name\t: Fancy CPU 3000\n") == "Fancy CPU 3000"
    assert bench.mem_total_gib("MemTotal:       2097152 kB\nMemFree: 1 kB\n") == 2.0


def test_versions_are_those_of_the_interpreter_that_ran_the_seeds(tmp_path, runs_out):
    """--python runs the seeds in another interpreter (the reference's pinned stack, a scratch MuJoCo): the JSON's
    versions must be that interpreter's. A bare venv has no numpy; the harness's own interpreter has."""
    import platform

    own = bench.interpreter_versions(sys.executable, ["numpy", "surely-not-installed-pkg"])
    packages = {"numpy": np.__version__, "surely-not-installed-pkg": None}
    assert own == {"python": platform.python_version(), "packages": packages}
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    machine = bench.machine_info(str(bare / "bin" / "python"))
    assert machine["packages"]["numpy"] is None and machine["packages"]["torch"] is None
    assert machine["versions_of"] == str(bare / "bin" / "python") and machine["python"] == platform.python_version()
    broken = bench.interpreter_versions(str(tmp_path / "no-such-python"), ["numpy"])
    assert broken["packages"] == {"numpy": None} and "no-such-python" in broken["versions_error"]
    # and the report the harness writes takes them from --python
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(runs_out.parent / f"{runs_out.name}_runs", tmp_path / "copy_runs")
    summarize = ["--summarize-only", "--python", str(bare / "bin" / "python")]
    assert bench.main(harness_args(out, "fake_train.py", [1, 2]) + summarize) == 0
    report = json.loads((tmp_path / "copy.json").read_text())
    assert report["machine"]["packages"]["numpy"] is None and report["machine"]["versions_of"] == str(bare / "bin" / "python")


# ---------------------------------------------------------------------------------------------------------------------
# End to end
# ---------------------------------------------------------------------------------------------------------------------


def test_summarize_only_writes_json_and_png(runs_out):
    argv = harness_args(runs_out, "fake_train.py", [1, 2])
    argv += ["--summarize-only", "--reference", "120", "--reference-std", "15", "--reference-label", "paper"]
    assert bench.main(argv) == 0
    report = json.loads(runs_out.with_suffix(".json").read_text())
    assert report["summary"]["last100_mean"] == {"mean": 104.5, "std": 5.0}
    assert report["summary"]["last10_mean"] == {"mean": 149.5, "std": 5.0}
    assert report["summary"]["std_ddof"] == 0 and "ddof=0" in report["summary"]["std_note"]
    first, second = report["per_seed"]
    assert (first["seed"], first["status"], first["last100_mean"], first["last10_mean"]) == (1, "ok", 99.5, 144.5)
    assert (second["num_episodes"], second["final_step"], second["sps_median"]) == (150, 15000, 1000.0)
    assert second["run_dir"] == f"fake_result_runs/{ENV_ID}__{EXP_NAME}__2__1700000000"
    assert report["reference"] == {"value": 120.0, "std": 15.0, "label": "paper"}
    assert "--summarize-only" in report["harness_command"]
    assert report["machine"]["note"] == bench.MACHINE_NOTE
    assert {"platform", "cpu_model", "cpu_count", "cpu_affinity_count", "mem_total_gib", "python"} <= set(report["machine"])
    assert set(report["machine"]["packages"]) >= {"torch", "gymnasium", "numpy"}
    png = runs_out.with_suffix(".png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 1000


def test_failing_script_exits_nonzero_with_log_tail(tmp_path):
    script = write_script(tmp_path / "fail.py", "print('about to fail: boom')\nraise SystemExit(3)\n")
    out = tmp_path / "results" / "fail"
    command = [sys.executable, str(HARNESS), *harness_args(out, str(script), [7])]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "seed 7 FAILED with exit code 3" in result.stderr
    assert "about to fail: boom" in result.stderr
    assert (out.parent / "fail_runs" / "seed7.log").read_text().startswith("about to fail")
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["per_seed"][0]["status"] == "failed" and report["per_seed"][0]["returncode"] == 3
    assert report["summary"]["num_seeds"] == 0


def test_fake_training_two_seeds_end_to_end(tmp_path):
    script = write_script(tmp_path / "fake_train.py", FAKE_TRAIN)
    out = tmp_path / "results" / "fake"
    argv = harness_args(out, str(script), [1, 2]) + ["--parallel", "2", "--", "--episodes", "4"]
    assert bench.main(argv) == 0
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["extra_args"] == ["--episodes", "4"]
    for entry, seed in zip(report["per_seed"], [1, 2]):
        # returns are seed, seed+1, seed+2, seed+3 at steps 250, 500, 750, 1000
        assert entry["status"] == "ok" and entry["returncode"] == 0 and entry["wall_time_s"] > 0
        assert (entry["num_episodes"], entry["final_step"], entry["last100_mean"]) == (4, 1000, seed + 1.5)
        # every episode's (step, return), so benchmarks/summary.py can draw curves from the JSON alone
        assert entry["curve"] == {"steps": [250, 500, 750, 1000], "returns": [seed, seed + 1, seed + 2, seed + 3]}
        assert entry["command"].endswith(f"--runs-dir {out.parent / 'fake_runs'} --episodes 4")
        assert (out.parent / entry["run_dir"]).is_dir()
        assert (out.parent / entry["log"]).read_text().strip() == f"fake training seed {seed}"
    assert report["summary"]["last100_mean"] == {"mean": 3.0, "std": 0.5}
    assert report["runs_harness_command"] == report["harness_command"]
    assert out.with_suffix(".png").stat().st_size > 1000

    # --summarize-only afterwards keeps the per-seed command and wall time of the runs
    assert bench.main(harness_args(out, str(script), [1, 2]) + ["--summarize-only", "--", "--episodes", "4"]) == 0
    again = json.loads(out.with_suffix(".json").read_text())
    assert again["per_seed"] == report["per_seed"]
    assert again["runs_harness_command"] == report["harness_command"]


def test_parallel_that_the_sweep_would_not_honour_is_refused(tmp_path):
    # the sweep reserves --torch-threads CPUs per seed: on 2+ cores, `--parallel 1 -- --torch-threads 1` ran two seeds
    # at once while the JSON said one (sac_continuous_ray's 150k runs of 2026-11-27)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if cores < 2:
        pytest.skip("needs 2 cores: on one, one thread per seed is one seed at a time")
    out = tmp_path / "results" / "ppo"
    argv = [
        "--script",
        "ppo_continuous.py",
        "--env-id",
        "Pendulum-v1",
        "--seeds",
        "1",
        "2",
        "--total-timesteps",
        "2048",
        "--out",
        str(out),
        "--parallel",
        "1",
        "--",
        "--torch-threads",
        "1",
    ]
    with pytest.raises(SystemExit, match=r"runs 2 seed\(s\) at once, not --parallel 1: give --parallel 2"):
        bench.main(argv)
    assert not (out.parent / "ppo_runs" / "sweep").exists() and not out.with_suffix(".json").exists()


def test_runs_in_cwd_for_a_script_without_runs_dir(tmp_path, monkeypatch):
    """--runs-in-cwd: a script in the reference's layout (no --runs-dir; it writes to ./runs/<run_name>) is run in a
    folder whose runs/ is <out>_runs/, so its curves are found; --runs-dir is not passed (it would be rejected)."""
    cwd_script = (
        FAKE_TRAIN.replace('parser.add_argument("--runs-dir")\n', "")
        .replace("Path(args.runs_dir) / run_name", 'Path("runs") / run_name')
        .replace("args, _ = parser.parse_known_args()", "args = parser.parse_args()")  # unknown flags fail
    )
    assert cwd_script != FAKE_TRAIN and "runs_dir" not in cwd_script and "parse_known_args" not in cwd_script
    script = write_script(tmp_path / "fake_reference.py", cwd_script)
    monkeypatch.chdir(tmp_path)  # relative --script and --out: the harness makes them absolute for the other folder
    out = Path("results") / "ref"
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert bench.main(harness_args(out, script.name, [1, 2]) + ["--runs-in-cwd", "--", "--episodes", "4"]) == 0
    report = json.loads(out.with_suffix(".json").read_text())
    assert [entry["last100_mean"] for entry in report["per_seed"]] == [2.5, 3.5]
    assert all("--runs-dir" not in entry["command"] for entry in report["per_seed"])
    assert report["harness"]["runs_in_cwd"] is True and report["harness"]["thread_env"] == {"OMP_NUM_THREADS": "1"}
    assert not (tmp_path / "runs").exists()  # nothing written where the test (the caller) runs
    # a later --summarize-only, under other thread settings, keeps the runs' thread settings
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert bench.main(harness_args(out, script.name, [1, 2]) + ["--runs-in-cwd", "--summarize-only"]) == 0
    assert json.loads(out.with_suffix(".json").read_text())["harness"]["thread_env"] == {"OMP_NUM_THREADS": "1"}


def test_partial_failure_still_writes_finished_seeds(tmp_path, capsys):
    script = write_script(tmp_path / "fake_train.py", FAKE_TRAIN)
    out = tmp_path / "partial"
    assert bench.main(harness_args(out, str(script), [1, 2]) + ["--", "--fail-seed", "2"]) == 1
    assert "seed 2 FAILED with exit code 3" in capsys.readouterr().err
    report = json.loads(out.with_suffix(".json").read_text())
    ok, failed = report["per_seed"]
    assert ok["status"] == "ok" and ok["last10_mean"] == 3.0  # values 1..5
    assert failed["status"] == "failed" and failed["returncode"] == 3 and failed["run_dir"] is None
    assert report["summary"]["seeds_used"] == [1] and report["summary"]["last10_mean"] == {"mean": 3.0, "std": 0.0}
    assert out.with_suffix(".png").stat().st_size > 1000


@pytest.mark.slow  # about 27 s
def test_update_ab_measures_a_slower_build_as_slower(tmp_path):
    """benchmarks/update_ab.py on sac_continuous.py against a copy whose critic update sleeps 200 ms more: the
    ratio must show it (a harness that timed the wrong thing, or swapped A and B, would not). 200 ms, not less: on a
    loaded machine a gradient step took 130 ms, and a 50 ms sleep measured only 1.25x."""
    slow = tmp_path / "sac_slow.py"
    slow.write_text(
        (REPO / "sac_continuous.py").read_text()
        + textwrap.dedent(
            """
        _critic_update = critic_update


        def critic_update(learner, batch, gamma):
            time.sleep(0.2)
            return _critic_update(learner, batch, gamma)
        """
        )
    )
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "update_ab.py"),
            str(REPO / "sac_continuous.py"),
            str(slow),
            "--rounds",
            "3",
            "--steps",
            "4",
            "--threads",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    ratio = float(proc.stdout.split("B / A time per gradient step: median ")[1].split()[0])
    assert ratio > 1.5, proc.stdout


def test_simulator_divergence_is_zero_for_the_same_interpreter_and_reports_each_step():
    """benchmarks/simulator_divergence.py compares two interpreters' HalfCheetah states step by step: against itself the
    simulation is deterministic, so every reported difference must be exactly 0 (a tool that compared different
    resets, actions or steps would not give 0)."""
    script = REPO / "benchmarks" / "simulator_divergence.py"
    proc = subprocess.run(
        [sys.executable, str(script), sys.executable, sys.executable, "--steps", "50"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line.split(":") for line in proc.stdout.splitlines() if line.startswith("  ")]
    assert [int(step) for step, _ in rows] == [1, 2, 5, 10, 20, 50]
    assert all(float(value) == 0.0 for _, value in rows)
    spec = importlib.util.spec_from_file_location("simulator_divergence_under_test", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    np.testing.assert_array_equal(
        module.divergence(np.array([[0.0, 1.0], [2.0, 3.0]]), np.array([[0.0, 1.5], [2.0, 2.0]])), [0.5, 1.0]
    )


# ---- benchmarks/summary.py: the README's results table and summary.png from the committed JSONs ----
from benchmarks import summary  # noqa: E402


def fake_report(script: str, seeds_last100: dict, reference=None, curves: bool = True, parallel: int = 1) -> dict:
    per_seed = []
    for seed, value in seeds_last100.items():
        entry = {
            "seed": seed,
            "status": "ok",
            "wall_time_s": 600.0,
            "last100_mean": value,
            "last10_mean": value,
            "final_step": 1000,
        }
        if curves:
            entry["curve"] = {"steps": list(range(100, 1001, 100)), "returns": [value * k / 10 for k in range(1, 11)]}
        per_seed.append(entry)
    return {
        "script": script,
        "total_timesteps": 1000,
        "extra_args": ["--bf16"],
        "per_seed": per_seed,
        "reference": reference,
        "machine": {"cpu_model": "AMD EPYC"},
        "harness": {"parallel": parallel},
    }


def test_summary_pools_seeds_and_reads_comparisons(tmp_path):
    (tmp_path / "ours_a.json").write_text(json.dumps(fake_report("x.py", {1: 10.0, 2: 20.0})))
    (tmp_path / "ours_b.json").write_text(json.dumps(fake_report("x.py", {3: 30.0}, curves=False, parallel=2)))
    (tmp_path / "pub.json").write_text(json.dumps(fake_report("y.py", {1: 5.0}, reference={"value": 12.5, "std": 1.5})))
    (tmp_path / "ref.json").write_text(json.dumps(fake_report("ref.py", {2: 8.0, 3: 12.0})))
    rows = [
        summary.Row(
            "x.py",
            "Env-v0",
            "1k steps",
            "`--bf16`",
            ["ours_a.json", "ours_b.json"],
            summary.Comparison("runs", "the other one, run here", ["ref.json"]),
            speed_key="x.py",
        ),
        summary.Row(
            "y.py",
            "Env-v0",
            "1k steps",
            "",
            ["pub.json"],
            summary.Comparison("published", "a paper", ["pub.json"], seeds=3),
            speed_key="y.py",
        ),
        summary.Row(
            "z.py",
            "Env-v0",
            "1k steps",
            "",
            ["pub.json"],
            summary.Comparison("runs", "later", ["missing.json"]),
            speed_key="z.py",
        ),
        summary.Row("w.py", "Env-v0", "1k steps", "", ["missing.json"], None),  # no JSON yet: no row
        summary.Row("x.py", "Other-v0", "1k steps", "", ["ours_a.json"], None),  # x.py's speed was not measured on this row
    ]
    speed = {
        "x.py": {"ours_sps": 300.0, "reference_sps": 150.0, "ratio": 2.0, "reps": 3},
        "z.py": {"ours_sps": 300.0, "reference_sps": 200.0, "ratio": 1.5, "reps": 3, "backend": "gymnasium"},
    }
    cells = summary.table_rows(rows, tmp_path, speed)
    assert len(cells) == 4
    x, y, z, x_other = cells
    # ours pooled over both JSONs: mean of 10, 20, 30 and the population std
    assert (x["seeds"], x["ours"]) == ("1, 2, 3", f"**20.0 ± {np.std([10, 20, 30]):.1f}**")
    assert x["comparison"] == "10.0 ± 2.0 (the other one, run here, 2 seeds)"
    assert x["speed"] == "2.00× (3 reps)" and x["wall"] == "10 min, AMD EPYC, 2 seeds at once"
    assert y["ours"] == "**5.0**" and y["comparison"] == "12.5 ± 1.5 (a paper, 3 seeds)" and y["speed"] == "not measured"
    assert z["comparison"] == "later: not measured yet" and z["speed"] == "1.50× (3 reps)"
    assert x_other["speed"] == "—"  # one measurement, shown on the one row it was made for
    resumed = fake_report("r.py", {1: 50.0})
    resumed["per_seed"][0]["wall_time_s"] = None  # a run finished with --resume, then --summarize-only
    (tmp_path / "resumed.json").write_text(json.dumps(resumed))
    (r,) = summary.table_rows([summary.Row("r.py", "Env-v0", "1k steps", "", ["resumed.json"], None)], tmp_path, speed)
    assert r["wall"] == "not recorded (resumed run), AMD EPYC" and r["comparison"] == "none published"
    table = summary.markdown_table(cells)
    assert table.count("\n") == 5 and table.startswith("| script |")
    readme = f"intro\n{summary.TABLE_START}\nold table\n{summary.TABLE_END}\nrest\n"
    assert summary.replace_table(readme, table) == f"intro\n{summary.TABLE_START}\n{table}\n{summary.TABLE_END}\nrest\n"
    # the figure: a panel per row with JSONs, curves where stored, final points where not
    png = tmp_path / "summary.png"
    summary.draw_figure(png, rows, tmp_path)
    assert png.read_bytes().startswith(b"\x89PNG") and png.stat().st_size > 10_000


def test_summary_band_is_mean_and_std_of_the_smoothed_curves():
    entries = [
        {"curve": {"steps": [1, 2, 3, 4], "returns": [0.0, 0.0, 4.0, 4.0]}},
        {"curve": {"steps": [1, 2, 3, 4], "returns": [2.0, 2.0, 2.0, 2.0]}},
    ]
    grid, mean, std = summary.smoothed_band(entries, window=1, num_points=4)
    assert grid.tolist() == [1, 2, 3, 4]
    assert mean.tolist() == [1.0, 1.0, 3.0, 3.0] and std.tolist() == [1.0, 1.0, 1.0, 1.0]
    assert summary.smoothed_band([{"curve": None}], window=1) is None  # a JSON without curves: no band


def script_flags(script: str) -> set:
    """Every flag the script takes today: its Args fields but the derived ones, as --kebab-case, and --no-X for a bool."""
    import ast

    tree = ast.parse((REPO / script).read_text())
    args = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Args")
    flags = set()
    for field in (node for node in args.body if isinstance(node, ast.AnnAssign) and "init=False" not in ast.unparse(node)):
        flag = "--" + field.target.id.replace("_", "-")
        flags |= {flag, "--no-" + flag[2:]} if ast.unparse(field.annotation) == "bool" else {flag}
    return flags


def test_summary_rows_name_committed_jsons_with_the_flags_they_ran():
    """Each row's JSONs exist and ran with the flags the row names; those flags, and every flag the JSONs ran with,
    are flags the script takes today (a row made with a flag since dropped is not reproducible: it has no place)."""
    for row in summary.ROWS:
        today = script_flags(row.script)
        for flag in re.findall(r"--[a-z0-9-]+", row.flags):
            assert flag in today, f"a row names {flag}, which {row.script} does not take"
        for name in row.files:
            report = summary.load(name)
            assert report is not None, f"{name} (a row of summary.py) is not in benchmarks/results/"
            for flag in re.findall(r"--[a-z0-9-]+(?: [^-`][^ `]*)?", row.flags):
                assert " ".join(report["extra_args"]).find(flag) >= 0, f"{name} did not run with {flag}"
            ran = {arg.split("=")[0] for arg in report["extra_args"] if arg.startswith("--")}
            assert ran <= today, f"{name} ran with {sorted(ran - today)}, which {row.script} does not take"
        if row.comparison is not None and row.comparison.kind == "published":
            assert summary.load(row.comparison.files[0])["reference"]["value"] is not None


def test_speed_json_entries_have_the_documented_fields():
    if not summary.SPEED_JSON.is_file():
        pytest.skip("benchmarks/results/speed_vs_reference.json not measured yet")
    fields = {"ours_sps", "reference_sps", "ratio", "reps", "machine", "command", "date"}
    for script, entry in json.loads(summary.SPEED_JSON.read_text()).items():
        assert fields <= set(entry), f"{script}: missing {fields - set(entry)}"
        assert entry["ratio"] == pytest.approx(entry["ours_sps"] / entry["reference_sps"], rel=0.01)


# ---- benchmarks/sb3_monitor.py: Stable-Baselines3 monitor CSVs -> a run.py-style JSON ----
def test_sb3_monitor_orders_games_by_end_time_and_estimates_steps(tmp_path):
    spec = importlib.util.spec_from_file_location("sb3_monitor_under_test", REPO / "benchmarks" / "sb3_monitor.py")
    sb3_monitor = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sb3_monitor)
    # two envs; env 1 started 0.5 s later. Games (score, frames, seconds since that env's start)
    (tmp_path / "0.monitor.csv").write_text('#{"t_start": 100.0, "env_id": "X"}\nr,l,t\n1.0,400,10.0\n3.0,800,30.0\n')
    (tmp_path / "1.monitor.csv").write_text('#{"t_start": 100.5, "env_id": "X"}\nr,l,t\n2.0,200,19.0\n')
    games = sb3_monitor.read_monitors(tmp_path, n_envs=2, frame_skip=4)
    # end times 110.0, 119.5, 130.0; steps = 2 envs * cumulative frames / 4
    assert games["returns"].tolist() == [1.0, 2.0, 3.0]
    assert games["steps"].tolist() == [200, 100, 600]
    assert games["wall_time_s"] == pytest.approx(30.0)


from benchmarks import aggregate  # noqa: E402


def test_normalized_score_is_zero_at_random_and_one_at_the_reference():
    scores = np.array([18.67, 2382.86, 4747.05])
    assert aggregate.normalized(scores, 18.67, 2382.86) == pytest.approx([0.0, 1.0, 2.0])


def test_iqm_is_the_mean_of_the_middle_half_with_an_interval_around_it():
    """8 runs over 2 tasks: the IQM drops the lowest and highest quarter (1, 2 and 7, 8) and averages 3-6."""
    matrix = np.array([[1.0, 5.0], [2.0, 6.0], [3.0, 7.0], [4.0, 8.0]])  # (seeds, tasks)
    iqm, low, high = aggregate.iqm_interval(matrix, reps=2_000)  # the reports' 50,000 resamples take ~20 s here
    assert iqm == pytest.approx(4.5)
    assert 1.0 <= low < iqm < high <= 8.0


def test_task_row_reports_an_interval_from_three_seeds_and_min_max_below():
    report = {
        "per_seed": [{"status": "ok", "last100_mean": v} for v in (100.0, 200.0, 300.0)],
        "machine": {"cpu_model": "x"},
        "reference": {"value": 400.0, "std": 10.0},
    }
    row = aggregate.task_row("T", report, random=0.0)
    assert (row["mean"], row["n"]) == (200.0, 3) and row["std"] == pytest.approx(81.65, abs=0.01)
    assert 100.0 <= row["ci95"][0] < 200.0 < row["ci95"][1] <= 300.0 and "min_max" not in row
    assert row["normalized_per_seed"] == [0.25, 0.5, 0.75]
    two = aggregate.task_row("T", {**report, "per_seed": report["per_seed"][:2], "reference": None}, random=None)
    assert two["min_max"] == (100.0, 200.0) and "ci95" not in two and "normalized_per_seed" not in two


# ---- benchmarks/speed_vs_reference.py: ours against the reference, side by side ----
def load_speed_harness():
    spec = importlib.util.spec_from_file_location(
        "speed_vs_reference_under_test", REPO / "benchmarks" / "speed_vs_reference.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_speed_harness_alternates_the_two_and_takes_the_median_of_marginal_rates():
    speed = load_speed_harness()
    calls = []
    # start-up 3 s (ours) and 5 s (the reference) cancel out; the rates per rep: ours 1000, 500, 800; reference 400 each
    ours_rates, reference_rates = iter([1000, 1000, 500, 500, 800, 800]), iter([400] * 6)

    def ours(steps):
        calls.append(("ours", steps))
        return 3.0 + steps / next(ours_rates)

    def reference(steps):
        calls.append(("reference", steps))
        return 5.0 + steps / next(reference_rates)

    result = speed.measure(ours, reference, 1000, 5000, reps=3)
    assert calls[:4] == [("ours", 1000), ("reference", 1000), ("ours", 5000), ("reference", 5000)] and len(calls) == 12
    assert result["per_rep"]["ours"] == pytest.approx([1000, 500, 800])
    assert result["ours_sps"] == pytest.approx(800) and result["reference_sps"] == pytest.approx(400)
    assert result["ratio"] == pytest.approx(2.0) and result["reps"] == 3
    with pytest.raises(ValueError, match="not slower"):
        speed.marginal_sps(1000, 5000, 4.0, 3.0)


def test_speed_harness_runs_two_commands_and_prints_their_ratio(tmp_path):
    """End to end with two fake 'scripts' that sleep 2 ms (ours) and 4 ms (the reference) per step after a start-up."""
    fake = tmp_path / "fake.py"
    fake.write_text("import sys, time\ntime.sleep(0.05 + int(sys.argv[2]) * float(sys.argv[1]))\n")
    py = sys.executable
    proc = subprocess.run(
        [py, str(REPO / "benchmarks" / "speed_vs_reference.py"), "--ours", f"{py} {fake} 0.002 {{steps}}"]
        + ["--reference", f"{py} {fake} 0.004 {{steps}}", "--n1", "50", "--n2", "250", "--reps", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    ratio = float(re.search(r"^ratio (\S+)", proc.stdout, re.M).group(1))
    assert ratio == pytest.approx(2.0, rel=0.25), proc.stdout


def test_speed_harness_names_the_pinned_references():
    speed = load_speed_harness()
    assert re.fullmatch(r"[0-9a-f]{40}", speed.CLEANRL_COMMIT)
    assert set(speed.BUDGETS) == {"ppo_continuous.py", "sac_continuous.py", "ppo_atari.py", "a2c_atari.py"}
    ours, reference = speed.commands("sac_continuous.py", "py", Path("/c"), Path("/r"))
    assert "sac_continuous.py --env-id HalfCheetah-v4 --total-timesteps {steps}" in ours
    assert reference.startswith("PYTHONPATH=/c /r/venv/bin/python /c/cleanrl/sac_continuous_action.py --env-id HalfCheetah")
    assert "benchmarks/sb3_a2c.py {steps}" in speed.commands("a2c_atari.py", "py", Path("/c"), Path("/r"))[1]


def test_the_reference_command_finds_cleanrl_utils_from_any_folder(tmp_path):
    """CleanRL's scripts import cleanrl_utils from the clone's top level; the harness runs them in a temporary folder
    (a first run of the harness failed there: ModuleNotFoundError). A stand-in clone and reference venv."""
    speed = load_speed_harness()
    clone, venv_bin, elsewhere = tmp_path / "cleanrl", tmp_path / "ref" / "venv" / "bin", tmp_path / "elsewhere"
    for folder in (clone / "cleanrl", clone / "cleanrl_utils", venv_bin, elsewhere):
        folder.mkdir(parents=True)
    (clone / "cleanrl_utils" / "__init__.py").write_text("")
    (clone / "cleanrl" / "ppo_continuous_action.py").write_text("import cleanrl_utils\n")
    (venv_bin / "python").symlink_to(sys.executable)
    _, reference = speed.commands("ppo_continuous.py", "py", clone, tmp_path / "ref")
    proc = subprocess.run(reference.format(steps=8), shell=True, cwd=elsewhere, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
