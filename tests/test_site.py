"""The documentation site builds with warnings as errors, and reads as a reference should: no raw
Sphinx role, no click sentinel, public names headed where users import them. No torch here, so the
pip user's tier (Python 3.10, the docs extra) builds the site too."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.extras("mkdocs")
def test_the_documentation_site_builds_with_warnings_as_errors(tmp_path):
    """The documentation site builds with warnings as errors."""
    out = subprocess.run(
        [str(Path(sys.executable).parent / "mkdocs"), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    api = (tmp_path / "site" / "reference" / "api" / "index.html").read_text()
    assert "new_syncer" in api
    assert "publish_every_steps" in api  # the parameters, from the docstrings
    # the Store's methods, which its concerns' modules define (connection, runs, protocol, reads)
    for method in ("redisync.Store.register", "redisync.Store.shard", "redisync.Store.fleet", "redisync.Store.snapshot",
                   "redisync.Store.leases", "redisync.Store.run_names", "redisync.Store.limits"):  # fmt: skip
        assert f'id="{method}"' in api, method
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    for command in (
        "demo",
        "watch",
        "inspect",
        "snapshot",
        "restore",
        "delete",
        "bench",
        "ab",
        "exporter",
        "functions",
    ):
        assert f"redisync {command}" in cli, command
    # what a reader sees, not the source's seams: no raw Sphinx role, no click sentinel as a default,
    # public names headed where users import them
    raw_role = re.compile(r":(?:func|class|meth|data|attr|mod|exc|obj):`")
    for page in (tmp_path / "site").rglob("*.html"):
        text = page.read_text()
        assert not raw_role.search(text), page
        assert "Sentinel." not in text, page
    for name in ("connect", "new_syncer", "Syncer", "Schema", "merge"):
        assert f'id="redisync.{name}"' in api, name
    assert "redisync/staleness_versions" in api  # metrics() keys, documented ...
    assert "`redisync/staleness_versions`" not in api  # ... and rendered
    # long code lines wrap (the deploying page's first blocks ran past the page's edge) and the CLI
    # reference's option names never break mid-word: the site's stylesheet says so, on every page
    css = (tmp_path / "site" / "stylesheets" / "extra.css").read_text()
    assert "white-space: pre-wrap" in css
    assert "td:first-child code" in css
    for name in ("reference/cli", "guides/deploying"):
        assert "stylesheets/extra.css" in (tmp_path / "site" / name / "index.html").read_text(), name
