"""Composition Scores (Elhage et al. 2021) for all head pairs, in factored form.

CS(i -> j) = ||left_i @ right_j||_F / (||left_i||_F ||right_j||_F), with TransformerLens's
``all_composition_scores`` semantics: left = earlier head's W_OV = W_V W_O; right = W_Q W_K^T
(mode Q), its transpose W_K W_Q^T (mode K) or W_OV (mode V); query head h of a grouped-query
model reads K/V head h // (H / H_kv) (TL's ``_expand_kv_heads``), but K/V weights are never
repeated here: every factor is per KV group or per query head, whichever it belongs to.

Never forms a d_model x d_model matrix per pair. With left = A B (A [d, dh], B [dh, d]) and
right = C D (C [d, dh], D [dh, d]), QR factorizations A = Q_A R_A and D^T = Q_D R_D give
||A B C D||_F = ||R_A B C R_D^T||_F = ||X^T Y||_F, X = B^T R_A^T, Y = C R_D^T ([d, dh] each),
and ||left||_F = ||X||_F = ||R_A R_B^T||_F (R_B of B^T), ||right||_F = ||R_C R_D^T||_F. Only
the R factors ([dh, dh] per KV group or head, one layer at a time in the compute dtype) are
computed; X and Y go to core.scores.overlaps as :class:`Factored` operands (weights in their
stored precision times the scaled R factors), whose projector pieces are built piece by piece,
so no [L, H, d, dh] factor exists. Nothing but the results is cached.
"""

from __future__ import annotations

import torch

from headgraph.core.errors import InvalidInput, UnsupportedModel
from headgraph.core.names import CS_MODES, check_mode
from headgraph.core.scores.layer_order import check_order, layer_mask
from headgraph.core.scores.overlaps import Factored, sq_overlaps
from headgraph.core.scores.subspaces import compute_dtype
from headgraph.core.types import HeadWeights, PairScores


def expand_kv(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Repeat grouped K/V heads [L, Hkv, ...] to query heads [L, n_heads, ...] (query h reads
    kv head h // (n_heads // Hkv)); no-op when already n_heads. For references and small
    tensors: the scores themselves never repeat K/V weights."""
    n_kv = w.shape[1]
    if n_kv == n_heads:
        return w
    if n_heads % n_kv:
        raise UnsupportedModel(f"cannot expand {n_kv} key-value heads to {n_heads} query heads")
    return w.repeat_interleave(n_heads // n_kv, dim=1)


def _r_factors(w: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """R of the reduced QR of every head's w [L, n, d, dh] -> [L, n, dh, dh] in ``dtype``
    (w^T w = R^T R, so ||w M||_F = ||R M||_F), one layer upcast at a time."""
    try:
        return torch.stack([torch.linalg.qr(layer.to(dtype), mode="r").R for layer in w.detach()])
    except RuntimeError as err:  # LAPACK failures on non-finite input
        raise UnsupportedModel(f"weights cannot be factorized: {err}") from err


def _per_head(r: torch.Tensor, n_heads: int) -> torch.Tensor:
    """[L, n, ...] factors of KV groups (or already of heads) -> [L, n_heads, ...]."""
    return expand_kv(r, n_heads)


def _unit(a: torch.Tensor, r: torch.Tensor, norms: torch.Tensor) -> Factored:
    """X = a r^T scaled to unit Frobenius norm per head (0 where the norm is 0)."""
    scale = torch.where(norms > 0, 1.0 / norms.clamp(min=torch.finfo(norms.dtype).tiny), 0.0)
    return Factored(a.detach(), r * scale[..., None, None])


def _factors(heads: HeadWeights, modes: list[str]) -> tuple[dict[str, Factored], dict[str, torch.Tensor]]:
    """Unit-norm factored X ("O", every head's W_OV) and Y per mode, with the norms [L, H]
    ||W_OV||_F ("O") and ||right||_F per mode."""
    dtype = compute_dtype(heads.W_Q.dtype)
    n = heads.info.n_heads
    if n % heads.W_K.shape[1]:
        raise UnsupportedModel(f"cannot share {heads.W_K.shape[1]} key-value heads among {n} query heads")
    w_ot = heads.W_O.transpose(-2, -1)  # [L, H, d, dh]
    r_v = _per_head(_r_factors(heads.W_V, dtype), n)
    r_o = _r_factors(w_ot, dtype)
    ov_norm = torch.linalg.matrix_norm(r_o @ r_v.transpose(-2, -1))  # ||W_V W_O||_F
    factors = {"O": _unit(w_ot, r_v, ov_norm)}  # X = W_O^T R_V^T
    norms = {"O": ov_norm}
    if {"Q", "K"} & set(modes):
        r_q = _r_factors(heads.W_Q, dtype)
        r_k = _per_head(_r_factors(heads.W_K, dtype), n)
        qk_norm = torch.linalg.matrix_norm(r_q @ r_k.transpose(-2, -1))  # ||W_Q W_K^T||_F
        if "Q" in modes:  # W_Q W_K^T: Y = W_Q R_K^T
            factors["Q"], norms["Q"] = _unit(heads.W_Q, r_k, qk_norm), qk_norm
        if "K" in modes:  # W_K W_Q^T: Y = W_K R_Q^T
            factors["K"], norms["K"] = _unit(heads.W_K, r_q, qk_norm), qk_norm
    if "V" in modes:  # W_V W_O: Y = W_V R_{O^T}^T
        factors["V"], norms["V"] = _unit(heads.W_V, r_o, ov_norm), ov_norm
    return factors, norms


def composition_score(heads: HeadWeights, mode: str = "K", *, order: str = "forward") -> PairScores:
    """Composition Scores [L, H, L, H] (query heads on both axes) for Q-, K- or V-composition.

    Matches TransformerLens ``all_composition_scores(mode).scores`` for ``order="forward"``
    (earlier source layer -> later target layer; other cells 0). ``normalized`` equals
    ``scores``; pairs with an all-zero W_OV or right matrix are invalid (0). Cached (the
    result only). For several modes use :func:`composition_scores` (one pass).
    """
    check_mode(mode)
    return composition_scores(heads, [mode], order=order)[mode]


def composition_scores(heads: HeadWeights, modes: list[str] | None = None, *,
                       order: str = "forward") -> dict[str, PairScores]:
    """:func:`composition_score` of several modes (default Q, K, V) from one pass that builds
    the earlier heads' W_OV pieces once; results are cached per mode."""
    modes = list(dict.fromkeys(CS_MODES if modes is None else modes))
    for m in modes:
        check_mode(m)
    check_order(order)
    missing = [m for m in modes if ("cs", m, order) not in heads._cache]
    if missing:
        for m, res in _cs_results(heads, missing, order).items():
            heads._cache[("cs", m, order)] = res
    return {m: heads._cache[("cs", m, order)] for m in modes}


def target_layer_cs(heads: HeadWeights, mode: str, source_layer: int, source_head: int,
                    target_layer: int) -> PairScores:
    """Composition Scores [1, 1, 1, H] of one source head to every query head of one target
    layer, in any layer order (a pair against the layer order, or in one layer, included):
    the cells :func:`composition_score` with ``order="all"`` gives, without its grids.

    float64 Gram form, nothing d_model x d_model: with left = A B and right = C D (module
    docstring), ||A B C D||_F^2 = tr(M^T G_A M G_D) for M = B C, G_A = A^T A, G_D = D D^T,
    and ||A B||_F^2 = tr(G_A B B^T), ||C D||_F^2 = tr(C^T C G_D). Positions are 0..L-1;
    ``layer_indices`` names the target layer only (core.scores.ranking.kv_level_cs of the
    row gives a KV group's mean, as the grids' views do).
    """
    check_mode(mode)
    L, n = heads.W_Q.shape[:2]
    for name, value, size in (("source_layer", source_layer, L), ("source_head", source_head, n),
                              ("target_layer", target_layer, L)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < size:
            raise InvalidInput(f"{name} must be an integer position in [0, {size}), got {value!r}")
    n_kv = heads.W_K.shape[1]
    if n % n_kv:
        raise UnsupportedModel(f"cannot share {n_kv} key-value heads among {n} query heads")
    group = n // n_kv
    f64 = torch.float64
    a = heads.W_V[source_layer, source_head // group].to(f64)  # [d, dh]
    b = heads.W_O[source_layer, source_head].to(f64)  # [dh, d]
    g_a = a.T @ a
    left_sq = torch.trace(g_a @ (b @ b.T))
    kv = [h // group for h in range(n)]
    if mode == "Q":  # W_Q W_K^T
        c = heads.W_Q[target_layer].to(f64)
        d = heads.W_K[target_layer, kv].to(f64).transpose(-2, -1)
    elif mode == "K":  # W_K W_Q^T
        c = heads.W_K[target_layer, kv].to(f64)
        d = heads.W_Q[target_layer].to(f64).transpose(-2, -1)
    else:  # W_V W_O
        c = heads.W_V[target_layer, kv].to(f64)
        d = heads.W_O[target_layer].to(f64)
    g_d = d @ d.transpose(-2, -1)  # [H, dh, dh]
    m = b @ c  # [H, dh, dh]
    num = torch.einsum("hij,ik,hkl,hjl->h", m, g_a, m, g_d)  # tr(M^T G_A M G_D)
    right_sq = torch.einsum("hij,hji->h", c.transpose(-2, -1) @ c, g_d).clamp(min=0.0)  # tr(G_C G_D)
    valid = (left_sq > 0) & (right_sq > 0)
    cs = torch.where(valid, (num.clamp(min=0.0) / (left_sq * right_sq).clamp(min=1e-300)).sqrt().clamp(max=1.0),
                     0.0)
    dh = heads.W_Q.shape[-1]
    one = torch.full((1, 1), dh, dtype=torch.long)
    return PairScores(
        kind="cs", pairing=mode, source_role="O", target_role=mode,
        scores=cs[None, None, None], normalized=cs[None, None, None], valid=valid[None, None, None],
        layer_indices=(heads.info.layer_indices[target_layer],), order="all",
        source_ranks=one, target_ranks=torch.full((1, n), dh, dtype=torch.long), source_rank=dh,
        target_rank=dh,
    )


def _cs_results(heads: HeadWeights, modes: list[str], order: str) -> dict[str, PairScores]:
    factors, norms = _factors(heads, modes)
    idx = heads.info.layer_indices
    # Blocks follow positions; should positions not follow the layer order, compute all pairs.
    monotone = all(a < b for a, b in zip(idx, idx[1:]))
    sq = sq_overlaps(factors, [("O", m) for m in modes], order=order if monotone else "all")
    dtype = factors["O"].dtype
    L, H, _, dh = factors["O"].shape
    lmask = layer_mask(idx, order, norms["O"].device)[:, None, :, None]
    full = torch.full((L, H), dh, dtype=torch.long, device=norms["O"].device)
    results = {}
    for m in modes:
        valid = lmask & (norms["O"] > 0)[:, :, None, None] & (norms[m] > 0)[None, None]
        scores = torch.where(valid, sq[("O", m)].clamp(0.0, 1.0).sqrt(), 0.0).to(dtype)
        results[m] = PairScores(
            kind="cs", pairing=m, source_role="O", target_role=m,
            scores=scores, normalized=scores, valid=valid, layer_indices=tuple(idx), order=order,
            source_ranks=full, target_ranks=full, source_rank=dh, target_rank=dh,
        )
    return results
