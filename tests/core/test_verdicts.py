"""Decision rules: paired Spearman differences, null-derived verdict thresholds, top-k precision
with Fisher's exact test and the power of a Spearman test, against scipy and direct counts."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats

from headgraph.core.errors import InvalidInput
from headgraph.core.stats.verdicts import (
    empirical_pvalues,
    null_threshold,
    paired_spearman_difference,
    pairs_for_power,
    spearman_power,
    spearman_rows,
    topk_precision,
)


def test_paired_difference_point_is_the_scipy_difference_and_decides_by_its_interval():
    rng = np.random.default_rng(0)
    e = rng.normal(size=300)
    a = e + rng.normal(size=300) * 0.7
    b = e + rng.normal(size=300) * 3.0
    res = paired_spearman_difference(a, b, e, names=("PK", "CS"), n_resamples=1000)
    ra = scipy.stats.spearmanr(a, e).statistic
    rb = scipy.stats.spearmanr(b, e).statistic
    assert res.rho_a == pytest.approx(ra, abs=1e-12) and res.rho_b == pytest.approx(rb, abs=1e-12)
    assert res.difference == pytest.approx(ra - rb, abs=1e-12)
    assert res.low is not None and res.high is not None and 0 < res.low < res.difference < res.high
    assert res.verdict == "A"
    swapped = paired_spearman_difference(b, a, e, n_resamples=1000)
    assert swapped.verdict == "B"
    same = paired_spearman_difference(a, a + 1e-9 * rng.normal(size=300), e, n_resamples=500)
    assert same.verdict == "tie"
    assert paired_spearman_difference([1, 2], [2, 1], [0, 1]).verdict is None  # too few pairs
    # the paired interval is narrower than what two marginal intervals would need
    assert res.to_dict()["metric_a"] == "PK"


def test_paired_difference_interval_is_the_bootstrap_percentile():
    rng = np.random.default_rng(1)
    e, a, b = rng.normal(size=(3, 50))
    res = paired_spearman_difference(a, b, e, n_resamples=300, seed=7, confidence=0.9)
    # the same resamples, drawn as the function draws them, recomputed with scipy
    idx = np.random.default_rng(7).integers(0, 50, size=(300, 50))
    d = [scipy.stats.spearmanr(a[i], e[i]).statistic - scipy.stats.spearmanr(b[i], e[i]).statistic for i in idx]
    assert res.low == pytest.approx(np.quantile(d, 0.05), abs=1e-12)
    assert res.high == pytest.approx(np.quantile(d, 0.95), abs=1e-12)
    rows = spearman_rows(np.stack([a, b]), np.stack([e, e]))
    assert rows[0] == pytest.approx(scipy.stats.spearmanr(a, e).statistic)


def test_threshold_is_derived_from_the_null_and_moves_with_it():
    rng = np.random.default_rng(2)
    null = np.abs(rng.normal(size=2000)) * 0.01
    t = null_threshold(null, n_tests=10, alpha=0.05)
    assert t.quantile == pytest.approx(1 - 0.05 / 10) and t.resolved
    assert t.threshold == pytest.approx(np.quantile(null, 0.995, method="higher"))
    assert (null > t.threshold).mean() <= 0.005
    # change the null: the threshold follows it
    louder = null_threshold(null * 3.0, n_tests=10)
    assert louder.threshold == pytest.approx(3.0 * t.threshold)
    shifted = null_threshold(np.r_[null, np.full(100, 1.0)], n_tests=10)
    assert shifted.threshold > t.threshold
    # more tested edges -> a stricter (higher) quantile; no correction -> lower
    assert null_threshold(null, n_tests=100).threshold >= t.threshold
    assert null_threshold(null, n_tests=10, rule="none").threshold <= t.threshold
    small = null_threshold(null[:50], n_tests=10)
    assert not small.resolved and small.threshold == pytest.approx(null[:50].max())
    assert list(t.verified([0.0, 1.0])) == [False, True]
    with pytest.raises(InvalidInput):
        null_threshold(null, rule="holm-ish")
    with pytest.raises(InvalidInput):
        null_threshold([math.nan])


def test_empirical_pvalues_count_the_null():
    null = np.arange(1.0, 100.0)  # 99 values
    p = empirical_pvalues([0.5, 50.0, 1000.0], null)
    assert list(p) == pytest.approx([1.0, (1 + 50) / 100, 1 / 100])


def test_topk_precision_is_fishers_exact_test():
    res = topk_precision(5, 10, 0, 200)
    want = scipy.stats.fisher_exact([[5, 5], [0, 200]], alternative="greater").pvalue
    assert res.p_value == pytest.approx(want) and res.p_value < 1e-7
    assert res.precision == 0.5 and res.null_share == 0.0
    weak = topk_precision(1, 10, 20, 200)
    assert weak.p_value > 0.5
    with pytest.raises(InvalidInput):
        topk_precision(11, 10, 0, 200)


def test_spearman_power_fisher_z():
    assert spearman_power(40, 0.3) == pytest.approx(0.447, abs=0.005)  # ~0.45 at n = 40
    assert spearman_power(200, 0.3) > 0.97
    z = math.atanh(0.3) / math.sqrt(1.06 / 97)
    crit = scipy.stats.norm.ppf(0.975)
    assert spearman_power(100, 0.3) == pytest.approx(scipy.stats.norm.cdf(z - crit) + scipy.stats.norm.cdf(-z - crit))
    n = pairs_for_power(0.8, 0.3)
    assert spearman_power(n, 0.3) >= 0.8 > spearman_power(n - 1, 0.3)
    with pytest.raises(InvalidInput):
        spearman_power(3)
