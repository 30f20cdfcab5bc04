"""Random-subspace baselines of token lists (core.tokens.token_baseline and the flags of
top_tokens) against an independent float64 numpy computation of the same random draw, and
the trained demo model's lists against those of the same architecture at random init."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headgraph.core.models.demo import DemoModel, load_demo_model
from headgraph.core.errors import InvalidInput
from headgraph.core.readout.tokens import (BASELINE_QUANTILE, haar_gaussians, slice_token_payload,
                                   token_baseline, top_tokens)

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def demo():
    return load_demo_model()


@pytest.fixture(scope="module")
def demo_heads(demo):
    return demo.head_weights()


def numpy_baseline(W_U: np.ndarray, rank: int, k: int, samples: int, seed: int, shaped: bool = False):
    """Float64 numpy: the same Gaussian draws, numpy QR bases, centred W_U, ||Q^T u|| / ||u||,
    top-k per subspace, then per-depth and mean-top-k 0.95 quantiles (numpy's linear rule);
    ``shaped``: the draws multiplied by a square root of the centred unembedding's covariance
    (scipy's sqrtm: another factor of the same covariance spans the same planes' law, so only
    the law is compared then)."""
    g = haar_gaussians(W_U.shape[0], rank, samples, seed).numpy()
    Wc = W_U - W_U.mean(axis=1, keepdims=True)
    if shaped:
        from scipy.linalg import sqrtm

        g = np.real(sqrtm(Wc @ Wc.T / Wc.shape[1])) @ g
    norms = np.linalg.norm(Wc, axis=0)
    top = np.zeros((samples, k))
    for i in range(samples):
        q, _ = np.linalg.qr(g[i])
        s = np.linalg.norm(q.T @ Wc, axis=0) / norms
        top[i] = -np.sort(-s)[:k]
    mean_topk = np.cumsum(top, axis=1) / np.arange(1, k + 1)
    return (top, np.quantile(top, BASELINE_QUANTILE, axis=0),
            np.quantile(mean_topk, BASELINE_QUANTILE, axis=0))


def test_baseline_matches_float64_numpy_of_the_same_draw():
    g = torch.Generator().manual_seed(5)
    W_U = torch.randn(48, 700, generator=g) + 0.3 * torch.randn(48, 1, generator=g)
    b = token_baseline(W_U, 6, 12, samples=24, seed=3, tile_elements=6 * 24 * 50)  # tiled
    top, rank_thr, mean_thr = numpy_baseline(W_U.double().numpy(), 6, 12, 24, 3)
    assert b.scores.shape == (24, 12) and b.samples == 24 and b.rank == 6
    np.testing.assert_allclose(b.scores.numpy(), top, atol=2e-6)
    np.testing.assert_allclose(b.rank_threshold.numpy(), rank_thr, atol=2e-6)
    np.testing.assert_allclose(b.mean_topk_threshold.numpy(), mean_thr, atol=2e-6)
    np.testing.assert_allclose(b.rank_mean.numpy(), top.mean(axis=0), atol=2e-6)
    # random planes sit near sqrt(r/d) on average and their best tokens well above it
    assert float(b.rank_mean[-1]) > np.sqrt(6 / 48)
    # seeded: the same draw again; another seed differs
    assert torch.allclose(token_baseline(W_U, 6, 12, samples=24, seed=3).scores, b.scores,
                          atol=1e-6)
    assert not torch.allclose(token_baseline(W_U, 6, 12, samples=24, seed=4).scores, b.scores)


def test_unembedding_shaped_baseline_draws_planes_with_the_unembeddings_covariance():
    from headgraph.core.readout.tokens import unembedding_factor

    g = torch.Generator().manual_seed(7)
    scales = torch.logspace(0, -2, 48, dtype=torch.float64)  # a strongly anisotropic unembedding
    W_U = (scales[:, None] * torch.randn(48, 700, generator=g, dtype=torch.float64))
    F = unembedding_factor(W_U)
    Wc = (W_U - W_U.mean(1, keepdim=True)).numpy()
    sigma = Wc @ Wc.T / 700
    np.testing.assert_allclose((F @ F.T).numpy(), sigma, rtol=1e-6, atol=2e-7 * np.diag(sigma).mean())  # + a tiny ridge
    b = token_baseline(W_U, 6, 12, samples=200, seed=3, method="unembedding")
    # The same planes by hand: the factor times the same draws, numpy QR (a plane is its span).
    gauss = (F @ haar_gaussians(48, 6, 200, 3)).numpy()
    norms = np.linalg.norm(Wc, axis=0)
    top = np.stack([-np.sort(-(np.linalg.norm(np.linalg.qr(gi)[0].T @ Wc, axis=0) / norms))[:12] for gi in gauss])
    np.testing.assert_allclose(b.scores.numpy(), top, atol=1e-9)
    mean_thr = np.quantile(np.cumsum(top, axis=1) / np.arange(1, 13), BASELINE_QUANTILE, axis=0)
    np.testing.assert_allclose(b.mean_topk_threshold.numpy(), mean_thr, atol=1e-9)
    # Another factor of the same covariance (scipy's symmetric square root) gives the same law.
    _, _, sym_thr = numpy_baseline(W_U.numpy(), 6, 12, 200, 3, shaped=True)
    assert abs(sym_thr[-1] - mean_thr[-1]) < 0.05
    # Planes along the crowded directions name tokens: a stricter bar than Haar planes.
    haar = token_baseline(W_U, 6, 12, samples=200, seed=3)
    assert float(b.mean_topk_threshold[-1]) > float(haar.mean_topk_threshold[-1]) + 0.1
    with pytest.raises(InvalidInput, match="unknown baseline method"):
        token_baseline(W_U, 6, 12, method="uniform")


def test_head_and_token_flags_follow_the_rule(demo_heads):
    table = top_tokens(demo_heads, "O", k=10)
    b = table.baseline_of(16)
    assert table.ranks.unique().tolist() == [16]
    _top, rank_thr, mean_thr = numpy_baseline(demo_heads.W_U.double().numpy(), 16, 10,
                                             b.samples, b.seed)
    np.testing.assert_allclose(b.mean_topk_threshold.numpy(), mean_thr, atol=2e-6)
    s = table.scores.double().numpy()
    mean = s.mean(axis=-1)
    np.testing.assert_allclose(table.mean_scores.numpy(), mean, atol=1e-9)
    clear = np.abs(mean - mean_thr[-1]) > 1e-5
    assert np.array_equal(table.above_baseline.numpy()[clear], (mean > mean_thr[-1])[clear])
    clear_t = np.abs(s - rank_thr[None, None, :]) > 1e-5
    assert np.array_equal(table.token_above.numpy()[clear_t], (s > rank_thr)[clear_t])
    d = table.to_dict()
    assert d["n_above_baseline"] == int(table.above_baseline.sum())
    assert d["baseline"]["samples"] == b.samples and d["baseline"]["quantile"] == 0.95
    h = d["heads"][8]  # L1H0
    assert h["name"] == "L1H0" and h["rank"] == 16
    assert h["baseline_threshold"] == pytest.approx(mean_thr[-1], abs=2e-6)
    assert [t["above_baseline"] for t in h["tokens"]] == table.token_above[1, 0].tolist()
    assert [t["baseline"] for t in h["tokens"]] == pytest.approx(rank_thr.tolist(), abs=2e-6)


def test_trained_lists_beat_the_baseline_random_init_lists_do_not(demo, demo_heads):
    trained = {r: top_tokens(demo_heads, r, k=10) for r in "QKVO"}
    # the demo's layer-1 heads write token directions: every layer-1 O list is above it
    assert bool(trained["O"].above_baseline[1].all())
    n_trained = sum(int(t.above_baseline.sum()) for t in trained.values())
    fresh = DemoModel(demo.cfg, seed=11).head_weights(name="demo-init")
    init = {r: top_tokens(fresh, r, k=10) for r in "QKVO"}
    n_init = sum(int(t.above_baseline.sum()) for t in init.values())
    # 64 lists; under the null ~5% (3.2) pass by construction
    assert n_init <= 8 < n_trained
    for t in init.values():  # random-init lists sit at the baseline's mean
        b = t.baselines[0]
        assert abs(float(t.mean_scores.mean()) - float(b.mean_topk_mean[-1])) < 0.03


def test_slicing_recomputes_the_head_flags_for_the_smaller_depth(demo_heads):
    deep = top_tokens(demo_heads, "Q", k=40).to_dict()
    shallow = top_tokens(demo_heads, "Q", k=5).to_dict()
    cut = slice_token_payload(deep, 5)
    assert cut["k"] == 5
    for a, b in zip(cut["heads"], shallow["heads"]):
        assert a["above_baseline"] == b["above_baseline"]
        assert a["mean_score"] == pytest.approx(b["mean_score"], abs=1e-9)
        assert a["baseline_threshold"] == pytest.approx(b["baseline_threshold"], abs=1e-9)
        assert [t["above_baseline"] for t in a["tokens"]] == \
            [t["above_baseline"] for t in b["tokens"]]
    assert cut["n_above_baseline"] == shallow["n_above_baseline"]
    assert len(cut["baseline"]["by_rank"]["16"]["rank_threshold"]) == 5
    with pytest.raises(InvalidInput):
        slice_token_payload(deep, 0)


def test_bad_baseline_inputs():
    W = torch.randn(8, 20)
    with pytest.raises(InvalidInput, match="samples"):
        token_baseline(W, 2, 3, samples=1)
    with pytest.raises(InvalidInput, match="exceeds"):
        token_baseline(W, 9, 3)
    with pytest.raises(InvalidInput, match="quantile"):
        token_baseline(W, 2, 3, quantile=1.0)
    with pytest.raises(InvalidInput, match="d_model, d_vocab"):
        token_baseline(W[0], 2, 3)
    zero = token_baseline(W, 0, 3, samples=4)
    assert float(zero.rank_threshold.max()) == 0.0
