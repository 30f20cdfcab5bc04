"""core.validation: pair choice and the bootstrap summaries, against direct computations."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import spearmanr

from headgraph.core.errors import InvalidInput
from headgraph.core.activations.validation import (mean_ci, sample_forward_pairs, spearman_ci, top_pairs_of,
                                       validation_summary)


def grid(seed: int = 0, shape: tuple[int, int, int, int] = (4, 3, 4, 2)) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    scores = rng.normal(size=shape)
    valid = rng.random(shape) > 0.2
    return scores, valid


def test_sampled_pairs_are_distinct_valid_forward_and_seeded() -> None:
    _, valid = grid()
    s = sample_forward_pairs(valid, 15, seed=3)
    assert s.shape == (15, 4) and len({tuple(r) for r in s.tolist()}) == 15
    assert all(valid[tuple(r)] and r[0] < r[2] for r in s.tolist())
    assert np.array_equal(s, sample_forward_pairs(valid, 15, seed=3))
    assert not np.array_equal(s, sample_forward_pairs(valid, 15, seed=4))
    forward = sum(1 for r in np.argwhere(valid).tolist() if r[0] < r[2])
    assert len(sample_forward_pairs(valid, 10_000)) == forward  # capped at what exists
    with pytest.raises(InvalidInput):
        sample_forward_pairs(valid, 0)


def test_top_pairs_match_a_brute_force_sort() -> None:
    scores, valid = grid(1)
    scores[0, 0, 1, 0] = np.nan
    cand = [(scores[tuple(r)], tuple(r)) for r in np.argwhere(valid).tolist()
            if r[0] < r[2] and np.isfinite(scores[tuple(r)])]
    expect = [p for _, p in sorted(cand, key=lambda c: -c[0])[:7]]
    assert [tuple(r) for r in top_pairs_of(scores, valid, 7).tolist()] == expect


def test_spearman_and_mean_intervals() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=60)
    y = x + rng.normal(scale=1.0, size=60)
    r = spearman_ci(x, y, seed=1)
    assert r.value == pytest.approx(spearmanr(x, y).statistic)
    assert r.low is not None and r.high is not None and r.low < r.value < r.high and r.n == 60
    # More pairs: a narrower interval.
    x2 = rng.normal(size=600)
    r2 = spearman_ci(x2, x2 + rng.normal(size=600), seed=1)
    assert (r2.high - r2.low) < (r.high - r.low)
    m = mean_ci(y, seed=1)
    assert m.value == pytest.approx(y.mean()) and m.low < m.value < m.high
    # Undefined: a constant input or fewer than three pairs.
    assert spearman_ci([1.0, 1.0, 1.0, 1.0], [1.0, 2.0, 3.0, 4.0]).value is None
    assert spearman_ci([1.0, 2.0], [1.0, 2.0]).value is None


def test_summary_reads_each_metric_on_its_rows() -> None:
    rng = np.random.default_rng(2)
    effects = rng.random(50)
    good = effects + rng.normal(scale=0.05, size=50)   # tracks the effect
    noise = rng.random(50)                            # does not
    sample = np.arange(40)
    top = {"good": np.argsort(-good)[:8], "noise": np.argsort(-noise)[:8]}
    out = {v.metric: v for v in validation_summary({"good": good, "noise": noise}, effects, sample, top)}
    assert out["good"].random_rho.value == pytest.approx(spearmanr(good[:40], effects[:40]).statistic)
    assert out["good"].random_rho.value > out["noise"].random_rho.value
    assert out["good"].top_mean_effect.value == pytest.approx(effects[top["good"]].mean())
    assert out["good"].top_mean_effect.value > out["noise"].top_mean_effect.value


def test_the_vectorized_resample_statistic_is_scipys_spearman() -> None:
    from headgraph.core.activations.validation import _spearman_along

    rng = np.random.default_rng(5)
    x, y = rng.integers(0, 6, size=(7, 30)).astype(float), rng.normal(size=(7, 30))  # ties in x
    got = _spearman_along(x, y)
    assert got == pytest.approx([spearmanr(a, b).statistic for a, b in zip(x, y)])
    assert np.isnan(_spearman_along(np.ones((1, 5)), np.arange(5.0)[None]))[0]


def test_paired_differences_are_the_paired_bootstrap_on_the_rows_both_metrics_define() -> None:
    from headgraph.core.activations.validation import paired_differences
    from headgraph.core.stats.verdicts import paired_spearman_difference

    rng = np.random.default_rng(7)
    effects = rng.random(80)
    pk = effects + rng.normal(scale=0.3, size=80)
    cs = effects + rng.normal(scale=0.6, size=80)
    cs[[3, 11]] = np.nan  # undefined cells: left out of that comparison only
    sample = np.arange(70)
    out = {d.metric_b: d for d in paired_differences({"PK": pk, "CS": cs, "noise": rng.random(80)}, effects,
                                                     sample, seed=2)}
    assert set(out) == {"CS", "noise"} and all(d.metric_a == "PK" for d in out.values())
    rows = np.array([i for i in range(70) if i not in (3, 11)])
    want = paired_spearman_difference(pk[rows], cs[rows], effects[rows], names=("PK", "CS"), seed=2)
    assert out["CS"] == want and out["CS"].n == 68
    assert out["CS"].difference == pytest.approx(spearmanr(pk[rows], effects[rows]).statistic
                                                 - spearmanr(cs[rows], effects[rows]).statistic)
    assert out["noise"].verdict == "A"  # PK clearly better than noise
    assert paired_differences({"CS": cs}, effects, sample) == ()  # no PK: nothing to compare


def test_the_paired_rule_decides_where_marginal_intervals_overlap() -> None:
    """Two metrics sharing most of their noise: their marginal intervals overlap, but on the
    same pairs one is better every time; the paired interval sees it."""
    from headgraph.core.activations.validation import paired_differences

    rng = np.random.default_rng(3)
    effects = rng.normal(size=200)
    shared = rng.normal(size=200)
    a = effects + shared
    b = effects + 1.25 * shared
    sample = np.arange(200)
    ra, rb = spearman_ci(a, effects), spearman_ci(b, effects)
    assert ra.low < rb.high  # overlapping marginal intervals: the old rule says no difference
    (d,) = paired_differences({"PK": a, "CS": b}, effects, sample)
    assert d.verdict == "A" and d.low > 0


def test_sample_power_is_the_spearman_power_of_the_pairs_drawn() -> None:
    from headgraph.core.activations.validation import forward_pair_count, sample_power
    from headgraph.core.stats.verdicts import spearman_power

    _, valid = grid()
    available = forward_pair_count(valid)
    assert available == len(sample_forward_pairs(valid, 10_000))
    p = sample_power(200, min(200, available), available)
    assert p.n == available < 200 and p.power == pytest.approx(spearman_power(available, 0.3))
    full = sample_power(200, 200, 5000)
    assert full.power == pytest.approx(spearman_power(200, 0.3)) and full.power > 0.95
    assert full.n_for_80 == 90 and sample_power(200, 3, 3).power is None
