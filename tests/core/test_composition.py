"""Composition Scores: TransformerLens (MHA and GQA) and a dense float64 reference."""

from __future__ import annotations

import pytest
import torch

from model_support import boot_bridge
from headgraph.core.scores.composition_score import composition_score, expand_kv, target_layer_cs
from headgraph.core.errors import InvalidInput
from headgraph.core.models.bridge_weights import heads_from_bridge


def _dense_reference(heads, mode: str) -> torch.Tensor:
    """CS from full d_model x d_model matrices in float64 (the definition, pair by pair)."""
    n = heads.info.n_heads
    W_Q = heads.W_Q.double()
    W_K = expand_kv(heads.W_K.double(), n)
    W_V = expand_kv(heads.W_V.double(), n)
    W_O = heads.W_O.double()
    ov = W_V @ W_O
    qk = W_Q @ W_K.transpose(-2, -1)
    right = {"Q": qk, "K": qk.transpose(-2, -1), "V": ov}[mode]
    L = W_Q.shape[0]
    out = torch.zeros(L, n, L, n, dtype=torch.float64)
    for sl in range(L):
        for sh in range(n):
            for tl in range(L):
                for th in range(n):
                    left, r = ov[sl, sh], right[tl, th]
                    out[sl, sh, tl, th] = torch.linalg.norm(left @ r) / (torch.linalg.norm(left) * torch.linalg.norm(r))
    return out


@pytest.mark.parametrize("mode", ["Q", "K", "V"])
def test_matches_transformerlens_gpt2(gpt2_cs_dir, mode):
    bridge = boot_bridge(gpt2_cs_dir)
    heads = heads_from_bridge(bridge, name="gpt2-cs", source="local")
    ref = bridge.all_composition_scores(mode).scores
    ours = composition_score(heads, mode)
    assert ours.scores.shape == ref.shape == (4, 4, 4, 4)
    assert (ours.scores - ref).abs().max() < 1e-5
    assert torch.equal(ours.normalized, ours.scores)
    assert (ours.source_role, ours.target_role, ours.kind) == ("O", mode, "cs")


@pytest.mark.parametrize("mode", ["Q", "K", "V"])
def test_matches_transformerlens_gqa(qwen2_gqa_dir, mode):
    bridge = boot_bridge(qwen2_gqa_dir)
    heads = heads_from_bridge(bridge, name="qwen2-gqa", source="local")
    assert heads.W_K.shape[1] == 2 and heads.W_Q.shape[1] == 4
    ref = bridge.all_composition_scores(mode).scores
    ours = composition_score(heads, mode)
    assert ours.scores.shape == ref.shape == (3, 4, 3, 4)
    assert (ours.scores - ref).abs().max() < 1e-5


@pytest.mark.parametrize("mode", ["Q", "K", "V"])
def test_matches_dense_float64_definition_all_orders(make_heads, mode):
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    W_V = r(3, 2, 20, 5)
    W_V[1, 0, :, 4] = 0.0  # a rank-deficient head must still be handled exactly
    heads = make_heads(r(3, 4, 20, 5), r(3, 2, 20, 5), W_V, r(3, 4, 5, 20))
    ref = _dense_reference(heads, mode)
    full = composition_score(heads, mode, order="all")
    assert bool(full.valid.all())
    assert (full.scores.double() - ref).abs().max() < 1e-5
    fwd = composition_score(heads, mode)
    mask = torch.tensor([[a < b for b in range(3)] for a in range(3)])[:, None, :, None].expand(3, 4, 3, 4)
    assert torch.equal(fwd.valid, mask)
    assert torch.all(fwd.scores[~mask] == 0)
    assert (fwd.scores.double() - ref)[mask].abs().max() < 1e-5
    same = composition_score(heads, mode, order="same-layer")
    assert torch.allclose(same.scores[same.valid].double(), ref[same.valid], atol=1e-5)
    # One source head against one target layer, any order (a pair panel against the layer
    # order): the definition's cells, without a grid.
    for sl, sh, tl in ((2, 3, 0), (1, 2, 1), (0, 1, 2)):
        row = target_layer_cs(heads, mode, sl, sh, tl)
        assert row.scores.shape == (1, 1, 1, 4) and bool(row.valid.all()) and row.layer_indices == (tl,)
        assert (row.scores[0, 0, 0].double() - ref[sl, sh, tl]).abs().max() < 1e-9
    with pytest.raises(InvalidInput, match="target_layer"):
        target_layer_cs(heads, mode, 0, 0, 3)


def test_scale_invariance_and_validation(make_heads):
    g = torch.Generator().manual_seed(1)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    W = (r(2, 3, 16, 4), r(2, 3, 16, 4), r(2, 3, 16, 4), r(2, 3, 4, 16))
    base = composition_score(make_heads(*W), "K", order="all").scores
    scaled = composition_score(make_heads(W[0] * 7.0, W[1] * 0.01, W[2] * 3.0, W[3]), "K", order="all").scores
    assert (base - scaled).abs().max() < 1e-12
    assert torch.all((base >= 0) & (base <= 1))
    with pytest.raises(InvalidInput, match=r"\['Q', 'K', 'V'\]"):
        composition_score(make_heads(*W), "O")
