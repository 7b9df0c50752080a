"""``redisync demo``: a fleet of collector processes with adaptive motion samplers, sync off then on.

Each collector (a process of its own) steps its envs over a motion whose bins differ in
difficulty, with failure rates of its own shard. Without sync every shard's sampling
distribution follows its own failures and they drift apart; with sync every shard samples
from the pooled distribution — the one a single unsharded run of all the envs would use.
The demo prints per-shard figures and writes a PNG of both runs.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import RedisyncError
from ..lifeline import spawn
from ..store.client import connect, serve_embedded

UNIFORM_RATIO = 0.1


def sampling_probs(ema: np.ndarray) -> np.ndarray:
    """The sampler's start-bin distribution (kernel size 1): ``(ema + ε / B)`` normalised."""
    p = ema + UNIFORM_RATIO / ema.size
    return p / p.sum()


def tv_distance(p: np.ndarray, q: np.ndarray) -> float:
    return 0.5 * float(np.abs(p - q).sum())


def normalised_entropy(p: np.ndarray) -> float:
    nz = p[p > 0]
    return float(-(nz * np.log(nz)).sum() / np.log(p.size))


@dataclass
class Phase:
    """One run of the fleet: per step and shard, the own EMA and the distribution actually used."""

    sync: bool
    own: dict[int, dict[int, np.ndarray]] = field(default_factory=dict)  # step -> shard -> own EMA
    used: dict[int, dict[int, np.ndarray]] = field(default_factory=dict)  # step -> shard -> sampling probs
    summaries: dict[int, dict[str, float]] = field(default_factory=dict)
    fleet_version: int = 0

    def pooled(self, step: int) -> np.ndarray:
        """What one unsharded run would sample from: the EMA of all failures is the sum of the own EMAs."""
        total = np.zeros(0)
        for n, own in enumerate(self.own[step].values()):  # 0 + own₁ + own₂ + … in shard order, as before
            total = own if n == 0 else total + own
        return sampling_probs(total)

    def tv(self, step: int, shard: int) -> float:
        return tv_distance(self.used[step][shard], self.pooled(step))

    @property
    def last(self) -> int:
        return max(self.used)

    def rows(self) -> list[dict[str, float]]:
        out = []
        for shard in sorted(self.used[self.last]):
            p = self.used[self.last][shard]
            out.append(
                {
                    "shard": shard,
                    "tv": self.tv(self.last, shard),
                    "entropy": normalised_entropy(p),
                    "top1_bin": int(p.argmax()),
                    "top1_prob": float(p.max()),
                }
            )
        return out

    @property
    def publishes(self) -> int:
        return int(sum(s.get("redisync/publishes", 0) for s in self.summaries.values()))

    @property
    def unpublished(self) -> list[int]:
        """The collectors whose last report did not reach the store at stop()."""
        return sorted(shard for shard, s in self.summaries.items() if not s.get("last_report_published", 1.0))

    @property
    def latency_ms(self) -> float | None:
        lat = [s["redisync/publish_latency_ms"] for s in self.summaries.values() if "redisync/publish_latency_ms" in s]
        return statistics.median(lat) if lat else None


def run_phase(url: str, cfg: Any, sync: bool, progress: Any, run: str, keep: bool) -> Phase:
    """One run of the fleet under ``run``; deleted at the end unless ``keep``."""
    from .collector import run_collector

    ctx = mp.get_context("spawn")
    out, go, end = ctx.Queue(), ctx.Event(), ctx.Barrier(cfg.shards)
    progress.set_postfix_str(f"starting {cfg.shards} collector processes", refresh=True)
    # each dies with this process, having stopped its syncer (a killed demo leaves no fleet running)
    procs = [spawn(run_collector, url, run, s, cfg, sync, out, go, end) for s in range(cfg.shards)]
    phase, done, ready = Phase(sync), 0, 0
    try:
        while done < cfg.shards:
            try:
                msg = out.get(timeout=5)
            except queue.Empty:
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise RedisyncError(f"a demo collector failed (exit codes {dead})") from None
                continue
            kind, shard = msg[0], msg[1]
            if kind == "ready":
                ready += 1
                progress.set_postfix_str(f"{ready}/{cfg.shards} collectors ready", refresh=True)
                if ready == cfg.shards:  # the whole fleet starts stepping at once
                    go.set()
                    progress.set_postfix_str("stepping", refresh=True)
            elif kind == "snapshot":
                _, _, step, own, used = msg
                phase.own.setdefault(step, {})[shard] = own
                phase.used.setdefault(step, {})[shard] = used
            elif kind == "progress":
                progress.update(msg[2])
            elif kind == "log":
                progress.write(msg[2])  # on a line of its own above the bar
            else:
                phase.summaries[shard] = msg[2]
                done += 1
        if sync:
            phase.fleet_version = connect(url, run=run).fleet().fleet_version
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
        if not keep:
            connect(url, run=run).delete()
    return phase


def plot(phases: dict[bool, Phase], cfg: Any, path: Path) -> tuple[float, float]:
    """Writes the demo's picture to ``path``; returns the y-range of its two distribution panels,
    one scale for both (so that a flatter panel is not stretched to look as peaked as the other)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # two rows, so that a page's width shows it legibly: the distributions side by side, the distance below
    fig = plt.figure(figsize=(11, 8.5))
    grid = fig.add_gridspec(2, 2)
    axes = [fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1]), fig.add_subplot(grid[1, :])]
    bins = np.arange(cfg.bins)
    colors = plt.cm.tab10(np.arange(cfg.shards) % 10)
    for ax, sync in zip(axes[:2], (False, True), strict=False):
        ph = phases[sync]
        for shard, p in sorted(ph.used[ph.last].items()):
            ax.plot(bins, p, color=colors[shard], lw=1.6, label=f"shard {shard}")
        ax.plot(bins, ph.pooled(ph.last), "k--", lw=2, label="pooled (unsharded)")
        ax.set_title(f"sync {'ON' if sync else 'OFF'}: start-bin distributions\nat step {ph.last}")
        ax.set_xlabel("motion bin (1 s each)")
        ax.set_ylabel("sampling probability")
        ax.legend(fontsize=8)
    top = max(max(float(p.max()) for p in ph.used[ph.last].values()) for ph in phases.values())
    top = max(top, *(float(ph.pooled(ph.last).max()) for ph in phases.values()))
    for ax in axes[:2]:
        ax.set_ylim(0.0, top * 1.05)
    ax = axes[2]
    for sync, style in ((False, "--"), (True, "-")):
        ph = phases[sync]
        steps = sorted(ph.used)
        for shard in range(cfg.shards):
            ax.plot(
                steps,
                [ph.tv(s, shard) for s in steps],
                style,
                color=colors[shard],
                label=f"shard {shard} sync {'on' if sync else 'off'}",
            )
    ax.set_title("TV distance from the pooled distribution")
    ax.set_xlabel("env step")
    ax.set_ylabel("TV distance (log scale)")
    ax.set_yscale("log")
    ax.legend(fontsize=8, ncol=4)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    ylim = axes[0].get_ylim()
    assert ylim == axes[1].get_ylim()
    plt.close(fig)
    return ylim


def run_demo(
    url: str | None,
    cfg: Any,
    out_dir: Path,
    run: str,
    keep: bool,
    show_progress: bool = True,
    on_start: Callable[[str], None] | None = None,
    on_done: Callable[[str, dict[bool, Phase]], None] | None = None,
) -> dict[bool, Phase]:
    """Both runs of the fleet against ``url`` (None: an embedded server all collectors reach over
    TCP). The synced run is ``run`` (the unsynced one writes nothing); ``on_start`` gets the URL the
    collectors use before they start; ``on_done(url, phases)`` runs while an embedded server is still
    up (it serves the run until ``on_done`` returns). With ``keep``, the run is not deleted."""
    from tqdm import tqdm

    server = serve_embedded() if url is None else None
    target = server.url if server is not None else url
    assert target is not None
    try:
        if on_start is not None:
            on_start(target)
        phases = {}
        for number, sync in enumerate((False, True), 1):  # a bar per phase, shown before its processes start
            with tqdm(
                total=cfg.shards * cfg.steps,
                unit="step",
                unit_scale=True,
                disable=not show_progress,
                desc=f"phase {number}/2: sync {'on' if sync else 'off'}",
            ) as bar:
                phases[sync] = run_phase(target, cfg, sync, bar, run, keep)
        plot(phases, cfg, out_dir / "demo.png")
        if on_done is not None:
            on_done(target, phases)
    finally:
        if server is not None:
            server.close()
    return phases
