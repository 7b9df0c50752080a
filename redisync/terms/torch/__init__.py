"""The collector-side terms on torch tensors (on the collector's device), synced through the store."""

try:
    import torch  # noqa: F401  (the terms' one requirement beyond redisync's own)
except ModuleNotFoundError as e:  # pragma: no cover - exercised in a subprocess without torch
    raise ModuleNotFoundError(
        "redisync.terms.torch needs torch, which redisync does not install by itself: install torch (the CPU "
        "or the CUDA build your trainer uses), or redisync's demo extra, which brings it; numpy envs need "
        "none of it (redisync.terms.numpy)",
        name="torch",
    ) from e

from .curriculum import AverageEpisodeLength, PenaltyCurriculum, TerrainLevels
from .normalization import SyncedEmpiricalNormalization
from .sampler import AdaptiveMotionSampler, sampling_probabilities

__all__ = [
    "AdaptiveMotionSampler",
    "AverageEpisodeLength",
    "PenaltyCurriculum",
    "SyncedEmpiricalNormalization",
    "TerrainLevels",
    "sampling_probabilities",
]
