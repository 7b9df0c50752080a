"""The sidecar's process from its collector (`redisync.collector.sidecar_supervisor`): where the sidecar
imports redisync from. (Its restarts, hangs and stops are tested with real sidecars in
test_sidecar.py, test_sidecar_faults.py and the model-based test_sidecar_life.py.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import redisync
from redisync.collector.sidecar_supervisor import _import_path


def test_the_sidecar_imports_redisync_from_where_its_collector_does_and_nothing_of_it_top_level():
    """The first entry of the sidecar's PYTHONPATH is the folder that holds this process's redisync
    package, not the package itself (which would make its modules, ``errors`` or ``cli``, importable
    as top-level modules in the sidecar, shadowing any of that name)."""
    package = Path(redisync.__file__).resolve().parent
    path = [Path(p).resolve() for p in _import_path()]
    assert path[0] == package.parent
    assert package not in path
    probe = "import importlib.util, redisync; print(redisync.__file__); print(importlib.util.find_spec('lifeline'))"
    env = {"PYTHONPATH": ":".join(map(str, path)), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True, cwd="/")
    found, lifeline = out.stdout.splitlines()
    assert Path(found).resolve() == package / "__init__.py"
    assert lifeline == "None"  # redisync's lifeline.py is redisync.lifeline only
