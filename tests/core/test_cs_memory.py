"""Composition Scores of grouped-query models from KV-group factors, against the definition.

The reference is written here from Elhage et al. (2021): CS = ||W_A W_B||_F / (||W_A||_F
||W_B||_F) with W_A the earlier head's W_OV = W_V W_O and W_B the later head's W_QK^T =
W_K W_Q^T (Q-composition reads TransformerLens's left-multiplied form W_Q W_K^T), its
transpose (K-composition) or W_OV (V-composition); query head h reads KV head
h // (H / H_kv). Every product is formed in float64, pair by pair, without sharing any code
with core. The module checks the result on random GQA weights in bfloat16 (the stored
precision core keeps) and float32, and that no factor outlives the call.
"""

from __future__ import annotations

import pytest
import torch

from headgraph.core.scores.composition_score import composition_score

pytestmark = pytest.mark.usefixtures("one_thread")


def _reference(W_Q, W_K, W_V, W_O, mode: str) -> torch.Tensor:
    """CS [L, H, L, H] for every pair (all orders), float64, from dense d x d matrices."""
    L, H = W_Q.shape[:2]
    group = H // W_K.shape[1]
    q, k, v, o = (w.to(torch.float64) for w in (W_Q, W_K, W_V, W_O))
    ov = [[v[layer, h // group] @ o[layer, h] for h in range(H)] for layer in range(L)]
    qk = [[q[layer, h] @ k[layer, h // group].T for h in range(H)] for layer in range(L)]
    out = torch.zeros(L, H, L, H, dtype=torch.float64)
    for sl in range(L):
        for sh in range(H):
            left = ov[sl][sh]
            for tl in range(L):
                for th in range(H):
                    right = {"Q": qk[tl][th], "K": qk[tl][th].T, "V": ov[tl][th]}[mode]
                    num = torch.linalg.matrix_norm(left @ right)
                    out[sl, sh, tl, th] = num / (torch.linalg.matrix_norm(left)
                                                 * torch.linalg.matrix_norm(right))
    return out


def _gqa_weights(dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    L, H, Hkv, d, dh = 3, 6, 2, 24, 4
    scale = [1.0, 0.3, 2.5]  # layers of different norms: CS must not depend on them
    W_Q = torch.randn(L, H, d, dh, generator=g) * torch.tensor(scale)[:, None, None, None]
    W_K = torch.randn(L, Hkv, d, dh, generator=g)
    W_V = torch.randn(L, Hkv, d, dh, generator=g)
    W_V[1, 1, :, 3] = 0.0  # a rank-deficient KV group
    W_O = torch.randn(L, H, dh, d, generator=g)
    return tuple(w.to(dtype) for w in (W_Q, W_K, W_V, W_O))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("mode", ["Q", "K", "V"])
def test_gqa_matches_float64_definition(make_heads, mode, dtype):
    W = _gqa_weights(dtype, seed=5)
    heads = make_heads(*W)
    ref = _reference(*W, mode)
    full = composition_score(heads, mode, order="all")
    assert full.scores.shape == (3, 6, 3, 6) and full.scores.dtype == torch.float32
    assert bool(full.valid.all())
    assert (full.scores.double() - ref).abs().max() < 1e-5
    fwd = composition_score(heads, mode)
    keep = torch.tensor([[a < b for b in range(3)] for a in range(3)])[:, None, :, None]
    assert torch.equal(fwd.valid, keep.expand(3, 6, 3, 6))
    assert (fwd.scores.double() - ref)[fwd.valid].abs().max() < 1e-5
    assert torch.all(fwd.scores[~fwd.valid] == 0)


def test_zero_heads_are_invalid_and_no_factor_is_cached(make_heads):
    W_Q, W_K, W_V, W_O = _gqa_weights(torch.float32, seed=6)
    W_O[0, 2] = 0.0  # writes nothing: invalid as a source in every mode, as a V target
    W_K[2, 0] = 0.0  # query heads 0..2 of layer 2 read no keys: invalid Q/K targets
    heads = make_heads(W_Q, W_K, W_V, W_O)
    ref = {m: _reference(W_Q, W_K, W_V, W_O, m) for m in "QKV"}
    for mode in "QKV":
        cs = composition_score(heads, mode, order="all")
        assert not bool(cs.valid[0, 2].any())
        dead_targets = [(0, 2)] if mode == "V" else [(2, 0), (2, 1), (2, 2)]
        for tl, th in dead_targets:
            assert not bool(cs.valid[:, :, tl, th].any())
        assert torch.all(cs.scores[~cs.valid] == 0)
        assert (cs.scores.double() - ref[mode])[cs.valid].abs().max() < 1e-5
    # Only the results stay in the model's cache: no [L, H, d, d_head] factor outlives a call.
    big = [k for k, v in heads._cache.items()
           if isinstance(v, torch.Tensor) or (isinstance(v, tuple) and any(
               isinstance(t, torch.Tensor) and t.dim() == 4 and t.shape[-2] == 24 for t in v))]
    assert big == []


@pytest.mark.parametrize("method", ["gram", "overlap"])
def test_factored_operands_equal_their_dense_bases(method):
    """A Factored operand (shared bf16 rows A, per-head R) gives the overlaps of X = A R^T."""
    from headgraph.core.scores.overlaps import Factored, sq_overlaps

    g = torch.Generator().manual_seed(7)
    a = torch.randn(3, 2, 20, 4, generator=g).to(torch.bfloat16)  # 2 groups serve 6 heads
    r = torch.randn(3, 6, 4, 4, generator=g)
    u = torch.randn(3, 5, 20, 3, generator=g)
    x = torch.stack([torch.stack([a[layer, h // 3].double() @ r[layer, h].double().T
                                  for h in range(6)]) for layer in range(3)])
    got = sq_overlaps({"x": Factored(a, r), "u": u}, [("x", "u"), ("u", "x"), ("x", "x")],
                      order="all", method=method, work_bytes=4096)
    want = {("x", "u"): (x, u.double()), ("u", "x"): (u.double(), x), ("x", "x"): (x, x)}
    for key, (s, t) in want.items():
        ref = torch.einsum("ahdr,bkds->ahbkrs", s, t).square().sum(dim=(-2, -1))
        assert (got[key] - ref).abs().max() < 1e-4 * ref.abs().max()


def test_pair_detail_factorizes_two_heads_and_bases_can_be_released(make_heads):
    """pair_detail reads only the two heads' bases (the same as the role's cached ones), and
    release_bases drops every cached basis while PK results stay."""
    from headgraph.core.scores.pk import pair_detail, projection_kernel
    from headgraph.core.scores.subspaces import release_bases, role_bases

    W_Q, W_K, W_V, W_O = _gqa_weights(torch.float32, seed=8)
    lone = pair_detail(make_heads(W_Q, W_K, W_V, W_O), "OK", 0, 4, 2, 1)
    heads = make_heads(W_Q, W_K, W_V, W_O)
    cold = pair_detail(heads, "OV", 0, 2, 1, 1)  # target: the rank-deficient KV group
    assert not any(k[0] == "bases" for k in heads._cache)
    pk = projection_kernel(heads, "OK")
    warm = pair_detail(heads, "OK", 0, 4, 2, 1)
    assert abs(warm.pk - lone.pk) < 1e-6 and abs(warm.pk - float(pk.scores[0, 4, 2, 1])) < 1e-5
    assert torch.allclose(warm.cosines, lone.cosines, atol=1e-6) and warm.ranks == lone.ranks
    assert cold.ranks == (4, 3)
    full = role_bases(heads, "V")
    again = pair_detail(heads, "OV", 0, 2, 1, 1)  # now from the cached bases
    assert abs(again.pk - cold.pk) < 1e-6 and torch.allclose(again.cosines, cold.cosines, atol=1e-6)
    assert release_bases(heads) >= full.U.nbytes
    assert not any(k[0] == "bases" for k in heads._cache)
    assert projection_kernel(heads, "OK") is pk
