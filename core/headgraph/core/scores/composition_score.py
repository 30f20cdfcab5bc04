"""Composition Scores (Elhage et al. 2021) for all head pairs, in factored form.

CS(i -> j) = ||left_i @ right_j||_F / (||left_i||_F ||right_j||_F), with TransformerLens's
``all_composition_scores`` semantics: left = earlier head's W_OV = W_V W_O; right = W_Q W_K^T
(mode Q), its transpose W_K W_Q^T (mode K) or W_OV (mode V); K/V weights of grouped-query
models are repeated to query heads (repeat_interleave, as TL's ``_expand_kv_heads``).

Never forms a d_model x d_model matrix per pair. With left = A B (A [d, dh], B [dh, d]) and
right = C D (C [d, dh], D [dh, d]), QR factorizations A = Q_A R_A and D^T = Q_D R_D give
||A B C D||_F = ||R_A B C R_D^T||_F = ||X^T Y||_F, X = B^T R_A^T, Y = C R_D^T ([d, dh] each),
and ||left||_F = ||X||_F, ||right||_F = ||Y||_F. The pair norms are then the same batched,
tiled computation as the Projection Kernel (core.scores.overlaps.pairwise_sq_overlap) on X/||X|| and Y/||Y||.
"""

from __future__ import annotations

import torch

from headgraph.core.errors import UnsupportedModel
from headgraph.core.names import check_mode
from headgraph.core.scores.layer_order import check_order, layer_mask
from headgraph.core.scores.overlaps import pairwise_sq_overlap
from headgraph.core.scores.subspaces import compute_dtype
from headgraph.core.types import HeadWeights, PairScores


def expand_kv(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Repeat grouped K/V heads [L, Hkv, ...] to query heads [L, n_heads, ...] (query h reads
    kv head h // (n_heads // Hkv)); no-op when already n_heads."""
    n_kv = w.shape[1]
    if n_kv == n_heads:
        return w
    if n_heads % n_kv:
        raise UnsupportedModel(f"cannot expand {n_kv} key-value heads to {n_heads} query heads")
    return w.repeat_interleave(n_heads // n_kv, dim=1)


def _r_factor(a: torch.Tensor) -> torch.Tensor:
    """R of the reduced QR of a [..., d, dh]: a^T a = R^T R, so ||a M||_F = ||R M||_F."""
    return torch.linalg.qr(a, mode="r").R


def _unit(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [L, H, d, dh] scaled to unit Frobenius norm per head, and the norms [L, H]."""
    norms = torch.linalg.matrix_norm(x)
    return x / norms.clamp(min=torch.finfo(x.dtype).tiny)[..., None, None], norms


def _weights(heads: HeadWeights) -> dict[str, torch.Tensor]:
    dtype = compute_dtype(heads.W_Q.dtype)
    n = heads.info.n_heads
    return {
        "Q": heads.W_Q.detach().to(dtype),
        "K": expand_kv(heads.W_K.detach(), n).to(dtype),
        "V": expand_kv(heads.W_V.detach(), n).to(dtype),
        "O": heads.W_O.detach().to(dtype),
    }


def _left_factor(heads: HeadWeights) -> tuple[torch.Tensor, torch.Tensor]:
    """Unit-norm X = W_O^T R_V^T [L, H, d, dh] of every head's W_OV, and ||W_OV||_F [L, H]."""
    key = ("cs_left",)
    hit = heads._cache.get(key)
    if hit is None:
        w = _weights(heads)
        x = w["O"].transpose(-2, -1) @ _r_factor(w["V"]).transpose(-2, -1)
        hit = _unit(x)
        heads._cache[key] = hit
    return hit


def _right_factor(heads: HeadWeights, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Unit-norm Y = C R_D^T [L, H, d, dh] of every head's right matrix C D, and ||C D||_F."""
    key = ("cs_right", mode)
    hit = heads._cache.get(key)
    if hit is None:
        w = _weights(heads)
        if mode == "Q":  # W_Q W_K^T: C = W_Q, D^T = W_K
            c, d_t = w["Q"], w["K"]
        elif mode == "K":  # W_K W_Q^T: C = W_K, D^T = W_Q
            c, d_t = w["K"], w["Q"]
        else:  # W_V W_O: C = W_V, D^T = W_O^T
            c, d_t = w["V"], w["O"].transpose(-2, -1)
        hit = _unit(c @ _r_factor(d_t).transpose(-2, -1))
        heads._cache[key] = hit
    return hit


def composition_score(heads: HeadWeights, mode: str = "K", *, order: str = "forward") -> PairScores:
    """Composition Scores [L, H, L, H] (query heads on both axes) for Q-, K- or V-composition.

    Matches TransformerLens ``all_composition_scores(mode).scores`` for ``order="forward"``
    (earlier source layer -> later target layer; other cells 0). ``normalized`` equals
    ``scores``; pairs with an all-zero W_OV or right matrix are invalid (0). Cached.
    """
    check_mode(mode)
    check_order(order)
    key = ("cs", mode, order)
    hit = heads._cache.get(key)
    if hit is not None:
        return hit
    x, left_norm = _left_factor(heads)
    y, right_norm = _right_factor(heads, mode)
    sq = pairwise_sq_overlap(x, y, order=order)
    valid = (layer_mask(heads.info.layer_indices, order, sq.device)[:, None, :, None]
             & (left_norm > 0)[:, :, None, None] & (right_norm > 0)[None, None])
    scores = torch.where(valid, sq.clamp(0.0, 1.0).sqrt(), 0.0).to(x.dtype)
    L, H = x.shape[:2]
    full = torch.full((L, H), x.shape[-1], dtype=torch.long, device=x.device)
    result = PairScores(
        kind="cs", pairing=mode, source_role="O", target_role=mode,
        scores=scores, normalized=scores, valid=valid,
        layer_indices=tuple(heads.info.layer_indices), order=order,
        source_ranks=full, target_ranks=full, source_rank=x.shape[-1], target_rank=x.shape[-1],
    )
    heads._cache[key] = result
    return result
