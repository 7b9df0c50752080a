"""What every command shares: its arguments, its URL, its errors in one line, its help."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import cli


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
    root = Path(__file__).resolve().parents[2]  # (this checkout, installed editable by scripts/setup)
    assert (
        f"redisync demo needs the demo extra (tqdm, matplotlib missing): pip install -e '{root}[demo]' "
        f"(or {root / 'scripts' / 'setup'})" in out.stderr
    )
    assert time.monotonic() - started < 60
    assert not (tmp_path / "out").exists()


def test_a_connection_error_names_the_url_with_its_password_masked():
    # (watch waits for a store it cannot reach, saying so with the URL masked: test_watch_lives_through_the_store)
    """A store that cannot be reached is named by its URL with the password masked, by every command."""
    out = cli(
        "watch", "--run", "x", "--count", "3", "--interval", "0.1", "--url", "redis://operator:s3cret@127.0.0.1:1/0"
    )
    assert out.returncode == 1, out.stderr  # --count ended on a refresh that could not show the run (it exited 0)
    assert "waiting for the store: redis://operator:***@127.0.0.1:1/0: " in out.stdout
    assert "after 3 refreshes" in out.stderr
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
