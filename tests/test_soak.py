"""A short soak in CI: 32 collector processes, Redis SIGKILLed and SIGSTOPped, nothing lost."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # starts redis-server processes of its own (see tests/servers.py)

SOAK = Path(__file__).resolve().parents[1] / "scripts" / "soak.py"


def _reseeds(stdout: str) -> int:
    found = re.search(r"re-seeds (\d+)", stdout)
    assert found, stdout
    return int(found.group(1))


def test_short_soak_loses_nothing():
    """A short soak of 32 collectors under a fault schedule loses nothing and counts nothing twice."""
    out = subprocess.run(
        [
            sys.executable,
            str(SOAK),
            "--collectors",
            "32",
            "--seconds",
            "20",
            "--elements",
            "1024",
            "--publish-every",
            "0.1",
            "--faults",
            "kill@6:1,stop@13:2",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    print(out.stdout)
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
    assert "lost 0" in out.stdout
    assert "NOT RECOVERED" not in out.stdout
    assert "every slot back" in out.stdout
    assert _reseeds(out.stdout) >= 1  # the kill landed on a running fleet: the run was lost and seeded again


def test_short_soak_with_sidecar_workers_loses_nothing():
    """The same faults with the process worker: 8 collectors, each with a sidecar of its own."""
    out = subprocess.run(
        [
            sys.executable,
            str(SOAK),
            "--collectors",
            "8",
            "--seconds",
            "15",
            "--elements",
            "1024",
            "--publish-every",
            "0.05",
            "--faults",
            "kill@5:1,stop@10:2",
            "--worker",
            "process",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    print(out.stdout)
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
    assert "process workers" in out.stdout
    assert "lost 0" in out.stdout
    assert "NOT RECOVERED" not in out.stdout
    assert "every slot back" in out.stdout
    assert _reseeds(out.stdout) >= 1  # the kill landed on a running fleet: the run was lost and seeded again
