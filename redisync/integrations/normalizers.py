"""The synced normaliser as a framework's model holds it, for the drop-ins that swap one in
(rsl_rl's, holosoma FastSAC's): it carries the replaced module's state, meets the process's fleet
after each update (a hand-over and a swap in memory, never the network), and a copy of it is not synced."""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from ..terms.torch.normalization import SyncedEmpiricalNormalization
from . import ProcessFleet


class FleetNormalization(SyncedEmpiricalNormalization):
    """A synced normaliser as a framework's models hold it: the torch term with the framework's calls."""

    fleet: ProcessFleet | None = None

    @classmethod
    def replacing(cls, module: nn.Module, *, key: str, fleet: ProcessFleet | None, **sync: Any) -> FleetNormalization:
        """A synced normaliser with ``module``'s shape, settings, state (its buffers: rsl_rl's names),
        device and mode; ``fleet`` None: not synced (``local``)."""
        mean = cast(torch.Tensor, module._mean)  # (rsl_rl's buffers)
        replacement = cls(tuple(mean.shape[1:]), float(module.eps), module.until, key=key, **sync)  # type: ignore[arg-type]
        replacement.load_state_dict(module.state_dict())
        replacement.to(mean.device).train(module.training)
        replacement.fleet = fleet
        return replacement

    def __getstate__(self) -> dict[str, Any]:
        # frameworks deep-copy the normaliser into exported (ONNX / JIT) models: the copy is not synced
        state = dict(super().__getstate__())
        state.pop("fleet", None)
        return state

    @torch.jit.unused
    def update(self, x: torch.Tensor) -> None:
        """Fold a batch of observations into this shard's statistics."""
        super().update(x)
        if self.fleet is not None and self.training:
            self.fleet.on_step()
            self.fleet.at_reset_boundary()
