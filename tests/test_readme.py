"""The README's trainer example runs as printed, on the embedded store and on a real Redis."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

import redisync
from redisync.store import codec
from redisync.terms.torch.sampler import grouped_probabilities

from .conftest import backend_url

README = Path(__file__).resolve().parents[1] / "README.md"


def example(heading: str = "## Using it from a trainer") -> str:
    text = README.read_text()
    section = text[text.index(heading) :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def use_backend(backend: str, monkeypatch) -> None:
    """Point REDISYNC_URL at the backend, as a user would (unset: the embedded store)."""
    url = backend_url(backend)
    if url:
        monkeypatch.setenv("REDISYNC_URL", url)
    else:
        monkeypatch.delenv("REDISYNC_URL", raising=False)


def test_readme_example_runs(backend, monkeypatch):
    use_backend(backend, monkeypatch)
    redisync.connect(run="humanoid-v3").delete()
    namespace: dict = {}
    try:
        exec(compile(example(), str(README), "exec"), namespace)
        assert namespace["result"].status == "applied"
        assert namespace["pooled"]["sum"][3] == 0.02
        assert namespace["pooled"]["count"] == 1
        assert namespace["fleet"].fleet_version == 1
    finally:
        redisync.connect(run="humanoid-v3").delete()


def test_readme_collector_loop_runs(backend, monkeypatch):
    use_backend(backend, monkeypatch)
    namespace: dict = {}
    try:
        exec(compile(example("## A collector loop"), str(README), "exec"), namespace)
        metrics = namespace["metrics"]
        assert metrics["redisync/publishes"] >= 1
        assert metrics["redisync/worker_errors"] == 0
        assert "redisync/motion/bin_failed/drift_tv" in metrics
    finally:
        redisync.connect(run="humanoid-v3-collectors").delete()


def _block_after(marker: str) -> str:
    text = README.read_text()
    start = text.index(marker)
    return text[start : text.index("```", start)]


def test_readme_redis_cli_section_matches_what_the_store_writes(real_url):
    import subprocess

    from redisync.store.schema import Schema, broadcast, merge

    run = "readme-cli-check"
    store = redisync.connect(real_url, run=run)
    store.delete()
    db = real_url.rsplit("/", 1)[1]
    try:
        store.register(
            Schema.of(
                {
                    "motion/bin_failed": merge(8, stale_after_s=120, lifecycle="state"),
                    "curriculum/penalty_scale": broadcast((), owner=0),
                }
            )
        )
        for shard in (0, 1):
            store.shard(shard).publish({"motion/bin_failed": {"count": 1, "sum": np.ones(8)}})
        store.shard(0).publish({"curriculum/penalty_scale": {"value": 0.5}})
        with pytest.raises(
            redisync.errors.NotOwner
        ):  # a client that skips the client-side check: refused, dead-lettered
            store.shard(1).publish_payloads({"curriculum/penalty_scale": codec.encode([np.array([0.9])])}, seq=1)

        def cli(*args: str) -> list[str]:
            host, port = real_url.split("//")[1].split("/")[0].split(":")
            out = subprocess.run(
                ["redis-cli", "-h", host, "-p", port, "-n", db, *args],
                capture_output=True,
                text=True,
                errors="backslashreplace",
                check=True,
            )
            return out.stdout.splitlines()

        # the key layout the README lists is the one SCAN finds
        listed = {
            line.split()[0].replace("{demo}", f"{{{run}}}")
            for line in _block_after("--scan --pattern 'redisync:{demo}:*'").splitlines()[1:]
            if line.strip()
        }
        assert set(cli("--scan", "--pattern", f"redisync:\\{{{run}\\}}:*")) == listed | {
            f"redisync:{{{run}}}:data:curriculum/penalty_scale",
            f"redisync:{{{run}}}:key:curriculum/penalty_scale",
            f"redisync:{{{run}}}:dead",
        }  # a run that rejected a report has its dead-letter stream too
        # every field the README shows for a key is in its HGETALL
        fields = set(cli("HGETALL", f"redisync:{{{run}}}:key:motion/bin_failed")[::2])
        shown = {
            seg.split()[0]
            for line in _block_after("HGETALL 'redisync:{demo}").splitlines()[1:]
            for seg in re.split(r"\s{2,}", line.strip())
            if seg
        }
        assert shown <= fields, shown - fields
        assert {"name", "size", "owner", "count_size", "sumsq"} <= fields
        # the dead-letter and report streams hold the fields the README names
        dead = cli("XRANGE", f"redisync:{{{run}}}:dead", "-", "+")
        for name in ("reason", "key", "detail", "shard", "incarnation", "seq", "report:curriculum/penalty_scale"):
            assert name in dead, name
        reports = cli("XRANGE", f"redisync:{{{run}}}:reports", "-", "+", "COUNT", "1")
        for name in ("shard", "incarnation", "seq", "fleet_version", "report:motion/bin_failed"):
            assert name in reports, name
    finally:
        store.delete()


def test_readme_multi_motion_loop_runs(backend, monkeypatch):
    use_backend(backend, monkeypatch)
    redisync.connect(run="motion-library").delete()
    namespace: dict = {}
    try:
        exec(compile(example("## Many motions, many env profiles"), str(README), "exec"), namespace)
        fleet, collectors = namespace["fleet"], namespace["collectors"]
        assert tuple(fleet.shape) == (4, 60)
        # the learner sees the fleet sum of every collector's own EMA: what one unsharded sampler uses
        pooled = sum(sampler.bin_failed_count.double() for sampler, *_ in collectors)
        sampler = collectors[0][0]
        want = grouped_probabilities(pooled, sampler.layout, sampler.uniform_ratio, sampler.kernel.double(), "paper")
        assert torch.allclose(fleet.double(), want.double(), rtol=1e-5, atol=1e-7)
        assert int(fleet[1, :11].argmax()) >= 6  # the cartwheel's hard landing gets the starts
        assert namespace["monitor"].metrics()["redisync/motion/bin_failed/sampling_entropy_min"] < 0.99
    finally:
        redisync.connect(run="motion-library").delete()


def test_readme_example_run_three_times_counts_its_one_writer_once(backend, monkeypatch):
    """Each run is a new process of shard 0: the EMA (state) keeps one slot, the normaliser's
    moments (history) keep every run's samples."""
    use_backend(backend, monkeypatch)
    redisync.connect(run="humanoid-v3").delete()
    try:
        for _ in range(3):
            exec(compile(example(), str(README), "exec"), {})
        fleet = redisync.connect(run="humanoid-v3").fleet()
        assert float(fleet.keys["motion/bin_failed"].parts()["count"]) == 1
        assert float(fleet.keys["obs/norm"].parts()["count"]) == 3 * 4096
    finally:
        redisync.connect(run="humanoid-v3").delete()


def test_every_readme_python_block_is_run_by_a_test_or_marked_a_fragment():
    """A block right after ``<!-- ... <tests/file.py> runs this block -->`` is run by that file (which
    finds it by its marker or its section); one after ``<!-- a fragment: why ... -->`` cannot run as
    written (the user's env, hosts) and names the tests that make its calls."""
    lines = README.read_text().splitlines()
    tests = Path(__file__).parent
    for n, line in enumerate(lines):
        if line != "```python":
            continue
        marker = lines[n - 1]
        assert marker.startswith("<!-- "), f"README.md:{n + 1}: a python block without a marker"
        assert marker.endswith(" -->"), f"README.md:{n + 1}: a python block without a marker"
        named = re.findall(r"tests/((?:\w+/)?test_\w+\.py)", marker)
        assert named, f"README.md:{n}: {marker}"
        assert all((tests / name).exists() for name in named), f"README.md:{n}: {marker}"
        if "runs this block" in marker:
            source = (tests / named[0]).read_text()
            label = marker.removeprefix("<!-- ").split(":")[0]
            assert marker in source or "example(" in source, f"README.md:{n}: {named[0]} does not run {label!r}"
        else:
            assert marker.startswith("<!-- a fragment: "), f"README.md:{n}: neither run by a test nor a fragment"
