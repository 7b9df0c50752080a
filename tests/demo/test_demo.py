"""The demo's parts that the CLI test does not look at: its picture's scales and its collectors' logs."""

from __future__ import annotations

import logging
import queue

import numpy as np
import pytest

pytestmark = pytest.mark.extras("torch", "matplotlib")


def test_both_distribution_panels_share_one_y_scale(tmp_path):
    """Each panel once had its own scale: the flat synced panel was stretched to look as peaked."""
    from redisync.demo.collector import FleetConfig
    from redisync.demo.fleet import Phase, plot

    cfg = FleetConfig(shards=2, bins=5)
    peaked, flat = np.array([0.8, 0.05, 0.05, 0.05, 0.05]), np.full(5, 0.2)
    phases = {}
    for sync, shapes in ((False, (peaked, peaked[::-1])), (True, (flat, flat))):
        ph = Phase(sync)
        for step in (10, 20):
            ph.own[step] = {s: shapes[s] * 10 for s in range(2)}
            ph.used[step] = {s: shapes[s] for s in range(2)}
        phases[sync] = ph
    low, high = plot(phases, cfg, tmp_path / "demo.png")
    assert (tmp_path / "demo.png").stat().st_size > 0
    assert low == 0.0
    assert high == pytest.approx(0.8 * 1.05)  # the peaked panel's top, for the flat one too


def test_a_collectors_warning_reaches_the_demo_as_a_line_of_its_own():
    """A collector process's warning reaches the demo as a line of its own, prefixed with the collector."""
    from redisync.demo.collector import LogToParent

    out: queue.Queue = queue.Queue()
    logger = logging.getLogger("redisync.collector.test-demo")
    handler = LogToParent(out, 3)
    logging.getLogger("redisync").addHandler(handler)
    try:
        logger.warning("redisync shard %d: stopped with the last report not published", 3)
    finally:
        logging.getLogger("redisync").removeHandler(handler)
    assert out.get_nowait() == (
        "log",
        3,
        "collector 3: warning: redisync shard 3: stopped with the last report not published",
    )


def test_every_axis_of_the_plot_is_labelled_and_the_captions_name_its_layout(tmp_path, monkeypatch):
    """Two distribution panels over one distance panel, each axis labelled (the log axis had none);
    the README's and the docs home's captions say top left, top right and below (they said left,
    middle, right)."""
    from pathlib import Path

    import matplotlib.figure

    from redisync.demo.collector import FleetConfig
    from redisync.demo.fleet import Phase, plot

    saved = []
    real_savefig = matplotlib.figure.Figure.savefig

    def savefig(self, *args, **kwargs):
        saved.append([(ax.get_xlabel(), ax.get_ylabel(), ax.get_position().bounds) for ax in self.axes])
        return real_savefig(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    cfg = FleetConfig(shards=2, bins=5)
    phases = {}
    peaked = np.array([0.8, 0.05, 0.05, 0.05, 0.05])
    for sync in (False, True):
        ph = Phase(sync)
        for step in (10, 20):
            ph.own[step] = {s: (peaked if s else peaked[::-1]) * 10 for s in range(2)}
            ph.used[step] = {s: (peaked if s else peaked[::-1]) for s in range(2)}
        phases[sync] = ph
    plot(phases, cfg, tmp_path / "demo.png")
    (axes,) = saved
    assert len(axes) == 3
    assert all(x and y for x, y, _ in axes), axes
    (l1, b1, _, _), (l2, b2, _, _), (_, b3, w3, _) = (bounds for _, _, bounds in axes)
    assert b1 == pytest.approx(b2)  # two panels side by side ...
    assert l1 < l2
    assert b3 < b1  # ... over one wide one
    assert w3 > 0.8
    root = Path(__file__).resolve().parents[2]
    for page in (root / "README.md", root / "docs" / "index.md"):
        text = " ".join(page.read_text().split())
        for where in ("(top left)", "top right", "below"):
            assert where in text, (page, where)
        assert "(middle)" not in text, page
