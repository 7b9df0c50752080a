"""The torch spelling of the operations the shared formulas (`redisync.terms.formulas`) need."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class TorchOps:
    """`ArrayOps` for torch tensors (the formulas are `redisync.terms.formulas`)."""

    def cat(self, parts: Any, axis: Any) -> Any:
        """Concatenate ``parts`` along ``axis``."""
        return torch.cat(list(parts), dim=axis)

    def where(self, cond: Any, a: Any, b: Any) -> Any:
        """Element-wise choice: ``a`` where ``cond`` holds, else ``b``."""
        return torch.where(cond, a, b)

    def minimum(self, a: Any, b: Any) -> Any:
        """Element-wise minimum."""
        return torch.minimum(a, b) if isinstance(b, torch.Tensor) else a.clamp(max=b)

    def zeros_like(self, x: Any) -> Any:
        """Zeros of ``x``'s shape and dtype."""
        return torch.zeros_like(x)

    def pad_index(self, index: Any, pad: Any) -> Any:
        """The indices that pad a ragged layout to its grid."""
        return torch.cat([index, index[:, -1:].expand(-1, pad)], dim=1)

    def wide(self, x: Any) -> Any:
        """``x`` in float64 (sums and the fleet's part are kept in float64)."""
        return x.to(torch.float64)

    def cast(self, x: Any, like: Any) -> Any:
        """``x`` in ``like``'s dtype."""
        return torch.as_tensor(x, device=like.device).to(like.dtype)

    def row_max(self, x: Any) -> Any:
        """The maximum of each row."""
        return x.amax(dim=1, keepdim=True)

    def smooth(self, p: Any, kernel: Any) -> Any:
        """BeyondMimic's kernel smoothing along the bins (a 1-D convolution per row)."""
        return nn.functional.conv1d(p.unsqueeze(1), kernel.view(1, 1, -1)).squeeze(1)

    def on_host(self, x: Any) -> bool:
        """Whether ``x`` is a CPU tensor (a CUDA tensor's values would wait for its device)."""
        return bool(x.device.type == "cpu")

    def isfinite(self, x: Any) -> Any:
        """Element-wise: finite."""
        return torch.isfinite(x)


TORCH = TorchOps()
