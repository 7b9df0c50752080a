"""What a study's records say of where they came from, and what the study page says of every study
that ran: provenance taken when a run starts, recorded runs refused from a dirty tree, the
configurations that ran (not others), every study reported (replaced ones too)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from redisync.errors import ConfigurationError
from redisync.study import provenance

ROOT = Path(__file__).resolve().parents[2]
THIRD = ROOT / "records" / "ab" / "third-study"


def test_a_runs_provenance_is_the_code_at_its_start_not_at_its_end(monkeypatch):
    """A run whose checkout moves while it trains records the commit it started from."""
    pytest.importorskip("torch")
    from redisync.study import study

    checked_out = {"commit": "a" * 40}
    monkeypatch.setattr(provenance, "commit", lambda: checked_out["commit"])

    def run_arm(*args, **kwargs):
        checked_out["commit"] = "b" * 40  # another commit checked out while the run trains
        return {"arm": "single"}

    monkeypatch.setattr(study, "run_arm", run_arm)
    monkeypatch.setattr(study, "load_env_factory", lambda spec, cfg: None)
    monkeypatch.setattr(study, "_progress", type("Q", (), {"put": staticmethod(lambda n: None)})())
    run = study._worker(study.StudyConfig().smoke().to_dict(), "single", 1, None, None)
    assert run["provenance"]["commit"] == "a" * 40


def test_a_recorded_run_from_a_dirty_tree_is_refused_or_records_its_diff(monkeypatch):
    """A checkout with uncommitted changes: `require_clean` refuses, naming the commit; the run's
    provenance (when allowed) records the diff's SHA-256 beside the commit."""
    monkeypatch.setattr(provenance, "commit", lambda: "c" * 40 + "+dirty")
    monkeypatch.setattr(provenance, "diff_sha256", lambda: "d" * 64)
    with pytest.raises(ConfigurationError, match=r"uncommitted changes.*\+dirty.*--allow-dirty"):
        provenance.require_clean("redisync ab")
    assert provenance.provenance("2026-12-04T00:00:00+00:00")["diff_sha256"] == "d" * 64
    monkeypatch.setattr(provenance, "commit", lambda: "c" * 40)
    provenance.require_clean("redisync ab")  # a clean tree starts
    assert "diff_sha256" not in provenance.provenance("2026-12-04T00:00:00+00:00")


def test_the_cli_refuses_a_kept_study_from_a_dirty_tree(monkeypatch, tmp_path):
    """`redisync ab --plan walker-ema-window` from a dirty checkout exits with the reason before any run."""
    pytest.importorskip("torch")
    from click.testing import CliRunner

    from redisync.cli import cli

    monkeypatch.setattr(provenance, "commit", lambda: "e" * 40 + "+dirty")
    result = CliRunner().invoke(cli, ["ab", "--plan", "walker-ema-window", "--out", str(tmp_path)])
    assert result.exit_code != 0
    assert "uncommitted changes" in str(result.exception) + result.output
    assert not (tmp_path / "runs").exists()


def test_the_third_studys_results_record_the_configuration_its_gate_ran():
    """results.json's config is the gate runs' own (α = 0.001), its task block the fields the walker reads."""
    pytest.importorskip("torch")
    from redisync.study.walker import TASK_FIELDS

    results = json.loads((THIRD / "results.json").read_text())
    runs = [json.loads(p.read_text()) for p in sorted((THIRD / "runs" / "gate").glob("*.json"))]
    assert runs
    for run in runs:
        assert run["config"]["sampler_alpha"] == results["config"]["sampler_alpha"]
        assert run["config"]["env_steps"] == results["config"]["env_steps"]
    task = results["config"]["task"]
    assert set(TASK_FIELDS) <= set(task)
    assert not {"max_force", "damping", "amplitude", "skill_angle_deg"} & set(task)  # the toy's, unread


def test_the_study_page_says_how_the_third_studys_gate_runs_were_recorded():
    """The gate's run files name the commits they name: the page says how many commits and how many dirty."""
    runs = [json.loads(p.read_text()) for p in sorted((THIRD / "runs" / "gate").glob("*.json"))]
    commits = {r["provenance"]["commit"] for r in runs}
    dirty = sum(str(r["provenance"]["commit"]).endswith("+dirty") for r in runs)
    page = " ".join((ROOT / "docs" / "study.md").read_text().split())
    words = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six"}
    assert f"across {words[len(commits)]} commits, {words[dirty]} of them with uncommitted changes" in page


def test_the_study_page_reports_every_study_that_ran():
    """No sentence says every study was pre-registered; the replaced studies are listed with their results;
    the failures-per-bin mechanism is stated as a hypothesis; no claim of BeyondMimic's table."""
    page = " ".join((ROOT / "docs" / "study.md").read_text().split())
    assert "Each study below was pre-registered" not in page
    assert "## Studies that were replaced" in (ROOT / "docs" / "study.md").read_text()
    for commit in ("48e16e7", "b9ffdb8", "6a8e450"):
        assert commit in page
    assert "+0.031" in page  # the first gate of the rare-segment task, which failed
    import re

    # every mention of what drives the harm is a question or a hypothesis, in the words before it
    spots = [m.start() for m in re.finditer(r"drives? the harm", page)]
    assert spots
    for at in spots:
        before = page[max(0, at - 300) : at]
        assert "hypothes" in before or "whether" in before, page[at - 150 : at + 20]
    for path in (ROOT / "docs" / "study.md", ROOT / "docs" / "ab" / "pilots.md", ROOT / "README.md"):
        assert "Table II" not in path.read_text(), path
    home = " ".join((ROOT / "docs" / "index.md").read_text().split())
    assert "when drift between shards hurts training" not in home


def _repo(tmp_path):
    """A git checkout of one committed file."""
    import subprocess

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    git("config", "user.email", "t@example.org")
    git("config", "user.name", "t")
    (tmp_path / ".gitignore").write_text("ignored/\n")
    (tmp_path / "task.py").write_text("SEGMENTS = 4\n")
    git("add", ".")
    git("commit", "-qm", "one")
    return tmp_path


def test_an_untracked_file_makes_the_tree_dirty_and_enters_the_diffs_digest(tmp_path):
    """A new module the run imports, not yet added to git, is code its commit does not hold: the
    tree is dirty, and the recorded digest changes with that file's bytes (an ignored file changes
    nothing)."""
    repo = _repo(tmp_path)
    assert provenance.commit(repo) is not None
    assert not provenance.commit(repo).endswith("+dirty")
    assert provenance.diff_sha256(repo) is None
    (repo / "ignored").mkdir()
    (repo / "ignored" / "cache.bin").write_bytes(b"x")
    assert not provenance.commit(repo).endswith("+dirty")
    (repo / "arms.py").write_text("ALPHA = 0.01\n")
    assert provenance.commit(repo).endswith("+dirty")
    first = provenance.diff_sha256(repo)
    (repo / "arms.py").write_text("ALPHA = 0.003\n")
    second = provenance.diff_sha256(repo)
    assert first is not None
    assert second is not None
    assert first != second


def test_a_run_records_its_host_and_every_installed_package():
    """Host, CPU model and count, Python, and every installed distribution's version - lupa and
    fakeredis among them, which decide the embedded store's arithmetic."""
    import importlib.metadata

    found = provenance.provenance(provenance.now())
    assert found["packages"]["fakeredis"] == importlib.metadata.version("fakeredis")
    assert found["packages"]["lupa"] == importlib.metadata.version("lupa")
    assert len(found["packages"]) == len({d.metadata["Name"].lower() for d in importlib.metadata.distributions()}) + 1
    host = found["host"]
    assert host["cpus"] >= 1
    assert host["cpu"]
    assert host["python"].startswith(".".join(map(str, __import__("sys").version_info[:2])))
    assert host["hostname"]
