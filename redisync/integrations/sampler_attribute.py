"""An upstream sampler attribute that lives in redisync's synced sampler.

mjlab's ``MotionCommand`` and holosoma's ``AdaptiveTimestepsSampler`` read and rebind their failure
EMA (``bin_failed_count``) and the current step's failures in their own code. A drop-in keeps those
in an `AdaptiveMotionSampler` and declares the upstream names as
`SamplerAttribute`: a read gives the sampler's own EMA — or, while the upstream draws its
starts, the fleet view it must sample from — and a write goes to the sampler. Before the sampler
exists (the upstream's own constructor assigns them first), the value is kept on the instance under
``_initial_<name>``, for the drop-in to hand to its sampler.
"""

from __future__ import annotations

from typing import Any, Literal

import torch


class SamplerAttribute:
    """``ema``: the own failure EMA (the fleet view while ``obj._drawing``); ``current``: the
    failures counted this step. ``holder``: the instance attribute that holds the synced sampler."""

    def __init__(self, holder: str, part: Literal["ema", "current"]):
        self.holder, self.part = holder, part
        self.initial = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.initial = f"_initial_{name.lstrip('_')}"

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        if obj is None:
            return self
        sampler = obj.__dict__.get(self.holder)
        if sampler is None:
            return obj.__dict__[self.initial]
        if self.part == "current":
            return sampler._current_bin_failed
        if obj.__dict__.get("_drawing", False):  # the upstream is drawing starts: it samples the fleet's view
            return sampler.sampling_ema().to(sampler.bin_failed_count.dtype)
        return sampler.bin_failed_count

    def __set__(self, obj: Any, value: torch.Tensor) -> None:
        sampler = obj.__dict__.get(self.holder)
        if sampler is None:  # the upstream's constructor, before the synced sampler exists
            obj.__dict__[self.initial] = value
        elif self.part == "current":
            sampler._current_bin_failed.copy_(value)
        else:
            sampler.set_own_ema(value)
