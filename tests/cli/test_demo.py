"""`redisync demo`: drift without sync and agreement with it, a kept run, and the commands it prints."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

import redisync as redisync_api

from ..conftest import real_redis_or_skip
from .conftest import cli, ctrl_c_default


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
        preexec_fn=ctrl_c_default,
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
        commands = [l.strip() for l in lines if l.startswith("  ") and (" --run " in l or "redis-cli" in l)]
        assert [c.split()[1] for c in commands] == ["inspect", "watch", "-u"]
        # as pasted into a fresh shell, whose PATH has no virtual environment activated
        fresh = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")}

        def pasted(command: str) -> subprocess.CompletedProcess:
            return subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=fresh, timeout=120)

        inspect = pasted(commands[0])
        assert inspect.returncode == 0, inspect.stderr
        assert "run first-look" in inspect.stdout
        assert "motion/bin_failed" in inspect.stdout
        watch = pasted(commands[1] + " --count 1")
        assert watch.returncode == 0, watch.stderr
        assert "motion/bin_failed TV" in watch.stdout
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert "stopped" in out
    assert "Traceback" not in err


def test_the_demos_follow_up_commands_run_as_pasted_when_the_url_has_a_password(tmp_path):
    """A kept run at a URL with a password: the printed commands carry no masked password (which would
    fail when pasted) and run as printed once REDISYNC_URL holds the URL; without one, the URL itself."""
    from pathlib import Path

    from redisync.cli.demo import follow_up

    from ..servers import RedisProcess

    server = RedisProcess(tmp_path, None, "--requirepass", "s3cret")
    server.start_authenticated(None, "s3cret")
    url = f"redis://:s3cret@127.0.0.1:{server.port}/0"
    try:
        store = redisync_api.connect(url, run="kept")
        store.register(redisync_api.Schema.of({"obs/norm": redisync_api.merge(2, lifecycle="history")}))
        lines = follow_up(url, "kept")
        commands = [line for line in lines if " --run " in line or line.startswith("redis-cli ")]
        assert len(commands) == 3
        assert not any("***" in line or "s3cret" in line for line in commands)
        assert "s3cret" not in lines[-1]  # the note says which URL, masked
        inspect = next(line for line in lines if " inspect " in line)
        done = subprocess.run(
            ["bash", "-c", inspect],  # a fresh shell: no virtual environment on its PATH
            env={"REDISYNC_URL": url, "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert "obs/norm" in done.stdout
        plain = follow_up("redis://redis.example:7000/0", "kept")
        assert (
            plain[0]
            == f"{Path(sys.executable).parent / 'redisync'} inspect --url redis://redis.example:7000/0 --run kept"
        )
    finally:
        server.kill()
