"""The tiled top-k token scorer and the all-ranks baselines (core.readout.projection and
core.readout.baselines) against float64 numpy computed directly, and the sampled Haar planes
against the exact per-token law Beta(r/2, (d-r)/2)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from headgraph.core.readout.baselines import haar_gaussians, token_baseline, token_baselines
from headgraph.core.readout.projection import RunningTopK, nested_token_scores, subspace_token_scores
from headgraph.core.stats.reference import haar_basis
from headgraph.core.types import HeadWeights, ModelInfo

torch.set_num_threads(1)


def unembedding(d: int = 24, V: int = 500, seed: int = 0) -> torch.Tensor:
    """[d, V] float32 with repeated token vectors (exact ties) and a zero centred vector."""
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(d, V, generator=g) + 0.4 * torch.randn(d, 1, generator=g)
    W[:, 100:130] = W[:, 7:8]  # 31 tokens share one vector: ties across tiles
    W[:, V // 2] = W.mean(dim=1)  # (nearly) the mean: a centred vector near 0
    return W


def float64_scores(U: np.ndarray, W: np.ndarray) -> np.ndarray:
    """||U^T ũ_t|| / ||ũ_t|| [N, V] of orthonormal bases U [N, d, r], in float64."""
    Wc = W - W.mean(axis=1, keepdims=True)
    norms = np.linalg.norm(Wc, axis=0)
    return np.stack([np.linalg.norm(u.T @ Wc, axis=0) / norms for u in U])


def expected_top(s: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Best first, ties by lower id (numpy's stable argsort of -s)."""
    order = np.argsort(-s, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(s, order, axis=1), order


@pytest.mark.parametrize("tile_elements", [1 << 24, 6 * 4 * 9, 6 * 4 * 64])
def test_top_k_matches_a_float64_full_sort(tile_elements):
    U = haar_basis(torch.randn(6, 24, 4, generator=torch.Generator().manual_seed(1),
                               dtype=torch.float64))
    W = unembedding()
    W[:, 7] = W[:, 8] + 5 * U[0, :, 0].float()  # well inside basis 0: in its list ...
    W[:, 100:130] = W[:, 7:8]  # ... 31 times over, tied
    want_s, want_i = expected_top(float64_scores(U.numpy(), W.double().numpy()), 40)
    got_s, got_i = subspace_token_scores(U.float(), W, 40, tile_elements=tile_elements)
    np.testing.assert_allclose(got_s.double().numpy(), want_s, atol=2e-6)
    # the same ids wherever a score is not within float32 rounding of its neighbour
    gaps = np.diff(want_s, axis=1)
    clear = np.ones_like(want_s, dtype=bool)
    clear[:, 1:] &= np.abs(gaps) > 1e-5
    clear[:, :-1] &= np.abs(gaps) > 1e-5
    assert np.array_equal(got_i.numpy()[clear], want_i[clear])
    # float64 in, float64 out: every id equals but among identical token vectors, which sit
    # together (their scores equal to rounding)
    s64, i64 = subspace_token_scores(U, W.double(), 40, tile_elements=tile_elements)
    assert s64.dtype == torch.float64
    np.testing.assert_allclose(s64.numpy(), want_s, atol=1e-12)
    same = {7, *range(100, 130)}
    outside = ~np.isin(want_i, list(same))
    assert np.array_equal(i64.numpy()[outside], want_i[outside])
    row = i64[0].tolist()
    start = min(row.index(t) for t in same)
    assert set(row[start: start + 31]) == same


def test_running_top_k_keeps_every_tie_in_id_order():
    top = RunningTopK(2, 5, torch.float64, torch.device("cpu"))
    top.add(torch.tensor([[0.5, 0.9, 0.5], [0.1, 0.1, 0.1]], dtype=torch.float64), 0)
    top.add(torch.tensor([[0.5, 0.5, 0.2], [0.1, 0.3, 0.1]], dtype=torch.float64), 3)
    assert top.ids.tolist() == [[1, 0, 2, 3, 4], [4, 0, 1, 2, 3]]
    assert top.scores.tolist() == [[0.9, 0.5, 0.5, 0.5, 0.5], [0.3, 0.1, 0.1, 0.1, 0.1]]
    few = RunningTopK(1, 9, torch.float64, torch.device("cpu"))  # fewer tokens than k
    few.add(torch.tensor([[0.2, 0.4]], dtype=torch.float64), 0)
    assert few.ids.tolist() == [[1, 0]]


def test_nested_prefixes_score_every_rank_as_its_own_basis():
    W = unembedding(seed=2).double()
    Q = haar_basis(torch.randn(3, 24, 10, generator=torch.Generator().manual_seed(3),
                               dtype=torch.float64))
    ranks = [1, 4, 10]
    got = nested_token_scores(Q, W, 12, ranks, tile_elements=3 * 10 * 50)
    for i, r in enumerate(ranks):
        want, _ = expected_top(float64_scores(Q[:, :, :r].numpy(), W.numpy()), 12)
        np.testing.assert_allclose(got[:, i].numpy(), want, atol=1e-12)


def test_one_draw_serves_every_rank_as_the_rank_alone():
    W = unembedding(d=32, V=400, seed=4)
    g40 = haar_gaussians(32, 9, 6, 5)
    assert torch.equal(haar_gaussians(32, 4, 6, 5), g40[:, :, :4])  # prefix-consistent draws
    for method in ("haar", "unembedding"):
        together = token_baselines(W, [0, 3, 9, 5], 7, samples=6, seed=5, method=method)
        assert sorted(together) == [0, 3, 5, 9]
        for r in (3, 5, 9):
            alone = token_baseline(W, r, 7, samples=6, seed=5, method=method)
            assert torch.allclose(together[r].scores, alone.scores, atol=1e-6)
            assert torch.allclose(together[r].mean_topk_threshold, alone.mean_topk_threshold, atol=1e-6)
        assert float(together[0].scores.abs().max()) == 0.0


def test_sampled_haar_planes_follow_the_exact_beta_law():
    """For any token vector x and a Haar plane P of rank r in d dimensions, ||P x||^2 / ||x||^2
    ~ Beta(r/2, (d-r)/2): two tokens (centred: one direction) give one score per plane, whose
    squares a KS test compares with that law; and for a crowded unembedding the mean count of
    tokens above any point equals V times the Beta tail (linearity of expectation), whatever
    the tokens' dependence."""
    d, r, S = 12, 3, 1500
    W = torch.randn(d, 2, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    one = token_baseline(W, r, 1, samples=S, seed=7).scores[:, 0].numpy() ** 2
    law = stats.beta(r / 2, (d - r) / 2)
    assert stats.kstest(one, law.cdf).pvalue > 1e-3
    assert abs(one.mean() - r / d) < 4 * law.std() / np.sqrt(S)
    V = 60
    crowd = torch.randn(d, 4, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    W = crowd.repeat(1, V // 4) + 0.3 * torch.randn(d, V, generator=torch.Generator().manual_seed(9),
                                                    dtype=torch.float64)
    allv = token_baseline(W, r, V, samples=S, seed=10).scores.numpy() ** 2  # every token's score
    for x in (0.3, 0.5, 0.7):
        count = (allv > x).sum(axis=1)
        assert abs(count.mean() - V * law.sf(x)) < 5 * count.std() / np.sqrt(S) + 1e-9


def test_rank_deficient_heads_score_without_their_zero_columns():
    """Heads of rank below d_head (their bases' last columns zero) score as float64 QR of their
    weights, and every distinct rank's baseline comes from the one draw."""
    from headgraph.core.readout.tokens import top_tokens

    g = torch.Generator().manual_seed(11)
    L, H, d, dh, V = 2, 3, 20, 6, 300
    W_O = torch.randn(L, H, dh, d, generator=g)
    W_O[:, :, 4:] = W_O[:, :, :2]  # every head rank 4 ...
    W_O[1, 2, 3] = W_O[1, 2, 0]  # ... one rank 3
    info = ModelInfo(name="deficient", architecture="GPT2LMHeadModel", n_layers=L, n_heads=H,
                     n_kv_heads=H, d_model=d, d_head=dh, d_vocab=V, dtype="float32",
                     layer_indices=tuple(range(L)), processing="raw", source="local")
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    W_U = unembedding(d, V, seed=12)
    heads = HeadWeights(info=info, W_Q=r(L, H, d, dh), W_K=r(L, H, d, dh), W_V=r(L, H, d, dh),
                        W_O=W_O, W_U=W_U, fingerprint="deficient", tokenizer=None)
    table = top_tokens(heads, "O", k=10)
    assert sorted(set(table.ranks.flatten().tolist())) == [3, 4]
    Wc = W_U.double().numpy()
    for i in range(L):
        for j in range(H):
            u, _s, _ = np.linalg.svd(W_O[i, j].double().numpy().T, full_matrices=False)
            basis = u[:, : int(table.ranks[i, j])]
            want, _ = expected_top(float64_scores(basis[None], Wc), 10)
            np.testing.assert_allclose(table.scores[i, j].double().numpy(), want[0], atol=2e-6)
    for rank in (3, 4):
        alone = token_baseline(W_U, rank, 10)
        assert torch.allclose(table.baseline_of(rank).scores, alone.scores, atol=1e-6)
