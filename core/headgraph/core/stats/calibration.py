"""Null calibration that does not grade its own homework: a verdict threshold fitted on one part
of the random-pair null and checked on the other, and the associations a loud source explains.

* :func:`split_null`: the stated split rule. A seeded permutation (numpy ``default_rng(seed)``)
  of the n null pairs; its first ceil(n / 2) calibrate, the other floor(n / 2) are held out.
* :func:`tail_threshold`: the null's (1 - alpha / n_tests) quantile (Bonferroni) from the
  calibration half. Empirical ("higher") when that half has at least 1 / (1 - q) values;
  otherwise a generalized Pareto fit (scipy.stats.genpareto, location 0) to the exceedances
  over the half's upper TAIL_SHARE (at least TAIL_MIN values), the peaks-over-threshold
  quantile u + sigma / xi ((zeta / (1 - q))^xi - 1) with a conservative shape (the fitted xi
  plus TAIL_Z standard errors: the plain fit's family-wise error was 0.13 for a nominal 0.05 on
  100 calibration values in simulation, this one's at most 0.03 for exponential, log-normal and
  Pareto tails on 90+); "unresolved" (no threshold: the verdict is refused) with fewer than
  GPD_MIN_NULL values or a failed fit.
* :func:`held_out_threshold`: both, plus the achieved error on the held-out half: the share of
  held-out null pairs above the threshold (expected 1 - q) and the family-wise error it
  implies over n_tests tests (n_tests x that share, expected alpha).
* :func:`partial_spearman`: Spearman of x and y given covariates (ranks regressed on the
  covariates' ranks by least squares, the residuals correlated), with its t-test p-value.

Pure numpy / scipy; nothing here runs a model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from headgraph.core.errors import InvalidInput

SPLIT_RULE = ("a seeded random half of the null (numpy default_rng(seed) permutation: the first "
              "ceil(n/2) pairs calibrate the threshold, the other floor(n/2) are held out and judged)")
TAIL_SHARE = 0.2  # the exceedances a generalized Pareto tail is fitted to: the upper 20%
TAIL_MIN = 10  # ... and at least this many values
TAIL_Z = 1.64  # the shape used: the fitted xi plus 1.64 of its standard error (1 + xi) / sqrt(n_exceed)
GPD_MIN_NULL = 90  # fewer calibration values: no tail fit, the threshold is unresolved
EMPIRICAL, GPD, UNRESOLVED = "empirical", "gpd", "unresolved"


def split_null(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(calibration rows, held-out rows) of n null pairs, each sorted (SPLIT_RULE)."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise InvalidInput(f"n must be a non-negative integer, got {n!r}")
    perm = np.random.default_rng(seed).permutation(int(n))
    cut = (int(n) + 1) // 2
    return np.sort(perm[:cut]), np.sort(perm[cut:])


def min_empirical(quantile: float) -> int:
    """The fewest null values whose empirical quantile resolves ``quantile`` (1 / (1 - q))."""
    return math.ceil(1.0 / (1.0 - quantile) - 1e-9)


def tail_threshold(values: Sequence[float] | np.ndarray, quantile: float
                   ) -> tuple[float | None, str, dict[str, Any] | None]:
    """(threshold or None, method, GPD fit {u, xi, sigma, n_exceed, zeta} or None) of the finite
    ``values`` at ``quantile`` (see the module docstring)."""
    from scipy.stats import genpareto

    v = np.sort(np.asarray(values, dtype=np.float64))
    v = v[np.isfinite(v)]
    n = len(v)
    if n and n >= min_empirical(quantile):
        return float(np.quantile(v, quantile, method="higher")), EMPIRICAL, None
    if n < GPD_MIN_NULL:
        return None, UNRESOLVED, None
    n_exc = max(TAIL_MIN, math.ceil(TAIL_SHARE * n))
    u = float(v[n - n_exc - 1])  # exceedances: the n_exc values above the (n_exc + 1)-th largest
    exc = v[n - n_exc:] - u
    if np.ptp(exc) == 0 or exc.max() <= 0:
        return None, UNRESOLVED, None
    try:
        xi, _, sigma = genpareto.fit(exc, floc=0.0)
    except (RuntimeError, ValueError, FloatingPointError):
        return None, UNRESOLVED, None
    zeta = n_exc / n  # P(X > u)
    p = 1.0 - quantile
    if not (math.isfinite(xi) and math.isfinite(sigma) and sigma > 0):
        return None, UNRESOLVED, None
    xi_fit = float(xi)
    xi = xi_fit + TAIL_Z * (1.0 + max(xi_fit, 0.0)) / math.sqrt(n_exc)  # conservative: an upper bound
    excess = sigma * math.log(zeta / p) if abs(xi) < 1e-9 else sigma / xi * ((zeta / p) ** xi - 1.0)
    if xi < 0:  # a bounded tail: never above its end point u + sigma / -xi
        excess = min(excess, sigma / -xi)
    t = u + excess
    fit = {"u": u, "xi": xi_fit, "xi_used": float(xi), "sigma": float(sigma), "n_exceed": int(n_exc), "zeta": zeta}
    return (float(t), GPD, fit) if math.isfinite(t) else (None, UNRESOLVED, fit)


@dataclass(frozen=True)
class HeldOutThreshold:
    """A verdict threshold calibrated on one half of the null and checked on the other.

    threshold: None when unresolved (no verdict); quantile: 1 - alpha / n_tests (Bonferroni)
    or 1 - alpha; method: "empirical" | "gpd" | "unresolved"; resolved: method != "unresolved";
    held_out_exceed / held_out_share: the held-out null values strictly above the threshold;
    expected_share: 1 - quantile (what that share should be); achieved_fwer: min(1, n_tests x
    held_out_share), the family-wise error the held-out half measures (expected alpha);
    min_empirical: the calibration values an empirical quantile would need."""

    threshold: float | None
    quantile: float
    alpha: float
    n_tests: int
    rule: str
    method: str
    resolved: bool
    n_null: int
    n_calibration: int
    n_held_out: int
    min_empirical: int
    held_out_exceed: int
    held_out_share: float | None
    expected_share: float
    achieved_fwer: float | None
    split_seed: int
    split: str
    tail: dict[str, Any] | None

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form."""
        return asdict(self)

    def verified(self, effects: Sequence[float] | np.ndarray) -> np.ndarray:
        """bool per effect: strictly above the threshold (all False when unresolved or NaN)."""
        e = np.nan_to_num(np.asarray(effects, dtype=np.float64), nan=-np.inf)
        return np.zeros(e.shape, dtype=bool) if self.threshold is None else e > self.threshold


def _check_level(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < float(value) < 1.0:
        raise InvalidInput(f"{name} must lie in (0, 1), got {value!r}")
    return float(value)


def bonferroni_quantile(n_tests: int, alpha: float, rule: str = "bonferroni") -> float:
    """1 - alpha / n_tests ("bonferroni") or 1 - alpha ("none")."""
    alpha = _check_level("alpha", alpha)
    if isinstance(n_tests, bool) or not isinstance(n_tests, (int, np.integer)) or n_tests < 1:
        raise InvalidInput(f"n_tests must be a positive integer, got {n_tests!r}")
    if rule not in ("bonferroni", "none"):
        raise InvalidInput(f"unknown multiple-testing rule {rule!r}; allowed: ['bonferroni', 'none']",
                           allowed=["bonferroni", "none"])
    return 1.0 - (alpha / int(n_tests) if rule == "bonferroni" else alpha)


def held_out_threshold(null_effects: Sequence[float] | np.ndarray, *, n_tests: int = 1, alpha: float = 0.05,
                       rule: str = "bonferroni", seed: int = 0) -> HeldOutThreshold:
    """The threshold from the calibration half of the finite ``null_effects`` (split_null with
    ``seed``) and its achieved error on the held-out half (see :class:`HeldOutThreshold`)."""
    q = bonferroni_quantile(n_tests, alpha, rule)
    null = np.asarray(null_effects, dtype=np.float64)
    if null.ndim != 1:
        raise InvalidInput(f"null_effects must be a 1-D sample, got shape {null.shape}")
    null = null[np.isfinite(null)]
    if len(null) == 0:
        raise InvalidInput("the null has no finite effects")
    cal, held = split_null(len(null), seed)
    threshold, method, tail = tail_threshold(null[cal], q)
    exceed = 0 if threshold is None else int((null[held] > threshold).sum())
    share = None if threshold is None or len(held) == 0 else exceed / len(held)
    return HeldOutThreshold(
        threshold=threshold, quantile=q, alpha=float(alpha), n_tests=int(n_tests), rule=rule, method=method,
        resolved=threshold is not None, n_null=len(null), n_calibration=len(cal), n_held_out=len(held),
        min_empirical=min_empirical(q), held_out_exceed=exceed, held_out_share=share, expected_share=1.0 - q,
        achieved_fwer=None if share is None else min(1.0, int(n_tests) * share), split_seed=int(seed),
        split=SPLIT_RULE, tail=tail)


@dataclass(frozen=True)
class PartialSpearman:
    """Spearman of x and y given covariates: rho, its two-sided p-value (t with n - 2 - c df),
    n pairs used (all finite), the covariates' names."""

    rho: float | None
    p_value: float | None
    n: int
    given: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form."""
        return {"rho": self.rho, "p_value": self.p_value, "n": self.n, "given": list(self.given)}


def partial_spearman(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray,
                     covariates: Mapping[str, Sequence[float] | np.ndarray]) -> PartialSpearman:
    """Partial Spearman rho(x, y | covariates): the average ranks of x and y each regressed on
    an intercept and the covariates' ranks (least squares), the residuals' Pearson correlation.
    Rows with any non-finite value are dropped; None when fewer than c + 4 rows remain or a
    residual is constant."""
    from scipy.stats import rankdata
    from scipy.stats import t as student_t

    xa, ya = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    cov = {k: np.asarray(v, dtype=np.float64) for k, v in covariates.items()}
    if xa.ndim != 1 or ya.shape != xa.shape or any(v.shape != xa.shape for v in cov.values()):
        raise InvalidInput("partial Spearman needs 1-D samples of one length")
    ok = np.isfinite(xa) & np.isfinite(ya)
    for v in cov.values():
        ok &= np.isfinite(v)
    n, c = int(ok.sum()), len(cov)
    if n < c + 4:
        return PartialSpearman(None, None, n, tuple(cov))
    design = np.column_stack([np.ones(n), *(rankdata(v[ok]) for v in cov.values())])

    def residual(a: np.ndarray) -> np.ndarray:
        r = rankdata(a[ok])
        coef, *_ = np.linalg.lstsq(design, r, rcond=None)
        return r - design @ coef

    rx, ry = residual(xa), residual(ya)
    den = math.sqrt(float((rx * rx).sum() * (ry * ry).sum()))
    if den <= 1e-12 * n * n:
        return PartialSpearman(None, None, n, tuple(cov))
    rho = float(np.clip((rx * ry).sum() / den, -1.0, 1.0))
    df = n - 2 - c
    t = rho * math.sqrt(df / max(1e-300, 1.0 - rho * rho))
    return PartialSpearman(rho, float(2.0 * student_t.sf(abs(t), df)), n, tuple(cov))


__all__ = ["EMPIRICAL", "GPD", "SPLIT_RULE", "UNRESOLVED", "HeldOutThreshold", "PartialSpearman",
           "bonferroni_quantile", "held_out_threshold", "min_empirical", "partial_spearman", "split_null",
           "tail_threshold"]
