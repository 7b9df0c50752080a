"""What a pip user gets: the wheel and the sdist carry the LICENSE, and a plain ``pip install`` of
the wheel (no extras) is a working library whose extra-needing commands say which extra to add."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.integration]


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)], check=True, capture_output=True, timeout=600
    )
    return out


def test_the_wheel_and_the_sdist_carry_the_license(dist):
    """The wheel and the sdist carry the license and the Lua files."""
    (wheel,) = dist.glob("*.whl")
    (sdist,) = dist.glob("*.tar.gz")
    names = zipfile.ZipFile(wheel).namelist()
    assert "redisync-0.1.0.dist-info/licenses/LICENSE" in names
    assert "redisync/store/lua/fold.lua" in names
    assert "License-Expression: MIT" in zipfile.ZipFile(wheel).read("redisync-0.1.0.dist-info/METADATA").decode()
    with tarfile.open(sdist) as archive:
        assert "redisync-0.1.0/LICENSE" in archive.getnames()


def test_a_plain_install_is_a_working_library_and_names_the_demo_extra(dist, tmp_path):
    """A plain install of the wheel is a working library, and the demo names the extra it needs."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    (wheel,) = dist.glob("*.whl")
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    script = (
        "import numpy as np, redisync\n"
        "store = redisync.connect(run='pip-user')\n"
        "store.register({'motion/bin_failed': redisync.merge(4, lifecycle='state')})\n"
        "print(store.shard(0).publish({'motion/bin_failed': {'count': 1, 'sum': np.ones(4)}}).status)\n"
    )
    out = subprocess.run([str(python), "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.stdout.strip() == "applied", out.stderr
    demo = subprocess.run(
        [str(venv / "bin" / "redisync"), "demo"], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert demo.returncode == 1, demo.stderr
    assert demo.stderr.count("\n") == 1, demo.stderr
    # (said the way this user installed: the wheel they installed, not a clone's editable install)
    assert (
        f"redisync demo needs the demo extra (torch, tqdm, matplotlib missing): pip install '{wheel}[demo]'"
        in demo.stderr
    )
    probe = "import redisync.terms.torch"
    torchless = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert "redisync.terms.torch needs torch" in torchless.stderr  # (was a bare "No module named 'torch'")
