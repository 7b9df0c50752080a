"""rsl_rl's observation normaliser, synced through the store: no collective, no barrier.

rsl_rl builds an ``EmpiricalNormalization(obs_dim)`` inside every model made with
``obs_normalization=True`` (actor, critic, RND); since rsl-rl-lib 5.5 its ``update`` all-reduces
count, mean and var over ``torch.distributed`` whenever a process group exists — a collective that
waits for the slowest rank at every update. `sync_normalizers` swaps each of them for a
`SyncedNormalization` holding the same state (rsl_rl's buffers and ``state_dict`` keys, so
checkpoints load both ways) and adds it to the process's fleet: each update hands the shard's
statistics to the Syncer's worker and takes in the last fleet statistics it pulled, and nothing
waits for another process.

    runner = OnPolicyRunner(env, train_cfg, log_dir, device)   # or mjlab's runner
    fleet = sync_normalizers(runner)                          # REDISYNC_URL, REDISYNC_SHARD / RANK
    runner.learn(num_learning_iterations=...)
    fleet.stop()
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rsl_rl.modules import EmpiricalNormalization
from torch import nn

from ..errors import ConfigurationError
from ..terms.torch.normalization import Mode
from . import ProcessFleet, process_fleet
from .normalizers import FleetNormalization

KEY_PREFIX = "rsl_rl"


class SyncedNormalization(FleetNormalization):
    """The synced normaliser as rsl_rl's models hold it."""


def _owners(root: Any) -> Iterator[tuple[str, nn.Module]]:
    """The modules an rsl_rl runner or algorithm holds (its ``alg``), by attribute name."""
    alg = getattr(root, "alg", root)
    if isinstance(alg, nn.Module):
        yield "", alg
        return
    for name, value in vars(alg).items():
        if isinstance(value, nn.Module):
            yield name.removeprefix("_raw_"), value


def normalizer_slots(root: Any) -> list[tuple[str, nn.Module, str, EmpiricalNormalization]]:
    """Every rsl_rl ``EmpiricalNormalization`` under ``root`` (a runner, an algorithm or a model):
    ``(where, parent module, attribute, module)``, each module once (rsl_rl keeps aliases such as
    ``_raw_actor``)."""
    found, seen = [], set()
    for owner_name, owner in _owners(root):
        for path, module in owner.named_modules():
            for attr, child in module.named_children():
                if isinstance(child, EmpiricalNormalization) and id(child) not in seen:
                    seen.add(id(child))
                    found.append((".".join(p for p in (owner_name, path, attr) if p), module, attr, child))
    return found


def sync_normalizers(
    root: Any,
    *,
    mode: Mode = "pooled",
    writer: bool = False,
    owner: int = 0,
    fleet: ProcessFleet | None = None,
    start: bool = True,
) -> ProcessFleet:
    """Replace every rsl_rl normaliser under ``root`` with a synced one carrying its state, and add
    them to ``fleet`` (the process's by default), which is returned: ``stop()`` it at the end.

    ``mode="pooled"`` (default): every shard normalises with the fleet's statistics, exactly what
    rsl_rl's all-reduce computes, without the collective. ``mode="learner"``: the process with
    ``writer=True`` owns the statistics and the others apply them. One key per normaliser:
    ``rsl_rl/<where>`` (``rsl_rl/actor.obs_normalizer``, …).

    ``start`` (default): the task and the runner are built, so the fleet starts here — its
    registration and its sidecar's start happen now, not in the first env step. ``start=False``
    leaves that to the first step, for terms still to be added. Given a runner, the fleet's metrics
    join its logging (`log_fleet_metrics`).
    """
    slots = normalizer_slots(root)
    if not slots:
        holosoma = (
            [n for n, v in vars(root).items() if type(v).__module__.endswith("fast_sac.fast_sac_utils")]
            if hasattr(root, "__dict__")
            else []
        )
        if holosoma:
            raise ConfigurationError(
                f"{', '.join(holosoma)} is holosoma FastSAC's EmpiricalNormalization, not rsl_rl's: "
                "use redisync.integrations.holosoma_wbt.sync_fastsac_normalizers(agent)"
            )
        raise ConfigurationError("no rsl_rl EmpiricalNormalization found: build the models with obs_normalization=True")
    fleet = fleet if fleet is not None else process_fleet()
    synced = []
    for where, parent, attr, module in slots:
        replacement = SyncedNormalization.replacing(
            module, key=f"{KEY_PREFIX}/{where}", fleet=fleet, mode=mode, writer=writer, owner=owner
        )
        setattr(parent, attr, replacement)
        synced.append(replacement)
    fleet.add(*synced)
    if start:
        fleet.start()
    if hasattr(getattr(root, "logger", None), "process_env_step"):  # an rsl_rl runner
        log_fleet_metrics(root.logger, fleet)
    return fleet


def log_fleet_metrics(logger: Any, fleet: ProcessFleet) -> None:
    """Put the fleet's metrics (`ProcessFleet.log_metrics`: health, staleness, drift) into
    rsl_rl's logger: each env step's ``extras["log"]`` (or ``extras["episode"]``) gains the
    ``redisync/...`` values, which rsl_rl averages over the iteration and writes to TensorBoard, W&B
    or Neptune with the env's own. `sync_normalizers` does this for a runner it is given."""
    if getattr(logger, "_redisync_logged", None) is fleet:
        return  # (once per logger)
    original = logger.process_env_step

    def process_env_step(rewards: Any, dones: Any, extras: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        metrics = fleet.log_metrics()
        if metrics:
            log = extras["episode"] if "episode" in extras else extras.setdefault("log", {})
            log.update(metrics)
        original(rewards, dones, extras, *args, **kwargs)

    logger.process_env_step = process_env_step
    logger._redisync_logged = fleet
