"""``redisync bench --peers``: the collector's cost of keeping curriculum state in sync, redisync
beside the ``torch.distributed`` collectives trainers use today, side by side in one run.

Each scenario starts ``procs`` collector processes that step ``steps`` times. A step is an env step
(``STEP_S`` of sleep: a simulator on an accelerator, the CPU free meanwhile) and the failures of
256 envs recorded into a 64-bin adaptive sampler; then the sync call under test, timed on the
collector (its blocking time):

- ``gloo broadcast/step``: holosoma's pattern, rank 0's sampler state broadcast every step;
- ``gloo all_reduce/50``: the statistics all-reduced every 50 steps (rl_games' normaliser pattern);
- ``gloo all_reduce async/step``: the fair peer of an asynchronous design, an overlapped collective:
  every step issues ``all_reduce(async_op=True)`` and waits for the one issued a step earlier, so a
  collector works with the fleet state of the step before;
- ``redisync thread`` / ``redisync process``: ``Syncer.on_step()`` and ``at_reset_boundary()``
  every step, a publish every step (``/50``: every 50 steps), with the thread or the sidecar worker.

With ``straggler``, the last process sleeps 20 ms more every 10 steps (a slow env, a GC pause, a
checkpoint): a collective makes every other rank wait for it, a store should not. The figures are
the others' blocking times (the straggler's own are left out). Each row also says what the steps
did (redisync: handed a report over, applied a fleet state, or neither, with their shares and
times) and the floor: the p99 of a fixed 5 µs of spinning timed in the same loop, which is what
the machine's scheduling alone adds to a call that short. How fresh the applied fleet states are
is measured too: how many a collector applies per second, and how many versions the store was
ahead of the one it applied, at that moment (one HGET, outside the timed calls). Each row's
freshness: for redisync, those versions behind; for a collective, the steps between the step whose
statistics the state in hand holds and the current one (0: this step's; 1: the step before's).
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import statistics
import time
import uuid
from dataclasses import dataclass
from typing import Any

import torch

from .. import redis_server
from ..lifeline import spawn

STEP_S = 1e-3
ENVS, BINS = 256, 64
STRAGGLE_EVERY, STRAGGLE_S = 10, 0.02
WARMUP = 100
FLOOR_NS = 5_000  # the floor: a fixed 5 us of spinning, timed in the same loop right after the sync calls


def _spin(ns: int) -> None:
    end = time.perf_counter_ns() + ns
    while time.perf_counter_ns() < end:
        pass


@dataclass(frozen=True)
class Scenario:
    mode: str  # gloo-broadcast | gloo-allreduce | gloo-allreduce-async | thread | process
    procs: int
    every: int = 1  # steps between publishes / collectives
    straggler: bool = False

    @property
    def label(self) -> str:
        name = {
            "gloo-broadcast": "gloo broadcast",
            "gloo-allreduce": "gloo all_reduce",
            "gloo-allreduce-async": "gloo all_reduce async",
            "thread": "redisync thread",
            "process": "redisync process",
        }[self.mode]
        return f"{name}/{'step' if self.every == 1 else self.every}"


def _collector(scenario: Scenario, rank: int, steps: int, port: int, url: str | None, run: str, out: Any) -> None:
    from ..collector.workers import new_syncer
    from ..store.client import connect
    from ..terms.torch.sampler import AdaptiveMotionSampler

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(rank)
    sampler = AdaptiveMotionSampler(BINS * 50, 0.02, mode="pooled", shard_id=rank)
    syncer = None
    if scenario.mode.startswith("gloo"):
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=scenario.procs)
        state = torch.zeros_like(sampler.bin_failed_count)
    else:
        store = connect(url, run=run)
        syncer = new_syncer(
            store, rank, [sampler], worker=scenario.mode, publish_every_steps=scenario.every, poll_every_s=0.5
        ).start()

    straggles = scenario.straggler and rank == scenario.procs - 1
    timings: list[int] = []
    kinds: list[str | None] = []
    floor: list[int] = []
    lags: list[int] = []
    behind: list[int] = []  # collectives: steps between the state in hand and this step
    held, pending = -1, None  # the step whose statistics the state in hand holds; the async op in flight
    out.put(("ready", rank))
    perf_ns = time.perf_counter_ns
    for step in range(steps + WARMUP):
        if step == WARMUP:
            started = time.perf_counter()
        time.sleep(STEP_S + (STRAGGLE_S if straggles and step % STRAGGLE_EVERY == 0 else 0.0))
        sampler.record_failures(
            torch.randint(0, sampler.frame_counts[0], (ENVS,), generator=g), torch.rand(ENVS, generator=g) < 0.02
        )
        sampler.step()
        # only the sync calls are timed; what the step did is worked out after
        if syncer is not None:
            reported = syncer.cadence.time_at
            t = perf_ns()
            syncer.on_step()
            took_state = syncer.at_reset_boundary()
            t1 = perf_ns()
            kinds.append("apply" if took_state else "hand-over" if syncer.cadence.time_at != reported else "neither")
            if took_state and step >= WARMUP:  # how far behind the store the state just applied is, in versions
                lags.append(int(store.run_info().get("fleet_version", 0)) - syncer._applied_version)
        else:
            t = perf_ns()
            if step % scenario.every == 0:
                if scenario.mode == "gloo-broadcast":
                    if rank == 0:
                        state.copy_(sampler.bin_failed_count)
                    dist.broadcast(state, src=0)
                    held = step
                elif scenario.mode == "gloo-allreduce-async":
                    if pending is not None:
                        pending.wait()  # the state of the step before, reduced while this step ran
                        held = step - 1
                    state.copy_(sampler.bin_failed_count)
                    pending = dist.all_reduce(state, async_op=True)
                else:
                    state.copy_(sampler.bin_failed_count)
                    dist.all_reduce(state)
                    held = step
            t1 = perf_ns()
            kinds.append(None)
            if step >= WARMUP and held >= 0:
                behind.append(step - held)
        f0 = perf_ns()
        _spin(FLOOR_NS)
        timings.append(t1 - t)
        floor.append(perf_ns() - f0)
    loop_s = time.perf_counter() - started
    applied: float | None = None
    if syncer is not None:
        syncer.stop(flush=False)
        applied = syncer.metrics()["redisync/fleet_version"]
    else:
        import torch.distributed as dist

        if pending is not None:
            pending.wait()
        dist.destroy_process_group()
    out.put(
        (
            "done",
            rank,
            None if straggles else list(zip(timings, kinds, floor, strict=False))[WARMUP:],
            applied,
            (lags, loop_s),
            behind,
        )
    )


def measure(scenario: Scenario, steps: int, url: str | None) -> dict[str, Any]:
    """Blocking time per step of the non-straggling collectors, in microseconds."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    run = f"bench-peers-{uuid.uuid4().hex[:8]}"
    port = redis_server.free_port()
    t0 = time.perf_counter()
    # each dies with this process
    procs = [spawn(_collector, scenario, r, steps, port, url, run, out) for r in range(scenario.procs)]
    results: list[Any] = []
    try:
        while len(results) < scenario.procs:
            try:
                message = out.get(timeout=1.0)
            except queue.Empty:
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(
                        f"{scenario.label} with {scenario.procs} processes: a collector died (exit codes {dead})"
                    ) from None
                continue
            if message[0] == "done":  # ("done", rank, steps, applied, (lags, loop_s), behind)
                results.append(message)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
        if url is not None and not scenario.mode.startswith("gloo"):
            from ..store.client import connect

            connect(url, run=run).delete()
    steps_kept = [s for _, _, ss, _, _, _ in results if ss is not None for s in ss]
    times = sorted(t / 1e3 for t, _, _ in steps_kept)
    row = {
        "scenario": scenario.label,
        "mode": scenario.mode,
        "procs": scenario.procs,
        "every": scenario.every,
        "straggler": scenario.straggler,
        "p50_us": statistics.median(times),
        "p99_us": _p99(times),
        "mean_us": statistics.fmean(times),
        "wall_s": time.perf_counter() - t0,
        "fleet_versions_applied": [a for *_, a, _, _ in results if a is not None],
        "floor_p99_us": _p99(sorted(f / 1e3 for _, _, f in steps_kept)),
    }
    if scenario.mode.startswith("gloo"):
        behind = [b for *_, bs in results for b in bs]
        row["behind_steps_mean"] = statistics.fmean(behind) if behind else None
        row["freshness"] = None if not behind else f"{statistics.fmean(behind):.1f} steps behind"
    else:  # what the steps did: handed a report over, applied a fleet state, neither
        # how fresh the applied states are: how often one is applied, and how many versions the store was ahead then
        lags = sorted(lag for *_, (ls, _), _ in results for lag in ls)
        row["applies_per_s"] = statistics.fmean(len(ls) / loop_s for *_, (ls, loop_s), _ in results)
        row["applied_lag_versions_p50"] = statistics.median(lags) if lags else None
        row["freshness"] = None if not lags else f"{statistics.median(lags):g} versions behind (p50)"
        row["breakdown"] = {}
        for kind in ("hand-over", "apply", "neither"):
            ts = sorted(t / 1e3 for t, k, _ in steps_kept if k == kind)
            row["breakdown"][kind] = {
                "share": len(ts) / len(times),
                "p50_us": statistics.median(ts) if ts else None,
                "p99_us": _p99(ts) if ts else None,
            }
    return row


def _p99(ordered: list[float]) -> float:
    return ordered[int(0.99 * (len(ordered) - 1))]


SCENARIOS = tuple(
    Scenario(mode, procs, every, straggler)
    for straggler in (False, True)
    for procs in (2, 4)
    for mode, every in (
        ("gloo-broadcast", 1),
        ("gloo-allreduce", 50),
        ("gloo-allreduce-async", 1),
        ("thread", 50),
        ("thread", 1),
        ("process", 1),
    )
)


def run_peers(url: str, steps: int = 2000, scenarios: tuple[Scenario, ...] = SCENARIOS) -> dict[str, Any]:
    """Every scenario, then the ratios peer / redisync (the process worker, a publish every step)."""
    rows = [measure(s, steps, url) for s in scenarios]
    ratios = []
    for row in rows:
        ours = next(
            r
            for r in rows
            if r["mode"] == "process" and (r["procs"], r["straggler"]) == (row["procs"], row["straggler"])
        )
        if row is not ours:
            ratios.append(
                {
                    "scenario": row["scenario"],
                    "procs": row["procs"],
                    "straggler": row["straggler"],
                    "p50_ratio": row["p50_us"] / ours["p50_us"],
                    "p99_ratio": row["p99_us"] / ours["p99_us"],
                }
            )
    targets = {}
    for row in rows:
        if row["mode"] == "process" and row["procs"] == 4 and not row["straggler"]:
            targets = {
                "process_worker_p50_us<=5": {"measured": row["p50_us"], "limit": 5.0, "met": row["p50_us"] <= 5.0},
                "process_worker_p99_us<=50": {"measured": row["p99_us"], "limit": 50.0, "met": row["p99_us"] <= 50.0},
            }
    from ..store.client import masked_url

    return {
        "url": masked_url(url),
        "steps": steps,
        "step_s": STEP_S,
        "rows": rows,
        "ratios_over_redisync_process": ratios,
        "targets": targets,
    }
