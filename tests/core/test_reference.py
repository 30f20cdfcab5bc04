"""Haar reference: analytic moments, Monte-Carlo samplers, z-scores and the KL grid."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import scipy.stats
import torch

from headgraph.core.errors import InvalidInput
from headgraph.core.scores.pk import pair_detail, projection_kernel
from headgraph.core.stats.reference import (
    haar_moments,
    haar_pk_samples,
    kl_divergence,
    kl_grid,
    pair_zscore,
    zscores,
)


def test_moments_match_transformerlens_and_beta_law():
    from transformer_lens.tools.analysis.projection_kernel import random_projection_kernel_moments

    for d, m in ((768, 64), (64, 16), (10, 3)):
        ours = haar_moments(d, m)
        tl = random_projection_kernel_moments(d, m)
        assert ours.mean == pytest.approx(tl.mean, rel=1e-12)
        assert ours.variance == pytest.approx(tl.variance, rel=1e-12)
    # m = 1: PK = squared length of a random unit vector's projection ~ Beta(n/2, (d-n)/2).
    for d, n in ((30, 4), (100, 17)):
        beta = scipy.stats.beta(n / 2, (d - n) / 2)
        mom = haar_moments(d, 1, n)
        assert mom.mean == pytest.approx(beta.mean(), rel=1e-12)
        assert mom.variance == pytest.approx(beta.var(), rel=1e-12)
    with pytest.raises(InvalidInput):
        haar_moments(10, 11)


@pytest.mark.parametrize("method,count", [("qr", 4000), ("wishart", 20000)])
@pytest.mark.parametrize("d,m,n", [(64, 8, 8), (40, 3, 9)])
def test_monte_carlo_matches_analytic_moments(method, count, d, m, n):
    samples = haar_pk_samples(d, m, n, count, seed=123, method=method)
    assert samples.shape == (count,) and samples.dtype == torch.float64
    mom = haar_moments(d, m, n)
    stderr = math.sqrt(mom.variance / count)
    assert abs(float(samples.mean()) - mom.mean) < 4 * stderr
    # sample variance has relative standard error ~ sqrt(2 / count) (a bit more for skewed laws)
    assert float(samples.var()) == pytest.approx(mom.variance, rel=6 * math.sqrt(2 / count))
    assert torch.all(samples >= 0) and torch.all(samples <= min(m, n))


def test_samplers_agree_and_are_seeded():
    a = haar_pk_samples(48, 6, 6, 3000, seed=1, method="qr").numpy()
    b = haar_pk_samples(48, 6, 6, 3000, seed=2, method="wishart").numpy()
    assert scipy.stats.ks_2samp(a, b).pvalue > 1e-3
    assert torch.equal(haar_pk_samples(48, 6, 6, 50, seed=5), haar_pk_samples(48, 6, 6, 50, seed=5))
    assert not torch.equal(haar_pk_samples(48, 6, 6, 50, seed=5), haar_pk_samples(48, 6, 6, 50, seed=6))


def test_zscores(make_heads):
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    W_K = r(3, 2, 24, 4)
    W_K[2, 1, :, 3] = W_K[2, 1, :, 0]  # rank 3
    heads = make_heads(r(3, 2, 24, 4), W_K, r(3, 2, 24, 4), r(3, 2, 4, 24))
    pk = projection_kernel(heads, "OK")
    z = zscores(pk, 24)
    for sl, sh, tl, th, rank_t in [(0, 0, 1, 1, 4), (1, 1, 2, 1, 3), (0, 1, 2, 0, 4)]:
        mom = haar_moments(24, 4, rank_t)
        expected = (float(pk.scores[sl, sh, tl, th]) - mom.mean) / mom.std
        assert float(z[sl, sh, tl, th]) == pytest.approx(expected, rel=1e-10)
        detail = pair_detail(heads, "OK", sl, sh, tl, th)  # one pair alone, no grid
        assert detail.ranks == (4, rank_t)
        assert pair_zscore(detail.pk, *detail.ranks, 24) == pytest.approx(expected, rel=1e-9)
    assert torch.all(z[~pk.valid] == 0)
    # Against the layer order (no forward grid holds it): the all-pairs grid's cell.
    z_all = zscores(projection_kernel(heads, "OK", order="all"), 24)
    back = pair_detail(heads, "OK", 2, 1, 0, 1)
    assert pair_zscore(back.pk, *back.ranks, 24) == pytest.approx(float(z_all[2, 1, 0, 1]), rel=1e-9)
    assert pair_zscore(0.5, 0, 4, 24) == 0.0 and pair_zscore(4.0, 24, 4, 24) == 0.0  # no variance


def test_kl_divergence_matches_gaussian_closed_form():
    rng = np.random.default_rng(0)
    p = rng.normal(0.0, 1.0, 20000)
    q = rng.normal(0.5, 1.5, 20000)
    closed = math.log(1.5 / 1.0) + (1.0 + 0.5**2) / (2 * 1.5**2) - 0.5
    assert kl_divergence(p, q) == pytest.approx(closed, abs=0.02)
    assert abs(kl_divergence(p, rng.normal(0.0, 1.0, 20000))) < 0.01


def test_kl_grid_on_random_and_structured_models(make_heads):
    g = torch.Generator().manual_seed(3)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    heads = make_heads(r(4, 4, 48, 6), r(4, 4, 48, 6), r(4, 4, 48, 6), r(4, 4, 6, 48))
    grid = kl_grid(heads, samples=4000, seed=0)
    assert grid.roles == ("Q", "K", "V", "O") and len(grid.kl) == 4 and all(len(row) == 4 for row in grid.kl)
    # isotropic random weights: model PKs follow the Haar law, so KLs are small
    assert max(v for row in grid.kl for v in row) < 0.1
    assert set(grid.histograms) == {a + b for a in "QKVO" for b in "QKVO"}
    hist = grid.histograms["OK"]
    assert len(hist.bin_edges) == len(hist.model_density) + 1 == len(hist.random_density) + 1
    widths = np.diff(hist.bin_edges)
    assert np.sum(np.array(hist.model_density) * widths) == pytest.approx(1.0)
    assert hist.random_mean == pytest.approx(6 * 6 / 48, rel=0.02)
    assert hist.n_pairs == 6 * 16
    json.dumps(grid.to_dict())
    # all heads in a shared 12-dim subspace: PKs far above random, large KL
    basis = torch.linalg.qr(r(48, 12)).Q
    shared = make_heads(*(basis @ r(4, 4, 12, 6) for _ in range(3)), (basis @ r(4, 4, 12, 6)).transpose(-2, -1))
    skewed = kl_grid(shared, samples=4000, seed=0)
    assert min(v for row in skewed.kl for v in row) > 1.0
    assert skewed.histograms["OK"].model_mean > 2.0 * skewed.histograms["OK"].random_mean


def test_binned_kde_matches_scipy_gaussian_kde():
    from headgraph.core.stats.reference import _kde

    rng = np.random.default_rng(4)
    values = np.concatenate([rng.gamma(3.0, 1.0, 3000), rng.normal(9.0, 0.5, 1000)])
    grid = np.linspace(values.min() - 2, values.max() + 2, 2048)
    ours = _kde(values, grid)
    ref = scipy.stats.gaussian_kde(values)(grid)
    assert np.max(np.abs(ours - ref)) < 0.01 * ref.max()
