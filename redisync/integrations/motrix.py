"""MotrixLab's asynchronous FastSAC: the whole-body-tracking command's adaptive sampler, synced
across the collectors.

MotrixLab's async FastSAC (``motrix-rl-builtin``) runs one learner and N spawned collector
processes, ``fastsac-async-collector-{i}``, each building its own environment. Its WBT tasks have
no env class of their own: they register the generic ``ManagerEnv``, which keeps its command terms
in ``command_terms`` — frozen, slotted ``@kernel_data`` dataclasses whose numpy arrays compiled
kernels read. The WBT command keeps a failure EMA per collector (``adaptive_bin_failed_count``),
so N collectors sample start frames from N distributions, each fed 1/N of the failures.

The drop-in is one line where the task is registered::

    registry.env("g1-wbt-dance")(SyncedManagerEnv)        # in place of ManagerEnv
    registry.env("my-task")(synced(MyManagerEnv, mode="broadcast"))   # a ManagerEnv subclass

It hooks where ``ManagerEnv`` drives its command terms and touches nothing else:

- ``compute_transition`` (which calls every term's ``on_transition()``, the EMA fold): then the
  process's fleet counts a step (a publish every ``publish_every_steps``, handed to the worker);
- ``reset(env_ids, ...)`` (which calls every term's ``reset(ResetContext)``, where the command
  records failures and rebuilds its CDF, then runs the reset kernels that draw from it): first the
  newest fleet state is swapped in; for the duration of the reset the command's own EMA array
  holds the EMA the mode samples from (the fleet's sum, or the owner's), written in place; the
  shard's own EMA is written back right after. So the command's own formula — smoothing and the
  cut past the last startable frame included — runs on the fleet's EMA, the arrays keep their
  identity, dtype and data pointer (the kernels hold them), and what the shard reports stays its own.

The state stays in the command term. The shard id is the collector's index (from its process
name; ``REDISYNC_SHARD_OFFSET`` adds to it when several trainers share a run). The parent's 1-env
probe, an evaluation or ``mxlab play`` join no fleet and sample locally. A collector's fleet
starts when its environment is built and publishes its last report at exit. Settings are class
attributes (``synced(..., mode=, key=, command=, owner=, stale_after_s=, lease_grace_s=)``), and
the environment overrides them for a run: ``REDISYNC_MODE``, ``REDISYNC_KEY``, ``REDISYNC_COMMAND``.
"""

from __future__ import annotations

import base64
import json
import logging
import multiprocessing
import os
import re
from importlib import import_module
from typing import Any, get_args

import numpy as np
from motrix_env_core.manager import ManagerEnv

from ..errors import ConfigurationError
from ..store.schema import DEFAULT_LEASE_GRACE_S
from ..terms.numpy import FailureEma
from ..terms.role import role_of
from ..terms.sampler_options import SAMPLER_KEY, DropInMode
from . import ProcessFleet, process_fleet

MODES: tuple[str, ...] = get_args(DropInMode)
COLLECTOR = re.compile(r"^fastsac-async-collector-(\d+)$")
ENV_OFFSET, ENV_MODE, ENV_KEY, ENV_COMMAND = (
    "REDISYNC_SHARD_OFFSET",
    "REDISYNC_MODE",
    "REDISYNC_KEY",
    "REDISYNC_COMMAND",
)
EMA = "adaptive_bin_failed_count"  # the WBT command's failure EMA (float32, read by its kernels)
log = logging.getLogger(__name__)
_said_disabled: list[bool] = []  # a disabled sampler is said once per process, not per env


def collector_index(name: str | None = None) -> int | None:
    """This process's collector index in MotrixLab's async trainer, or None when it is not a collector."""
    match = COLLECTOR.match(name if name is not None else multiprocessing.current_process().name)
    return int(match.group(1)) if match else None


class SyncedCommands:
    """The sync hooks over a ``ManagerEnv`` (list it before the env class, or use `synced`)."""

    redisync_mode: DropInMode = "pooled"
    redisync_key: str = SAMPLER_KEY
    redisync_command: str | None = None  # None: the one command term that holds an adaptive_bin_failed_count
    redisync_owner: int = 0
    redisync_stale_after_s: float | None = None
    redisync_lease_grace_s: float | None = DEFAULT_LEASE_GRACE_S

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.redisync_fleet: ProcessFleet | None = None
        self.redisync_ema: FailureEma | None = None
        mode = os.environ.get(ENV_MODE) or self.redisync_mode
        if mode not in MODES:
            raise ConfigurationError(
                f"{type(self).__name__}: unknown redisync mode {mode!r} (from {_source(ENV_MODE, 'redisync_mode')}); "
                f"set one of {', '.join(MODES)}"
            )
        if not role_of(mode, leads=False).syncs:
            return
        command = self._synced_command()
        if getattr(command, EMA).size == 0:  # WbtMotionCommandCfg(adaptive_sampling_enabled=False): 0 bins
            if not _said_disabled:
                log.info(
                    "%s: the adaptive sampler of its command is disabled (its %s has no bins): nothing to sync, "
                    "start frames stay the command's own",
                    type(self).__name__,
                    EMA,
                )
                _said_disabled.append(True)
            return
        index = collector_index()
        if index is None:
            return  # the parent's probe env, an evaluation, a synchronous trainer: local sampling
        shard = index + int(os.environ.get(ENV_OFFSET, "0"))
        self.redisync_ema = FailureEma(
            getattr(command, EMA),  # the command's own array: read where it lies, written in place
            mode=mode,  # type: ignore[arg-type]
            key=os.environ.get(ENV_KEY) or self.redisync_key,
            shard_id=shard,
            owner=self.redisync_owner,
            stale_after_s=self.redisync_stale_after_s,
            lease_grace_s=self.redisync_lease_grace_s,
        )
        fleet = process_fleet()
        if fleet.syncer is None:
            fleet.configure(shard_id=shard)
        fleet.add(self.redisync_ema)
        fleet.start()  # register, claim the shard and start the worker now, not inside the first step
        self.redisync_fleet = fleet

    def _synced_command(self) -> Any:
        """The command term to sync, by name or as the one term holding a failure EMA."""
        terms: dict[str, Any] = dict(getattr(self, "command_terms", {}))
        seen = ", ".join(f"{n} ({type(t).__name__})" for n, t in terms.items()) or "none"
        env = type(self).__name__
        name = os.environ.get(ENV_COMMAND) or self.redisync_command
        if name is not None:
            if name not in terms:
                raise ConfigurationError(
                    f"{env}: no command term {name!r} (from {_source(ENV_COMMAND, 'redisync_command')}); "
                    f"its command terms: {seen}"
                )
            found = [name]
        else:
            found = [n for n, t in terms.items() if hasattr(t, EMA)]
            if len(found) != 1:
                if not found:
                    raise ConfigurationError(
                        f"{env}: no command term holds an {EMA} array (its command terms: {seen}): the task has no "
                        f"adaptive motion sampler to sync; register the plain ManagerEnv for it, or set "
                        f"{ENV_MODE}=local"
                    )
                raise ConfigurationError(
                    f"{env}: {len(found)} command terms hold an {EMA} array (its command terms: {seen}); set "
                    f"redisync_command (synced(..., command=...)) or {ENV_COMMAND} to the name of the one to sync"
                )
        command = terms[found[0]]
        ema = getattr(command, EMA, None)
        if not isinstance(ema, np.ndarray) or ema.dtype.kind != "f" or ema.ndim not in (1, 2):
            raise ConfigurationError(
                f"{env}: command term {found[0]!r} ({type(command).__name__}) has an {EMA} that is not a 1-D or 2-D "
                f"float numpy array (got {type(ema).__name__} {getattr(ema, 'dtype', '')} "
                f"{getattr(ema, 'shape', '')}); redisync writes the fleet's EMA into that array in place"
            )
        return command

    def compute_transition(self, state: Any) -> Any:
        """ManagerEnv's transition (the command terms' EMA fold), then one env step for the fleet."""
        state = super().compute_transition(state)  # type: ignore[misc]  # the terms' on_transition(): the EMA fold
        if self.redisync_fleet is not None:
            self.redisync_fleet.on_step()
            # scalar gauges in the env's live metrics view: MotrixLab reduces it into info["metrics"], which
            # its collectors send to the learner's console and logger
            self.redisync_fleet.put_metrics(state.metrics)
        return state

    def reset(self, env_ids: np.ndarray, *args: Any, **kwargs: Any) -> Any:
        """ManagerEnv's reset with the fleet's EMA in the command's own array while it builds the CDF."""
        ema = self.redisync_ema
        if ema is None or self.redisync_fleet is None or not np.size(env_ids):
            return super().reset(env_ids, *args, **kwargs)  # type: ignore[misc]
        self.redisync_fleet.at_reset_boundary()
        own = ema.own
        saved = own.copy()
        ema.write_sampling_ema(own)  # in place: the command's kernels hold this very array
        try:
            return super().reset(env_ids, *args, **kwargs)  # type: ignore[misc]  # the command's reset: CDF from it
        finally:
            np.copyto(own, saved)


def _source(variable: str, attribute: str) -> str:
    return f"${variable}" if os.environ.get(variable) else f"the class attribute {attribute}"


class SyncedManagerEnv(SyncedCommands, ManagerEnv):
    """MotrixLab's ``ManagerEnv`` with its WBT command's sampler synced: register it in place of ``ManagerEnv``."""


_SETTINGS = ("mode", "key", "command", "owner", "stale_after_s", "lease_grace_s")


def synced(env_cls: type = ManagerEnv, **settings: Any) -> type:
    """``env_cls`` (``ManagerEnv`` or a subclass) with its adaptive command synced, for the line that
    registers the task; ``settings``: ``mode``, ``key``, ``command``, ``owner``, ``stale_after_s``,
    ``lease_grace_s``. The class pickles by name, so MotrixLab's spawned collectors rebuild it."""
    if not (isinstance(env_cls, type) and issubclass(env_cls, ManagerEnv)):
        raise ConfigurationError(f"synced(): {env_cls!r} is not a ManagerEnv class (MotrixLab's manager-based env)")
    unknown = set(settings) - set(_SETTINGS)
    if unknown:
        raise ConfigurationError(f"synced(): unknown settings {sorted(unknown)}; known: {', '.join(_SETTINGS)}")
    if settings.get("mode", "pooled") not in MODES:
        raise ConfigurationError(f"synced(): unknown mode {settings['mode']!r}; set one of {', '.join(MODES)}")
    spec = json.dumps([env_cls.__module__, env_cls.__qualname__, settings], sort_keys=True)
    return _synced_class(_name_of(spec))


_made: dict[str, type] = {}


def _name_of(spec: str) -> str:
    return "Synced_" + base64.b32encode(spec.encode()).decode().rstrip("=")


def _synced_class(name: str) -> type:
    """The class a name made by `synced` stands for (made once per process)."""
    if name not in _made:
        encoded = name.removeprefix("Synced_")
        module, qualname, settings = json.loads(base64.b32decode(encoded + "=" * (-len(encoded) % 8)))
        base: Any = import_module(module)
        for part in qualname.split("."):
            base = getattr(base, part)
        attrs = {f"redisync_{k}": v for k, v in settings.items()}
        cls = type(name, (SyncedCommands, base), {**attrs, "__module__": __name__, "__doc__": SyncedManagerEnv.__doc__})
        cls.__qualname__ = name  # pickled by this name: a spawned collector rebuilds it through __getattr__
        _made[name] = cls
    return _made[name]


def __getattr__(name: str) -> Any:
    if name.startswith("Synced_"):
        return _synced_class(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
