"""Projection Kernel: scipy principal angles, TransformerLens, invariances, orders, ranks."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.linalg
import torch

from model_support import boot_bridge
from headgraph.core.errors import InvalidInput
from headgraph.core.models.bridge_weights import heads_from_bridge
from headgraph.core.scores.layer_order import group_cover, group_rects, layer_blocks
from headgraph.core.scores.overlaps import pairwise_sq_overlap, piece_plan, sq_overlaps
from headgraph.core.scores.pk import all_pairings, pair_detail, projection_kernel
from headgraph.core.scores.subspaces import rank_report, role_bases, singular_values


def _random_weights(L, H, Hkv, d, dh, *, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).to(dtype)  # noqa: E731
    return r(L, H, d, dh), r(L, Hkv, d, dh), r(L, Hkv, d, dh), r(L, H, dh, d)


def _role_np(heads, role, layer, head):
    return heads.role(role)[layer, head].to(torch.float64).numpy()


def _scipy_pk(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sum(np.cos(scipy.linalg.subspace_angles(a, b)) ** 2))


def _check_against_scipy(heads, pairing, order="all", tol=1e-6):
    res = projection_kernel(heads, pairing, order=order)
    L, Hs, _, Ht = res.scores.shape
    for sl in range(L):
        for sh in range(Hs):
            for tl in range(L):
                for th in range(Ht):
                    if not res.valid[sl, sh, tl, th]:
                        assert res.scores[sl, sh, tl, th] == 0
                        continue
                    ref = _scipy_pk(_role_np(heads, pairing[0], sl, sh), _role_np(heads, pairing[1], tl, th))
                    assert abs(float(res.scores[sl, sh, tl, th]) - ref) < tol, (pairing, sl, sh, tl, th)
    return res


@pytest.mark.parametrize("pairing", ["OK", "QV", "KK", "VO"])
def test_pk_equals_scipy_principal_angles_random(make_heads, pairing):
    heads = make_heads(*_random_weights(3, 3, 3, 40, 6, seed=0))
    _check_against_scipy(heads, pairing)


def test_pk_equals_scipy_structured_shared_and_rank_deficient(make_heads):
    W_Q, W_K, W_V, W_O = _random_weights(3, 2, 2, 24, 5, seed=1)
    # Shared directions: K of (1, 0) contains 3 of O(0, 1)'s columns; K of (2, 1) equals O(0, 0)'s span.
    W_K[1, 0, :, :3] = W_O[0, 1, :3, :].T
    W_K[2, 1] = W_O[0, 0].T @ torch.randn(5, 5, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    # Rank-deficient heads: a repeated column (rank 4) and a rank-2 head.
    W_K[2, 0, :, 4] = W_K[2, 0, :, 1]
    W_O[1, 1, 2:, :] = torch.tensor([[1.0, 2.0], [3.0, -1.0], [0.5, 0.5]], dtype=torch.float64) @ W_O[1, 1, :2, :]
    heads = make_heads(W_Q, W_K, W_V, W_O)
    res = _check_against_scipy(heads, "OK")
    assert res.scores[0, 0, 2, 1] == pytest.approx(5.0, abs=1e-9)
    assert res.scores[0, 1, 1, 0] >= 3.0 - 1e-9
    assert role_bases(heads, "K").ranks[2, 0] == 4
    assert role_bases(heads, "O").ranks[1, 1] == 2
    report = rank_report(heads)
    assert report["K"] == [(2, 0, 4)] and report["O"] == [(1, 1, 2)] and report["Q"] == []
    # normalized uses the measured ranks of the pair
    assert res.normalized[1, 1, 2, 0] == pytest.approx(float(res.scores[1, 1, 2, 0]) / math.sqrt(2 * 4), abs=1e-12)
    # extra columns of a rank-deficient head are zero (they must not count)
    assert torch.all(role_bases(heads, "K").U[2, 0, :, 4] == 0)


def test_both_formulas_and_streaming_agree_with_float64(make_heads):
    W = _random_weights(4, 3, 3, 150, 12, seed=2, dtype=torch.float32)
    heads = make_heads(*W)
    u_s = role_bases(heads, "O").U
    u_t = role_bases(heads, "V").U
    s64 = u_s.double().reshape(-1, 150, 12)
    t64 = u_t.double().reshape(-1, 150, 12)
    ref = torch.einsum("adr,bds->abrs", s64, t64).square().sum((-1, -2)).reshape(4, 3, 4, 3)
    for order in ("forward", "all", "same-layer"):
        mask = projection_kernel(heads, "OV", order=order).valid
        for method in ("gram", "overlap"):
            got = pairwise_sq_overlap(u_s, u_t, order=order, method=method)
            assert (got - ref)[mask].abs().max() < 2e-6, (order, method)
        streamed = pairwise_sq_overlap(u_s, u_t, order=order, method="gram", work_bytes=1)
        assert (streamed - ref)[mask].abs().max() < 2e-6

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_factored_bases_give_the_dense_pk_and_form_no_bases(make_heads, dtype):
    """PK from factors U = W M of the stored weights (how a 7B-class model is scored) equals PK
    from dense bases and the float64 definition, on grouped-query weights kept in ``dtype``;
    no [L, H, d, r] bases are cached. A rank-deficient head makes the factored form fall back
    to dense bases (exact under the rank rule)."""
    W = _random_weights(4, 6, 2, 96, 8, seed=3, dtype=dtype)
    pairings = ["OQ", "OK", "OV", "QK"]
    fact_heads = make_heads(*W)
    factored = all_pairings(fact_heads, pairings=pairings, order="all", bases="factored")
    assert not [k for k in fact_heads._cache if k[0] == "bases"]
    dense = all_pairings(make_heads(*W), pairings=pairings, order="all", bases="dense")
    for p in pairings:
        s_w = fact_heads.role(p[0]).double().flatten(0, 1)
        t_w = fact_heads.role(p[1]).double().flatten(0, 1)
        q_s, q_t = torch.linalg.qr(s_w).Q, torch.linalg.qr(t_w).Q
        ref = torch.einsum("adr,bds->abrs", q_s, q_t).square().sum((-1, -2)).view(factored[p].scores.shape)
        assert (factored[p].scores.double() - ref).abs().max() < 2e-5, p
        assert (factored[p].scores - dense[p].scores).abs().max() < 2e-5, p
        assert torch.equal(factored[p].valid, dense[p].valid)
        assert torch.equal(factored[p].source_ranks, dense[p].source_ranks)
    W_K = W[1].clone()
    W_K[1, 0, :, 3] = W_K[1, 0, :, 0]  # rank 7: not certified, dense bases instead
    deficient = make_heads(W[0], W_K, W[2], W[3])
    res = all_pairings(deficient, pairings=["OK"], order="all", bases="factored")["OK"]
    assert int(res.target_ranks[1, 0]) == 7
    assert ("bases", "K", None, None) in deficient._cache
    with pytest.raises(InvalidInput, match="bases must be one of"):
        all_pairings(make_heads(*W), pairings=["OK"], bases="sparse")


@pytest.fixture(scope="module")
def gpt2_small_bridge(gpt2_small_random_dir):
    return boot_bridge(gpt2_small_random_dir)


@pytest.mark.parametrize("target", ["Q", "K", "V"])
@pytest.mark.slow  # a GPT-2-small-shaped model booted in TransformerLens: ~20 s
def test_matches_transformerlens_gpt2_small_shape(gpt2_small_bridge, target):
    from transformer_lens.tools.analysis.projection_kernel import attention_head_subspace_affinity

    heads = heads_from_bridge(gpt2_small_bridge, name="gpt2-random", source="local")
    assert (heads.info.n_layers, heads.info.n_heads, heads.info.d_model) == (12, 12, 768)
    ref = attention_head_subspace_affinity(gpt2_small_bridge, target_role=target)
    ours = projection_kernel(heads, "O" + target)
    assert ours.scores.shape == ref.scores.shape == (12, 12, 12, 12)
    assert torch.equal(ours.valid, ref.valid_mask)
    assert (ours.scores - ref.scores).abs().max() < 1e-5
    assert (ours.normalized - ref.normalized).abs().max() < 1e-5
    assert torch.equal(ours.source_ranks, ref.source_ranks) and torch.equal(ours.target_ranks, ref.target_ranks)
    assert ours.layer_indices == ref.source_layer_indices


@pytest.mark.parametrize("target", ["Q", "K", "V"])
def test_gqa_matches_transformerlens(qwen2_gqa_dir, target):
    from transformer_lens.tools.analysis.projection_kernel import attention_head_subspace_affinity

    bridge = boot_bridge(qwen2_gqa_dir)
    heads = heads_from_bridge(bridge, name="qwen2-random", source="local")
    ours = projection_kernel(heads, "O" + target)
    ref = attention_head_subspace_affinity(bridge, target_role=target)
    expected_heads = 4 if target == "Q" else 2
    assert ours.scores.shape == (3, 4, 3, expected_heads) == ref.scores.shape
    assert torch.equal(ours.valid, ref.valid_mask)
    assert (ours.scores - ref.scores).abs().max() < 1e-5
    assert (ours.normalized - ref.normalized).abs().max() < 1e-5


def test_invariant_to_basis_change(make_heads):
    W_Q, W_K, W_V, W_O = _random_weights(3, 2, 2, 32, 6, seed=4)
    g = torch.Generator().manual_seed(9)
    a = torch.randn(3, 2, 6, 6, generator=g, dtype=torch.float64) + 3 * torch.eye(6, dtype=torch.float64)
    heads = make_heads(W_Q, W_K, W_V, W_O)
    moved = make_heads(W_Q @ a, W_K @ a, W_V @ a, (W_O.transpose(-2, -1) @ a).transpose(-2, -1))
    for pairing in ("OQ", "OK", "OV", "QK", "VO"):
        x = projection_kernel(heads, pairing, order="all").scores
        y = projection_kernel(moved, pairing, order="all").scores
        assert (x - y).abs().max() < 1e-9, pairing


def test_self_pk_is_rank_and_bounds_hold(make_heads):
    W_Q, W_K, W_V, W_O = _random_weights(3, 3, 3, 20, 7, seed=6)
    W_Q[0, 2, :, 6] = W_Q[0, 2, :, 0] + W_Q[0, 2, :, 1]  # rank 6
    heads = make_heads(W_Q, W_K, W_V, W_O)
    qq = projection_kernel(heads, "QQ", order="all")
    diag = torch.einsum("abab->ab", qq.scores)
    expected = torch.full((3, 3), 7.0, dtype=torch.float64)
    expected[0, 2] = 6.0
    assert torch.allclose(diag, expected, atol=1e-10)
    assert torch.allclose(torch.einsum("abab->ab", qq.normalized), torch.ones(3, 3, dtype=torch.float64))
    for res in all_pairings(heads, order="all").values():
        rs = res.source_ranks.clamp(max=res.source_rank).double()[:, :, None, None]
        rt = res.target_ranks.clamp(max=res.target_rank).double()[None, None]
        assert torch.all(res.scores >= 0) and torch.all(res.scores <= torch.minimum(rs, rt) + 1e-12)
        assert torch.all(res.normalized <= 1 + 1e-12)


def test_orders_and_validation(make_heads):
    heads = make_heads(*_random_weights(3, 2, 2, 16, 4, seed=7), layer_indices=(1, 4, 9))
    fwd = projection_kernel(heads, "OK")
    same = projection_kernel(heads, "OK", order="same-layer")
    full = projection_kernel(heads, "OK", order="all")
    layers = torch.tensor([1, 4, 9])
    assert torch.equal(fwd.valid, (layers[:, None] < layers[None, :])[:, None, :, None].expand(3, 2, 3, 2))
    assert torch.equal(same.valid, torch.eye(3, dtype=torch.bool)[:, None, :, None].expand(3, 2, 3, 2))
    assert bool(full.valid.all())
    assert torch.all(fwd.scores[~fwd.valid] == 0) and torch.all(same.scores[~same.valid] == 0)
    assert torch.allclose(fwd.scores[fwd.valid], full.scores[fwd.valid])
    assert fwd.layer_indices == (1, 4, 9)
    with pytest.raises(InvalidInput, match="QK"):
        projection_kernel(heads, "OX")
    with pytest.raises(InvalidInput, match="same-layer"):
        projection_kernel(heads, "OK", order="backward")
    assert set(all_pairings(heads)) == {a + b for a in "QKVO" for b in "QKVO"}


def test_rank_truncation_and_errors(make_heads):
    W_Q, W_K, W_V, W_O = _random_weights(2, 2, 2, 30, 6, seed=8)
    heads = make_heads(W_Q, W_K, W_V, W_O)
    res = projection_kernel(heads, "OK", order="all", rank=3)
    assert res.source_rank == res.target_rank == 3
    for sl, sh, tl, th in [(0, 0, 1, 1), (1, 1, 0, 0), (0, 1, 0, 1)]:
        a = np.linalg.svd(_role_np(heads, "O", sl, sh), full_matrices=False)[0][:, :3]
        b = np.linalg.svd(_role_np(heads, "K", tl, th), full_matrices=False)[0][:, :3]
        assert float(res.scores[sl, sh, tl, th]) == pytest.approx(_scipy_pk(a, b), abs=1e-9)
    W_K[1, 1, :, 5] = W_K[1, 1, :, 0]
    deficient = make_heads(W_Q, W_K, W_V, W_O, layer_indices=(3, 7))
    with pytest.raises(InvalidInput, match="layer 7, head 1"):
        projection_kernel(deficient, "OK", rank=6)


def test_pair_detail_principal_angles(make_heads):
    heads = make_heads(*_random_weights(3, 2, 1, 25, 5, seed=10))
    det = pair_detail(heads, "OV", 0, 1, 2, 0)
    ref_angles = np.sort(scipy.linalg.subspace_angles(_role_np(heads, "O", 0, 1), _role_np(heads, "V", 2, 0)))
    assert np.allclose(det.angles.numpy(), ref_angles, atol=1e-7)
    assert torch.all(det.cosines[:-1] >= det.cosines[1:])
    grid = projection_kernel(heads, "OV")
    assert det.pk == pytest.approx(float(grid.scores[0, 1, 2, 0]), abs=1e-9)
    assert det.normalized == pytest.approx(det.pk / 5.0)
    assert det.to_dict()["source"] == "L0H1" and det.ranks == (5, 5)
    with pytest.raises(InvalidInput, match="target_head"):
        pair_detail(heads, "OV", 0, 1, 2, 1)  # only one KV head


def test_low_precision_weights_computed_in_float32(make_heads):
    W = _random_weights(2, 2, 2, 48, 8, seed=11, dtype=torch.float32)
    heads16 = make_heads(*(w.to(torch.bfloat16) for w in W))
    res = projection_kernel(heads16, "OK")
    assert res.scores.dtype == torch.float32
    ref = make_heads(*(w.to(torch.bfloat16).to(torch.float64) for w in W))
    assert (res.scores - projection_kernel(ref, "OK").scores).abs().max() < 1e-5


# ----------------------------------------------------------------------------- engine details


@pytest.mark.parametrize("d,block,height",
                         [(64, 64, 64), (150, 16, 40), (97, 8, 8), (30, 64, 128), (200, 64, 128)])
def test_piece_plan_weighted_blocks_give_the_frobenius_product(d, block, height):
    g = torch.Generator().manual_seed(d)
    a = torch.randn(d, d, generator=g, dtype=torch.float64)
    b = torch.randn(d, d, generator=g, dtype=torch.float64)
    a, b = a + a.T, b + b.T
    plan = piece_plan(d, block, height)
    covered = torch.zeros(d, d, dtype=torch.float64)
    total = 0.0
    for p in plan:
        assert p.c0 >= p.r0  # on or below the diagonal
        assert p.r1 - p.r0 <= block and p.c1 - p.c0 <= max(height, block) + block
        pa, pb = a[p.c0:p.c1, p.r0:p.r1].reshape(-1), b[p.c0:p.c1, p.r0:p.r1].reshape(-1)
        weight = torch.zeros(p.features, dtype=torch.float64)
        for f0, f1, w in p.spans:  # feature ranges of the piece (its rows, flattened), weighted
            total += w * float((pa[f0:f1] * pb[f0:f1]).sum())
            weight[f0:f1] += w
        covered[p.c0:p.c1, p.r0:p.r1] += weight.view(p.c1 - p.c0, p.r1 - p.r0)
    # every entry (a, b) of the symmetric product is counted exactly once: covered + covered^T == 2
    assert torch.all(covered + covered.T == 2)
    assert abs(total - float((a * b).sum())) < 1e-9 * float((a * b).abs().sum())


def test_layer_blocks_cover_each_forward_pair_exactly_once():
    for n in (1, 2, 3, 7, 12, 32):
        count = torch.zeros(n, n, dtype=torch.long)
        for sa, sb, ta, tb in layer_blocks(n, "forward"):
            count[sa:sb, ta:tb] += 1
        assert torch.equal(count, torch.ones(n, n, dtype=torch.long).triu(1)), n
        same = torch.zeros(n, n, dtype=torch.long)
        for sa, sb, ta, tb in layer_blocks(n, "same-layer"):
            same[sa:sb, ta:tb] += 1
        assert torch.equal(same, torch.eye(n, dtype=torch.long))


def test_group_cover_holds_every_kept_pair_of_the_group():
    for order in ("forward", "all", "same-layer"):
        for g0, g1, s_lo, s_hi in [(1, 4, 0, 11), (0, 3, 0, 12), (10, 12, 0, 11), (5, 6, 6, 12)]:
            kept = torch.zeros(12, 12, dtype=torch.long)
            for sa, sb, ta, tb in group_rects(order, g0, g1, s_lo, s_hi):
                kept[sa:sb, ta:tb] += 1
            cover = group_cover(order, g0, g1, s_lo, s_hi)
            if cover is None:
                assert int(kept.sum()) == 0
                continue
            inside = torch.zeros(12, 12, dtype=torch.long)
            inside[cover[0]:cover[1], cover[2]:cover[3]] = 1
            assert bool((kept <= inside).all())  # nothing kept is left out
            assert s_lo <= cover[0] and cover[1] <= s_hi and g0 <= cover[2] and cover[3] <= g1


def test_fused_products_match_separate_calls_and_float64():
    # GQA-like widths, a role that is both source and target, and unequal ranks.
    g = torch.Generator().manual_seed(12)
    L, d = 4, 90
    bases = {
        "O": torch.linalg.qr(torch.randn(L, 3, d, 7, generator=g))[0].float(),
        "K": torch.linalg.qr(torch.randn(L, 2, d, 5, generator=g))[0].float(),
        "Q": torch.linalg.qr(torch.randn(L, 3, d, 7, generator=g))[0].float(),
    }
    products = [("O", "K"), ("O", "Q"), ("K", "K"), ("K", "O")]
    for order in ("forward", "all", "same-layer"):
        fused = sq_overlaps(bases, products, order=order, method="gram", work_bytes=4096)
        for s, t in products:
            ref = torch.einsum("ahdr,bkds->ahbkrs", bases[s].double(), bases[t].double())
            ref = ref.square().sum((-1, -2))
            mask = torch.zeros(L, L, dtype=torch.bool)
            for sa, sb, ta, tb in layer_blocks(L, order):
                mask[sa:sb, ta:tb] = True
            mask = mask[:, None, :, None].expand_as(ref)
            assert (fused[(s, t)] - ref)[mask].abs().max() < 2e-6, (order, s, t)
            assert torch.all(fused[(s, t)][~mask] == 0)
            alone = sq_overlaps({s: bases[s], t: bases[t]}, [(s, t)], order=order, method="overlap")[(s, t)]
            assert (alone - ref)[mask].abs().max() < 2e-6  # the other formula, same float64 check


@pytest.mark.parametrize("d,work_bytes", [(70, 2048), (300, None)])  # tiny pieces; bands of chunks
def test_sources_reading_some_target_only_roles_match_float64(d, work_bytes):
    # O reads both target-only roles (one wide product), Q only V (per-role products).
    g = torch.Generator().manual_seed(21)
    L = 5
    bases = {r: torch.linalg.qr(torch.randn(L, 2, d, 6, generator=g))[0].float() for r in "OQKV"}
    products = [("O", "K"), ("Q", "V"), ("O", "V")]
    for order in ("forward", "all", "same-layer"):
        got = sq_overlaps(bases, products, order=order, method="gram", work_bytes=work_bytes)
        mask = torch.zeros(L, L, dtype=torch.bool)
        for sa, sb, ta, tb in layer_blocks(L, order):
            mask[sa:sb, ta:tb] = True
        mask = mask[:, None, :, None].expand(L, 2, L, 2)
        for s, t in products:
            ref = torch.einsum("ahdr,bkds->ahbkrs", bases[s].double(), bases[t].double())
            ref = ref.square().sum((-1, -2))
            assert (got[(s, t)] - ref)[mask].abs().max() < 2e-6, (order, s, t)
            assert torch.all(got[(s, t)][~mask] == 0)


def test_all_pairings_in_one_pass_equals_one_pairing_at_a_time(make_heads):
    W = _random_weights(5, 3, 3, 64, 8, seed=13)
    together = all_pairings(make_heads(*W), pairings=["OQ", "OK", "OV", "KQ"])
    for p, res in together.items():
        alone = projection_kernel(make_heads(*W), p)
        assert torch.equal(alone.valid, res.valid)
        assert (alone.scores - res.scores).abs().max() < 1e-12, p


def test_unordered_layer_positions_still_give_forward_pairs(make_heads):
    W = _random_weights(3, 2, 2, 24, 4, seed=14)
    heads = make_heads(*W, layer_indices=(5, 2, 9))
    fwd = projection_kernel(heads, "OK")
    full = projection_kernel(make_heads(*W), "OK", order="all")
    layers = torch.tensor([5, 2, 9])
    assert torch.equal(fwd.valid, (layers[:, None] < layers[None, :])[:, None, :, None].expand(3, 2, 3, 2))
    assert (fwd.scores[fwd.valid] - full.scores[fwd.valid]).abs().max() < 1e-12
    assert fwd.scores[1, 0, 0, 0] > 0  # position 1 (block 2) -> position 0 (block 5) is forward


def test_cholesky_and_householder_bases_agree_with_numpy_svd(make_heads):
    """Well-conditioned heads take the Cholesky QR path, ill-conditioned ones the exact path;
    both give the SVD's subspace (projector), singular values and TransformerLens ranks."""
    W_Q, W_K, W_V, W_O = _random_weights(2, 3, 3, 40, 6, seed=15, dtype=torch.float32)
    W_K[0, 1] = W_K[0, 1] @ torch.diag(torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 1e-3]))  # cond 1e3: exact path
    W_K[1, 2, :, 5] = W_K[1, 2, :, 0] * 2.0  # rank 5: exact path
    W_K[1, 0] = W_K[1, 0] @ torch.diag(torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 0.2]))  # cond^2 > 8: two passes
    heads = make_heads(W_Q, W_K, W_V, W_O)
    # The three paths are all exercised (rule from core.subspaces): certified single pass,
    # certified with a second pass (cond^2 > 8), not certified (exact Householder + SVD).
    eps = torch.finfo(torch.float32).eps
    lam = torch.linalg.eigvalsh(W_K.transpose(-2, -1) @ W_K)
    certified = lam[..., 0] > ((40 * eps) ** 2 + 2 * 40 * 6 * eps) * lam[..., -1]
    ratio = lam[..., -1] / lam[..., 0].clamp(min=1e-30)
    assert bool((certified & (ratio <= 8)).any()) and bool((certified & (ratio > 8)).any())
    assert not bool(certified[0, 1]) and not bool(certified[1, 2])
    bases = role_bases(heads, "K")
    for layer in range(2):
        for head in range(3):
            w = W_K[layer, head].double().numpy()
            u, s, _ = np.linalg.svd(w, full_matrices=False)
            sv32 = torch.linalg.svdvals(W_K[layer, head])
            tl_rank = int((sv32 > 40 * eps * sv32[0]).sum())
            rank = int(bases.ranks[layer, head])
            assert rank == tl_rank
            ours = bases.U[layer, head].double()
            assert torch.allclose(ours.T @ ours, torch.diag((torch.arange(6) < rank).double()), atol=2e-6)
            ref_p = torch.from_numpy(u[:, :rank] @ u[:, :rank].T)
            tol = 5e-5 if s[0] / s[rank - 1] > 100 else 2e-6  # span of an ill-conditioned fp32 head
            assert (ours @ ours.T - ref_p).abs().max() < tol
            ours_s = singular_values(heads, "K")[layer, head].double().numpy()
            assert np.allclose(ours_s, s, rtol=1e-4, atol=1e-6 * s[0])
    assert bases.ranks.tolist() == [[6, 6, 6], [6, 6, 5]]
