"""The study's pre-registered paired statistics (`redisync.study.stats`): the exact sign-flip test,
Holm's correction, t-intervals, equivalence and the primary family."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from redisync.study.stats import contrast, equivalence_p, holm, primary_family, sign_flip_p, t_interval


def test_the_sign_flip_test_is_exact():
    """The paired sign-flip test's p is the exact share of the 2^n sign patterns at least as extreme (2/256 at
    best with 8 seeds)."""
    d = [0.3, 0.1, -0.05, 0.2, 0.25]
    flips = [np.mean(np.array(s) * d) for s in itertools.product((-1, 1), repeat=len(d))]
    want = np.mean(np.abs(flips) >= abs(np.mean(d)) - 1e-12)
    assert sign_flip_p(d) == pytest.approx(want)
    assert sign_flip_p([1.0] * 8) == pytest.approx(2 / 256)  # the smallest p of 8 seeds: all positive


def test_holm_adjusts_step_down_and_keeps_the_order():
    """Holm's step-down adjustment gives the textbook values, monotone in the original order."""
    assert holm([0.01, 0.04, 0.03, 0.2]) == pytest.approx([0.04, 0.09, 0.09, 0.2])
    assert holm([0.5]) == [0.5]


def test_the_t_interval_and_equivalence_answer_what_they_should():
    """The t interval covers a zero difference; equivalence within a margin holds for a tight zero and never
    for a real difference; four noisy seeds are inconclusive, a large difference is higher."""
    rng = np.random.default_rng(0)
    same = rng.normal(0.0, 0.02, 12)
    lo, hi = t_interval(same)
    assert lo < 0 < hi
    assert equivalence_p(same, margin=0.1) < 0.01  # tightly around 0: equivalent within ±0.1
    assert equivalence_p(same + 0.3, margin=0.1) > 0.5  # a real difference is never "equivalent"
    noisy = rng.normal(0.0, 0.5, 4)
    c = contrast("H: a − b", noisy + 1, np.ones(4), margin=0.1)
    assert c.verdict() == "inconclusive"  # neither significant nor equivalent: no claim
    big = contrast("H: a − b", np.full(8, 0.9) + rng.normal(0, 0.01, 8), np.full(8, 0.3), margin=0.1)
    assert big.verdict() == "higher"
    assert big.lo > 0.5


def test_the_primary_family_is_holm_corrected():
    """The pre-registered primary contrasts are Holm-corrected as one family, claims of no difference
    included."""
    rng = np.random.default_rng(1)
    cs = [contrast(f"H: a{i} − b", rng.normal(m, 0.05, 8), np.zeros(8), 0.1) for i, m in enumerate((0.5, 0.01, 0.0))]
    family = primary_family(cs)
    assert [c.p_holm for c in family] == pytest.approx(holm([c.p_sign_flip for c in cs]))
    assert family[0].verdict() == "higher"
    assert family[1].p_holm >= family[1].p_sign_flip
    # a claim of no difference is corrected over the family too
    assert [c.p_equivalence_holm for c in family] == pytest.approx(holm([c.p_equivalence for c in cs]))


def test_an_equivalence_on_a_knife_edge_does_not_survive_the_familys_correction():
    """The committed study's H local − pooled: TOST p 0.0496 alone, not once Holm sees the family;
    its 90 % interval is the one that decides, and the report says what the seeds could detect."""
    rng = np.random.default_rng(5)
    d = rng.normal(0.0, 1.0, 8)
    d = (d - d.mean()) / d.std(ddof=1) * 0.076 - 0.049  # the committed contrast's mean and spread
    edge = contrast("H: local − pooled", d, np.zeros(8), 0.1)
    assert 0.04 < edge.p_equivalence < 0.06
    assert edge.equivalent()
    assert edge.lo90 > -0.1
    assert edge.hi90 < 0.1
    assert edge.lo < -0.1
    clear = contrast("H: a − b", rng.normal(0.5, 0.05, 8), np.zeros(8), 0.1)
    family = primary_family([clear, edge, contrast("X: c − d", rng.normal(0.0, 0.3, 8), np.zeros(8), 0.1)])
    assert family[1].p_equivalence_holm > 0.05
    assert family[1].verdict() == "inconclusive"
    # the power: a spread of 0.076 over 8 seeds detects about ±0.075 (t quantiles at 7 dof)
    assert edge.detectable == pytest.approx((2.3646 + 0.8960) * 0.076 / 8**0.5, rel=1e-3)


def test_contrasts_need_paired_finite_values():
    """A contrast refuses unpaired or non-finite values, saying which."""
    with pytest.raises(ValueError, match="same length"):
        contrast("H: a − b", [1.0, 2.0], [1.0], 0.1)
    with pytest.raises(ValueError, match="finite"):
        contrast("H: a − b", [1.0, float("nan")], [1.0, 1.0], 0.1)
