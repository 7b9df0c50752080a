"""Every ``redisync bench`` mode the docs name, run end to end as a user runs it (``--quick``: each
measurement at a small size), so that a change that breaks one mode fails here rather than in a
user's hands. The figures are not judged (they depend on the machine), only that each mode runs to
its table and exits 0."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .conftest import cli

ROOT = Path(__file__).resolve().parents[2]

MODES = {
    "core": (("--seconds", "0.3"), "PING median", True),
    "--load": (("--load", "--seconds", "0.3"), "every collector subscribed", False),
    "--scale": (("--scale", "--seconds", "0.3"), "the largest fleet within", True),
    "--peers": (("--peers",), "vs redisync process/step", True),
    "--instructions": (("--instructions",), "marginal", False),
    "--instructions --fleet": (("--instructions", "--fleet"), "one history key, per value", False),
    "--tree": (("--tree", "--loopback-cluster", "--seconds", "2"), "exact: yes", False),
    "--all --json": (("--all", "--json", "--seconds", "0.3"), '"scale"', True),
}
"""mode -> (arguments, a line of its output, whether it takes --url: a server of the module's own, as
the bench turns the server's slow log on, a server-wide setting)."""


def test_every_mode_the_docs_name_is_run_here():
    """A mode a page names that this file does not run would go unchecked."""
    named = set()
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = page.read_text()
        for command in re.findall(r"redisync bench([^`\n]*)", text):
            named |= set(re.findall(r"--(load|tree|scale|peers|instructions|fleet|all)\b", command))
        if page.name == "performance.md":  # its opening lists the modes as bare flags
            named |= set(re.findall(r"`--(load|tree|scale|peers|instructions|fleet|all)\b", text))
    covered = {flag.lstrip("-") for mode in MODES for flag in mode.split()}
    assert named, "no bench mode found on the pages: the search is broken"
    assert named <= covered, f"modes named on the pages but not run here: {sorted(named - covered)}"


@pytest.mark.integration  # servers of their own (--load, --instructions, --tree), collector processes
@pytest.mark.parametrize("mode", list(MODES))
def test_each_bench_mode_runs_to_its_table(mode, counted_url):
    """``--load`` stopped with 'Too many connections' once its fan-out held more subscribers than a
    client's connection pool (100): ``--quick`` still subscribes 120 collectors."""
    args, expected, takes_url = MODES[mode]
    out = cli("bench", "--quick", *args, *(("--url", counted_url) if takes_url else ()))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert expected in out.stdout
    assert "Traceback" not in out.stderr
