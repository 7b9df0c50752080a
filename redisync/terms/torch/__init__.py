"""The collector-side terms on torch tensors (on the collector's device), synced through the store."""

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
