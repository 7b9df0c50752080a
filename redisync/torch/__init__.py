"""Collector-side terms that sync through the store; the only package that imports torch."""

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
