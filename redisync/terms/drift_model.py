"""A model of the adaptive start-frame sampler over a fleet: how far unsynced shards sample from one
unsharded run, computed from the sampler's own formulas in seconds, without training anything.

Why: whether a user's run needs the sampler synced depends on their shard count, envs per shard, EMA
rate α, bin count and failure rate; a study on one task cannot answer that for another. This model
answers it for the sampler itself (not for the learner: what a start distribution does to training is
outside it).

The fleet modelled: ``shards`` shards of ``envs_per_shard`` envs. Each env step, each env starts an
episode with probability ``start_rate`` (one over the mean episode length in steps), in a bin drawn
from its shard's start distribution. The episode runs forward through at most ``episode_bins`` bins
and fails in bin ``b``, if it gets there, with the bin's ``hazard``; its failure counts in that bin.
The hazard falls as the fleet practises the bin: ``h_b = hazard[b]·(1 + c)/(1 + c·B·v̄_b)``, ``v̄`` the
fleet's share of visits in each bin (one policy learns from every shard) and ``c`` the ``practice``
(0: a policy that never improves, where equally hard bins compete without end and a pooled sampler
locks onto one at random). ``hazard`` is each bin's hazard when visits are uniform. The shard's failure EMA folds those counts every step (`formulas.ema_step`) and
the start distribution is `formulas.grouped_probabilities` of the EMA the mode chooses: its own
(``local``) or the sum of every shard's (``pooled``: one unsharded run of all the envs).

How (a mean-field model with the linear-noise approximation): a shard's EMA ``x`` has a mean ``μ``
where the failures its start distribution causes keep it (``μ = λ(p(μ))``, the feedback loop), and a
covariance from the Poisson noise of the counts, shaped by the same loop (a discrete Lyapunov equation
in the loop's Jacobian). The start distribution the fleet sees is ``E[p(x)]`` over that law, taken by
Monte Carlo with gamma marginals. Every figure is split into three parts, each relative to the oracle
(the pooled fleet's distribution without noise):

- **flattening**: a shard's EMA holds 1/N of the fleet's failure mass, so its fixed uniform part weighs
  more (the code mix's ``ε/(F + ε)``);
- **noise**: a shard's EMA counts few failures per bin, and ``p`` is not linear in it;
- **feedback**: a shard that over-samples a bin fails there more and keeps over-sampling it.

A **learning law** per bin (`trajectory`): a bin's failure probability falls as ``exp(−starts/τ)`` with
the starts the whole fleet made there (one policy learns from every shard), stepped quasi-statically
one EMA window at a time.

`simulate` runs the sampler's formulas themselves on that fleet, step by step, as the model's check.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..errors import ConfigurationError
from . import formulas
from .formulas import UniformMix
from .sampler_options import SamplerOptions

SAMPLER = SamplerOptions()  # the sampler's defaults: the model's, declared once

# The drift warning's threshold on the predicted shard distance, chosen on the training grid of
# docs/ab/warning-validation-plan.md (records/ab/warning-threshold-2026-12-05.json) and frozen here before
# the held-out judgement (records/ab/warning-validation.json).
WARNING_DISTANCE = 0.1520738842668895
SAMPLES = 4096  # Monte Carlo draws of a shard's EMA per evaluation
ITERATIONS = 40  # at most, of the fixed point with noise
JENSEN_DRAWS = 256  # draws over which a pooled fleet's E[λ(p)] is taken (each its own transfer matrix)
TOLERANCE = 1e-3  # its stop: the EMA's mean moved by less than this share of its mass


@dataclass(frozen=True)
class FleetModel:
    """A fleet's sampler configuration and its env's failure law (see the module's docstring)."""

    shards: int
    envs_per_shard: int
    hazard: tuple[float, ...]  # per bin: the chance an episode that reaches the bin fails there
    alpha: float = SAMPLER.alpha  # the EMA's rate (the sampler's default: BeyondMimic's)
    start_rate: float = 0.02  # episode starts per env per step (1 / mean episode length in steps)
    episode_bins: int = 10  # the most bins an episode runs through (its length in seconds)
    uniform_ratio: float = SAMPLER.uniform_ratio  # ε
    mix: UniformMix = SAMPLER.uniform_mix
    kernel_size: int = SAMPLER.kernel_size
    kernel_lambda: float = SAMPLER.kernel_lambda
    hard: tuple[bool, ...] | None = None  # the bins whose share is reported as the skill share
    practice: float = 1.0  # c: how much practice in a bin lowers its failure probability

    def __post_init__(self) -> None:
        problems = []
        if self.shards < 1:
            problems.append(f"shards must be at least 1, got {self.shards}")
        if self.envs_per_shard < 1:
            problems.append(f"envs_per_shard must be at least 1, got {self.envs_per_shard}")
        if not 0 < self.alpha <= 1:
            problems.append(f"alpha must be in (0, 1], got {self.alpha}")
        if not 0 < self.start_rate <= 1:
            problems.append(f"start_rate must be in (0, 1], got {self.start_rate}")
        if not 0 < self.uniform_ratio < 1:
            problems.append(f"uniform_ratio must be in (0, 1), got {self.uniform_ratio}")
        if self.mix not in formulas.MIXES:
            problems.append(f"mix must be one of {formulas.MIXES}, got {self.mix!r}")
        if self.practice < 0:
            problems.append(f"practice must be at least 0, got {self.practice}")
        if self.episode_bins < 1:
            problems.append(f"episode_bins must be at least 1, got {self.episode_bins}")
        if len(self.hazard) < 2:
            problems.append(f"hazard needs a value per bin (at least 2 bins), got {len(self.hazard)}")
        bad = [i for i, q in enumerate(self.hazard) if not 0 <= q <= 1]
        if bad:
            problems.append(f"hazard must lie in [0, 1]; bins {bad[:5]} do not")
        if self.hard is not None and len(self.hard) != len(self.hazard):
            problems.append(f"hard has {len(self.hard)} entries for {len(self.hazard)} bins")
        if problems:
            raise ConfigurationError("drift model: " + "; ".join(problems))

    @property
    def bins(self) -> int:
        """The sampler's bin count (one hazard a bin)."""
        return len(self.hazard)

    @property
    def hard_mask(self) -> NDArray[np.bool_]:
        """The skill bins: as given, else the bins failing more often than the median bin."""
        q = np.asarray(self.hazard)
        return np.asarray(self.hard, dtype=bool) if self.hard is not None else q > np.median(q)


def profile(
    bins: int,
    failure_rate: float,
    *,
    start_rate: float = 0.02,
    episode_bins: int = 10,
    hard_bins: int = 0,
    hard_ratio: float = 10.0,
) -> tuple[tuple[float, ...], tuple[bool, ...]]:
    """Per-bin hazards for a user's figures: ``failure_rate`` failures per env per step when starts
    are uniform, ``hard_bins`` bins (spread evenly) ``hard_ratio`` times as hazardous as the rest."""
    if not 0 < failure_rate < start_rate:
        raise ConfigurationError(
            f"drift model: failure_rate must be in (0, start_rate = {start_rate}) failures per env per step "
            f"(a failure ends an episode), got {failure_rate}"
        )
    if not 0 <= hard_bins < bins:
        raise ConfigurationError(f"drift model: hard_bins must be in [0, {bins}), got {hard_bins}")
    hard = np.zeros(bins, dtype=bool)
    if hard_bins:
        hard[np.linspace(0, bins, hard_bins, endpoint=False).astype(int) + bins // (2 * hard_bins)] = True
    weight = np.where(hard, hard_ratio, 1.0)
    uniform = np.full(bins, 1.0 / bins)

    def rate(scale: float) -> float:
        h = np.minimum(scale * weight, 1.0)
        return float(start_rate * (uniform @ _transfer(h, episode_bins)[0]).sum())

    low, high = 0.0, 1.0 / weight.min()
    if rate(high) < failure_rate:
        raise ConfigurationError(
            f"drift model: {failure_rate} failures per env per step cannot be reached with these bins (at most "
            f"{rate(high):.3g}): lower failure_rate or hard_ratio"
        )
    for _ in range(60):  # bisection on the hazards' scale
        mid = 0.5 * (low + high)
        low, high = (mid, high) if rate(mid) < failure_rate else (low, mid)
    h = np.minimum(high * weight, 1.0)
    return tuple(float(v) for v in h), tuple(bool(x) for x in hard)


def _transfer(hazard: NDArray[np.float64], episode_bins: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """``K[..., s, b]``: the chance an episode started in bin ``s`` fails in bin ``b``; ``V[..., s, b]``:
    that it reaches bin ``b`` (it runs forward through at most ``episode_bins`` bins, to the motion's
    end). ``hazard`` is ``[B]`` or a batch ``[M, B]``."""
    h = np.clip(np.asarray(hazard, dtype=np.float64), 0.0, 1.0 - 1e-12)
    bins = h.shape[-1]
    logs = np.cumsum(np.log1p(-h), axis=-1)
    before = np.concatenate([np.zeros((*h.shape[:-1], 1)), logs[..., :-1]], axis=-1)  # Σ_{k<b} log(1 − h_k)
    s, b = np.arange(bins)[:, None], np.arange(bins)[None, :]
    within = (b >= s) & (b - s < episode_bins)
    reach = np.where(within, np.exp(np.minimum(before[..., None, :] - before[..., :, None], 0.0)), 0.0)
    return reach * h[..., None, :], reach


def tv(a: NDArray[Any], b: NDArray[Any]) -> float:
    """Total variation distance between distributions (over the last axis; a mean over the others)."""
    return float(0.5 * np.abs(np.asarray(a) - np.asarray(b)).sum(axis=-1).mean())


class _Sampler:
    """The sampler's distribution as a function of its EMA, for a batch of EMAs ``[M, B]``."""

    def __init__(self, m: FleetModel):
        self.m = m
        self.kernel = formulas.smoothing_kernel(m.kernel_size, m.kernel_lambda, np.float64)
        self.ops = formulas.NumpyOps()
        self._geometries: dict[int, Any] = {}

    def __call__(self, ema: NDArray[np.float64]) -> NDArray[np.float64]:
        ema = np.atleast_2d(ema)
        rows = ema.shape[0]
        geometry = self._geometries.get(rows)
        if geometry is None:
            geometry = self._geometries[rows] = formulas.BinGeometry.of([self.m.bins] * rows)
        p = formulas.grouped_probabilities(
            np.ascontiguousarray(ema, dtype=np.float64).reshape(-1), geometry, self.m.uniform_ratio, self.kernel,
            self.ops, self.m.mix,
        )  # fmt: skip
        return np.asarray(p, dtype=np.float64)


@dataclass
class Arm:
    """One arm's predicted figures (see `Prediction`)."""

    distribution: list[float]  # the fleet's start distribution (what the replay buffer receives)
    ema_mass: float  # a shard's EMA mass F (failures per step as its EMA sees them)
    failures_per_bin_window: float
    uniform_share: float
    disagreement: float  # the mean TV between a shard's distribution and the fleet's
    shard_distance: float  # the mean TV between a shard's distribution and the pooled one
    skill_share: float  # the share of starts in the skill bins
    regret: float  # TV from the oracle's distribution
    parts: dict[str, float] = field(default_factory=dict)  # regret = flattening + noise + feedback


@dataclass
class Prediction:
    """What the model predicts for a fleet: each arm, and how far ``local`` samples from ``pooled``."""

    model: dict[str, Any]
    local: Arm
    pooled: Arm
    oracle: list[float]
    distance_from_pooled: float  # TV between the local fleet's distribution and the pooled one

    def to_dict(self) -> dict[str, Any]:
        """The prediction as plain data (the CLI's ``--json``)."""
        return asdict(self)


class _Env:
    """The env's failure law at the fleet's distribution: the hazards after practice and their transfer."""

    def __init__(self, m: FleetModel):
        self.m = m
        self.base = np.asarray(m.hazard, dtype=np.float64)
        self.visits = _transfer(self.base, m.episode_bins)[1]

    def hazards(self, fleet_p: NDArray[np.float64]) -> NDArray[np.float64]:
        """``h_b`` when the fleet starts from ``fleet_p`` (``[B]`` or ``[M, B]``): ``hazard·(1 + c)/(1 + c·B·v̄)``."""
        m = self.m
        v = np.asarray(fleet_p) @ self.visits
        share = v / v.sum(axis=-1, keepdims=True)
        h: NDArray[np.float64] = np.minimum(self.base * (1 + m.practice) / (1 + m.practice * m.bins * share), 1.0)
        return h

    def failures(self, fleet_p: NDArray[np.float64]) -> NDArray[np.float64]:
        """``K`` at the fleet's distribution: failures in each bin per start in each bin (batched like ``fleet_p``)."""
        return _transfer(self.hazards(fleet_p), self.m.episode_bins)[0]


def _rates(
    m: FleetModel, env: _Env, p: NDArray[np.float64], envs: int, fleet_p: NDArray[np.float64]
) -> NDArray[np.float64]:
    """Expected failures per step per bin of ``envs`` envs starting from ``p`` (``[B]`` or ``[M, B]``)
    in a fleet starting from ``fleet_p`` (one ``[B]``, or one per row): ``λ = n·rate·(p @ K(p̄))``."""
    k = env.failures(fleet_p)
    flows = np.einsum("...s,...sb->...b", np.asarray(p), k) if k.ndim == 3 else np.asarray(p) @ k
    result: NDArray[np.float64] = envs * m.start_rate * flows
    return result


def _mean_field(m: FleetModel, env: _Env, sampler: _Sampler, envs: int) -> NDArray[np.float64]:
    """The EMA's noise-free fixed point ``μ = λ(p(μ))`` for ``envs`` envs whose distribution is the
    fleet's (every shard alike; damped iteration)."""
    uniform = np.full(m.bins, 1.0 / m.bins)
    mu = _rates(m, env, uniform, envs, uniform)
    for _ in range(5000):
        p = sampler(mu)[0]
        new = _rates(m, env, p, envs, p)
        if np.allclose(new, mu, rtol=1e-10, atol=1e-14):
            return new
        mu = 0.7 * mu + 0.3 * new
    return mu


def _jacobian(
    m: FleetModel, env: _Env, sampler: _Sampler, mu: NDArray[np.float64], envs: int, fleet_p: NDArray[np.float64] | None
) -> NDArray[np.float64]:
    """``∂λ/∂x`` at ``μ``: how a shard's failures answer its own EMA (central differences); with
    ``fleet_p`` the fleet's distribution is held there (one shard of many moves it by little), else
    it is the shard's own (the pooled sampler: the fleet is one distribution)."""
    h = np.maximum(1e-6, 1e-4 * mu)
    plus = mu[None, :] + np.diag(h)
    minus = np.maximum(mu[None, :] - np.diag(h), 0.0)
    width = (plus - minus).diagonal()
    p_plus, p_minus = sampler(plus), sampler(minus)
    f_plus = p_plus if fleet_p is None else fleet_p
    f_minus = p_minus if fleet_p is None else fleet_p
    dlam = (_rates(m, env, p_plus, envs, f_plus) - _rates(m, env, p_minus, envs, f_minus)) / width[:, None]
    # (row j: ∂λ/∂x_j)
    jac: NDArray[np.float64] = dlam.T
    return jac


def _covariance(
    m: FleetModel,
    env: _Env,
    sampler: _Sampler,
    mu: NDArray[np.float64],
    envs: int,
    feedback: bool,
    fleet_p: NDArray[np.float64] | None = None,
) -> NDArray[np.float64]:
    """The EMA's stationary covariance: Poisson counts of mean ``λ(μ)`` folded at rate α, through the
    loop's Jacobian when ``feedback`` (``Σ = AΣAᵀ + α²·diag(λ)``, ``A = (1 − α)I + αJ``)."""
    a = m.alpha
    lam = np.maximum(mu, 0.0)
    if not feedback:
        return np.diag(a / (2 - a) * lam)
    transition = (1 - a) * np.eye(m.bins) + a * _jacobian(m, env, sampler, mu, envs, fleet_p)
    sigma = _lyapunov(transition, a * a * np.diag(lam))
    return 0.5 * (sigma + sigma.T)


def _lyapunov(a: NDArray[np.float64], q: NDArray[np.float64]) -> NDArray[np.float64]:
    """``Σ = Σₖ Aᵏ Q Aᵏᵀ`` (the solution of ``Σ = AΣAᵀ + Q``) by doubling: ``k`` up to 2⁶⁰ terms in 60 steps."""
    sigma, power = q.copy(), a.copy()
    for _ in range(60):
        step = power @ sigma @ power.T
        sigma = sigma + step
        power = power @ power
        if np.abs(step).max() <= 1e-13 * max(np.abs(sigma).max(), 1e-300):
            break
    return sigma


def _draws(
    mu: NDArray[np.float64], sigma: NDArray[np.float64], alpha: float, rng: np.random.Generator, n: int
) -> NDArray[np.float64]:
    """``n`` EMAs with mean ``μ`` and covariance ``Σ``: gamma marginals (an EMA of Poisson counts)
    mixed by ``Σ^½·Σ₀^-½`` where Σ is not the independent counts' ``Σ₀``; never negative."""
    scale = alpha / (2 - alpha)
    shape = np.where(mu > 0, mu / scale, 1.0)
    g = np.where(mu > 0, rng.gamma(shape, scale, size=(n, mu.size)), 0.0)
    var0 = scale * mu
    if np.allclose(sigma, np.diag(var0), rtol=1e-9, atol=1e-18):
        return g
    z = np.where(var0 > 0, (g - mu) / np.sqrt(np.where(var0 > 0, var0, 1.0)), 0.0)
    w, v = np.linalg.eigh(sigma)
    root = (v * np.sqrt(np.clip(w, 0.0, None))) @ v.T
    drawn: NDArray[np.float64] = np.maximum(mu + z @ root.T, 0.0)
    return drawn


def _expected(
    m: FleetModel, sampler: _Sampler, mu: NDArray[np.float64], sigma: NDArray[np.float64], seed: int
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """``E[p(x)]`` and the draws' distributions ``[SAMPLES, B]`` (the same seed, common random numbers)."""
    probs = sampler(_draws(mu, sigma, m.alpha, np.random.default_rng(seed), SAMPLES))
    return probs.mean(axis=0), probs


def _self_consistent(
    m: FleetModel, env: _Env, sampler: _Sampler, envs: int, seed: int, pooled: bool
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """The fixed point with noise and feedback: ``μ = λ(E[p(x)])``, ``x ~ (μ, Σ(μ))``, the fleet
    starting from ``E[p]``; returns μ, E[p], draws."""
    mu = _mean_field(m, env, sampler, envs)
    mean_p = sampler(mu)[0]
    probs = mean_p[None, :]
    for _ in range(ITERATIONS):
        sigma = _covariance(m, env, sampler, mu, envs, True, None if pooled else mean_p)
        mean_p, probs = _expected(m, sampler, mu, sigma, seed)
        # E[λ(p(x))]: for the pooled sampler the fleet's distribution is each draw's own (a subsample)
        few = probs[:JENSEN_DRAWS]
        new = _rates(m, env, few, envs, few).mean(axis=0) if pooled else _rates(m, env, mean_p, envs, mean_p)
        if np.abs(new - mu).sum() <= TOLERANCE * max(float(mu.sum()), 1e-12):
            break
        mu = 0.5 * mu + 0.5 * new
    return mu, mean_p, probs


def _disagreement(probs: NDArray[np.float64], shards: int) -> float:
    """The mean TV between a shard's distribution and the mean of its fleet of ``shards`` (draws in fleets)."""
    if shards == 1:
        return 0.0
    fleets = probs[: (len(probs) // shards) * shards].reshape(-1, shards, probs.shape[1])
    return tv(fleets, fleets.mean(axis=1, keepdims=True))


def predict(m: FleetModel, seed: int = 0) -> Prediction:
    """The model's figures for the fleet ``m`` (both arms, the oracle, the parts)."""
    sampler, env = _Sampler(m), _Env(m)
    n, fleet = m.envs_per_shard, m.shards * m.envs_per_shard
    hard = m.hard_mask
    mu_oracle = _mean_field(m, env, sampler, fleet)
    oracle = sampler(mu_oracle)[0]

    def arm(envs: int, fleet_of: int, pooled: NDArray[np.float64] | None) -> tuple[Arm, NDArray[np.float64]]:
        base = mu_oracle * envs / fleet  # a shard's share of the oracle's failures
        flat = sampler(base)[0]
        noisy, _ = _expected(m, sampler, base, _covariance(m, env, sampler, base, envs, False), seed)
        mu, dist, probs = _self_consistent(m, env, sampler, envs, seed, pooled=fleet_of == 1)
        mass = float(mu.sum())
        stats = formulas.ema_statistics(mass, m.bins, m.alpha, m.uniform_ratio, m.mix)
        flattening = tv(flat, oracle)
        noise = tv(noisy, oracle) - flattening
        regret = tv(dist, oracle)
        return Arm(
            distribution=dist.tolist(),
            shard_distance=0.0 if pooled is None else tv(probs, pooled[None, :]),
            ema_mass=mass,
            failures_per_bin_window=stats["failures_per_bin_window"],
            uniform_share=stats["uniform_share"],
            disagreement=_disagreement(probs, fleet_of),
            skill_share=float(dist[hard].sum()),
            regret=regret,
            parts={"flattening": flattening, "noise": noise, "feedback": regret - flattening - noise},
        ), dist

    pooled, pooled_dist = arm(fleet, 1, None)
    local, _ = arm(n, m.shards, pooled_dist)
    return Prediction(
        model=asdict(m),
        local=local,
        pooled=pooled,
        oracle=oracle.tolist(),
        distance_from_pooled=tv(np.asarray(local.distribution), np.asarray(pooled.distribution)),
    )


def trajectory(m: FleetModel, learn_visits: float, fleet_steps: int, seed: int = 0) -> dict[str, list[float]]:
    """Each arm under a learning law: bin ``b``'s hazard ``hazard_b·exp(−S_b/τ)``, ``S_b`` the fleet's
    env steps spent in the bin so far (one policy learns from every shard), ``τ = learn_visits``;
    stepped one EMA window (1/α steps) at a time. Returns, per window's end, the fleet steps and each
    arm's mean hazard over the skill bins and its skill share."""
    if learn_visits <= 0:
        raise ConfigurationError(f"drift model: learn_visits must be positive, got {learn_visits}")
    window = max(1, round(1 / m.alpha))
    h0 = np.asarray(m.hazard)
    hard = m.hard_mask if m.hard_mask.any() else np.ones(m.bins, dtype=bool)
    fleet = m.shards * m.envs_per_shard
    steps_per_start = 1.0 / m.start_rate  # an episode's env steps, spread over the bins it visits
    out: dict[str, list[float]] = {"steps": []}
    spent = {"local": np.zeros(m.bins), "pooled": np.zeros(m.bins)}
    for name in spent:
        out[f"{name}_skill_hazard"], out[f"{name}_skill_share"] = [], []
    for done in range(window, fleet_steps + window, window):
        out["steps"].append(float(min(done, fleet_steps)))
        for name, visits in spent.items():
            h = h0 * np.exp(-visits / learn_visits)
            now = replace(m, hazard=tuple(float(v) for v in h))
            env, sampler = _Env(now), _Sampler(now)
            envs = m.envs_per_shard if name == "local" else fleet
            _, dist, _ = _self_consistent(now, env, sampler, envs, seed, pooled=name == "pooled")
            reach = dist @ env.visits
            visits += fleet * window * reach / reach.sum() * min(1.0, m.start_rate * steps_per_start)
            out[f"{name}_skill_hazard"].append(float(h[hard].mean()))
            out[f"{name}_skill_share"].append(float(dist[hard].sum()))
    return out


def simulate(
    m: FleetModel, steps: int, seed: int, burn_in: int | None = None, every: int = 10, stride: int = 1
) -> dict[str, Any]:
    """The sampler's own formulas run on the modelled fleet, both arms, for ``steps`` env steps after
    ``burn_in`` (5 EMA windows by default): each step every shard draws its starts from its
    distribution and its failures (Poisson, per bin, of the episodes' transfer ``K``), and folds them
    into its EMA; figures are taken every ``every`` steps. ``stride`` > 1 takes that many env steps at
    once (the counts of ``stride`` steps folded as one, ``(1 − α)^stride`` of the EMA kept): for a
    small α, where a window is many steps and ``stride·α`` stays small.

    ``shard_distance`` is what an observing sampler and the studies' runs measure: a ``local``
    shard's distribution against the one the fleet's summed EMAs give at the same moment;
    ``fleet_distance`` the same for the shards' mixture (what the replay buffer receives);
    ``shard_noise`` how far a shard's distribution moves from its own time average (``pooled_noise``
    the pooled arm's);
    ``pooled_arm_distance`` a shard against the pooled arm's (another fleet's) distribution at the
    same step; ``distance_from_pooled`` the two arms' time-averaged fleet distributions."""
    if stride < 1 or every < 1 or steps < 1:
        raise ConfigurationError(
            f"simulate: steps, every and stride must be at least 1, got {steps}, {every}, {stride}"
        )
    rng = np.random.default_rng(seed)
    sampler, env = _Sampler(m), _Env(m)
    hard = m.hard_mask
    burn = int(5 / m.alpha) if burn_in is None else burn_in
    n, shards = m.envs_per_shard, m.shards
    keep = (1.0 - m.alpha) ** stride  # the EMA's share kept over one iteration of ``stride`` steps
    watched = min(shards, 8)  # the shards whose own time average ``shard_noise`` is taken against
    local = np.zeros((shards, m.bins))
    pooled = np.zeros((shards, m.bins))  # each shard's own EMA; the distribution is built from their sum
    acc: dict[str, Any] = {"local": np.zeros(m.bins), "pooled": np.zeros(m.bins), "disagreement": 0.0, "mass": 0.0,
                           "shard_distance": 0.0, "fleet_distance": 0.0, "pooled_arm_distance": 0.0,
                           "pooled_mass": 0.0}  # fmt: skip
    seen: list[NDArray[np.float64]] = []
    seen_pooled: list[NDArray[np.float64]] = []
    taken = 0
    every_iterations = max(1, round(every / stride))
    burn_iterations = -(-burn // stride)
    for t in range(burn_iterations + -(-steps // stride)):
        p_local = sampler(local)
        p_pooled = np.broadcast_to(sampler(pooled.sum(axis=0))[0], (shards, m.bins))
        if t >= burn_iterations and (t - burn_iterations) % every_iterations == 0:
            mix = p_local.mean(axis=0)
            now = sampler(local.sum(axis=0))  # the local fleet's pooled distribution at this moment
            acc["local"] += mix
            acc["pooled"] += p_pooled[0]
            acc["disagreement"] += tv(p_local, mix[None, :])
            acc["shard_distance"] += tv(p_local, now)
            acc["fleet_distance"] += tv(mix, now[0])
            acc["pooled_arm_distance"] += tv(p_local, p_pooled[:1])
            acc["mass"] += float(local.sum(axis=1).mean())
            acc["pooled_mass"] += float(pooled.sum())
            seen.append(p_local[:watched].copy())
            seen_pooled.append(p_pooled[0].copy())
            taken += 1
        for ema, p in ((local, p_local), (pooled, p_pooled)):
            started = rng.multinomial(rng.binomial(n * stride, m.start_rate, size=shards), p)
            counts = rng.poisson(started @ env.failures(p.mean(axis=0)))
            if stride == 1:
                formulas.ema_step(ema, counts, m.alpha)
            else:
                ema *= keep
                ema += (1.0 - keep) / stride * counts
    local_dist, pooled_dist = acc["local"] / taken, acc["pooled"] / taken
    history, pooled_history = np.stack(seen), np.stack(seen_pooled)  # [taken, watched, bins], [taken, bins]
    return {
        "local": local_dist,
        "pooled": pooled_dist,
        "distance_from_pooled": tv(local_dist, pooled_dist),
        "disagreement": acc["disagreement"] / taken,
        "shard_distance": acc["shard_distance"] / taken,
        "fleet_distance": acc["fleet_distance"] / taken,
        "pooled_arm_distance": acc["pooled_arm_distance"] / taken,
        "shard_noise": tv(history, history.mean(axis=0, keepdims=True)),
        "pooled_noise": tv(pooled_history, pooled_history.mean(axis=0, keepdims=True)),
        "local_skill_share": float(local_dist[hard].sum()),
        "pooled_skill_share": float(pooled_dist[hard].sum()),
        "local_ema_mass": acc["mass"] / taken,
        "pooled_ema_mass": acc["pooled_mass"] / taken,
    }


MEASURED_WINDOWS = 10  # EMA windows `measure` averages over, after `simulate`'s 5 of burn-in
STRIDE_ALPHA = 0.01  # `measure` folds steps in strides of at most this much of the EMA's window
WORK_BUDGET = 3e8  # shard-bins × iterations `measure` takes on (about a minute on a 2-core machine)


def measurement_plan(m: FleetModel) -> tuple[int, int, float]:
    """`measure`'s env steps, its stride and its work (shard-bins plus the transfer's bins² per
    iteration, times the iterations): the same number of iterations whatever α."""
    stride = max(1, int(STRIDE_ALPHA / m.alpha))
    steps = max(1, round(MEASURED_WINDOWS / m.alpha))
    iterations = (int(5 / m.alpha) + steps) / stride
    return steps, stride, iterations * (m.shards * m.bins + 2 * m.bins * m.bins)


def measure(m: FleetModel, seed: int = 0) -> dict[str, Any]:
    """The drift a fleet's samplers would show, measured as the runs measure it, on the modelled fleet:
    `simulate` over `MEASURED_WINDOWS` EMA windows, in strides for a small α. A fleet beyond
    `WORK_BUDGET` is refused (ConfigurationError naming the figure) rather than left running for hours."""
    steps, stride, work = measurement_plan(m)
    if work > WORK_BUDGET:
        raise ConfigurationError(
            f"drift model: {m.shards} shards x {m.bins} bins is {work:.2g} units of work, beyond the {WORK_BUDGET:.0e} "
            f"measured in about a minute: fewer shards or bins"
        )
    return simulate(m, steps, seed, stride=stride) | {"steps": steps, "stride": stride, "seed": seed}


def sweep(
    shards: Sequence[int],
    envs_per_shard: Sequence[int],
    alphas: Sequence[float],
    bins: Sequence[int],
    failure_rate: float,
    *,
    start_rate: float = 0.02,
    episode_bins: int = 10,
    hard_bins: int = 0,
    hard_ratio: float = 10.0,
    mix: UniformMix = SAMPLER.uniform_mix,
) -> list[dict[str, Any]]:
    """`predict` over the grid shards × envs per shard × α × bins: one row a configuration."""
    rows = []
    for b in bins:
        q, hard = profile(
            b, failure_rate, start_rate=start_rate, episode_bins=episode_bins, hard_bins=min(hard_bins, b - 1),
            hard_ratio=hard_ratio,
        )  # fmt: skip
        for a in alphas:
            for s in shards:
                for e in envs_per_shard:
                    model = FleetModel(s, e, q, alpha=a, start_rate=start_rate, episode_bins=episode_bins, mix=mix,
                                       hard=hard)  # fmt: skip
                    p = predict(model)
                    rows.append(
                        {
                            "shards": s,
                            "envs_per_shard": e,
                            "alpha": a,
                            "bins": b,
                            "distance_from_pooled": p.distance_from_pooled,
                            "disagreement": p.local.disagreement,
                            "failures_per_bin_window": p.local.failures_per_bin_window,
                            "local_regret": p.local.regret,
                            "pooled_regret": p.pooled.regret,
                            **{f"local_{k}": v for k, v in p.local.parts.items()},
                        }
                    )
    return rows
