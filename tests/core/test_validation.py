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
