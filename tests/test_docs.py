"""The README and the documentation site: every code block runs as written in a test, or is
labelled a fragment naming the tests that make its calls; the site builds with warnings as errors;
the README stays short and speaks of the product."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import redisync
from redisync.store import codec
from redisync.terms.torch.sampler import grouped_probabilities

from .conftest import backend_url

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# the pages a user reads (docs/ab holds the study's generated reports, which tests/study checks; the
# dated records of runs, which the pages cite, are in records/)
DOCS = [
    README,
    ROOT / "CHANGELOG.md",
    *sorted(p for p in (ROOT / "docs").rglob("*.md") if "ab" not in p.parts),
]


def example(marker: str) -> str:
    """The python block right after ``<!-- {marker}...`` in whichever page holds it."""
    return block_after(f"<!-- {marker}")[1]


def block_after(marker: str) -> tuple[Path, str]:
    """The page holding ``marker`` and the first fenced block after it."""
    for page in DOCS:
        text = page.read_text()
        if marker in text:
            return page, re.search(r"```[a-z]*\n(.*?)```", text[text.index(marker) :], re.S).group(1)
    raise AssertionError(f"no page holds {marker!r}")


def use_backend(backend: str, monkeypatch) -> None:
    """Point REDISYNC_URL at the backend, as a user would (unset: the embedded store)."""
    url = backend_url(backend)
    if url:
        monkeypatch.setenv("REDISYNC_URL", url)
    else:
        monkeypatch.delenv("REDISYNC_URL", raising=False)


@pytest.mark.xdist_group("humanoid-v3")  # the documented run name: one worker at a time
def test_the_store_api_example_runs(backend, monkeypatch):
    """The store API page's trainer example runs as written, on either backend: its report applied and pooled,
    fleet version 1."""
    use_backend(backend, monkeypatch)
    redisync.connect(run="humanoid-v3").delete()
    namespace: dict = {}
    try:
        exec(compile(example("the trainer example"), "store-api.md", "exec"), namespace)
        assert namespace["result"].status == "applied"
        assert namespace["pooled"]["sum"][3] == 0.02
        assert namespace["pooled"]["count"] == 1
        assert namespace["fleet"].fleet_version == 1
    finally:
        redisync.connect(run="humanoid-v3").delete()


@pytest.mark.xdist_group("humanoid-v3")  # the documented run name: one worker at a time
def test_the_collector_loop_runs(backend, monkeypatch):
    """The README's collector loop runs as written and publishes with no worker error."""
    use_backend(backend, monkeypatch)
    namespace: dict = {}
    try:
        exec(compile(example("the collector loop"), "README.md", "exec"), namespace)
        metrics = namespace["metrics"]
        assert metrics["redisync/publishes"] >= 1
        assert metrics["redisync/worker_errors"] == 0
        assert "redisync/motion/bin_failed/drift_tv" in metrics
    finally:
        redisync.connect(run="humanoid-v3").delete()


def _block_after(marker: str) -> str:
    """The text from ``marker`` to the end of its fenced block, in whichever page holds it."""
    for page in DOCS:
        text = page.read_text()
        if marker in text:
            start = text.index(marker)
            return text[start : text.index("```", start)]
    raise AssertionError(f"no page holds {marker!r}")


def test_the_redis_cli_section_matches_what_the_store_writes(real_url):
    """What the README says redis-cli shows of a run is what the store writes."""
    from redisync.store.schema import Schema, broadcast, merge

    run = "readme-cli-check"
    store = redisync.connect(real_url, run=run)
    store.delete()
    db = real_url.rsplit("/", 1)[1]
    try:
        store.register(
            Schema.of(
                {
                    "motion/bin_failed": merge(8, lifecycle="state"),
                    "curriculum/penalty_scale": broadcast((), owner=0),
                }
            )
        )
        assert store.lease(0, store.shard(0).incarnation, 60_000)  # (a Syncer's lease: the index of lease ends)
        for shard in (0, 1):
            store.shard(shard).publish({"motion/bin_failed": {"count": 1, "sum": np.ones(8)}})
        store.shard(0).publish({"curriculum/penalty_scale": {"value": 0.5}})
        with pytest.raises(
            redisync.errors.NotOwner
        ):  # a client that skips the client-side check: refused, dead-lettered
            store.shard(1).publish_payloads({"curriculum/penalty_scale": codec.encode([np.array([0.9])])}, seq=1)

        def cli(*args: str) -> list[str]:
            host, port = real_url.split("//")[1].split("/")[0].split(":")
            out = subprocess.run(
                ["redis-cli", "-h", host, "-p", port, "-n", db, *args],
                capture_output=True,
                text=True,
                errors="backslashreplace",
                check=True,
            )
            return out.stdout.splitlines()

        # the key layout the README lists is the one SCAN finds
        listed = {
            line.split()[0].replace("{demo}", f"{{{run}}}")
            for line in _block_after("--scan --pattern 'redisync:{demo}:*'").splitlines()[1:]
            if line.strip()
        }
        assert set(cli("--scan", "--pattern", f"redisync:\\{{{run}\\}}:*")) == listed | {
            f"redisync:{{{run}}}:data:curriculum/penalty_scale",
            f"redisync:{{{run}}}:key:curriculum/penalty_scale",
            f"redisync:{{{run}}}:dead",
        }  # a run that rejected a report has its dead-letter stream too
        # every field the README shows for a key is in its HGETALL
        fields = set(cli("HGETALL", f"redisync:{{{run}}}:key:motion/bin_failed")[::2])
        shown = {
            seg.split()[0]
            for line in _block_after("HGETALL 'redisync:{demo}").splitlines()[1:]
            for seg in re.split(r"\s{2,}", line.strip())
            if seg
        }
        assert shown <= fields, shown - fields
        assert {"name", "size", "owner", "count_size", "sumsq"} <= fields
        # the dead-letter and report streams hold the fields the README names
        dead = cli("XRANGE", f"redisync:{{{run}}}:dead", "-", "+")
        for name in ("reason", "key", "detail", "shard", "incarnation", "seq", "report:curriculum/penalty_scale"):
            assert name in dead, name
        reports = cli("XRANGE", f"redisync:{{{run}}}:reports", "-", "+", "COUNT", "1")
        for name in ("shard", "incarnation", "seq", "fleet_version", "report:motion/bin_failed"):
            assert name in reports, name
    finally:
        store.delete()


def test_the_multi_motion_loop_runs(backend, monkeypatch):
    """The many-motions page's loop runs as written: the learner's fleet distribution is what one unsharded
    sampler of every collector's EMA gives, and the hard landing gets the starts."""
    use_backend(backend, monkeypatch)
    redisync.connect(run="motion-library").delete()
    namespace: dict = {}
    try:
        exec(compile(example("the multi-motion loop"), "many-motions.md", "exec"), namespace)
        fleet, collectors = namespace["fleet"], namespace["collectors"]
        assert tuple(fleet.shape) == (4, 60)
        # the learner sees the fleet sum of every collector's own EMA: what one unsharded sampler uses
        pooled = sum(sampler.bin_failed_count.double() for sampler, *_ in collectors)
        sampler = collectors[0][0]
        want = grouped_probabilities(pooled, sampler.layout, sampler.uniform_ratio, sampler.kernel.double(), "paper")
        assert torch.allclose(fleet.double(), want.double(), rtol=1e-5, atol=1e-7)
        assert int(fleet[1, :11].argmax()) >= 6  # the cartwheel's hard landing gets the starts
        assert namespace["monitor"].metrics()["redisync/motion/bin_failed/sampling_entropy_min"] < 0.99
    finally:
        redisync.connect(run="motion-library").delete()


@pytest.mark.xdist_group("humanoid-v3")  # the documented run name: one worker at a time
def test_the_store_api_example_run_three_times_counts_its_one_writer_once(backend, monkeypatch):
    """Each run is a new process of shard 0: the EMA (state) keeps one slot, the normaliser's
    moments (history) keep every run's samples."""
    use_backend(backend, monkeypatch)
    redisync.connect(run="humanoid-v3").delete()
    try:
        for _ in range(3):
            exec(compile(example("the trainer example"), "store-api.md", "exec"), {})
        fleet = redisync.connect(run="humanoid-v3").fleet()
        assert float(fleet.keys["motion/bin_failed"].parts()["count"]) == 1
        assert float(fleet.keys["obs/norm"].parts()["count"]) == 3 * 4096
    finally:
        redisync.connect(run="humanoid-v3").delete()


@pytest.mark.parametrize("page", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_code_block_is_run_by_a_test_or_labelled(page):
    """A block right after ``<!-- ... <tests/file.py> runs this block -->`` is run by that file (which
    finds it by its marker); one after ``<!-- a fragment: why ... tests/file.py ... -->`` cannot run as
    written (the user's env, hosts) and names the tests that make its calls; one after
    ``<!-- output ... tests/file.py ... -->`` shows what a command printed, which that file checks."""
    lines = page.read_text().splitlines()
    tests = Path(__file__).parent
    inside = False
    for n, line in enumerate(lines):
        if not line.startswith("```"):
            continue
        inside = not inside
        if not inside:
            continue
        where = f"{page.relative_to(ROOT)}:{n + 1}"
        marker = lines[n - 1]
        assert marker.startswith("<!-- "), f"{where}: a code block without a marker"
        assert marker.endswith(" -->"), f"{where}: a code block without a marker"
        named = re.findall(r"tests/((?:\w+/)?test_\w+\.py)", marker)
        assert named, f"{where}: {marker}"
        assert all((tests / name).exists() for name in named), f"{where}: {marker}"
        if "runs this block" in marker:
            source = (tests / named[0]).read_text()
            label = marker.removeprefix("<!-- ").split(":")[0]
            assert marker in source or f'example("{label}")' in source, f"{where}: {named[0]} does not run {label!r}"
        else:
            assert marker.startswith(("<!-- a fragment: ", "<!-- output")), (
                f"{where}: neither run by a test nor labelled"
            )


def test_the_own_term_example_runs_and_both_shards_decide_on_the_fleets_rate(backend, monkeypatch):
    """The own-term page's example runs as written: every attempt counted once, both shards deciding on the
    fleet's rate."""
    use_backend(backend, monkeypatch)
    redisync.connect(run="own-term").delete()
    namespace: dict = {}
    try:
        exec(compile(example("the own term"), "own-term.md", "exec"), namespace)
        terms = namespace["terms"]
        fleet = redisync.connect(run="own-term").fleet().keys["curriculum/successes"].parts()
        assert float(fleet["count"]) == sum(t.attempts for t in terms)  # every attempt, counted once
        want = sum(t.successes for t in terms) / sum(t.attempts for t in terms)
        assert [t.fleet_rate for t in terms] == [pytest.approx(want)] * 2
        assert 0.3 < want < 0.5  # between shard 0's 0.2 and shard 1's 0.6
    finally:
        redisync.connect(run="own-term").delete()


def test_the_checkpoint_example_resumes_into_its_old_slot(backend, monkeypatch):
    """The checkpoint page's example resumes into its previous slot: the pooled state is its own, counted
    once."""
    use_backend(backend, monkeypatch)
    redisync.connect(run="resume-example").delete()
    namespace: dict = {}
    try:
        exec(compile(example("the checkpoint and resume"), "checkpoints.md", "exec"), namespace)
        own = namespace["sampler"].bin_failed_count.double().numpy()
        np.testing.assert_allclose(namespace["pooled"], own, rtol=1e-6)  # counted once, not twice
        store = redisync.connect(run="resume-example")
        assert store.fleet().keys["motion/bin_failed"].parts()["count"] == 1  # one slot: the resumed one
    finally:
        redisync.connect(run="resume-example").delete()


def test_the_readme_is_short_and_speaks_of_the_product():
    """The README stays within 200 lines, and no page speaks of issues, rounds or runs that have not happened."""
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    for page in DOCS:
        body = page.read_text()
        for phrase in (r"\bissue \d+", r"\bthis round\b", r"\bthe morning's run\b", r"\bhas not run yet\b"):
            assert not re.search(phrase, body, re.I), f"{page.relative_to(ROOT)}: {phrase}"


def test_the_readmes_demo_figures_are_the_committed_runs():
    """The README's demo figures are those of the committed, dated demo runs."""
    runs = (ROOT / "records" / "demo-runs-2026-12-01.txt").read_text()
    largest = [float(x) for x in re.findall(r"largest TV distance from the pooled distribution: ([0-9.]+)", runs)]
    off, on = largest[0::2], largest[1::2]
    assert len(off) == len(on) == 3
    assert all(round(x, 2) == 0.42 for x in off)
    assert all(x < 0.02 for x in on)
    loaded = (ROOT / "records" / "demo-runs-2026-12-04-loaded.txt").read_text()
    both = [float(x) for x in re.findall(r"largest TV distance from the pooled distribution: ([0-9.]+)", loaded)]
    assert len(both) == 4
    assert all(round(x, 2) == 0.42 for x in both[0::2])
    assert all(x < 0.02 for x in both[1::2])
    every = []  # sync ON's largest distance in every committed demo run, idle or loaded
    for path in sorted((ROOT / "records").glob("demo-runs-*.txt")):
        found = [
            float(x)
            for x in re.findall(r"largest TV distance from the pooled distribution: ([0-9.]+)", path.read_text())
        ]
        every += found[1::2]
    readme = " ".join(README.read_text().split())
    dash = "\u2013"  # (the pages' en dash)
    stated = f"{min(every):.3f}{dash}{max(every):.3f} in the {len(every)} committed runs on a 2-core machine"
    assert f"largest 0.42 without sync, and with it {stated}" in readme
    started_text = " ".join((ROOT / "docs" / "getting-started.md").read_text().split())
    assert f"{min(every):.3f}{dash}{max(every):.3f} over all {len(every)} committed runs" in started_text
    ahead = [int(v) - int(p) for v, p in re.findall(r"fleet version (\d+), (\d+) publishes", runs)]
    started = " ".join((ROOT / "docs" / "getting-started.md").read_text().split())
    assert f"ran a little ahead, by {min(ahead)} to {max(ahead)} in those three runs" in started


def test_the_troubleshooting_page_names_every_error_a_user_can_meet():
    """The troubleshooting page names every error class a user can meet."""
    import inspect

    import redisync.errors as errors

    page = (ROOT / "docs" / "guides" / "troubleshooting.md").read_text()
    named = [n for n, c in inspect.getmembers(errors, inspect.isclass) if issubclass(c, errors.RedisyncError)]
    assert [n for n in named if f"`{n}`" not in page] == []


def test_the_readmes_performance_figures_are_the_committed_runs():
    """Every figure of the README's performance section, read from the dated run it names."""
    bench = ROOT / "records" / "bench"
    fleet = {(r["lifecycle"], r["slots"]): r["fold"] for r in
             json.loads((bench / "instructions-fleet-2026-12-05.json").read_text())["rows"]}  # fmt: skip
    every = json.loads((bench / "bench-all-2026-12-02-functions.json").read_text())
    sizes = {row["elements"]: row for row in every["sizes"]}
    pull = max(row["pull_unchanged_over_ping"] for row in every["sizes"])
    peers = json.loads((bench / "bench-peers-2026-12-02-functions.json").read_text())["rows"]

    def row(scenario: str) -> dict:
        return next(r for r in peers if r["scenario"] == scenario and r["procs"] == 4 and not r["straggler"])

    sidecar, broadcast, overlapped = (
        row("redisync process/step"),
        row("gloo broadcast/step"),
        row("gloo all_reduce async/step"),
    )
    text = " ".join(README.read_text().split("## Performance")[1].split("## ")[0].split())
    expected = [
        f"costs the server {fleet[('history', 64)] / 1e6:.1f} M instructions at 64 live slots and "
        f"{fleet[('history', 1024)] / 1e6:.1f} M at 1 024",
        f"takes {sizes[64]['publish_over_floor']:.1f} × its transport floor",
        f"at 64 values and {sizes[1024]['publish_over_floor']:.1f} × at 1 024",
        f"at most {pull:.2f} × a PING",
        f"wait {sidecar['p50_us']:.1f} µs at the median and {sidecar['p99_us']:.0f} µs at the 99th",
        f"a state {sidecar['applied_lag_versions_p50']:.0f} versions behind",
        f"broadcast of the same state waits {broadcast['p50_us']:.0f} / {broadcast['p99_us']:,.0f} µs".replace(
            ",", " "
        ),
        f"all-reduce {overlapped['p50_us']:,.0f} / {overlapped['p99_us']:,.0f} µs".replace(",", " "),
        f"for a state {'one' if overlapped['behind_steps_mean'] == 1 else overlapped['behind_steps_mean']} step old",
    ]
    for phrase in expected:
        assert phrase in text, phrase
    assert fleet[("history", 1024)] <= 1.25 * fleet[("history", 64)]  # the README's "does not grow"


def test_the_readmes_collector_uses_a_run_the_shipped_roles_cover_and_the_try_out_redis_its_own_port():
    """A user who starts deploy/'s server with users.acl can run the README's collector as is; the
    getting-started try-out Redis does not take deploy/redis.conf's port."""
    runs = re.findall(r'redisync\.connect\(run="([^"]+)"\)', example("the collector loop"))
    acl = (ROOT / "deploy" / "users.acl").read_text()
    assert runs
    assert all(f"~redisync:{{{run}}}:*" in acl for run in runs), runs
    conf_port = re.search(r"^port (\d+)", (ROOT / "deploy" / "redis.conf").read_text(), re.M).group(1)
    try_out = re.search(r"redis-server --port (\d+)", (ROOT / "docs" / "getting-started.md").read_text()).group(1)
    assert try_out != conf_port


@pytest.mark.xdist_group("humanoid-v3")  # the documented run name: one worker at a time
@pytest.mark.extras("tensorboard")
def test_the_tensorboard_recipe_writes_the_syncers_metrics(backend, monkeypatch, tmp_path):
    """The collector guide's recipe, run as written: TensorBoard's event files hold every metric of
    the syncer at each logged step, read back with TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    use_backend(backend, monkeypatch)
    namespace: dict = {"log_dir": str(tmp_path / "tb")}
    try:
        exec(compile(example("metrics into tensorboard"), "docs/guides/collector.md", "exec"), namespace)
    finally:
        redisync.connect(run="humanoid-v3").delete()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    final = namespace["syncer"].metrics()
    assert {"redisync/fleet_version", "redisync/healthy", "redisync/publishes"} <= tags
    assert tags <= set(final) | {n for n in tags if n.startswith("redisync/publish_latency")}
    assert [e.step for e in events.Scalars("redisync/healthy")] == [99, 199, 299]
    assert [e.value for e in events.Scalars("redisync/healthy")] == [1.0, 1.0, 1.0]
    published = [e.value for e in events.Scalars("redisync/publishes")]
    assert published == sorted(published)  # a counter (the sidecar's lags its reports by a status period)
    assert final["redisync/publishes"] >= max(published[-1], 1)


def test_the_newcomers_shell_blocks_fit_beside_the_copy_button():
    """The README's and getting-started's shell blocks keep comments on lines of their own and every
    line within 80 characters: a comment at the end of a long line ran under the site's copy button."""
    for page in (README, ROOT / "docs" / "getting-started.md"):
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(), re.S):
            for line in block.splitlines():
                assert len(line) <= 80, f"{page.name}: {line}"
                assert line.startswith("#") or " # " not in line, f"{page.name}: {line}"


def test_a_capacity_at_1_hz_is_called_an_extrapolation_with_the_rate_reached():
    """The tree bench's runs reached 0.19-0.35 reports a second per collector, not 1: the README and the
    performance page give the rate reached beside any figure at 1 Hz, and call that figure an extrapolation."""
    tree = (ROOT / "records" / "bench" / "tree-2026-12-04.txt").read_text()
    unsplit = re.search(
        r"bench-tree-\w+\s+1002 collectors, (\d+) reports/s: [0-9.]+ core, ([0-9.]+) ms a report -> (\d+)", tree
    )
    rate, ms, collectors = int(unsplit.group(1)), unsplit.group(2), unsplit.group(3)
    readme = " ".join(README.read_text().split())
    assert f"{ms} ms of CPU per report" in readme
    assert f"serving {rate} reports a second, {rate / 1002:.2f} a second from each of 1 002 collectors" in readme
    assert f"about {collectors} collectors reporting once a second, a rate no run here reached" in readme
    perf = " ".join((ROOT / "docs" / "performance.md").read_text().split())
    assert "collectors at 1 Hz within half a core (extrapolated)" in perf
    assert "No run reached one report a second per collector" in perf


def test_the_performance_pages_load_table_and_figures_are_its_dated_run():
    """The load table on the performance page is the dated run's, row for row, and the costs the
    text gives are that run's (rounded as written)."""
    import json

    from redisync.bench.load import format_load

    data = json.loads((ROOT / "records" / "bench" / "load-2026-12-05-exact.json").read_text())
    assert format_load(data) == (ROOT / "records" / "bench" / "load-2026-12-05-exact.txt").read_text().strip()
    tables = (
        format_load(data).split("\n\n", 1)[1].split("\n\nevery collector subscribed to the run's announcements:\n\n")
    )
    page = (ROOT / "docs" / "performance.md").read_text()
    assert len(tables) == 2
    assert all(t.strip() in page for t in tables)
    heard = [r["announcements_per_s"] for r in data["fanout"] if r["window_s"] > 0]
    assert max(heard) <= 20
    assert f"({min(heard):.1f}\N{EN DASH}{max(heard):.1f} here)" in " ".join(page.split())
    cores = [r["server_core"] for r in data["rows"] if r["design"] == "redisync"]
    assert f"kept the server at {min(cores):.2f}\N{EN DASH}{max(cores):.2f} of a core" in " ".join(page.split())
    ours = {r["slots"]: r for r in data["rows"] if r["design"] == "redisync"}
    plain = [r for r in data["rows"] if r["design"] != "redisync"]
    text = " ".join(page.split())
    assert (
        f"cost {ours[64]['server_ms_per_report']:.2f} ms at 64 collectors, {ours[256]['server_ms_per_report']:.2f} ms "
        f"at 256 and {ours[1024]['server_ms_per_report']:.2f} ms at 1 024"
    ) in text
    assert f"about {256 * ours[256]['server_ms_per_report'] / 1e3:.2f} of a core" in text
    big = ours[1024]
    assert big["reached_1hz"]
    assert f"reached {big['reports_per_s']:.0f} reports a second, {big['reports_per_s'] / 1024:.2f} from each" in text
    assert (
        f"its capacity, {big['collectors_within_budget']:.0f} collectors at 1 Hz within half a core, is measured"
        in text
    )
    low, high = min(r["server_ms_per_report"] for r in plain), max(r["server_ms_per_report"] for r in plain)
    assert f"cost {low:.2f}\N{EN DASH}{high:.2f} ms" in text
    ratios = [ours[r["slots"]]["server_ms_per_report"] / r["server_ms_per_report"] for r in plain]
    assert f"about {min(ratios):.0f} to {max(ratios):.0f} times less" in text
    assert f"(load average {data['load_average'][0]:.1f})" in text


def test_the_semantics_page_shows_the_fold_drawn_by_its_script(tmp_path):
    """The semantics page's picture of a fold is the committed fold.png, and its script draws it."""
    import subprocess
    import sys

    page = (ROOT / "docs" / "concepts" / "semantics.md").read_text()
    assert "](fold.png)" in page
    assert (ROOT / "docs" / "concepts" / "fold.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = tmp_path / "fold.png"
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "fold_diagram.py"), str(out)], capture_output=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_development_page_shows_the_architecture_drawn_from_the_code(tmp_path):
    """The development page's architecture picture is the committed architecture.png, its script draws
    it, and the floors it draws are the import contract's layers with the package's own modules."""
    import importlib.util
    import subprocess
    import sys

    page = (ROOT / "docs" / "development.md").read_text()
    assert "](architecture.png)" in page
    assert (ROOT / "docs" / "architecture.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = tmp_path / "architecture.png"
    script = ROOT / "scripts" / "architecture_diagram.py"
    done = subprocess.run([sys.executable, str(script), str(out)], capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    spec = importlib.util.spec_from_file_location("architecture_diagram", script)
    diagram = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(diagram)
    floors = diagram.floors()
    assert floors[0] == ["cli"]
    assert floors[-1] == ["errors", "lifeline"]
    assert "sidecar_process" in diagram.modules_of("collector")
    assert "subscription" in diagram.modules_of("store")


def test_the_monitoring_guides_inspect_frame_is_its_dated_run_and_its_sentence_reads_it():
    """The guide's inspect frame is the dated run's output line for line, and the sentence under it
    gives that frame's fold count and number of slots (it said four live slots of an older run)."""
    guide = (ROOT / "docs" / "guides" / "monitoring.md").read_text()
    marker = "<!-- output of redisync inspect on 2026-12-04 (records/demo-run-2026-12-04-inspect.txt)"
    frame = guide.split(marker, 1)[1].split("```text\n", 1)[1].split("```", 1)[0].strip().splitlines()
    run = [line.rstrip() for line in (ROOT / "records" / "demo-run-2026-12-04-inspect.txt").read_text().splitlines()]
    assert all(line.rstrip() in run for line in frame)
    version = int(re.search(r"fleet version (\d+)", frame[1]).group(1))
    slots = [line for line in frame if line.startswith("motion/bin_failed") and "merge" not in line]
    words = {1: "one", 2: "two", 3: "three", 4: "four"}
    text = " ".join(guide.split())
    assert f"folded {version:,} times".replace(",", " ") in text
    assert f"the slots of the {words[len(slots)]} shards that stopped last are still there" in text
    assert all(line.split()[-1] == "stopped" for line in slots)


def test_the_study_pages_figure_is_drawn_from_the_committed_results(tmp_path):
    """The study page's figure of the second follow-up's contrasts is drawn by its script from
    results.json: one row per contrast, red exactly where the interval lies below zero."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("figures", ROOT / "scripts" / "study_figures.py")
    figures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figures)
    rows = figures.draw(tmp_path / "answers.png")
    results = json.loads((ROOT / "records" / "ab" / "second-follow-up" / "results.json").read_text())
    assert rows == results["second_follow_up"]
    assert (tmp_path / "answers.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (ROOT / "docs" / "study.md").read_text()
    assert "](ab/answers.png)" in page
    assert (ROOT / "docs" / "ab" / "answers.png").is_file()


def test_the_sites_overflow_check_found_the_cli_and_deploying_pages_clean_at_1280_px():
    """The dated run of scripts/docs_overflow_check.py: every page of the nav checked at 1280 px, the
    command-line and deploying pages without a finding, their screenshots 1280 px wide; the
    development page says what the run found elsewhere."""
    import json
    import re
    import struct

    run = json.loads((ROOT / "records" / "site-check" / "overflow-2026-12-05.json").read_text())
    assert run["width_px"] == 1280
    nav = re.findall(r":\s+([\w/.-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M)
    assert len(run["pages"]) == len(nav)
    assert run["pages"]["reference/cli/"] == []
    assert run["pages"]["guides/deploying/"] == []
    for shot in ("reference-cli", "guides-deploying"):
        png = (ROOT / "records" / "site-check" / f"{shot}-2026-12-05.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        assert struct.unpack(">I", png[16:20])[0] == 1280
    found = [f for page in run["pages"].values() for f in page]
    paragraphs = [f["over"] for f in found if f["what"] == "p"]
    assert len(paragraphs) == 3
    assert set(paragraphs) <= {2, 3}
    assert {f["what"] for f in found} == {"p", "table", "wrapped code"}
    dev = " ".join((ROOT / "docs" / "development.md").read_text().split())
    assert "found both of those pages clean" in dev
    assert "three paragraphs 2\N{EN DASH}3 px too wide" in dev


def test_the_performance_pages_fleet_table_and_targets_are_its_dated_run():
    """The fold-and-pull table of today's fold, its ratios and its cost per value on the performance
    page are the dated run's (``bench --instructions --fleet``)."""
    run = json.loads((ROOT / "records" / "bench" / "instructions-fleet-2026-12-05.json").read_text())
    page = " ".join((ROOT / "docs" / "performance.md").read_text().split())

    def m(v: float) -> str:
        return f"{v / 1e6:.2f} M" if v >= 1e6 else f"{v / 1e3:.0f} k"

    for r in run["rows"]:
        slots = f"{r['slots']:,}".replace(",", " ")
        row = f"| {r['lifecycle']} | {slots} | {m(r['fold'])} | {m(r['pull'])} | {r['collectors_at_1hz']:.0f} |"
        assert row in page, row
    fold = {(r["lifecycle"], r["slots"]): r["fold"] for r in run["rows"]}
    assert f"| {fold[('history', 1024)] / fold[('history', 64)]:.3f} | met |" in page
    assert f"| {fold[('state', 1024)] / fold[('state', 64)]:.3f} | met |" in page
    per = {x["slots"]: x for x in run["marginal"]}
    assert f"| {per[64]['per_value'] / per[4]['per_value']:.3f} | met |" in page
    assert (
        f"costs {per[4]['per_value']:,.0f} instructions per value at 4 slots and {per[64]['per_value']:,.0f} at 64".replace(
            ",", " "
        )
        in page
    )
    fixed = per[4]["fold_64_values"] - 64 * per[4]["per_value"]
    assert (
        f"| {fixed / 1e3:.0f} k (the 64-value fold less 64 values at {per[4]['per_value']:,.0f})".replace(",", " ")
        in page
    )
    assert f"({run['rate'] / 1e9:.1f} G instructions per second of the server's CPU" in page


def test_the_fold_context_runs_figures_on_the_performance_page_are_its_dated_run():
    """The fold's instruction counts after the semantics' Lua was given the fold context, as the page
    says them, are the dated run's, and within the page's bound of the table's run."""
    text = (ROOT / "records" / "bench" / "instructions-fleet-2026-12-05-fold-context.txt").read_text()
    after = {
        (m[1], int(m[2])): int(m[3].replace(",", ""))
        for m in re.finditer(r"^(history|state)\s+(\d+)\s+([\d,]+)\s", text, flags=re.M)
    }
    before = {
        (r["lifecycle"], r["slots"]): r["fold"]
        for r in json.loads((ROOT / "records" / "bench" / "instructions-fleet-2026-12-05.json").read_text())["rows"]
    }
    assert len(after) == 6
    assert set(after) == set(before)
    page = " ".join((ROOT / "docs" / "performance.md").read_text().split())
    for kind in ("history", "state"):
        said = " / ".join(f"{after[(kind, n)]:,}" for n in (4, 64, 1024))
        assert f"{said} instructions at 4 / 64 / 1 024" in page or f"{said} (state)" in page, said
    worst = max(abs(after[k] / before[k] - 1) for k in after)
    assert worst <= 0.0006
    assert "within 0.06 % of the table's" in page


def test_the_performance_pages_stage_table_of_todays_fold_is_its_dated_run():
    """The stages of today's fold on the performance page add up the dated profile's lines."""
    lines = (ROOT / "records" / "bench" / "fold-stages-2026-12-05-exact.txt").read_text().splitlines()[2:]
    cost = [int(line.split()[0].replace(",", "")) for line in lines]
    whole, stages = cost[-1], cost[:-1]
    assert sum(stages) == whole
    page = " ".join((ROOT / "docs" / "performance.md").read_text().split())
    assert f"spends its {whole / 1e6:.2f} M instructions" in page
    groups = [sum(stages[:6]), sum(stages[6:8]), stages[8], stages[9], sum(stages[10:])]
    shown = [f"{g / 1e6:.2f} M" if g >= 1e6 else f"{g / 1e3:.0f} k" for g in groups]
    for value in shown:
        assert f"| {value} |" in page, value


def test_the_development_pages_package_layout_is_generated_from_the_package():
    """The development page's package layout is what scripts/package_layout.py lists of the package
    (every module and folder, each with its docstring's first sentence), so it cannot drift: a module
    added, moved or re-described changes the listing, and this test then asks for ``--write``."""
    import runpy

    layout = runpy.run_path(str(ROOT / "scripts" / "package_layout.py"), run_name="package_layout")
    page = (ROOT / "docs" / "development.md").read_text()
    block = page[page.index(layout["BEGIN"]) : page.index(layout["END"]) + len(layout["END"])]
    assert block == layout["layout"]()
    listed = {line.split()[0] for line in block.splitlines() if line.startswith("  ")}
    assert {"aggregation/", "library.py", "settings.py", "lifecycle.lua", "exact.lua"} <= listed


def test_the_performance_pages_reference_folds_are_their_dated_run():
    """The performance page's reference folds (floor_add, the plain fold) and the exact fold's ratios to
    them are those of the dated run it cites."""
    run = json.loads((ROOT / "records" / "bench" / "instructions-fleet-2026-12-08.json").read_text())
    page = " ".join((ROOT / "docs" / "performance.md").read_text().split())
    floors = run["floors"]
    assert (
        f"`floor_add` {floors['floor_add'] / 1e6:.2f} M instructions, the plain fold {floors['plain_fold'] / 1e6:.2f} M"
        in page
    )
    rows = {(r["lifecycle"], r["slots"]): r for r in run["rows"]}
    history, state = rows[("history", 64)], rows[("state", 64)]
    assert (
        f"{history['fold'] / 1e6:.2f} M as a history key ({history['over_floor_add']:.2f} × `floor_add`, "
        f"{history['over_plain_fold']:.2f} × the plain fold)" in page
    )
    assert (
        f"{state['fold'] / 1e6:.2f} M as a state key ({state['over_floor_add']:.2f} ×, {state['over_plain_fold']:.2f} ×)"
        in page
    )
