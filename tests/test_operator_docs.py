"""What the operator's pages say of the commands is what the commands do."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_cli_page_says_how_a_failure_and_a_usage_error_end():
    """A failure: one line, status 1; a usage error: four lines, status 2 (the page said one line and 1 for both)."""
    page = " ".join((ROOT / "docs" / "reference" / "cli.md").read_text().split())
    usage = subprocess.run(
        [sys.executable, "-m", "redisync.cli", "inspect", "--no-such-option"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert usage.returncode == 2
    assert len(usage.stderr.splitlines()) == 4, usage.stderr  # usage, a hint, a blank line, the error
    assert "four lines, and exits with status 2" in page
    failure = subprocess.run(
        [sys.executable, "-m", "redisync.cli", "inspect", "--url", "redis://127.0.0.1:1/0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert failure.returncode == 1
    assert len(failure.stderr.strip().splitlines()) == 1
    assert "a failure prints one line naming what went wrong and exits with status 1" in page


def test_the_deploy_recipe_without_containers_names_the_rule_file_to_change():
    """Prometheus outside the containers needs rule_files changed too, not only the targets."""
    text = " ".join((ROOT / "deploy" / "README.md").read_text().split())
    assert "`rule_files` entry to the path of `prometheus/alerts.yml`" in text
    config = (ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text()
    assert "/etc/prometheus/alerts.yml" in config  # the containers' path, which the README says to change
