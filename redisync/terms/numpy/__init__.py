"""Collector-side terms for numpy (and numba) environments: the torch terms' algorithms
(`redisync.terms.formulas`) on numpy arrays the environment owns, written in place."""

from .normalization import EmpiricalNormalizer
from .sampler import AdaptiveMotionSampler, FailureEma

__all__ = ["AdaptiveMotionSampler", "EmpiricalNormalizer", "FailureEma"]
