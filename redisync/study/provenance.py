"""What a run file records of where it came from: the commit (dirty when a tracked file changed or an
untracked one exists), every installed package's version, the host and its CPU, the start time, all
taken when the run starts.

A run reproduces bit for bit only within one code version (the first follow-up's gate moved at the 4th
decimal after code changes), so a run file says which one made it.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..errors import ConfigurationError

HERE = Path(__file__).resolve().parent


def _git(*args: str, where: Path = HERE) -> str:
    return subprocess.run(["git", *args], cwd=where, capture_output=True, text=True, timeout=10, check=True).stdout


def commit(where: Path = HERE) -> str | None:
    """The checkout's commit, with ``+dirty`` when its files differ from it: a tracked file changed,
    or an untracked one that git does not ignore (a new module the run imported is code the commit
    does not hold); None outside a checkout."""
    try:
        head = _git("rev-parse", "HEAD", where=where).strip()
        dirty = _git("status", "--porcelain", "--untracked-files=all", where=where).strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")


def diff_sha256(where: Path = HERE) -> str | None:
    """The SHA-256 of ``git diff HEAD`` and of every untracked file that git does not ignore (its
    path and bytes): which uncommitted change a dirty run ran with; None on a clean tree or outside
    a checkout."""
    try:
        diff = _git("diff", "HEAD", where=where)
        top = Path(_git("rev-parse", "--show-toplevel", where=where).strip())
        untracked = _git("ls-files", "--others", "--exclude-standard", "-z", where=where).split("\0")
    except (OSError, subprocess.SubprocessError):
        return None
    digest = hashlib.sha256(diff.encode())
    for name in sorted(n for n in untracked if n):
        digest.update(b"\0untracked\0" + name.encode() + b"\0")
        with contextlib.suppress(OSError):
            digest.update((top / name).read_bytes())
    return digest.hexdigest() if diff or any(untracked) else None


def require_clean(what: str) -> None:
    """Refuse to start a recorded run from a tree that differs from its commit (a changed tracked
    file, an untracked one): its record could not say which code made it."""
    found = commit()
    if found is not None and found.endswith("+dirty"):
        raise ConfigurationError(
            f"{what}: the checkout has uncommitted changes or untracked files ({found}; see git status); commit "
            "or remove them first, so "
            "that each run file names the code that made it (or pass --allow-dirty: the diff's SHA-256 is recorded)"
        )


def versions() -> dict[str, str]:
    """Python's version and every installed distribution's (lupa, fakeredis and BLAS wheels included:
    a run that does not rerun bit for bit is compared package by package), by name."""
    found = {"python": platform.python_version()}
    for dist in sorted(importlib.metadata.distributions(), key=lambda d: str(d.metadata["Name"] or "").lower()):
        name = dist.metadata["Name"]
        if name:
            found.setdefault(str(name).lower(), dist.version)
    return found


def host() -> dict[str, Any]:
    """The machine a run ran on: its name, OS, CPU model and count, and the thread settings that
    change floating-point reductions (BLAS and OpenMP threads)."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    threads = {k: v for k, v in os.environ.items() if k.endswith("_NUM_THREADS")}
    return {
        "hostname": platform.node(),
        "system": platform.platform(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0] + " " + platform.python_implementation(),
        "thread_settings": threads,
    }


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def provenance(started: str) -> dict[str, Any]:
    """What a run file records beside its configuration and its run: taken when the run starts (the
    code that ran, not the code checked out when it ended)."""
    found = {"commit": commit(), "packages": versions(), "host": host(), "started": started}
    if str(found["commit"]).endswith("+dirty"):
        found["diff_sha256"] = diff_sha256()
    return found
