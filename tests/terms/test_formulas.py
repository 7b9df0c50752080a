"""The terms' formulas (`redisync.terms.formulas`), each against an independent computation, and the
numpy and torch spellings of their operations agreeing."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from redisync.terms import formulas
from redisync.terms.formulas import NUMPY, BinGeometry
from redisync.terms.torch.ops import TORCH


def test_one_bin_per_second_of_motion_plus_one():
    """BeyondMimic's bin count: ``frames // (1 / step_dt) + 1``."""
    assert formulas.bin_counts_of([100, 49, 50], 0.02) == (3, 1, 2)
    assert formulas.bin_counts_of([1], 0.5) == (1,)


def test_a_ragged_geometry_places_groups_end_to_end_and_pads_rows_with_their_last_bin():
    """Groups of 3, 1 and 2 bins: offsets 0, 3, 4; the grid's gather repeats a row's last bin (``last``)
    or points at an appended zero (``zero``) past the group's own bins."""
    g = BinGeometry.of((3, 1, 2))
    assert (g.groups, g.width, g.size, g.ragged) == (3, 3, 6, True)
    np.testing.assert_array_equal(g.offsets, [0, 3, 4])
    np.testing.assert_array_equal(g.last, [[0, 1, 2], [3, 3, 3], [4, 5, 5]])
    np.testing.assert_array_equal(g.zero, [[0, 1, 2], [3, 6, 6], [4, 5, 6]])
    flat = np.arange(1.0, 7.0)
    np.testing.assert_array_equal(formulas.group_sums(flat, g, NUMPY), [6.0, 4.0, 11.0])
    assert not BinGeometry.of((2, 2)).ragged


def test_a_time_steps_bin_is_t_times_b_over_t_clamped_and_both_array_libraries_agree():
    """``t·B // T`` inside ``[0, B − 1]`` (a step past the motion's end stays in its last bin)."""
    steps = np.array([-3, 0, 9, 10, 19, 20, 45])
    want = np.clip(steps * 4 // 20, 0, 3)
    np.testing.assert_array_equal(formulas.bin_of(steps, 4, 20, NUMPY), want)
    got = formulas.bin_of(torch.as_tensor(steps), torch.tensor(4), torch.tensor(20), TORCH)
    np.testing.assert_array_equal(got.numpy(), want)


def test_the_ema_after_k_constant_steps_is_the_closed_form():
    """From zero, ``k`` steps of a constant ``c`` give ``c·(1 − (1 − α)^k)``."""
    ema, current, alpha = np.zeros(3), np.array([1.0, 0.0, 2.0]), 0.01
    for _ in range(250):
        formulas.ema_step(ema, current, alpha)
    np.testing.assert_allclose(ema, current * (1 - (1 - alpha) ** 250), rtol=1e-12)


def test_moments_are_the_samples_mean_and_population_variance_also_from_shifted_sums():
    """From ``n``, ``Σ(x − c)`` and ``Σ(x − c)²`` the mean (plus ``c``) and variance are numpy's; a
    variance that rounds below zero is zero."""
    rng = np.random.default_rng(3)
    x = rng.normal(1000.0, 0.5, size=(500, 4))
    shift = 1000.0
    s = x - shift
    mean, var = formulas.moments(len(x), s.sum(0), (s * s).sum(0), NUMPY)
    np.testing.assert_allclose(mean + shift, x.mean(0), rtol=1e-12)
    np.testing.assert_allclose(var, x.var(0), rtol=1e-9)
    same = np.full(3, 1e8)
    _, flat = formulas.moments(3.0, same.sum(), (same * same).sum(), NUMPY)
    assert flat >= 0


def test_the_pooled_average_weighs_each_shard_by_what_is_behind_it():
    """``(Σ wᵢ·avgᵢ) / Σ wᵢ``; while nobody has counted anything, the shard's own average."""
    assert formulas.pooled_average(10.0, 100.0, (30.0, 30.0 * 200.0)) == pytest.approx(175.0)
    assert formulas.pooled_average(0.0, 42.0, (0.0, 0.0)) == 42.0


@pytest.mark.parametrize("mix", ["code", "paper"])
def test_a_groups_start_distribution_is_its_formula_and_both_array_libraries_agree(mix):
    """One group, no smoothing: ``code``: ``(ema + ε/B) / Σ``; ``paper``: ``ε/B + (1 − ε)·ema/Σema``."""
    ema, eps = np.array([0.0, 1.0, 3.0, 0.0]), 0.2
    g, kernel = BinGeometry.of((4,)), formulas.smoothing_kernel(1, 0.8, np.float64)
    got = formulas.grouped_probabilities(ema, g, eps, kernel, NUMPY, mix)[0]
    want = (ema + eps / 4) / (ema + eps / 4).sum() if mix == "code" else eps / 4 + (1 - eps) * ema / ema.sum()
    np.testing.assert_allclose(got, want, rtol=1e-12)
    tg = _torch_geometry(g)
    on_torch = formulas.grouped_probabilities(torch.as_tensor(ema), tg, eps, torch.as_tensor(kernel), TORCH, mix)
    np.testing.assert_allclose(on_torch[0].numpy(), want, rtol=1e-12)


def test_ragged_rows_are_distributions_over_their_own_bins_even_near_the_dtypes_top():
    """Each row sums to 1 and is zero past its group's bins; an EMA near float64's largest value
    (a fleet sum) gives the same distribution as a small one, not inf or NaN."""
    g = BinGeometry.of((3, 1, 2))
    kernel = formulas.smoothing_kernel(2, 0.8, np.float64)
    ema = np.array([1.0, 2.0, 0.0, 5.0, 0.0, 1.0])
    p = formulas.grouped_probabilities(ema, g, 0.1, kernel, NUMPY)
    np.testing.assert_allclose(p.sum(axis=1), 1.0)
    assert (p[~g.real] == 0).all()
    huge = formulas.grouped_probabilities(ema * 1e307, g, 0.1 * 1e307, kernel, NUMPY)
    assert np.isfinite(huge).all()
    np.testing.assert_allclose(huge, p, rtol=1e-9)


def test_the_smoothing_kernel_and_the_group_weights_are_their_formulas():
    """The kernel ``λʲ / Σλʲ``; the weights over groups ``λ/G + (1 − λ)·mass/Σmass`` (uniform with no mass)."""
    np.testing.assert_allclose(
        formulas.smoothing_kernel(3, 0.5, np.float64), np.array([1.0, 0.5, 0.25]) / 1.75, rtol=1e-12
    )
    mass = np.array([3.0, 1.0, 0.0, 0.0])
    np.testing.assert_allclose(formulas.group_weights(mass, 0.2, 4, NUMPY), 0.05 + 0.8 * mass / 4.0)
    np.testing.assert_allclose(formulas.group_weights(np.zeros(4), 0.2, 4, NUMPY), np.full(4, 0.25))


def _torch_geometry(g: BinGeometry) -> BinGeometry:
    """The same geometry with its index arrays as tensors (as a torch term holds them)."""
    return BinGeometry(
        g.bin_counts,
        torch.as_tensor(g.bins),
        torch.as_tensor(g.offsets),
        torch.as_tensor(g.real),
        torch.as_tensor(g.inverse_bins),
        torch.as_tensor(g.last),
        torch.as_tensor(g.zero),
    )
