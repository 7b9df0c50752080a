"""MotrixLab's asynchronous FastSAC: the collectors' adaptive start-frame samplers, synced.

MotrixLab's async FastSAC (``motrix-rl-builtin``) runs one learner and N spawned collector
processes, ``fastsac-async-collector-{i}``, each building its own environment. A whole-body-
tracking command keeps its failure EMA per collector, so N collectors sample start frames from N
different distributions, each fed 1/N of the failures. The trainer has no collector callback; the
seam is the environment class, so the drop-in is a mixin::

    class MyTrackingEnv(SyncedAdaptiveSampling, MyTrackingEnvBase):   # MyTrackingEnvBase: an ArrayEnv
        redisync_mode = "pooled"                                      # or "broadcast", "local"

and each collector's command then builds its CDF from the fleet's summed EMA. What the mixin
relies on is the layout of MotrixLab's ``WbtMotionCommand`` (from its published source; that
package is not installable, so the parity is with its formula, not tested against it): the command
holds its failure EMA as a numpy array ``adaptive_bin_failed_count`` that compiled kernels read
(updated in place, never rebound), folds it in ``on_transition()``, and rebuilds its sampling CDF
from it inside ``reset(ctx)``. So the mixin never computes the distribution itself:

- ``on_transition()``: the command's own, then the process's fleet counts a step (a publish every
  ``publish_every_steps`` steps, handed to the sidecar: no network on the step);
- ``reset(ctx)``: the newest fleet state is swapped in (a reset boundary); for the duration of the
  command's own reset the EMA array holds the EMA the mode samples from (the fleet's sum, or the
  owner's), written in place, and the shard's own EMA is written back right after — so the
  command's formula, kernel smoothing and cuts included, run on the fleet's EMA, and what the shard
  reports stays its own. A grouped EMA (motions end to end, or ``[G, bins]``) pools bin by bin.

The shard id is the collector's index (from its process name; ``REDISYNC_SHARD_OFFSET`` adds to it
when several trainers share a run). An environment built anywhere else — the parent's 1-env probe,
the synchronous trainer's single process, an evaluation — joins no fleet and samples locally. The
fleet starts when the collector's environment is built and publishes its last report at exit.
"""

from __future__ import annotations

import multiprocessing
import os
import re
from typing import Any, Literal

import numpy as np

from ..errors import ConfigurationError
from ..terms.numpy import FailureEma
from . import ProcessFleet, process_fleet

SyncMode = Literal["local", "pooled", "broadcast"]
COLLECTOR = re.compile(r"^fastsac-async-collector-(\d+)$")
ENV_OFFSET = "REDISYNC_SHARD_OFFSET"
_EMA, _RESET, _TRANSITION = "adaptive_bin_failed_count", "reset", "on_transition"


def collector_index(name: str | None = None) -> int | None:
    """This process's collector index in MotrixLab's async trainer, or None when it is not a collector."""
    match = COLLECTOR.match(name if name is not None else multiprocessing.current_process().name)
    return int(match.group(1)) if match else None


class SyncedAdaptiveSampling:
    """Mixin for a motrix ``ArrayEnv`` whose command keeps a WBT-style adaptive sampler.

    Class attributes configure it: ``redisync_mode`` (``pooled``, ``broadcast`` or ``local``),
    ``redisync_key`` (the store key), ``redisync_owner`` (the broadcast's owner shard),
    ``redisync_stale_after_s`` (drop a collector's EMA from the pool once it has not published for
    that long: a dead collector that never comes back). :meth:`redisync_command` finds the command.
    """

    redisync_mode: SyncMode = "pooled"
    redisync_key: str = "motion/bin_failed"
    redisync_owner: int = 0
    redisync_stale_after_s: float | None = None

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        index = collector_index()
        self.redisync_fleet: ProcessFleet | None = None
        self.redisync_ema: FailureEma | None = None
        if index is None or self.redisync_mode == "local":
            return  # the parent's probe env, a synchronous trainer, an evaluation: local sampling
        command = self.redisync_command()
        own = getattr(command, _EMA)
        shard = index + int(os.environ.get(ENV_OFFSET, "0"))
        self.redisync_ema = FailureEma(
            own,
            mode=self.redisync_mode,
            key=self.redisync_key,
            shard_id=shard,
            owner=self.redisync_owner,
            stale_after_s=self.redisync_stale_after_s,
        )
        fleet = process_fleet()
        if fleet.syncer is None:
            fleet.configure(shard_id=shard)
        fleet.add(self.redisync_ema)
        _wrap(command, self.redisync_ema, fleet)
        fleet.start()  # register, claim the shard and start the sidecar now, not inside the first step
        self.redisync_fleet = fleet

    def redisync_command(self) -> Any:
        """The command whose sampler is synced: the one attribute of the env that holds an
        ``adaptive_bin_failed_count`` array and ``reset``/``on_transition`` methods (override this
        when there are several or it lives deeper)."""
        found = [value for value in vars(self).values() if _is_command(value)]
        if len(found) != 1:
            raise ConfigurationError(
                f"{type(self).__name__}: found {len(found)} commands with an {_EMA} numpy array and reset()/"
                f"{_TRANSITION}() among the env's attributes; override redisync_command() to return the one to sync"
            )
        return found[0]


def _is_command(value: Any) -> bool:
    return isinstance(getattr(value, _EMA, None), np.ndarray) and all(
        callable(getattr(value, name, None)) for name in (_RESET, _TRANSITION)
    )


def _wrap(command: Any, ema: FailureEma, fleet: ProcessFleet) -> None:
    """Wrap the command's two methods on the instance (its class and every other instance unchanged)."""
    transition, reset = getattr(command, _TRANSITION), getattr(command, _RESET)
    own = ema.own
    saved = np.empty_like(own)

    def on_transition(*args: Any, **kwargs: Any) -> Any:
        result = transition(*args, **kwargs)
        fleet.on_step()
        return result

    def synced_reset(*args: Any, **kwargs: Any) -> Any:
        fleet.at_reset_boundary()
        np.copyto(saved, own)
        ema.write_sampling_ema(own)  # in place: the command's kernels hold this very array
        try:
            return reset(*args, **kwargs)
        finally:
            np.copyto(own, saved)

    setattr(command, _TRANSITION, on_transition)
    setattr(command, _RESET, synced_reset)
