"""benchmarks/env_backends.py with tiny budgets: it measures every installed backend (raw env steps/s and a script's
marginal SPS), round by round, and writes the report. The figures themselves mean nothing at these budgets."""

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytest.importorskip("ale_py")


@pytest.mark.slow  # eight fresh script runs: about 110 s on 2 cores
def test_env_backends_benchmark_reports_every_backend_per_round(tmp_path):
    out = tmp_path / "backends"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "env_backends.py"), "--reps", "2", "--num-envs", "2",
           "--warmup", "2", "--env-steps", "10", "--scripts", "a2c_atari.py", "--n1", "40", "--n2", "200",
           "--script-flags", "--torch-threads 1 --num-envs 2 --log-interval 1", "--out", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["skipped_not_installed"] == []  # both backends come with ale-py
    for backend in ("gymnasium", "ale-vector"):
        raw = report["raw_env_steps_per_s"][backend]
        assert len(raw["per_rep"]) == 2 and all(v > 0 for v in raw["per_rep"]) and raw["median"] > 0
        sps = report["script_sps"]["a2c_atari.py"][backend]
        assert len(sps["per_rep"]) == 2  # a round is None only when the larger budget was not slower
        assert f"a2c_atari.py on {backend}" in proc.stdout
        ref = report["raw_env_steps_per_s"]["gymnasium"]["median"]  # every backend's median over gymnasium's
        assert raw["vs_gymnasium"] == pytest.approx(raw["median"] / ref, abs=1e-3)
    assert report["reps"] == 2 and report["machine"]["cpu_count"] >= 1 and "raw env steps/s" in proc.stdout
