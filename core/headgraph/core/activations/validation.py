"""Do weight-level metrics predict activation-level effects?

The question researchers ask of the paper, answered for one model: over forward head pairs
(source layer < target layer) of one O -> Q/K/V pairing, how well does each weight-level
metric (PK, CS, data-weighted PK, ...) rank the pairs' path-ablation effects
(core.activations.ablation)? Two views, each with bootstrap confidence intervals:

* **random sample**: ``n`` forward pairs drawn uniformly (seeded); per metric the Spearman
  correlation between its value and the effect — how well it ranks pairs in general;
* **top-k**: per metric its ``k`` highest pairs; their mean effect (do the pairs a metric
  puts first matter?) and the Spearman within them;
* **paired differences** (the decision rule): rho(PK) - rho(other metric) on the same random
  pairs with a paired bootstrap interval (core.stats.verdicts), and the sample's power.

Pure numpy / scipy on arrays: choosing pairs (``sample_forward_pairs``, ``top_pairs_of``) and
summarising values against effects (``spearman_ci``, ``mean_ci``, ``validation_summary``).
Running the ablation is the caller's (the server joins core.activations.ablation results).
Pairs are positions ``(source layer, source head, target layer, target head)`` on a grid
[L, H, L, Ht] (Ht = KV groups for a grouped-query model's K / V targets).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from headgraph.core.errors import InvalidInput
from headgraph.core.stats.verdicts import PairedDifference, paired_spearman_difference, pairs_for_power, spearman_power

CONFIDENCE = 0.95
N_RESAMPLES = 2000


@dataclass(frozen=True)
class Interval:
    """A statistic with its bootstrap percentile interval (None where undefined: fewer
    than three pairs, or a constant input)."""

    value: float | None
    low: float | None
    high: float | None
    n: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class MetricValidation:
    """One metric against the effect: Spearman over the random sample, and its top-k's mean
    effect and Spearman."""

    metric: str
    random_rho: Interval
    top_mean_effect: Interval
    top_rho: Interval

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "random_rho": self.random_rho.to_dict(),
                "top_mean_effect": self.top_mean_effect.to_dict(), "top_rho": self.top_rho.to_dict()}


def _positions(valid: np.ndarray) -> np.ndarray:
    valid = np.asarray(valid, dtype=bool)
    if valid.ndim != 4:
        raise InvalidInput(f"a pair grid is [L, H, L, Ht], got shape {valid.shape}")
    L = valid.shape[0]
    forward = np.arange(L)[:, None] < np.arange(L)[None, :]
    return np.argwhere(valid & forward[:, None, :, None])


def sample_forward_pairs(valid: np.ndarray, n: int, seed: int = 0) -> np.ndarray:
    """``min(n, available)`` distinct valid forward pairs [m, 4], uniformly at random with
    numpy's seeded Generator, in grid order."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InvalidInput(f"the sample size must be a positive integer, got {n!r}")
    pos = _positions(valid)
    if len(pos) == 0:
        raise InvalidInput("no valid forward pairs to sample")
    pick = np.random.default_rng(seed).choice(len(pos), size=min(n, len(pos)), replace=False)
    return pos[np.sort(pick)]


def top_pairs_of(scores: np.ndarray, valid: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` valid forward pairs with the highest finite ``scores`` [k, 4], best first
    (ties: grid order)."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise InvalidInput(f"k must be a positive integer, got {k!r}")
    scores = np.asarray(scores, dtype=np.float64)
    if scores.shape != np.shape(valid):
        raise InvalidInput(f"scores {scores.shape} and valid {np.shape(valid)} differ in shape")
    pos = _positions(np.asarray(valid, dtype=bool) & np.isfinite(scores))
    values = scores[tuple(pos.T)]
    order = np.argsort(-values, kind="stable")[:k]
    return pos[order]


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(x, y).statistic)  # type: ignore[union-attr]


def _spearman_along(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    """Spearman of every resample at once (scipy.stats.bootstrap's vectorized form): the
    Pearson correlation of average ranks along ``axis``; NaN where a resample is constant."""
    from scipy.stats import rankdata

    rx, ry = rankdata(x, axis=axis), rankdata(y, axis=axis)
    rx = rx - rx.mean(axis=axis, keepdims=True)
    ry = ry - ry.mean(axis=axis, keepdims=True)
    den = np.sqrt((rx * rx).sum(axis=axis) * (ry * ry).sum(axis=axis))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, (rx * ry).sum(axis=axis) / den, np.nan)


def _defined(x: np.ndarray, y: np.ndarray | None = None) -> bool:
    if len(x) < 3 or np.ptp(x) == 0:
        return False
    return y is None or np.ptp(y) > 0


def spearman_ci(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray, *, confidence: float = CONFIDENCE,
                n_resamples: int = N_RESAMPLES, seed: int = 0) -> Interval:
    """Spearman rho of paired samples with its bootstrap percentile interval (pairs resampled
    together, scipy.stats.bootstrap)."""
    from scipy.stats import bootstrap

    xa, ya = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if xa.shape != ya.shape or xa.ndim != 1:
        raise InvalidInput(f"paired 1-D samples needed, got shapes {xa.shape} and {ya.shape}")
    if not _defined(xa, ya):
        return Interval(None, None, None, len(xa))
    rho = _spearman(xa, ya)
    res = bootstrap((xa, ya), _spearman_along, paired=True, vectorized=True, confidence_level=confidence,
                    n_resamples=n_resamples, method="percentile", rng=np.random.default_rng(seed))
    lo, hi = (float(v) for v in (res.confidence_interval.low, res.confidence_interval.high))
    return Interval(rho, None if lo != lo else lo, None if hi != hi else hi, len(xa))


def mean_ci(x: Sequence[float] | np.ndarray, *, confidence: float = CONFIDENCE, n_resamples: int = N_RESAMPLES,
            seed: int = 0) -> Interval:
    """The mean with its bootstrap percentile interval."""
    from scipy.stats import bootstrap

    xa = np.asarray(x, dtype=np.float64)
    if len(xa) == 0:
        return Interval(None, None, None, 0)
    mean = float(xa.mean())
    if not _defined(xa):
        return Interval(mean, mean if len(xa) >= 3 else None, mean if len(xa) >= 3 else None, len(xa))
    res = bootstrap((xa,), np.mean, confidence_level=confidence, n_resamples=n_resamples,
                    method="percentile", rng=np.random.default_rng(seed))
    return Interval(mean, float(res.confidence_interval.low), float(res.confidence_interval.high), len(xa))


def validation_summary(values: Mapping[str, np.ndarray], effects: np.ndarray, sample: np.ndarray,
                       top: Mapping[str, np.ndarray], *, seed: int = 0) -> tuple[MetricValidation, ...]:
    """Per metric: Spearman of its values against ``effects`` over the ``sample`` rows, and
    the mean effect and Spearman over its ``top`` rows (row indices into ``effects`` and each
    metric's ``values``, all [n_pairs])."""
    effects = np.asarray(effects, dtype=np.float64)
    out = []
    for name, v in values.items():
        v = np.asarray(v, dtype=np.float64)
        if v.shape != effects.shape:
            raise InvalidInput(f"{name}: {v.shape} values for {effects.shape} effects")
        s = np.asarray(sample, dtype=np.int64)
        s = s[np.isfinite(v[s])]
        t = np.asarray(top.get(name, np.zeros(0, dtype=np.int64)), dtype=np.int64)
        out.append(MetricValidation(
            metric=name, random_rho=spearman_ci(v[s], effects[s], seed=seed),
            top_mean_effect=mean_ci(effects[t], seed=seed), top_rho=spearman_ci(v[t], effects[t], seed=seed)))
    return tuple(out)


def paired_differences(values: Mapping[str, np.ndarray], effects: np.ndarray, sample: np.ndarray, *,
                       against: str = "PK", seed: int = 0,
                       n_resamples: int = N_RESAMPLES) -> tuple[PairedDifference, ...]:
    """``against`` minus every other metric: rho(against, effect) - rho(metric, effect) over the
    ``sample`` rows where both are finite, with a paired bootstrap interval and its verdict
    (core.stats.verdicts.paired_spearman_difference: the decision rule, "A" when the interval
    lies above 0). Empty when ``against`` is not among ``values``."""
    if against not in values:
        return ()
    effects = np.asarray(effects, dtype=np.float64)
    s = np.asarray(sample, dtype=np.int64)
    a = np.asarray(values[against], dtype=np.float64)
    out = []
    for name, v in values.items():
        if name == against:
            continue
        v = np.asarray(v, dtype=np.float64)
        rows = s[np.isfinite(a[s]) & np.isfinite(v[s]) & np.isfinite(effects[s])]
        out.append(paired_spearman_difference(a[rows], v[rows], effects[rows], names=(against, name),
                                              n_resamples=n_resamples, seed=seed))
    return tuple(out)


@dataclass(frozen=True)
class SamplePower:
    """The random sample's power: ``n`` pairs measured of ``requested`` (fewer when the model
    has fewer valid forward pairs, ``available``; None when not known yet), the power of a
    level-``alpha`` Spearman test to detect ``rho`` with them, and the pairs that reach 80% power."""

    requested: int
    n: int
    available: int | None
    rho: float
    alpha: float
    power: float | None
    n_for_80: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def sample_power(requested: int, n: int, available: int | None, *, rho: float = 0.3, alpha: float = 0.05) -> SamplePower:
    """:class:`SamplePower` from core.stats.verdicts.spearman_power (None below 4 pairs)."""
    return SamplePower(requested=requested, n=n, available=available, rho=rho, alpha=alpha,
                       power=spearman_power(n, rho, alpha=alpha) if n >= 4 else None,
                       n_for_80=pairs_for_power(0.8, rho, alpha=alpha))


def forward_pair_count(valid: np.ndarray) -> int:
    """How many valid forward pairs a grid has (the most a random sample can draw)."""
    return len(_positions(valid))
