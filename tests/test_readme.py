"""The README's trainer example runs as printed, on the embedded store and on a real Redis."""

from __future__ import annotations

import re
from pathlib import Path

import redisync

from .conftest import backend_url

README = Path(__file__).resolve().parents[1] / "README.md"


def example() -> str:
    text = README.read_text()
    section = text[text.index("## Using it from a trainer") :]
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
