"""`redisync ab`: the study names its store with the password masked."""

from __future__ import annotations

import pytest

from .conftest import cli


@pytest.mark.integration  # the study's pool of worker processes
def test_the_study_names_its_store_with_the_password_masked(tmp_path):
    """``redisync ab`` printed the URL it was given, password and all, before its first run."""
    out = cli(
        *("ab", "--smoke", "--stage", "gate", "--no-progress", "--out", str(tmp_path)),
        *("--url", "redis://operator:s3cret@127.0.0.1:1/0"),
    )
    assert out.returncode == 1
    assert "store: redis://operator:***@127.0.0.1:1/0" in out.stdout
    assert "s3cret" not in out.stdout + out.stderr
    assert "Connection refused" in out.stderr
