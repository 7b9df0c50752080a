"""The README's trainer example runs as printed, on the embedded store and on a real Redis."""

from __future__ import annotations

import re
from pathlib import Path

import redisync

from .conftest import backend_url

README = Path(__file__).resolve().parents[1] / "README.md"


def example(heading: str = "## Using it from a trainer") -> str:
    text = README.read_text()
    section = text[text.index(heading) :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_example_runs(backend, monkeypatch):
    url = backend_url(backend)
    if url:
        monkeypatch.setenv("REDISYNC_URL", url)
    else:
        monkeypatch.delenv("REDISYNC_URL", raising=False)
    redisync.connect(run="humanoid-v3").delete()
    namespace: dict = {}
    try:
        exec(compile(example(), str(README), "exec"), namespace)
        assert namespace["result"].status == "applied"
        assert namespace["pooled"]["sum"][3] == 0.02 and namespace["pooled"]["count"] == 1
        assert namespace["fleet"].fleet_version == 1
    finally:
        redisync.connect(run="humanoid-v3").delete()


def test_readme_collector_loop_runs(backend, monkeypatch):
    url = backend_url(backend)
    if url:
        monkeypatch.setenv("REDISYNC_URL", url)
    else:
        monkeypatch.delenv("REDISYNC_URL", raising=False)
    namespace: dict = {}
    try:
        exec(compile(example("## A collector loop"), str(README), "exec"), namespace)
        metrics = namespace["metrics"]
        assert metrics["redisync/publishes"] >= 1 and metrics["redisync/worker_errors"] == 0
        assert "redisync/motion/bin_failed/drift_tv" in metrics
    finally:
        redisync.connect(run="humanoid-v3-collectors").delete()
