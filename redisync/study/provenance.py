"""What a run file records of where it came from: the commit, the package versions, the start time.

A run reproduces bit for bit only within one code version (the first follow-up's gate moved at the 4th
decimal after code changes), so a run file says which one made it.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import platform
import subprocess
from pathlib import Path
from typing import Any

PACKAGES = ("redisync", "numpy", "torch", "scipy", "gymnasium", "mujoco", "redis")


def commit() -> str | None:
    """The checkout's commit, with ``+dirty`` when tracked files differ from it; None outside a checkout."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")


def versions() -> dict[str, str]:
    """The installed versions of the packages a run's figures depend on (those installed)."""
    found = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def provenance(started: str) -> dict[str, Any]:
    """What a run file records beside its configuration and its run."""
    return {"commit": commit(), "packages": versions(), "started": started}
