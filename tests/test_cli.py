"""The command line end to end: demo, bench and inspect, on the embedded store and a real Redis."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest

import redisync as redisync_api
from redisync.store import codec
from redisync.store.client import serve_embedded
from redisync.store.schema import Schema, broadcast, merge

from .conftest import real_redis_or_skip


def _ctrl_c_default() -> None:
    """In the child: SIGINT as a terminal delivers it, even when this test runs in a background job
    (which starts with SIGINT ignored, and Python then installs no KeyboardInterrupt handler)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def cli(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "redisync.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("backend", ["embedded", "real"])
@pytest.mark.integration  # a fleet of collector processes
@pytest.mark.extras("torch", "tqdm", "matplotlib")
def test_demo_shows_drift_without_sync_and_agreement_with_it(backend, tmp_path):
    """`redisync demo` shows the shards' distributions drifting apart without sync and agreeing with it, on
    either backend."""
    url = ["--url", real_redis_or_skip()] if backend == "real" else []
    run = f"demo-test-{uuid.uuid4().hex[:8]}"
    try:
        out = cli(
            "demo",
            *url,
            "--run",
            run,
            "--shards",
            "2",
            "--steps",
            "2000",
            "--envs",
            "512",
            "--out",
            str(tmp_path),
            "--no-progress",
        )
    finally:
        if url:  # with --url the demo keeps its run
            redisync_api.connect(url[1], run=run).delete()
    assert out.returncode == 0, out.stderr
    assert (f"run {run!r} kept at" in out.stdout) == bool(url)
    off, on = out.stdout.split("sync ON")
    worst_off = float(off.rsplit("largest TV distance from the pooled distribution:", 1)[1].split()[0])
    worst_on = float(on.rsplit("largest TV distance from the pooled distribution:", 1)[1].split()[0])
    assert worst_off > 0.1
    assert worst_on < worst_off / 4
    publishes = int(on.split(" publishes")[0].rsplit(", ", 1)[1])
    # each collector's last report is published at its stop, however fast the machine (how many due
    # reports the sidecar coalesced on the way depends on the load; agreement is checked above)
    assert publishes >= 2
    png = tmp_path / "demo.png"
    assert png.stat().st_size > 20_000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.integration  # two bench runs, each with publisher processes of its own
def test_bench_prints_figures_and_the_targets_only_for_developers(real_url):
    """A user read 'target ...: MISSED' lines as a broken install: targets are behind --targets."""
    args = ("bench", "--url", real_url, "--calls", "20", "--procs", "2", "--seconds", "0.3")
    plain, dev = cli(*args), cli(*args, "--targets")
    assert plain.returncode == 0, plain.stderr
    assert dev.returncode == 0, dev.stderr
    assert "PING median" in plain.stdout
    assert "publish us" in plain.stdout
    assert "target" not in plain.stdout
    assert "target pull_unchanged_over_ping<=1.15:" in dev.stdout


def test_bench_json_on_real_redis(real_url):
    """`redisync bench --json` prints every figure, each publish beside its transport floor measured in the
    same run."""
    out = cli("bench", "--url", real_url, "--json", "--calls", "20", "--procs", "2", "--seconds", "0.5")
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["ping_us"] > 0
    assert [s["elements"] for s in res["sizes"]] == [64, 1024, 16384]
    for s in res["sizes"]:
        assert s["publish_us"] > 0
        assert s["server_fold_us"] > 0
        assert s["pull_changed_us"] > 0
        assert s["publish_floor_us"] > 0  # the transport floor, in the same run
        assert s["publish_over_floor"] == pytest.approx(s["publish_us"] / s["publish_floor_us"])
        assert s["pull_changed_polled_us"] > 0
    c = res["concurrency"]
    assert c["lua_publishes_per_s"] > 0
    assert c["watch_publishes_per_s"] > 0
    assert set(res["targets"]) >= {"pull_unchanged_over_ping<=1.15", "server_fold_ns_per_value_at_4_slots<=200"}
    assert not any("publish_64_over_ping" in name for name in res["targets"])  # retired: it measured PING
    assert all(s["slots"] == 4 for s in res["sizes"])
    assert res["server_fold_ns_per_value"] is not None
    from redisync.bench.core import PHASES

    profile = res["fold_profile_us"]["1024"]  # every phase of the fold, read off the server's clock
    assert list(profile) == [name for name, _ in PHASES]
    assert all(v >= 0 for v in profile.values())
    assert profile["validate and compute"] > 0


@pytest.fixture(params=["embedded", "real"])
def cli_url(request):
    """A store the CLI subprocesses reach: a real Redis, or the embedded server served over TCP."""
    if request.param == "real":
        yield real_redis_or_skip()
        return
    server = serve_embedded()
    yield server.url
    server.close()


@pytest.fixture
def populated(cli_url):
    """A run with three shards, a broadcast decision and one rejected report."""
    store = redisync_api.connect(cli_url, run=f"cli-{uuid.uuid4().hex[:8]}")
    store.register(
        Schema.of(
            {
                "motion/bin_failed": merge(4, stale_after_s=60, lifecycle="state"),
                "curriculum/scale": broadcast((), owner=0),
            }
        )
    )
    for shard in range(3):
        store.shard(shard).publish({"motion/bin_failed": {"count": 1, "sum": np.eye(4)[shard] + 0.1}})
    store.shard(0).publish({"curriculum/scale": {"value": 0.5}})
    with pytest.raises(
        redisync_api.errors.NotOwner
    ):  # a misbehaving client skips the client-side check: the server refuses
        store.shard(2).publish_payloads({"curriculum/scale": codec.encode([np.array([0.9])])}, seq=1)
    yield cli_url, store
    store.delete()


def test_inspect_shows_keys_slots_and_dead_letters(populated):
    """`redisync inspect` shows a run's keys with their semantics, versions, writers and slots, and its dead
    letters."""
    url, store = populated
    out = cli("inspect", "--url", url, "--run", store.run)
    assert out.returncode == 0, out.stderr
    assert f"run {store.run}" in out.stdout
    assert "fleet version 4" in out.stdout
    assert "dead letters 1" in out.stdout
    line = next(l for l in out.stdout.splitlines() if l.startswith("motion/bin_failed") and "merge" in l)
    assert line.split()[1:7] == ["merge", "4", "stale", "60.0s", "3", "0,1,2"]
    slots = [l.split() for l in out.stdout.splitlines() if l.startswith("motion/bin_failed") and "merge" not in l]
    assert [row[1] for row in slots] == ["0", "1", "2"]
    assert all(row[5:] == ["1", "live"] for row in slots)
    assert "not_owner curriculum/scale" in out.stdout
    report = json.loads(cli("inspect", "--url", url, "--run", store.run, "--json").stdout)[0]
    key = next(k for k in report["keys"] if k["key"] == "motion/bin_failed")
    assert [s["shard"] for s in key["slots"]] == [0, 1, 2]
    assert report["dead_letters"] == 1
    listing = cli("inspect", "--url", url)
    assert f"run {store.run}" in listing.stdout


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
        time.sleep(1.5)
        assert proc.poll() is None  # still waiting
        store.register({"obs/norm": merge(2, lifecycle="history")})
        out, err = proc.communicate(timeout=30)
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
        preexec_fn=_ctrl_c_default,
    )
    first = proc.stdout.readline()  # watching (a fixed sleep could end while a loaded machine still imports)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert first
    assert "stopped" in out
    assert "Traceback" not in err


def test_snapshot_and_restore_move_a_run(populated, tmp_path):
    """`redisync snapshot` then `redisync restore` moves a run's state into another run, value for value."""
    url, store = populated
    path = tmp_path / "run.json"
    out = cli("snapshot", "--url", url, "--run", store.run, str(path))
    assert out.returncode == 0, out.stderr
    assert json.loads(path.read_text())["format"] == "redisync.snapshot"
    copy = redisync_api.connect(url, run=store.run + "-copy")
    try:
        out = cli("restore", "--url", url, "--run", copy.run, str(path))
        assert out.returncode == 0, out.stderr
        want, got = store.fleet(), copy.fleet()
        for name in want.keys:
            np.testing.assert_array_equal(got.keys[name].value, want.keys[name].value)
        assert got.fleet_version > want.fleet_version
    finally:
        copy.delete()


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["inspect", "--url", "redis://127.0.0.1:1"], "Connection refused"),
        (["inspect", "--url", "http://nowhere"], "unsupported URL"),
        (["inspect", "--url", "{url}", "--run", "no-such-run"], "run 'no-such-run' is not registered"),
        (["snapshot", "--url", "{url}", "--run", "no-such-run", "/tmp/x.json"], "run 'no-such-run' is not registered"),
        (["restore", "--url", "{url}", "--run", "x", "/nonexistent/snap.json"], "/nonexistent/snap.json: no such file"),
        (["restore", "--url", "{url}", "--run", "x", __file__], "is not a redisync snapshot"),
        (["demo", "--shards", "0"], "--shards"),
        pytest.param(
            ["demo", "--url", "redis://127.0.0.1:1", "--no-progress", "--steps", "200", "--shards", "1"],
            "Connection refused",
            marks=pytest.mark.extras("torch", "tqdm", "matplotlib"),
        ),
    ],
)
def test_bad_arguments_print_one_line_and_exit_nonzero(args, words, real_url):
    """A bad argument is one line naming it and a non-zero status, no traceback."""
    out = cli(*(a.format(url=real_url) for a in args))
    assert out.returncode != 0
    assert words in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["inspect"],
        ["inspect", "--run", "demo"],
        ["watch", "--run", "demo", "--count", "1"],
        ["snapshot", "--run", "demo", "/tmp/x.json"],
        ["restore", "--run", "demo", "/tmp/x.json"],
    ],
)
def test_commands_on_a_run_refuse_the_embedded_store(args, monkeypatch, tmp_path):
    """A command that works on a run in a Redis refuses to run without a URL (status 2, saying why), and its
    help says the URL is required."""
    monkeypatch.delenv("REDISYNC_URL", raising=False)
    out = cli(*args)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert "pass --url or set REDISYNC_URL" in out.stderr
    assert "gone when this command exits" in out.stderr
    helped = cli(args[0], "--help").stdout  # and their help says so (it said "unset: embedded")
    assert "unset: embedded" not in helped
    assert "required" in " ".join(helped.split())


def test_version_and_no_password_in_what_inspect_prints(real_url):
    """`--version` prints the package's version, and nothing inspect prints holds the URL's password."""
    out = cli("--version")
    assert out.returncode == 0
    assert out.stdout.strip() == f"redisync, version {redisync_api.__version__}"
    db = real_url.rsplit("/", 1)[1]
    # a URL with a password the server ignores (requirepass unset): the run list is empty, the password masked
    out = cli("inspect", "--url", f"redis://:hunter2@127.0.0.1:6379/{db}", "--run", "no-such-run-here")
    assert "hunter2" not in out.stdout + out.stderr
    out = cli("inspect", "--url", f"redis://:hunter2@127.0.0.1:6379/{db}")
    assert "hunter2" not in out.stdout + out.stderr


def test_a_snapshot_into_a_missing_folder_is_one_line_naming_the_path(populated, tmp_path):
    """A snapshot into a folder that does not exist is one line naming the path and why, status 1."""
    url, store = populated
    path = tmp_path / "no-such-folder" / "snap.json"
    out = cli("snapshot", "--url", url, "--run", store.run, str(path))
    assert out.returncode == 1
    assert out.stderr.count("\n") == 1
    assert f"redisync: error: {path}: cannot write the snapshot there (No such file or directory)" in out.stderr


def test_url_help_lists_every_scheme_connect_takes():
    """The --url help names every scheme connect() takes."""
    out = cli("inspect", "--help")
    for scheme in ("redis://", "rediss://", "unix://", "redis+sentinel://", "redis+cluster://"):
        assert scheme in out.stdout


@pytest.mark.extras("torch")
def test_a_command_whose_extra_is_missing_says_which_before_any_work(tmp_path):
    """A command whose optional extra is not installed says which extra and how to install it, before doing
    any work."""
    blocker = tmp_path / "sitecustomize.py"  # the interpreter as a plain `pip install redisync` leaves it: no tqdm
    blocker.write_text(
        "import sys\nclass Block:\n    def find_spec(self, name, *a):\n"
        "        if name.split('.')[0] in ('tqdm', 'matplotlib'):\n            raise ImportError(name)\n"
        "sys.meta_path.insert(0, Block())\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "redisync.cli", "demo", "--steps", "2000"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert out.returncode == 1, out.stderr
    assert out.stderr.count("\n") == 1, out.stderr
    assert (
        "redisync demo needs the demo extra (tqdm, matplotlib missing): from the clone, pip install -e '.[demo]' (or scripts/setup)"
        in out.stderr
    )
    assert time.monotonic() - started < 60
    assert not (tmp_path / "out").exists()


def test_a_connection_error_names_the_url_with_its_password_masked():
    # (watch waits for a store it cannot reach, saying so with the URL masked: test_watch_lives_through_the_store)
    """A store that cannot be reached is named by its URL with the password masked, by every command."""
    out = cli("watch", "--run", "x", "--count", "1", "--url", "redis://operator:s3cret@127.0.0.1:1/0")
    assert out.returncode == 0, out.stderr
    assert "waiting for the store: redis://operator:***@127.0.0.1:1/0: " in out.stdout
    assert "s3cret" not in out.stdout + out.stderr
    for command in (
        ["inspect"],
        ["bench", "--calls", "10"],
        ["snapshot", "--run", "x", "/tmp/x.json"],
    ):
        out = cli(*command, "--url", "redis://operator:s3cret@127.0.0.1:1/0")
        assert out.returncode == 1, (command, out.stdout)
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1, (
            command,
            out.stderr,
        )
        assert lines[0].startswith("redisync: error: redis://operator:***@127.0.0.1:1/0: "), (
            command,
            out.stderr,
        )
        assert "refused" in lines[0]
        assert "s3cret" not in out.stderr
        assert "Traceback" not in out.stderr


def test_a_database_the_server_lacks_is_named_in_words(real_url):
    """A database index the server lacks is one line naming the URL and the server's 'databases' setting."""
    base = real_url.rsplit("/", 1)[0]
    out = cli("inspect", "--url", f"{base}/99")
    assert out.returncode == 1
    assert out.stderr.count("\n") == 1
    assert f"{base}/99: DB index is out of range" in out.stderr
    assert "'databases' setting" in out.stderr


def test_snapshot_errors_name_the_file_and_the_problem(populated, tmp_path):
    """A snapshot file that is missing, not JSON, not a snapshot or damaged is refused naming the file and the
    problem."""
    url, store = populated
    missing, not_json, no_run, damaged = (
        tmp_path / n for n in ("missing.json", "not.json", "norun.json", "damaged.json")
    )
    not_json.write_text("garbage")
    no_run.write_text("{}")
    assert cli("snapshot", "--url", url, "--run", store.run, str(damaged)).returncode == 0
    snap = json.loads(damaged.read_text())
    snap["hashes"]["meta"]["fleet_version"] = "not base64!"
    damaged.write_text(json.dumps(snap))
    for path, problem in (
        (missing, "no such file"),
        (not_json, "is not a redisync snapshot: not JSON"),
        (no_run, "is not a redisync snapshot: the field 'run' is missing"),
        (damaged, "meta"),
    ):
        out = cli("restore", "--url", url, "--run", store.run, str(path))
        assert out.returncode == 1, out.stderr
        assert f"redisync: error: {path}" in out.stderr, out.stderr
        assert problem in out.stderr, out.stderr
        assert out.stderr.count("\n") == 1
        assert "Traceback" not in out.stderr
    assert store.fleet().fleet_version == 4  # nothing was restored


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


@pytest.mark.integration  # a fleet of collector processes
@pytest.mark.extras("torch", "tqdm", "matplotlib")
def test_a_kept_demo_run_is_named_served_and_inspectable_until_ctrl_c(tmp_path):
    """The newcomer's path: the demo names its run and URL up front, ends with the commands that show
    it, and those commands work while the demo serves the run; Ctrl-C ends it cleanly."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "redisync.cli",
            "demo",
            "--shards",
            "2",
            "--steps",
            "400",
            "--envs",
            "128",
            "--run",
            "first-look",
            "--keep",
            "--out",
            str(tmp_path),
            "--no-progress",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_ctrl_c_default,
    )
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            if "serves the run until you press Ctrl-C" in line or not line:
                break
        text = "".join(lines)
        assert text.startswith("demo: run 'first-look' at redis://127.0.0.1:"), text
        commands = [l.strip() for l in lines if l.startswith("  redisync ") or l.startswith("  redis-cli ")]
        assert [c.split()[1] for c in commands] == ["inspect", "watch", "-u"]
        inspect = cli(*commands[0].split()[1:])
        assert inspect.returncode == 0
        assert "run first-look" in inspect.stdout
        assert "motion/bin_failed" in inspect.stdout
        watch = cli(*commands[1].split()[1:], "--count", "1")
        assert watch.returncode == 0
        assert "motion/bin_failed TV" in watch.stdout
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert "stopped" in out
    assert "Traceback" not in err


def test_inspect_lists_every_readable_run_and_says_which_keys_it_skipped(populated):
    """Keys that only look like a run's meta (a foreign string, a hash without a schema) are named
    and skipped; the real runs are listed."""
    url, store = populated
    fake = [f"redisync:{{fake-{uuid.uuid4().hex[:6]}}}:meta" for _ in range(2)]
    store.redis.set(fake[0], "not a hash")
    store.redis.hset(fake[1], "owner", "someone else")
    try:
        out = cli("inspect", "--url", url)
        assert out.returncode == 0, out.stderr
        assert f"run {store.run}" in out.stdout
        for key in fake:
            assert f"skipped {key}: " in out.stderr
        as_json = cli("inspect", "--url", url, "--json")
        assert as_json.returncode == 0
        assert store.run in [r["run"] for r in json.loads(as_json.stdout)]
    finally:
        store.redis.delete(*fake)


@pytest.mark.integration  # the study's pool of worker processes
def test_the_study_names_its_store_with_the_password_masked(tmp_path):
    """``redisync ab`` printed the URL it was given, password and all, before its first run."""
    out = cli(
        *("ab", "--smoke", "--gate-only", "--no-progress", "--out", str(tmp_path)),
        *("--url", "redis://operator:s3cret@127.0.0.1:1/0"),
    )
    assert out.returncode == 1
    assert "store: redis://operator:***@127.0.0.1:1/0" in out.stdout
    assert "s3cret" not in out.stdout + out.stderr
    assert "Connection refused" in out.stderr


def test_functions_lists_loads_and_prunes_redisync_versions(real_url):
    """``redisync functions``: the versions on a server, this build's loaded beside another's, and
    the other one retired (only redisync's libraries are touched)."""
    from redisync.store.library import Library

    store = redisync_api.connect(real_url, run="functions-cli")
    Library(store.redis, version="cli0ld").load()  # another version's library on the server
    out = cli("functions", "load", "--url", real_url)
    assert out.returncode == 0, out.stderr
    assert f"loaded redisync's functions of version {store.scripts.version}" in out.stdout
    out = cli("functions", "list", "--url", real_url)
    assert out.returncode == 0, out.stderr
    assert "cli0ld" in out.stdout
    assert re.search(rf"{store.scripts.version}.*this build", out.stdout)
    out = cli("functions", "prune", "--url", real_url)
    assert out.returncode == 0, out.stderr
    assert "redisync_cli0ld" in out.stdout
    assert "cli0ld" not in {lib.version for lib in store.functions()}
    assert store.scripts.version in {lib.version for lib in store.functions()}


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
    from .servers import RedisProcess

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
        server.kill()


def test_every_commands_summary_is_whole():
    """`redisync --help` lists each command with a summary that ends a sentence, not one cut short."""
    from click.testing import CliRunner

    from redisync.cli import cli

    listing = CliRunner().invoke(cli, ["--help"]).output.split("Commands:")[1].split("\n\n")[0]
    rows = [line.split(None, 1) for line in listing.strip().splitlines()]
    assert {name for name, _ in rows} >= {"ab", "bench", "demo", "exporter", "functions", "inspect", "watch"}
    for name, summary in rows:
        assert summary.endswith("."), (name, summary)
        assert not summary.endswith("..."), (name, summary)


def test_the_demos_follow_up_commands_run_as_pasted_when_the_url_has_a_password(tmp_path):
    """A kept run at a URL with a password: the printed commands carry no masked password (which would
    fail when pasted) and run as printed once REDISYNC_URL holds the URL; without one, the URL itself."""
    from pathlib import Path

    from redisync.cli.demo import follow_up

    from .servers import RedisProcess

    server = RedisProcess(tmp_path, None, "--requirepass", "s3cret")
    server.start_authenticated(None, "s3cret")
    url = f"redis://:s3cret@127.0.0.1:{server.port}/0"
    try:
        store = redisync_api.connect(url, run="kept")
        store.register(redisync_api.Schema.of({"obs/norm": redisync_api.merge(2, lifecycle="history")}))
        lines = follow_up(url, "kept")
        commands = [line for line in lines if line.startswith(("redisync ", "redis-cli "))]
        assert len(commands) == 3
        assert not any("***" in line or "s3cret" in line for line in commands)
        assert "s3cret" not in lines[-1]  # the note says which URL, masked
        inspect = next(line for line in lines if line.startswith("redisync inspect"))
        bin_dir = Path(sys.executable).parent
        done = subprocess.run(
            ["bash", "-c", inspect],
            env={**os.environ, "REDISYNC_URL": url, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert "obs/norm" in done.stdout
        plain = follow_up("redis://127.0.0.1:6379/0", "kept")
        assert plain[0] == "redisync inspect --url redis://127.0.0.1:6379/0 --run kept"
    finally:
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
    (it used to wait for ever: only drawn frames were counted)."""
    run = f"cli-never-{uuid.uuid4().hex[:8]}"
    out = cli("watch", "--url", real_url, "--run", run, "--count", "2", "--interval", "0.1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.count(f"waiting for run {run!r}") == 1
