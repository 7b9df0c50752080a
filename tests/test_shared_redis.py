"""The tests share the machine's Redis with every other test worker and test run: a server-wide command
there (FUNCTION FLUSH, a prune of the libraries, FLUSHALL, FLUSHDB, CONFIG SET) would remove or change
what the others rely on. Such a command runs only on a server its module started."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SERVER_WIDE = re.compile(
    r"\.(function_flush|function_delete|prune_functions|flushall|flushdb|config_set|config_rewrite)\("
    r"|[\"'](FUNCTION FLUSH|FLUSHALL|FLUSHDB|CONFIG SET)[\"']",
    re.IGNORECASE,
)
OWN_SERVER = ("RedisProcess(", "LoopbackCluster(")


def test_server_wide_commands_run_only_in_modules_that_start_their_own_server():
    """A test module that calls a server-wide command starts a redis-server of its own."""
    offenders = []
    for path in sorted(TESTS.rglob("test_*.py")):
        if path == Path(__file__).resolve():
            continue
        text = path.read_text()
        calls = [m.group(0) for m in SERVER_WIDE.finditer(text)]
        if calls and not any(own in text for own in OWN_SERVER):
            offenders.append(f"{path.relative_to(TESTS)}: {sorted(set(calls))}")
    assert not offenders, "server-wide commands on the shared Redis:\n" + "\n".join(offenders)
