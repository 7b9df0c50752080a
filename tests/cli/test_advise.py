"""`redisync advise` (`redisync.cli.advise`): the drift model's figures for a user's configuration,
its limits, and the commands the docs print, run as printed."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from redisync.cli import cli
from redisync.terms import drift_model as dm

ROOT = Path(__file__).resolve().parents[2]


def test_advise_prints_the_models_figures_and_its_limits():
    """`redisync advise` prints the model's own figures for the configuration, and what the model cannot claim."""
    args = ["advise", "--shards", "16", "--envs-per-shard", "64", "--alpha", "0.01", "--bins", "30",
            "--failure-rate", "0.004", "--episode-s", "10", "--hard-bins", "2"]  # fmt: skip
    out = CliRunner().invoke(cli, args)
    assert out.exit_code == 0, out.output
    start = 1 / 500 + 0.004
    hazard, hard = dm.profile(30, 0.004, start_rate=start, episode_bins=10, hard_bins=2)
    p = dm.predict(dm.FleetModel(16, 64, hazard, alpha=0.01, start_rate=start, episode_bins=10, hard=hard))
    assert f"is {p.distance_from_pooled:.3f} (TV) from one unsharded run's" in out.output
    assert f"{p.local.disagreement:.3f}" in out.output
    assert "not what that does to training" in out.output
    figures = json.loads(CliRunner().invoke(cli, [*args, "--json"]).output)
    assert figures["distance_from_pooled"] == pytest.approx(p.distance_from_pooled)
    # the validated warning: the model from the failure rate alone (every bin alike), at WARNING_DISTANCE
    blind_hazard, _ = dm.profile(30, 0.004, start_rate=start, episode_bins=10)
    blind = dm.predict(dm.FleetModel(16, 64, blind_hazard, alpha=0.01, start_rate=start, episode_bins=10))
    assert figures["warning"]["predicted_shard_distance"] == pytest.approx(blind.local.shard_distance)
    assert figures["warning"]["fires"] == (blind.local.shard_distance >= dm.WARNING_DISTANCE)
    verdict = "fires" if figures["warning"]["fires"] else "stays quiet"
    assert "The model's drift warning (judged against this model, not against runs: the documentation's " in out.output
    assert f"warning-validation report) {verdict}" in out.output
    assert "docs/" not in out.output  # (paths of the source tree: a wheel ships no docs folder)
    assert "Verdict: " in out.output
    assert "mode='observe'" in out.output
    bad = CliRunner().invoke(cli, ["advise", "--shards", "4", "--envs-per-shard", "8", "--bins", "30",
                                   "--failure-rate", "0.01", "--hard-bins", "30"])  # fmt: skip
    assert bad.exit_code != 0
    assert "hard_bins must be in [0, 30)" in str(bad.exception)


def test_the_model_pages_advise_example_runs_as_written():
    """The drift model page's command runs as printed and prints its figures."""
    page = (ROOT / "docs" / "concepts" / "drift-model.md").read_text()
    marker = "<!-- advise example: tests/cli/test_advise.py runs this block -->"
    block = page.split(marker, 1)[1].split("```")[1].removeprefix("bash").strip()
    args = shlex.split(block)
    assert args[0] == "redisync"
    out = CliRunner().invoke(cli, args[1:])
    assert out.exit_code == 0, out.output
    assert "from one unsharded run's" in out.output


def test_the_readmes_advise_command_runs_as_printed():
    """The advise command in the README runs as printed and prints its figures."""
    readme = (ROOT / "README.md").read_text()
    command = re.search(r"`(redisync advise [^`]+)`", readme).group(1)
    out = CliRunner().invoke(cli, shlex.split(command)[1:])
    assert out.exit_code == 0, out.output
    assert "from one unsharded run's" in out.output


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--episode-s", "inf"), "Invalid value for '--episode-s'"),
        (("--alpha", "1e-320"), "Invalid value for '--alpha'"),
        (("--bins", "100000"), "Invalid value for '--bins'"),
        (("--step-dt", "20", "--episode-s", "10"), "longer than the episode"),
    ],
)
def test_a_value_the_model_cannot_compute_is_refused_in_one_line(args, said):
    """Values inside the options' old ranges gave a traceback (an infinite episode), NaNs (α 1e-320)
    or a 9 GiB allocation (100 000 bins): each is now refused before the model runs, saying which."""
    base = ["--shards", "4", "--envs-per-shard", "32", "--bins", "10", "--failure-rate", "0.001"]
    out = CliRunner().invoke(cli, ["advise", *base, *args])
    assert out.exit_code == 2, out.output
    assert said in out.output
    assert out.exception is None or isinstance(out.exception, SystemExit)
    assert "nan" not in out.output
