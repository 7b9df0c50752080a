"""What a run file records of where it came from: the commit, the package versions, the start time,
all taken when the run starts.

A run reproduces bit for bit only within one code version (the first follow-up's gate moved at the 4th
decimal after code changes), so a run file says which one made it.
"""

from __future__ import annotations

import datetime
import hashlib
import importlib.metadata
import platform
import subprocess
from pathlib import Path
from typing import Any

from ..errors import ConfigurationError

PACKAGES = ("redisync", "numpy", "torch", "scipy", "gymnasium", "mujoco", "redis")


def _git(*args: str) -> str:
    here = Path(__file__).resolve().parent
    return subprocess.run(["git", *args], cwd=here, capture_output=True, text=True, timeout=10, check=True).stdout


def commit() -> str | None:
    """The checkout's commit, with ``+dirty`` when tracked files differ from it; None outside a checkout."""
    try:
        head = _git("rev-parse", "HEAD").strip()
        dirty = _git("status", "--porcelain", "--untracked-files=no").strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")


def diff_sha256() -> str | None:
    """The SHA-256 of ``git diff HEAD`` (tracked files): which uncommitted change a dirty run ran
    with; None on a clean tree or outside a checkout."""
    try:
        diff = _git("diff", "HEAD")
    except (OSError, subprocess.SubprocessError):
        return None
    return hashlib.sha256(diff.encode()).hexdigest() if diff else None


def require_clean(what: str) -> None:
    """Refuse to start a recorded run from a tree whose tracked files differ from its commit: its
    record could not say which code made it."""
    found = commit()
    if found is not None and found.endswith("+dirty"):
        raise ConfigurationError(
            f"{what}: the checkout has uncommitted changes to tracked files ({found}); commit them first, so "
            "that each run file names the code that made it (or pass --allow-dirty: the diff's SHA-256 is recorded)"
        )


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
    """What a run file records beside its configuration and its run: taken when the run starts (the
    code that ran, not the code checked out when it ended)."""
    found = {"commit": commit(), "packages": versions(), "started": started}
    if str(found["commit"]).endswith("+dirty"):
        found["diff_sha256"] = diff_sha256()
    return found
