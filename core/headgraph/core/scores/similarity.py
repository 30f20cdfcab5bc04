"""Linear CKA and orthogonal Procrustes similarity between every pair of heads' weight matrices.

The PK paper's two representation-similarity baselines, computed on the same pairs as PK (one
pairing's source role matrix vs target role matrix, K/V with native KV heads, the layer order's
pairs). Each head's role matrix X [d_model, d_head] (W_Q, W_K, W_V, or W_O^T for O) is read as
a representation of the d_model residual dimensions by d_head features, centred over the
residual dimensions (X~ = H X with H = I - 11^T / d_model; for W_O this is TransformerLens's
``center_writing_weights``):

* linear CKA (Kornblith et al., 2019):
  CKA(X, Y) = ||Y~^T X~||_F^2 / (||X~^T X~||_F ||Y~^T Y~||_F), in [0, 1];
* orthogonal Procrustes similarity (Ding et al., 2021):
  Proc(X, Y) = ||X~^T Y~||_* / (||X~||_F ||Y~||_F), in [0, 1] (nuclear norm: the sum of the
  singular values; 1 - Proc is half the squared Procrustes distance of the normalized X~, Y~).

Unlike PK neither is invariant to a change of basis inside a head (W -> W A), so they weigh a
head's directions by their singular values. CKA's numerator is the same sum of squared overlaps
as PK's (core.scores.overlaps, batched and bounded in memory), on X~ scaled to
||X~^T X~||_F = 1; Procrustes takes the [d_head, d_head] products X^_s^T Y^_t of the
Frobenius-normalized matrices for the kept pairs (one GEMM per block of pairs) and sums their
singular values (float64, from the eigenvalues of M^T M).
Results are PairScores (kind "cka" or "procrustes", normalized == scores, valid like PK's: the
order's pairs between heads of non-zero rank, and of non-zero centred weights).
"""

from __future__ import annotations

import torch

from headgraph.core.errors import InvalidInput
from headgraph.core.names import SIMILARITY_KINDS, SimilarityKind, check_order, check_pairing
from headgraph.core.scores.layer_order import layer_blocks, layer_mask
from headgraph.core.scores.overlaps import sq_overlaps
from headgraph.core.scores.subspaces import compute_dtype, effective_ranks, roles_bases
from headgraph.core.types import HeadWeights, PairScores

# Largest batch of [d_head, d_head] products per SVD call (bytes of the products).
_PRODUCT_BYTES = 64 * 1024 * 1024


def check_similarity(kind: str) -> SimilarityKind:
    """``kind`` if it is one of SIMILARITY_KINDS, else InvalidInput listing them."""
    if kind not in SIMILARITY_KINDS:
        raise InvalidInput(f"unknown similarity {kind!r}; allowed: {list(SIMILARITY_KINDS)}",
                           allowed=list(SIMILARITY_KINDS))
    return kind  # type: ignore[return-value]


def centred(heads: HeadWeights, role: str) -> torch.Tensor:
    """A role's matrices [L, H, d_model, d_head] centred over d_model, in the compute dtype."""
    w = heads.role(role).detach()
    w = w.to(compute_dtype(w.dtype))
    return w - w.mean(dim=-2, keepdim=True)


def _scaled(heads: HeadWeights, role: str, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(X~ scaled per head, bool [L, H] non-zero): CKA scales to ||X~^T X~||_F = 1, Procrustes
    to ||X~||_F = 1; a zero centred matrix stays zero (and is marked)."""
    key = ("similarity-operand", role, kind)
    hit = heads._cache.get(key)
    if hit is not None:
        return hit
    x = centred(heads, role)
    if kind == "cka":
        scale = torch.linalg.matrix_norm(x.transpose(-2, -1) @ x).sqrt()
    else:
        scale = torch.linalg.matrix_norm(x)
    nonzero = scale > 0
    x = x / torch.where(nonzero, scale, torch.ones_like(scale))[..., None, None]
    heads._cache[key] = (x, nonzero)
    return x, nonzero


def _nuclear(m: torch.Tensor) -> torch.Tensor:
    """Nuclear norms of [n, a, b] float64 matrices: the sum of sqrt(eigenvalues of M^T M) (a
    symmetric eigensolver, far cheaper than an SVD; an eigenvalue's rounding, ~eps s_max^2,
    moves its root by at most ~sqrt(eps) s_max = 1.5e-8 s_max)."""
    gram = m.transpose(-2, -1) @ m if m.shape[-1] <= m.shape[-2] else m @ m.transpose(-2, -1)
    return torch.linalg.eigvalsh(gram).clamp(min=0.0).sqrt().sum(-1)


def _procrustes_grid(xs: torch.Tensor, xt: torch.Tensor, order: str) -> torch.Tensor:
    """||xs_i^T xt_j||_* for every kept pair: xs [L, Hs, d, r], xt [L, Ht, d, r] (unit Frobenius
    norm) -> float64 [L, Hs, L, Ht] (0 outside the order). Products in the inputs' dtype, the
    singular values in float64, a bounded batch at a time."""
    L, hs, d, rs = xs.shape
    ht, rt = xt.shape[1], xt.shape[3]
    out = torch.zeros(L, hs, L, ht, dtype=torch.float64, device=xs.device)
    per_pair = max(1, rs * rt * 8)
    for sa, sb, ta, tb in layer_blocks(L, order):
        src = xs[sa:sb].reshape(-1, d, rs)  # [(sb-sa) hs, d, rs]
        tgt = xt[ta:tb].reshape(-1, d, rt)
        n_t = tgt.shape[0]
        tgt_flat = tgt.permute(1, 0, 2).reshape(d, n_t * rt)
        step = max(1, _PRODUCT_BYTES // (per_pair * n_t))
        for i0 in range(0, src.shape[0], step):
            i1 = min(src.shape[0], i0 + step)
            m = (src[i0:i1].transpose(1, 2).reshape(-1, d) @ tgt_flat)  # [(i1-i0) rs, n_t rt]
            m = m.view(i1 - i0, rs, n_t, rt).permute(0, 2, 1, 3).to(torch.float64)
            nuc = _nuclear(m.reshape(-1, rs, rt)).view(i1 - i0, n_t)
            block = out[sa:sb].reshape(-1, L, ht)[i0:i1, ta:tb]  # a view into out
            block.copy_(nuc.view(i1 - i0, tb - ta, ht))
    return out


def _results(heads: HeadWeights, kind: str, pairings: list[str], order: str
             ) -> dict[str, PairScores]:
    roles = list(dict.fromkeys(r for p in pairings for r in (p[0], p[1])))
    bases = roles_bases(heads, roles)
    ops = {r: _scaled(heads, r, kind) for r in roles}
    idx = heads.info.layer_indices
    monotone = all(a < b for a, b in zip(idx, idx[1:]))
    eff_order = order if monotone else "all"
    device = next(iter(ops.values()))[0].device
    lmask = layer_mask(idx, order, device)
    if kind == "cka":
        raw = sq_overlaps({r: x for r, (x, _) in ops.items()}, [(p[0], p[1]) for p in pairings],
                          order=eff_order)
        grids = {p: raw[(p[0], p[1])] for p in pairings}
    else:
        grids = {p: _procrustes_grid(ops[p[0]][0], ops[p[1]][0], eff_order) for p in pairings}
    out = {}
    for p in pairings:
        s, t = p[0], p[1]
        sb, tb = bases[s], bases[t]
        ok_s = (effective_ranks(sb) > 0) & ops[s][1]
        ok_t = (effective_ranks(tb) > 0) & ops[t][1]
        valid = lmask[:, None, :, None] & ok_s[:, :, None, None] & ok_t[None, None]
        vals = torch.where(valid, grids[p].clamp(0.0, 1.0), 0.0).to(sb.U.dtype)
        out[p] = PairScores(
            kind=kind, pairing=p, source_role=s, target_role=t, scores=vals, normalized=vals,
            valid=valid, layer_indices=tuple(idx), order=order, source_ranks=sb.ranks,
            target_ranks=tb.ranks, source_rank=sb.rank, target_rank=tb.rank,
        )
    return out


def similarity(heads: HeadWeights, kind: str, pairing: str = "OK", *, order: str = "forward"
               ) -> PairScores:
    """Linear CKA (``kind="cka"``) or orthogonal Procrustes similarity (``"procrustes"``) of
    every (source head, target head) pair of ``pairing``, e.g. "OK": earlier head's W_O^T vs
    later head's W_K (see the module docstring for the definitions).

    Returns PairScores with scores == normalized in [0, 1] and valid, [L, Hs, L, Ht] (K/V axes
    keep native KV heads, as PK); invalid cells hold 0. Cached in ``heads._cache``.
    """
    return all_similarities(heads, kind, pairings=[pairing], order=order)[pairing]


def all_similarities(heads: HeadWeights, kind: str, *, pairings: list[str] | None = None,
                     order: str = "forward") -> dict[str, PairScores]:
    """:func:`similarity` for several pairings (default OQ, OK, OV), each role's centred and
    scaled matrices built once; results are cached per pairing."""
    kind = check_similarity(kind)
    check_order(order)
    pairings = list(pairings) if pairings is not None else ["OQ", "OK", "OV"]
    for p in pairings:
        check_pairing(p)
    missing = [p for p in dict.fromkeys(pairings) if (kind, p, order) not in heads._cache]
    if missing:
        for p, res in _results(heads, kind, missing, order).items():
            heads._cache[(kind, p, order)] = res
    return {p: heads._cache[(kind, p, order)] for p in pairings}


def cka(heads: HeadWeights, pairing: str = "OK", *, order: str = "forward") -> PairScores:
    """Linear CKA of every pair of ``pairing`` (= ``similarity(heads, "cka", pairing)``)."""
    return similarity(heads, "cka", pairing, order=order)


def procrustes(heads: HeadWeights, pairing: str = "OK", *, order: str = "forward") -> PairScores:
    """Orthogonal Procrustes similarity of every pair of ``pairing``."""
    return similarity(heads, "procrustes", pairing, order=order)


__all__ = ["SIMILARITY_KINDS", "SimilarityKind", "all_similarities", "centred", "check_similarity",
           "cka", "procrustes", "similarity"]
