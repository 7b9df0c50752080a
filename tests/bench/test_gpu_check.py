"""scripts/gpu-check and its benchmark: what runs of them on a machine without a GPU."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.extras("torch")
def test_gpu_check_refuses_a_machine_without_cuda_and_says_why(tmp_path):
    """scripts/gpu-check on a machine without CUDA exits 2 saying so, before making its environment."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device: scripts/gpu-check would run for real")
    existed = (ROOT / ".venv-gpu").exists()
    done = subprocess.run(
        [str(ROOT / "scripts" / "gpu-check"), "--out", str(tmp_path)],
        env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "no CUDA device" in done.stderr
    assert (ROOT / ".venv-gpu").exists() == existed  # it stopped before making anything


@pytest.mark.extras("torch")
def test_the_device_hot_path_benchmark_measures_both_loops_and_the_rebuild():
    """Its figures on the CPU (the same code scripts/gpu-check runs on CUDA): every step timed with
    sync on and off, the syncer's calls timed, reports published, a rebuild timed."""
    from redisync.bench.terms import format_device_hot_path, measure_device_hot_path

    r = measure_device_hot_path("cpu", envs=128, bins=50, steps=40)
    assert r["publishes"] > 0
    for key in ("step_us_p50_sync_off", "step_us_p50_sync_on", "syncer_calls_us_p50", "rebuild_device_us"):
        assert r[key] > 0
    assert r["step_us_p99_sync_on"] >= r["step_us_p50_sync_on"]
    text = format_device_hot_path(r)
    assert "128 envs, 50 bins" in text
    assert "us of wall time" in text
