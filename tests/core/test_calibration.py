"""Held-out null calibration: a planted null with a known tail, many repetitions, the achieved
family-wise error of the held-out-calibrated rule against its stated alpha (binomial error),
the old self-calibrated rule's circularity, and partial Spearman against a float64 reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats

from headgraph.core.errors import InvalidInput
from headgraph.core.stats.calibration import (EMPIRICAL, GPD, UNRESOLVED, held_out_threshold, partial_spearman,
                                              split_null, tail_threshold)

ALPHA, N_TESTS = 0.05, 20  # 10 edges x 2 prompt sets: q = 0.9975


def _fwer(null_size: int, draw, reps: int, seed: int) -> tuple[float, float, str]:
    """(family-wise error over reps, mean held-out share, method): each rep draws a null of
    ``null_size``, calibrates on its half, and tests N_TESTS fresh null edges."""
    rng = np.random.default_rng(seed)
    any_false, shares, method = 0, [], ""
    for r in range(reps):
        th = held_out_threshold(draw(rng, null_size), n_tests=N_TESTS, alpha=ALPHA, seed=r)
        method = th.method
        assert th.resolved and th.held_out_share is not None
        any_false += bool(th.verified(draw(rng, N_TESTS)).any())
        shares.append(th.held_out_share)
    return any_false / reps, float(np.mean(shares)), method


def _bound(reps: int) -> float:
    return ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / reps)  # alpha within binomial error


def test_split_rule_is_seeded_disjoint_and_covering():
    cal, held = split_null(11, seed=4)
    assert len(cal) == 6 and len(held) == 5
    assert sorted(np.r_[cal, held].tolist()) == list(range(11))
    assert np.array_equal(cal, np.sort(np.random.default_rng(4).permutation(11)[:6]))
    assert not np.array_equal(split_null(11, seed=5)[0], cal)


def test_held_out_rule_keeps_the_family_wise_error_at_alpha_empirical_quantile():
    """800 null pairs: the calibration half (400) resolves q = 0.9975 empirically."""
    reps = 600
    fwer, share, method = _fwer(800, lambda g, n: g.exponential(1.0, n), reps, seed=0)
    assert method == EMPIRICAL
    assert fwer <= _bound(reps)
    assert share <= (1 - 0.9975) + 3 * math.sqrt(0.0025 / (400 * reps))  # held-out share ~ 1 - q


@pytest.mark.parametrize("name", ["exponential", "pareto"])
def test_held_out_rule_keeps_the_family_wise_error_at_alpha_with_a_tail_fit(name):
    """200 null pairs (100 calibrate, fewer than the 400 an empirical quantile needs): the
    conservative generalized Pareto tail keeps the family-wise error at alpha on a light and a
    heavy (Pareto, shape 3) tail."""
    draw = {"exponential": lambda g, n: g.exponential(1.0, n), "pareto": lambda g, n: g.pareto(3.0, n)}[name]
    reps = 200
    fwer, _, method = _fwer(200, draw, reps, seed=1)
    assert method == GPD
    assert fwer <= _bound(reps)


def test_the_old_self_calibrated_rule_is_circular():
    """Judging the null's pairs by a threshold computed from themselves: with fewer pairs than
    1 / (1 - q) the threshold is their maximum, so none is ever above it whatever the null (0 of
    200 by construction, a Fisher p of 5e-13 against any top-k that is not evidence); the
    held-out half, judged by the other half's threshold, is not guaranteed to be 0."""
    rng = np.random.default_rng(2)
    q = 1 - ALPHA / N_TESTS
    held_hits = 0
    for _ in range(30):
        null = rng.lognormal(0.0, 2.0, 200)
        self_threshold = np.quantile(null, q, method="higher")
        assert (null > self_threshold).sum() == 0  # circular: always 0
        th = held_out_threshold(null, n_tests=N_TESTS, alpha=ALPHA)
        held_hits += th.held_out_exceed
    assert held_hits > 0  # the held-out check can see exceedances


def test_too_small_a_null_is_unresolved_and_verifies_nothing():
    th = held_out_threshold(np.arange(60.0), n_tests=N_TESTS)
    assert th.method == UNRESOLVED and th.threshold is None and not th.resolved
    assert th.n_calibration == 30 and th.min_empirical == 400
    assert not th.verified([1e9]).any()
    assert th.held_out_share is None and th.achieved_fwer is None
    with pytest.raises(InvalidInput):
        held_out_threshold([math.nan])
    with pytest.raises(InvalidInput):
        held_out_threshold(np.ones(10), n_tests=0)


def test_tail_threshold_is_empirical_when_resolved_and_moves_with_the_null():
    x = np.random.default_rng(3).exponential(1.0, 1000)
    t, method, _ = tail_threshold(x, 0.995)
    assert method == EMPIRICAL and t == pytest.approx(np.quantile(x, 0.995, method="higher"))
    t2, method2, fit = tail_threshold(x[:150], 0.9975)
    assert method2 == GPD and fit is not None and fit["n_exceed"] == 30
    t3, _, _ = tail_threshold(x[:150] * 2.0, 0.9975)
    assert t3 == pytest.approx(2.0 * t2, rel=1e-3)  # scale-equivariant


def test_partial_spearman_is_the_rank_residual_correlation():
    rng = np.random.default_rng(4)
    z = rng.normal(size=300)
    x = z + 0.3 * rng.normal(size=300)
    y = z + 0.3 * rng.normal(size=300)
    plain = scipy.stats.spearmanr(x, y).statistic
    part = partial_spearman(x, y, {"z": z})
    assert plain > 0.8 and abs(part.rho) < 0.15  # the association is z's
    # float64 reference: residuals of ranks on [1, rank(z)]
    rx, ry, rz = (scipy.stats.rankdata(v) for v in (x, y, z))
    d = np.column_stack([np.ones(300), rz])
    res = [r - d @ np.linalg.lstsq(d, r, rcond=None)[0] for r in (rx, ry)]
    assert part.rho == pytest.approx(scipy.stats.pearsonr(*res).statistic)
    own = partial_spearman(x + y, y, {"z": z})
    assert own.rho > 0.5 and own.p_value < 1e-6 and own.n == 300
    assert partial_spearman([1.0, 2.0], [1.0, 2.0], {"z": [0.0, 1.0]}).rho is None
