"""`redisync advise` (`redisync.cli.advise`): the drift model's figures for a user's configuration,
its limits, and the commands the docs print, run as printed."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from redisync.cli import cli
from redisync.terms import drift_model as dm

ROOT = Path(__file__).resolve().parents[2]


WALKER_LAW = ["--failure-rate", "0.0007", "--episode-s", "10", "--hard-bins", "2"]  # the fourth study's


def _simulated(shards, envs, alpha, bins, seed):
    """The sampler's formulas run step by step (no stride), twice as long as advise runs them, another seed."""
    start = 1 / 500 + 0.0007
    hazard, hard = dm.profile(bins, 0.0007, start_rate=start, episode_bins=10, hard_bins=2)
    m = dm.FleetModel(shards, envs, hazard, alpha=alpha, start_rate=start, episode_bins=10, hard=hard)
    return dm.simulate(m, int(20 / alpha), seed)


@pytest.mark.parametrize(
    ("shards", "envs", "alpha", "bins"),
    [(16, 32, 0.01, 120), (64, 8, 0.01, 120), (24, 48, 0.003, 90), (3, 700, 0.003, 90), (4, 128, 0.001, 120)],
)
def test_advise_reads_a_shards_drift_as_the_sampler_run_step_by_step_gives_it(shards, envs, alpha, bins):
    """advise's shard and fleet distances (a shard's, and the shards' mixture's, TV from the fleet's
    pooled distribution at the same moment) are within 15 % of the sampler's formulas run step by
    step on the same fleet: on the walker's regime (alpha 0.01, 120 bins, ~0.02 failures per bin),
    24 x 48 and 3 x 700. The model advise printed before read the walker's 0.43 as 0.186."""
    args = ["advise", "--shards", str(shards), "--envs-per-shard", str(envs), "--alpha", str(alpha),
            "--bins", str(bins), *WALKER_LAW, "--json"]  # fmt: skip
    out = CliRunner().invoke(cli, args)
    assert out.exit_code == 0, out.output
    figures = json.loads(out.output)
    sim = _simulated(shards, envs, alpha, bins, seed=11)
    assert figures["local"]["shard_distance"] == pytest.approx(sim["shard_distance"], rel=0.15)
    assert figures["local"]["fleet_distance"] == pytest.approx(sim["fleet_distance"], rel=0.15, abs=0.01)
    assert figures["pooled"]["shard_distance"] == 0.0


def test_advise_on_the_walkers_configuration_reads_what_its_runs_recorded():
    """On the fourth study's walker (16 x 32 envs, alpha 0.01, 120 bins, its failure law), advise's
    shard distance is within 15 % of the mean drift the 10 committed local runs recorded, and the
    limits say so with both figures; the verdict keeps 'pooled'."""
    runs = sorted((ROOT / "records" / "ab" / "fourth-study" / "contrast").glob("H-local-*.json"))
    records = [r for p in runs for r in json.loads(p.read_text())["run"]["drift"] if r["tv"]]
    recorded = float(np.mean([np.mean(r["tv"]) for r in records]))
    args = ["advise", "--shards", "16", "--envs-per-shard", "32", "--alpha", "0.01", "--bins", "120", *WALKER_LAW]
    figures = json.loads(CliRunner().invoke(cli, [*args, "--json"]).output)
    assert figures["local"]["shard_distance"] == pytest.approx(recorded, rel=0.15)
    assert f"recorded {recorded:.3f}" in figures["limits"]
    assert f"measures about {figures['local']['shard_distance']:.2f}" in figures["limits"]
    out = CliRunner().invoke(cli, args)
    assert out.exit_code == 0, out.output
    assert "Verdict: keep 'pooled'." in out.output
    assert "not what that does to training" in out.output
    assert "docs/" not in out.output  # (paths of the source tree: a wheel ships no docs folder)
    measured = f"{figures['local']['shard_distance']:.2f}"

    def page(*path):  # (its words, whatever its line breaks)
        return " ".join(ROOT.joinpath(*path).read_text().split())

    assert f"{measured} on the walker's configuration, where its runs recorded {recorded:.3f}" in page("README.md")
    assert f"it measures {measured}, where the ten local runs recorded {recorded:.3f}" in page(
        "docs", "concepts", "drift-model.md"
    )
    assert f"reads {measured} here" in page("docs", "study.md")
    assert f"reads {measured} where the runs recorded {recorded:.3f}" in page("CHANGELOG.md")


def test_advise_takes_the_metric_a_sampler_logs_and_one_shard_has_nothing_to_sync():
    """--ema-failures-per-step (the sampler's metric) is --failure-rate times the envs per shard; one
    of the two is required; one shard gets its one line, not a table."""
    common = ["advise", "--shards", "4", "--envs-per-shard", "50", "--alpha", "0.01", "--bins", "20", "--json"]
    by_rate = json.loads(CliRunner().invoke(cli, [*common, "--failure-rate", "0.002"]).output)
    by_metric = json.loads(CliRunner().invoke(cli, [*common, "--ema-failures-per-step", "0.1"]).output)
    assert by_metric == by_rate
    neither = CliRunner().invoke(cli, common)
    assert neither.exit_code == 2
    assert "give one of --failure-rate and --ema-failures-per-step" in neither.output
    one = CliRunner().invoke(cli, ["advise", "--shards", "1", "--envs-per-shard", "50", "--bins", "20",
                                   "--failure-rate", "0.002"])  # fmt: skip
    assert one.exit_code == 0
    assert one.output.strip() == ("Verdict: nothing to sync with 1 shard: its own failure EMA is the whole fleet's.")
    bad = CliRunner().invoke(cli, ["advise", "--shards", "4", "--envs-per-shard", "8", "--bins", "30",
                                   "--failure-rate", "0.01", "--hard-bins", "30"])  # fmt: skip
    assert bad.exit_code == 2
    assert "hard_bins must be in [0, 30)" in bad.output


@pytest.mark.parametrize("page", ["concepts/drift-model.md", "index.md", "getting-started.md"])
def test_the_pages_advise_examples_run_as_written(page):
    """Each page's advise command runs as printed and prints its verdict; the docs home and
    getting-started ("Does my run need it?") say what it reads there, and it reads that."""
    text = (ROOT / "docs" / page).read_text()
    marker = "<!-- advise example: tests/cli/test_advise.py runs this block -->"
    block = text.split(marker, 1)[1].split("```")[1].removeprefix("bash").strip().replace("\\\n", " ")
    args = shlex.split(block)
    assert args[0] == "redisync"
    out = CliRunner().invoke(cli, args[1:])
    assert out.exit_code == 0, out.output
    assert "Verdict: " in out.output
    if page != "concepts/drift-model.md":
        measured = json.loads(CliRunner().invoke(cli, [*args[1:], "--json"]).output)["local"]["shard_distance"]
        words = " ".join(text.split())
        assert f"on the walker study's configuration it reads {measured:.2f} and says keep `pooled`" in words
        assert "Verdict: keep 'pooled'." in out.output


def test_the_readmes_advise_command_runs_as_printed():
    """The advise command in the README runs as printed and prints its figures."""
    readme = (ROOT / "README.md").read_text()
    command = re.search(r"`(redisync advise [^`]+)`", readme).group(1)
    out = CliRunner().invoke(cli, shlex.split(command)[1:])
    assert out.exit_code == 0, out.output
    assert "Verdict: " in out.output


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--episode-s", "inf"), "Invalid value for '--episode-s'"),
        (("--alpha", "1e-320"), "Invalid value for '--alpha'"),
        (("--bins", "100000"), "Invalid value for '--bins'"),
        (("--step-dt", "20", "--episode-s", "10"), "longer than the episode"),
        (("--shards", "5000", "--bins", "500"), "units of work, beyond"),
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
