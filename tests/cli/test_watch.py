"""`redisync watch`: each shard's drift and lease, live, through a store that goes and comes back."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest

import redisync as redisync_api
from redisync.store.schema import Schema, merge

from .conftest import cli, ctrl_c_default


def watch_rows(stdout: str) -> dict[str, dict[str, str]]:
    """The last frame's shard rows of ``redisync watch``'s piped output, by column header (the
    columns are at least two spaces apart; a header has single spaces)."""
    lines = stdout.splitlines()
    start = max(i for i, l in enumerate(lines) if l.startswith("shard  "))
    headers = re.split(r"\s{2,}", lines[start].strip())
    rows = {}
    for line in lines[start + 2 :]:
        if not line[:1].isdigit():
            break
        cells = re.split(r"\s{2,}", line.strip())
        rows[cells[0]] = dict(zip(headers, cells, strict=True))
    return rows


def test_watch_shows_per_shard_drift_and_stops(populated):
    """`redisync watch --count 2` prints each shard's drift from the fleet twice, then stops."""
    url, store = populated
    out = cli("watch", "--url", url, "--run", store.run, "--count", "2", "--interval", "0.1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("fleet version 4") == 2
    assert "rejected reports 1" in out.stdout
    rows = watch_rows(out.stdout)
    # each shard's own distribution is mostly its own hot bin: far from the pooled one
    assert set(rows) == {"0", "1", "2"}
    assert all(0.4 < float(r["motion/bin_failed TV without sync"]) < 0.7 for r in rows.values())
    # each report came from a new client that had seen no fleet version: the versions before its own
    assert {shard: r["behind"] for shard, r in rows.items()} == {"0": "3", "1": "1", "2": "2"}
    # no state this view recorded is as old as what they had seen: not judged yet
    assert {r["motion/bin_failed TV sampling"] for r in rows.values()} == {"-"}


def test_watch_judges_what_each_shard_samples_from_the_fleet_state_it_had_seen(cli_url):
    """A synced shard samples the rest of the fleet as of the version it held, plus its own EMA: the
    view shows that distance beside the one without sync, and catches a shard that saw an old state."""
    store = redisync_api.connect(cli_url, run=f"cli-sampled-{uuid.uuid4().hex[:8]}")
    store.register(Schema.of({"motion/bin_failed": merge(4, lifecycle="state")}))
    own = {0: np.eye(4)[0] + 0.1, 1: np.eye(4)[1] + 0.1}
    shards = {i: store.shard(i) for i in own}
    proc = subprocess.Popen(
        [sys.executable, "-m", "redisync.cli", "watch", "--url", cli_url, "--run", store.run, "--interval", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for i in own:
            shards[i].publish({"motion/bin_failed": {"count": 1, "sum": own[i]}})  # versions 1, 2

        def frame_at(version: int) -> str:
            """The first whole frame showing ``version`` (each ends with the dim legend's last line)."""
            text = ""
            while True:
                line = proc.stdout.readline()
                assert line, proc.stderr.read()
                text = line if line.startswith("run ") else text + line
                if line.startswith("pooled entropy") and f"fleet version {version} " in text:
                    return text

        frame_at(2)  # the view has recorded version 2
        for i in own:
            shards[i].pull()  # both see version 2
        shards[0].publish({"motion/bin_failed": {"count": 1, "sum": own[0]}})  # version 3, had seen 2
        own[1] = np.eye(4)[2] + 0.1  # shard 1's failures moved to bin 2
        shards[1].publish({"motion/bin_failed": {"count": 1, "sum": own[1]}})  # version 4, had seen 2
        rows = watch_rows(frame_at(4))
    finally:
        proc.kill()
        proc.communicate()
        store.delete()
    pooled_then = np.eye(4)[0] + np.eye(4)[1] + 0.2
    pooled_now = own[0] + own[1]

    def tv(a, b):
        return 0.5 * np.abs(a / a.sum() - b / b.sum()).sum()

    sampled = {0: pooled_then - own[0] + own[0], 1: pooled_then - (np.eye(4)[1] + 0.1) + own[1]}
    for i in own:
        row = rows[str(i)]
        assert row["behind"] == str(i)  # shard 0 made version 3 having seen 2, shard 1 made 4
        assert float(row["motion/bin_failed TV sampling"]) == pytest.approx(tv(sampled[i], pooled_now), abs=1e-4)
        assert float(row["motion/bin_failed TV without sync"]) == pytest.approx(tv(own[i], pooled_now), abs=1e-4)
    # shard 0 samples a fleet that no longer holds shard 1's move; shard 1 holds all of it
    assert float(rows["0"]["motion/bin_failed TV sampling"]) > 0.2
    assert float(rows["1"]["motion/bin_failed TV sampling"]) == 0.0


def test_watch_started_before_the_run_exists_waits_for_it(real_url):
    """It exited with 'not registered'; a user starts it beside a training about to register."""
    run = f"cli-later-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "redisync.cli",
            "watch",
            "--url",
            real_url,
            "--run",
            run,
            "--count",
            "40",  # refreshes, the waiting ones included: at least 4 s
            "--interval",
            "0.1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    store = redisync_api.connect(real_url, run=run)
    try:
        assert proc.stdout is not None
        said = ""  # (register once it has said it waits: however long its start took on a loaded machine)
        while f"waiting for run {run!r}" not in said and proc.poll() is None:
            said += proc.stdout.readline()
        assert proc.poll() is None  # still waiting
        store.register({"obs/norm": merge(2, lifecycle="history")})
        out, err = proc.communicate(timeout=30)
        out = said + out
        assert proc.returncode == 0, err
        assert out.count(f"waiting for run {run!r}") == 1  # said once, not at every refresh
        assert "fleet version 0" in out
    finally:
        proc.kill()
        store.delete()


def test_watch_exits_cleanly_on_ctrl_c(populated):
    """`redisync watch` ends on Ctrl-C with status 0 and no traceback."""
    url, store = populated
    proc = subprocess.Popen(
        [sys.executable, "-m", "redisync.cli", "watch", "--url", url, "--run", store.run, "--interval", "0.1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ctrl_c_default,
    )
    first = proc.stdout.readline()  # watching (a fixed sleep could end while a loaded machine still imports)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert first
    assert "stopped" in out
    assert "Traceback" not in err


def test_watch_measures_each_key_by_its_kind(cli_url):
    """Moments: each shard's mean offset in pooled sds; distributions: TV and entropy; signed sums and
    one-element keys: nothing (they are not distributions); never a negative zero."""
    store = redisync_api.connect(cli_url, run=f"cli-kinds-{uuid.uuid4().hex[:8]}")
    store.register(
        Schema.of(
            {
                "obs/norm": merge(2, sumsq=True, lifecycle="history"),
                "motion/bin_failed": merge(4, lifecycle="history"),
                "curriculum/delta": merge(3, lifecycle="history"),
                "motion/one": merge(1, lifecycle="history"),
            }
        )
    )
    try:
        for shard, mean in ((0, np.array([0.0, 0.0])), (1, np.array([2.0, 0.0]))):
            x = mean + np.array([[1.0, 1.0], [-1.0, -1.0]])  # sd 1 around the shard's mean
            store.shard(shard).publish(
                {
                    "obs/norm": {"count": 2, "sum": x.sum(0), "sumsq": (x**2).sum(0)},
                    "motion/bin_failed": {"count": 1, "sum": np.array([1.0, 1.0, 1.0, 1.0])},  # identical: TV 0
                    "curriculum/delta": {"count": 1, "sum": np.array([1.0, -2.0, 0.5])},
                    "motion/one": {"count": 1, "sum": 3.0},
                }
            )
        out = cli("watch", "--url", cli_url, "--run", store.run, "--count", "1")
        assert out.returncode == 0, out.stderr
        assert "curriculum/delta" not in out.stdout
        assert "motion/one" not in out.stdout
        rows = watch_rows(out.stdout)
        # pooled: mean (1, 0), variance 1 + 1 = 2; each shard's mean is 1 away in the first element
        assert set(rows) == {"0", "1"}
        assert all(
            float(r["obs/norm |mean offset| (pooled sd)"]) == pytest.approx(0.71, abs=0.01) for r in rows.values()
        )
        assert all(r["motion/bin_failed TV without sync"] == "0.0000" for r in rows.values())
        assert all(r["motion/bin_failed entropy"] == "1.000" for r in rows.values())
        assert "-0.0" not in out.stdout
    finally:
        store.delete()


def _watch(url: str, run: str, count: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "redisync.cli", "watch", "--url", url, "--run", run, "--interval", "0.1"]
    return subprocess.Popen([*cmd, "--count", str(count)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_line(proc: subprocess.Popen, words: str, timeout: float = 60) -> list[str]:
    """The lines ``proc`` printed up to the first holding ``words``."""
    lines, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if words in line:
            return lines
    pytest.fail(f"never printed {words!r}: {''.join(lines)[-2000:]} {proc.stderr.read() if proc.poll() else ''}")


@pytest.mark.integration  # a redis-server of its own
@pytest.mark.parametrize("event", ["restart", "run_lost", "refused"])
def test_watch_lives_through_the_store(tmp_path, event):
    """A store restarted without persistence, a run lost and registered again, a connection refused
    for a while: watch says what it waits for, once, and carries on (it died with a traceback:
    KeyError 'fleet_version')."""
    from ..servers import RedisProcess

    server = RedisProcess(tmp_path)
    if event != "refused":
        server.start()
    schema = {"obs/norm": merge(2, lifecycle="history")}
    run = "watched"
    if event != "refused":
        redisync_api.connect(server.url, run=run).register(schema)
    proc = _watch(server.url, run, 100_000)
    try:
        if event == "refused":
            _wait_for_line(proc, "waiting for the store")
            server.start()
            redisync_api.connect(server.url, run=run).register(schema)
        else:
            _wait_for_line(proc, "fleet version 0")
            if event == "restart":
                server.kill()
                _wait_for_line(proc, "waiting for the store")
                server.start()
                _wait_for_line(proc, "is gone from")
            else:
                redisync_api.connect(server.url, run=run).delete()
                _wait_for_line(proc, "is gone from")
            store = redisync_api.connect(server.url, run=run)
            store.register(schema)
            store.shard(0).publish({"obs/norm": {"count": 1, "sum": [1.0, 1.0]}})
        _wait_for_line(proc, "fleet version")
        assert proc.poll() is None  # still watching
    finally:
        proc.kill()
        proc.communicate()  # reaps it and closes its pipes
        server.kill()


def test_watch_says_a_run_finished_labels_its_sparklines_and_prints_its_legend_once(cli_url):
    """Every collector stopped (its lease given up): the view says the run finished and each shard's
    lease 'stopped'; refreshes without a sampled distance draw blanks, not the lowest block (which read
    as zero); each sparkline names its range; a pipe gets the legend once, not in every frame."""
    store = redisync_api.connect(cli_url, run=f"cli-finished-{uuid.uuid4().hex[:8]}")
    store.register(Schema.of({"motion/bin_failed": merge(4, lifecycle="history")}))  # (slots kept at the stop)
    try:
        for i in range(2):
            shard = store.shard(i)
            shard.publish({"motion/bin_failed": {"count": 1, "sum": np.eye(4)[i] + 0.1}})
            store.lease(i, shard.incarnation, 5_000)
            store.lease(i, shard.incarnation, 0)  # a clean stop
        out = cli("watch", "--url", cli_url, "--run", store.run, "--count", "3", "--interval", "0.1")
        assert out.returncode == 0, out.stderr
        assert out.stdout.count("finished: every collector stopped and gave its lease up") == 3
        assert {r["lease"] for r in watch_rows(out.stdout).values()} == {"stopped"}
        assert out.stdout.count("TV sampling: the distance") == 1
        sampled = [l for l in out.stdout.splitlines() if l.startswith("worst TV sampling")][-1]
        assert sampled.split("  0 to ")[0].removeprefix("worst TV sampling").strip() == ""  # blanks: no value yet
        unsynced = [l for l in out.stdout.splitlines() if l.startswith("worst TV w/o sync")][-1]
        assert unsynced.endswith(f"0 to {float(watch_rows(out.stdout)['0']['motion/bin_failed TV without sync']):.3g}")
    finally:
        store.delete()


def test_watch_tells_a_run_whose_trainer_died_from_a_finished_one(cli_url):
    """Every collector gave its lease up, one because the trainer that started it died: the view says
    the run ended without finishing, and that shard's lease reads 'aborted'."""
    store = redisync_api.connect(cli_url, run=f"cli-aborted-{uuid.uuid4().hex[:8]}")
    store.register(Schema.of({"motion/bin_failed": merge(4, lifecycle="history")}))
    try:
        for i, cause in enumerate(("clean", "parent_exited")):
            shard = store.shard(i)
            shard.publish({"motion/bin_failed": {"count": 1, "sum": np.eye(4)[i] + 0.1}})
            store.lease(i, shard.incarnation, 5_000)
            store.lease(i, shard.incarnation, 0, cause)
        out = cli("watch", "--url", cli_url, "--run", store.run, "--count", "1", "--interval", "0.1")
        assert out.returncode == 0, out.stderr
        assert "finished: every" not in out.stdout
        assert "ended without finishing: every collector has stopped, 1 of them because" in " ".join(out.stdout.split())
        assert {k: r["lease"] for k, r in watch_rows(out.stdout).items()} == {"0": "stopped", "1": "aborted"}
    finally:
        store.delete()


def test_the_live_view_fits_80_columns(cli_url):
    """In a terminal of 80 columns: short column headers, the keys named below, nothing cut."""
    from rich.console import Console

    from redisync.cli.watch import WatchState, frame

    store = redisync_api.connect(cli_url, run=f"cli-narrow-{uuid.uuid4().hex[:8]}")
    store.register(
        Schema.of(
            {"motion/bin_failed": merge(4, lifecycle="state"), "obs/norm": merge(2, sumsq=True, lifecycle="history")}
        )
    )
    try:
        for i in range(3):
            store.shard(i).publish(
                {
                    "motion/bin_failed": {"count": 1, "sum": np.eye(4)[i] + 0.1},
                    "obs/norm": {"count": 2, "sum": np.array([1.0, i]), "sumsq": np.array([1.0, 1.0 + i * i])},
                }
            )
        console = Console(width=80, record=True, force_terminal=False, highlight=False)
        console.print(frame(store, cli_url, WatchState(), compact=True))
        text = console.export_text()
        assert max(len(line) for line in text.splitlines()) <= 80
        assert "…" not in text
        assert "1: motion/bin_failed" in text
        assert "2: obs/norm" in text
    finally:
        store.delete()


def test_watch_count_bounds_the_waiting_too(real_url):
    """`watch --count 2` on a run nobody registers ends after two refreshes, saying what it waited for
    (it used to wait for ever: only drawn frames were counted), with status 1: it never showed the run."""
    run = f"cli-never-{uuid.uuid4().hex[:8]}"
    out = cli("watch", "--url", real_url, "--run", run, "--count", "2", "--interval", "0.1")
    assert out.returncode == 1, out.stderr
    assert "after 2 refreshes" in out.stderr
    assert out.stdout.count(f"waiting for run {run!r}") == 1
