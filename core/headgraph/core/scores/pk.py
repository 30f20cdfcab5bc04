"""Projection Kernel between every pair of heads' role subspaces, as typed results.

PK(U_s, U_t) = ||U_s^T U_t||_F^2 = <P_s, P_t>_F with P = U U^T (the sum of squared cosines of the
principal angles), for orthonormal bases from core.scores.subspaces. The pair sums come from
core.scores.overlaps (projector Gram, only the pairs the layer order keeps); several pairings (e.g. OQ,
OK, OV through ``all_pairings``) share one pass that builds each role's pieces once. This
module turns them into PairScores (bounds, ranks, normalization, validity) and gives one pair's
principal angles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from headgraph.core.errors import InvalidInput
from headgraph.core.names import PAIRINGS, check_pairing, head_label
from headgraph.core.scores.layer_order import check_order, layer_mask
from headgraph.core.scores.overlaps import Factored, sq_overlaps
from headgraph.core.scores.subspaces import (
    compute_dtype,
    effective_ranks,
    head_basis,
    role_factors,
    roles_bases,
)
from headgraph.core.types import HeadWeights, PairScores, RoleBases, RoleFactors


def parse_pairing(pairing: str) -> tuple[str, str]:
    """Split a pairing like "OK" into (source role, target role); InvalidInput listing allowed ones."""
    p = check_pairing(pairing)
    return p[0], p[1]


# Above this many bytes of dense bases (all roles of one pass, compute dtype), PK reads the
# bases as factors of the stored weights (core.scores.subspaces.role_factors): 8.6 GB at 7B.
DENSE_BASES_BYTES = 1 << 30
BASES_FORMS = ("auto", "dense", "factored")


def _operands(heads: HeadWeights, roles: list[str], rank: int | None, rtol: float | None,
              form: str) -> tuple[dict[str, RoleBases | RoleFactors], dict[str, torch.Tensor | Factored]]:
    """Each role's bases (for ranks) and its operand for the overlap pass: dense U, or factors
    U = W M when ``form`` asks for them (or "auto" finds the dense ones over
    DENSE_BASES_BYTES) and every head is certified full rank; dense otherwise."""
    width = torch.finfo(compute_dtype(heads.W_Q.dtype)).bits // 8
    dense_bytes = sum(w[..., 0].numel() * min(w.shape[-2:]) for w in map(heads.role, roles)) * width
    cached = all(("bases", r, rank, rtol) in heads._cache for r in roles)
    if rank is None and not cached and (form == "factored" or (form == "auto" and dense_bytes > DENSE_BASES_BYTES)):
        factors = {r: role_factors(heads, r, rtol=rtol) for r in roles}
        kept = {r: f for r, f in factors.items() if f is not None}
        if len(kept) == len(roles):
            return dict(kept), {r: Factored(f.a, f.m.transpose(-2, -1)) for r, f in kept.items()}
    bases = roles_bases(heads, roles, rank=rank, rtol=rtol)
    return dict(bases), {r: b.U for r, b in bases.items()}


def _pk_results(heads: HeadWeights, pairings: list[str], order: str, rank: int | None,
                rtol: float | None, form: str = "auto") -> dict[str, PairScores]:
    """PairScores of several pairings from one shared pass (bases and projector pieces built once)."""
    roles = list(dict.fromkeys(r for p in pairings for r in parse_pairing(p)))
    bases, operands = _operands(heads, roles, rank, rtol, form)
    idx = heads.info.layer_indices
    # Blocks follow positions; should positions not follow the layer order, compute all pairs.
    monotone = all(a < b for a, b in zip(idx, idx[1:]))
    sq = sq_overlaps(operands, [parse_pairing(p) for p in pairings],
                     order=order if monotone else "all")
    lmask = layer_mask(heads.info.layer_indices, order, next(iter(sq.values())).device)
    results = {}
    for p in pairings:
        s_role, t_role = parse_pairing(p)
        sb, tb = bases[s_role], bases[t_role]
        raw = sq[(s_role, t_role)]
        rs = effective_ranks(sb).to(torch.float64)
        rt = effective_ranks(tb).to(torch.float64)
        bound = torch.minimum(rs[:, :, None, None], rt[None, None])
        scores = torch.minimum(raw.clamp(min=0.0), bound)
        valid = lmask[:, None, :, None] & (rs > 0)[:, :, None, None] & (rt > 0)[None, None]
        denom = torch.sqrt(rs[:, :, None, None] * rt[None, None]).clamp(min=1.0)
        out_dtype = compute_dtype(heads.W_Q.dtype)
        results[p] = PairScores(
            kind="pk", pairing=p, source_role=s_role, target_role=t_role,
            scores=torch.where(valid, scores, 0.0).to(out_dtype),
            normalized=torch.where(valid, scores / denom, 0.0).to(out_dtype), valid=valid,
            layer_indices=tuple(heads.info.layer_indices), order=order,
            source_ranks=sb.ranks, target_ranks=tb.ranks, source_rank=sb.rank, target_rank=tb.rank,
        )
    return results


def projection_kernel(
    heads: HeadWeights,
    pairing: str = "OK",
    *,
    order: str = "forward",
    rank: int | None = None,
    rtol: float | None = None,
) -> PairScores:
    """PK between every source head's and target head's role subspaces.

    pairing: source role then target role, e.g. "OK" (earlier head's output span vs later
    head's key span). Returns PairScores with scores/normalized/valid [L, Hs, L, Ht] (K/V axes
    keep native KV heads): raw PK in [0, min(r_s, r_t)], normalized = PK / sqrt(r_s r_t) with
    per-head ranks (measured, or ``rank`` when truncating); pairs outside ``order`` or with a
    zero-rank head are invalid and hold 0. Cached in ``heads._cache``. For several pairings
    use :func:`all_pairings`, which builds each role's projector pieces once.
    """
    parse_pairing(pairing)
    check_order(order)
    key = ("pk", pairing, order, rank, rtol)
    hit = heads._cache.get(key)
    if hit is None:
        hit = _pk_results(heads, [pairing], order, rank, rtol)[pairing]
        heads._cache[key] = hit
    return hit


def all_pairings(
    heads: HeadWeights,
    *,
    order: str = "forward",
    pairings: list[str] | None = None,
    rank: int | None = None,
    rtol: float | None = None,
    bases: str = "auto",
) -> dict[str, PairScores]:
    """PK for several pairings (default: all 16 of QKVO x QKVO), computed together in one pass
    (each role's bases and projector pieces built once); results are cached per pairing.

    bases: "dense" (orthonormal bases [L, H, d_model, r] per role, cached in ``heads._cache``),
    "factored" (U = W M from the stored weights, nothing [L, H, d_model, r] formed: every head
    must be proven full rank, else dense) or "auto" (factored once the dense bases would pass
    DENSE_BASES_BYTES, e.g. a 7B-class model). Both give the same PK to float rounding."""
    if pairings is None:
        pairings = list(PAIRINGS)
    for p in pairings:
        parse_pairing(p)
    check_order(order)
    if bases not in BASES_FORMS:
        raise InvalidInput(f"bases must be one of {list(BASES_FORMS)}, got {bases!r}")
    missing = [p for p in dict.fromkeys(pairings) if ("pk", p, order, rank, rtol) not in heads._cache]
    if missing:
        for p, res in _pk_results(heads, missing, order, rank, rtol, bases).items():
            heads._cache[("pk", p, order, rank, rtol)] = res
    return {p: heads._cache[("pk", p, order, rank, rtol)] for p in pairings}


@dataclass(frozen=True)
class PairDetail:
    """One head pair's PK with its principal angles (computed in float64).

    Positions are indices into the stacked tensors; ``layer_indices`` maps them to blocks.
    cosines/angles: [min(r_s, r_t)], cosines descending, angles in radians ascending.
    """

    pairing: str
    source_layer: int
    source_head: int
    target_layer: int
    target_head: int
    pk: float
    normalized: float
    cosines: torch.Tensor
    angles: torch.Tensor
    ranks: tuple[int, int]
    layer_indices: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form."""
        return {
            "pairing": self.pairing,
            "source": head_label(self.layer_indices[self.source_layer], self.source_head),
            "target": head_label(self.layer_indices[self.target_layer], self.target_head),
            "source_layer": self.layer_indices[self.source_layer],
            "source_head": self.source_head,
            "target_layer": self.layer_indices[self.target_layer],
            "target_head": self.target_head,
            "pk": self.pk,
            "normalized": self.normalized,
            "cosines": self.cosines.tolist(),
            "angles": self.angles.tolist(),
            "ranks": list(self.ranks),
        }


def pair_detail(
    heads: HeadWeights,
    pairing: str,
    source_layer: int,
    source_head: int,
    target_layer: int,
    target_head: int,
    *,
    rank: int | None = None,
    rtol: float | None = None,
) -> PairDetail:
    """PK, normalized PK and principal angles of one pair (layer args are positions 0..L-1)."""
    s_role, t_role = parse_pairing(pairing)
    sizes = {"source_layer": heads.role(s_role).shape[0], "source_head": heads.role(s_role).shape[1],
             "target_layer": heads.role(t_role).shape[0], "target_head": heads.role(t_role).shape[1]}
    for name, value in (("source_layer", source_layer), ("source_head", source_head),
                        ("target_layer", target_layer), ("target_head", target_head)):
        size = sizes[name]
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < size:
            raise InvalidInput(f"{name} must be an integer position in [0, {size}), got {value!r}")
    # The two heads' bases only (from the role's cached bases when present).
    u_s, m_s = head_basis(heads, s_role, source_layer, source_head, rank=rank, rtol=rtol)
    u_t, m_t = head_basis(heads, t_role, target_layer, target_head, rank=rank, rtol=rtol)
    r_s, r_t = min(m_s, u_s.shape[-1]), min(m_t, u_t.shape[-1])
    u_s = u_s[:, :r_s].to(torch.float64)
    u_t = u_t[:, :r_t].to(torch.float64)
    overlap = u_s.transpose(0, 1) @ u_t
    if min(r_s, r_t) == 0:
        cosines = overlap.new_zeros(0)
    else:
        cosines = torch.linalg.svdvals(overlap).clamp(0.0, 1.0)
    pk = float(overlap.square().sum().clamp(0.0, float(min(r_s, r_t))))
    normalized = pk / math.sqrt(r_s * r_t) if r_s and r_t else 0.0
    return PairDetail(
        pairing=pairing, source_layer=source_layer, source_head=source_head,
        target_layer=target_layer, target_head=target_head, pk=pk, normalized=normalized,
        cosines=cosines, angles=torch.arccos(cosines), ranks=(r_s, r_t),
        layer_indices=tuple(heads.info.layer_indices),
    )


__all__ = ["BASES_FORMS", "DENSE_BASES_BYTES", "PairDetail", "all_pairings", "pair_detail", "parse_pairing", "projection_kernel"]
