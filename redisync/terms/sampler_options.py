"""The adaptive start-frame sampler's options, declared once for both array libraries.

The torch sampler (`redisync.terms.torch.AdaptiveMotionSampler`) and the numpy one
(`redisync.terms.numpy.AdaptiveMotionSampler`) are one concept: the same modes, the same options
with the same defaults and checks, the same metrics. Each names these options in its own signature
(its defaults read from here) and adds only what its array library needs (a device; arrays the
caller owns).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

from ..errors import InvalidSchema
from ..store.schema import DEFAULT_LEASE_GRACE_S, Lifecycle
from .formulas import MIXES, UniformMix
from .role import Role, role_of

Mode = Literal["local", "pooled", "weighted", "broadcast", "observe"]
MODES: tuple[str, ...] = get_args(Mode)
SAMPLER_KEY = "motion/bin_failed"
"""The adaptive sampler's failure EMA's key unless told another (every sampler and drop-in)."""
DropInMode = Literal["pooled", "broadcast", "local", "observe"]
"""The modes a framework's drop-in offers, its default first (``weighted`` needs per-shard weights a framework does not give)."""


@dataclass(frozen=True)
class SamplerOptions:
    """What an adaptive sampler is told, checked against its motion lengths by `check`.

    Attributes:
        mode: ``"local"`` (its own EMA), ``"pooled"`` (the sum of every shard's own EMA: what one
            unsharded sampler would hold), ``"weighted"`` (the failure-weighted mean, blended into
            the own EMA at each reset boundary), ``"broadcast"`` (the owner's EMA) or ``"observe"``
            (its own EMA, as ``"local"``, while it reports as ``"pooled"`` does and reads the fleet's:
            its metrics measure how far its start distribution is from the pooled one, and it warns
            where that distance is as large as where unsynced shards trained worse).
        key: the store key of the failure EMA.
        shard_id: this collector's shard.
        owner: the shard whose EMA ``"broadcast"`` follows.
        alpha: the EMA's rate per env step (BeyondMimic's 0.001).
        uniform_ratio: ε, the uniform share mixed into the start distribution.
        uniform_mix: ``"code"`` (BeyondMimic's code: ``ema + ε/B``) or ``"paper"`` (a fixed share ε).
        group_uniform_ratio: the uniform floor when a group is drawn.
        group_names: names for the groups in the metrics (default ``group_0``, ``group_1``, ...).
        worst_groups: how many of the sharpest and most drifted groups the metrics name.
        kernel_size: the smoothing kernel's width in bins (BeyondMimic's; 1: none).
        kernel_lambda: the kernel's decay.
        stale_after_s: the merge key's ``stale_after_s`` (a silent shard leaves the pool).
        lifecycle: the merge key's life cycle (``"state"``: a current value).
        lease_grace_s: how long past its lease a lapsed shard's slot still counts (a ``"state"``
            key's; ``None``: for ever).
        rebuild_tol: the distribution is rebuilt when the EMA it was built from moved by more than
            this share of its mass (0: whenever it changed at all; a ``local`` sampler always
            uses 0, so that it reproduces the unsynced algorithm exactly).
        fleet_shards: the shards of the fleet this one belongs to (torchrun's world size, the
            collectors of an async trainer); given, a ``local`` sampler warns once when its own EMA
            is a poor guide where the fleet's pooled one would be fair (`EmaWatch`).
    """

    mode: Mode = "pooled"
    key: str = SAMPLER_KEY
    shard_id: int = 0
    owner: int = 0
    alpha: float = 0.001
    uniform_ratio: float = 0.1
    uniform_mix: UniformMix = "code"
    group_uniform_ratio: float = 0.1
    group_names: Sequence[str] | None = None
    worst_groups: int = 3
    kernel_size: int = 1
    kernel_lambda: float = 0.8
    stale_after_s: float | None = None
    lifecycle: Lifecycle = "state"
    lease_grace_s: float | None = DEFAULT_LEASE_GRACE_S
    rebuild_tol: float = 1e-4
    fleet_shards: int | None = None

    @classmethod
    def of(cls, arguments: Mapping[str, Any]) -> SamplerOptions:
        """The options among a sampler's arguments (its ``locals()`` on entry: each sampler names
        every option in its own signature, for its users' help and IDEs)."""
        return cls(**{field.name: arguments[field.name] for field in dataclasses.fields(cls)})

    def check(self, frames: tuple[int, ...], step_dt: float) -> None:
        """Refuse options that make no sampler for motions of ``frames`` frames at ``step_dt``."""
        if self.mode not in MODES:
            raise InvalidSchema(f"sampler mode must be one of {MODES}, got {self.mode!r}")
        if self.uniform_mix not in MIXES:
            raise InvalidSchema(f"uniform_mix must be one of {MIXES}, got {self.uniform_mix!r}")
        if not frames or min(frames) < 1 or step_dt <= 0 or self.kernel_size < 1:
            raise InvalidSchema("num_frames >= 1 (for every group), step_dt > 0 and kernel_size >= 1 are required")
        if (
            self.uniform_ratio < 0
            or (self.uniform_mix == "paper" and self.uniform_ratio > 1)
            or not 0 <= self.group_uniform_ratio <= 1
        ):
            raise InvalidSchema(
                "uniform_ratio >= 0 (at most 1 with uniform_mix='paper') and group_uniform_ratio in [0, 1] are required"
            )
        if self.group_names is not None and len(self.group_names) != len(frames):
            raise InvalidSchema(f"group_names has {len(self.group_names)} names for {len(frames)} groups")
        if self.rebuild_tol < 0:
            raise InvalidSchema(f"rebuild_tol must be >= 0, got {self.rebuild_tol!r}")

    def names(self, groups: int) -> tuple[str, ...]:
        """The groups' names in the metrics."""
        return tuple(self.group_names) if self.group_names is not None else tuple(f"group_{g}" for g in range(groups))

    @property
    def role(self) -> Role:
        """This shard's role in the fleet (a broadcast's owner leads)."""
        return role_of(self.mode, leads=self.shard_id == self.owner)

    @property
    def tolerance(self) -> float:
        """The rebuild tolerance in effect (0 for ``local`` and ``observe``: the unsynced algorithm, exactly)."""
        return 0.0 if self.role.acts_alone else self.rebuild_tol
