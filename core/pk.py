"""Projection Kernel between every pair of heads' role subspaces, batched.

PK(U_s, U_t) = ||U_s^T U_t||_F^2 = <P_s, P_t>_F with P = U U^T (the sum of squared cosines of the
principal angles). Two exact formulas, chosen by flop count:

* projector Gram (~d^2/2 per pair plus ~d^2 r/2 per head): P is symmetric, so <P_s, P_t> is a
  sum over its lower triangle with off-diagonal entries counted twice. The triangle is cut into
  pieces: 64 x 64 diagonal blocks (weight 1; both halves kept, cheaper than cutting them) and
  blocks of up to 128 x 64 below them (weight 2). A piece is built for every head of a role by
  one batched product U[:, c] U[:, b]^T into a reused buffer and consumed at once by the
  source x target products of every pairing that uses the role, so no projector stack is
  stored (memory stays bounded at any model size, and no page of it is ever faulted in).
  Products are summed in the input precision for 8 pieces (<= 65536 features), then in float64.
* overlap (~r_s r_t d per pair): ||U_s^T U_t||_F^2 from the [r_s, r_t] overlap matrices.

Only the head pairs ``order`` keeps are computed: for "forward" the strictly upper (by layer)
triangle is covered exactly by recursively halving the layer range (one rectangle
earlier-half x later-half per level), so no lower-triangle work is done. Several pairings
(e.g. OQ, OK, OV through ``all_pairings``) are computed in one pass that builds each role's
pieces once, for just the layers the pairings use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Hashable, Sequence

import torch

from headgraph.core.subspaces import effective_ranks, role_bases
from headgraph.core.types import LAYER_ORDERS, ROLES, HeadWeights, PairScores

# Projector pieces: diagonal blocks _BLOCK x _BLOCK, blocks below them _HEIGHT x _BLOCK, small
# enough that the pieces of every operand stay in cache between being built and multiplied.
_BLOCK = 64
_HEIGHT = 128
# Pieces summed in the input precision between float64 flushes (<= 8 * 8192 features).
_FLUSH_PIECES = 8
# Budget for the pieces of one step (all operands together); the block shrinks to fit it.
_WORK_BYTES = 64 * 1024 * 1024
# Largest temporary of one tile product in the overlap path (the overlap matrices).
_TILE_BYTES = 128 * 1024 * 1024


def parse_pairing(pairing: str) -> tuple[str, str]:
    """Split a pairing like "OK" into (source role, target role); ValueError listing allowed values."""
    if not isinstance(pairing, str) or len(pairing) != 2 or any(c not in ROLES for c in pairing):
        allowed = [a + b for a in ROLES for b in ROLES]
        raise ValueError(
            f"pairing must be two letters from {''.join(ROLES)} (source then target), "
            f"one of {allowed}; got {pairing!r}"
        )
    return pairing[0], pairing[1]


def check_order(order: str) -> str:
    """Validate a layer order; ValueError listing the allowed values otherwise."""
    if order not in LAYER_ORDERS:
        raise ValueError(f"order must be one of {list(LAYER_ORDERS)}, got {order!r}")
    return order


def layer_mask(layer_indices: tuple[int, ...], order: str, device: torch.device) -> torch.Tensor:
    """[L, L] bool: which (source layer, target layer) positions ``order`` keeps.

    forward: strictly earlier -> later block; same-layer: equal blocks; all: every pair.
    """
    check_order(order)
    idx = torch.tensor(layer_indices, device=device)
    if order == "forward":
        return idx[:, None] < idx[None, :]
    if order == "same-layer":
        return idx[:, None] == idx[None, :]
    return torch.ones(len(idx), len(idx), dtype=torch.bool, device=device)


def _forward_blocks(lo: int, hi: int) -> list[tuple[int, int, int, int]]:
    """Rectangles (source start, stop, target start, stop) covering exactly the position pairs
    i < j in [lo, hi): earlier half x later half, then both halves recursively."""
    if hi - lo < 2:
        return []
    mid = (lo + hi) // 2
    return [(lo, mid, mid, hi)] + _forward_blocks(lo, mid) + _forward_blocks(mid, hi)


def layer_blocks(n_layers: int, order: str) -> list[tuple[int, int, int, int]]:
    """Layer-position rectangles (source start, stop, target start, stop) that ``order`` needs.

    Positions are assumed to follow the model's layer order (true for stacked HeadWeights).
    """
    check_order(order)
    if order == "forward":
        return _forward_blocks(0, n_layers)
    if order == "same-layer":
        return [(i, i + 1, i, i + 1) for i in range(n_layers)]
    return [(0, n_layers, 0, n_layers)] if n_layers else []


@dataclass(frozen=True)
class _Piece:
    """Projector block P[c0:c1, r0:r1] (c0 >= r0), counted once on the diagonal, else twice."""

    r0: int
    r1: int
    c0: int
    c1: int

    @property
    def features(self) -> int:
        return (self.r1 - self.r0) * (self.c1 - self.c0)

    @property
    def weight(self) -> float:
        return 1.0 if self.c0 == self.r0 else 2.0


def piece_plan(d: int, block: int = _BLOCK, height: int | None = None) -> list[_Piece]:
    """Blocks of a d x d symmetric matrix on or below the diagonal: sum_piece weight * <a, b>
    over them equals <A, B>_F. Diagonal blocks are block x block (both halves kept: cheaper
    than cutting them); those below span ``height`` rows (default: block) of one column band."""
    block = max(1, min(block, d))
    height = block if height is None else max(1, height)
    edges = [(i, min(d, i + block)) for i in range(0, d, block)]
    plan = [_Piece(r0, r1, r0, r1) for r0, r1 in edges]
    for r0, r1 in edges:  # row ranges on a common grid of ``height``
        plan += [_Piece(r0, r1, max(r1, g), min(d, g + height))
                 for g in range(0, d, height) if g + height > r1]
    # Row-range major: consecutive pieces share U[:, c0:c1] of every head (kept in cache).
    return sorted(plan, key=lambda p: (p.c1, p.r0))


def _build_piece(u: torch.Tensor, piece: _Piece, out: torch.Tensor) -> None:
    """Features of one piece for every head of u [N, d, r] into out [N, features]."""
    torch.bmm(u[:, piece.c0:piece.c1], u[:, piece.r0:piece.r1].transpose(1, 2),
              out=out.view(u.shape[0], piece.c1 - piece.c0, piece.r1 - piece.r0))


@dataclass(frozen=True)
class _Operand:
    """One role's bases in the flat layout [L * H, d, r] and the layer positions [lo, hi) it needs."""

    u: torch.Tensor
    heads: int
    lo: int
    hi: int


def _gram_pass(ops: dict[Hashable, _Operand], products: list[tuple[Hashable, Hashable]],
               blocks: list[tuple[int, int, int, int]], out: dict[tuple[Hashable, Hashable], torch.Tensor],
               work_bytes: int) -> None:
    """Accumulate <P_s, P_t> into out[(s, t)] [L * Hs, L * Ht] (float64) for every block pair.

    Piece by piece: each operand's features are built once (all its heads in one batched
    product) and used by every product it is part of; float32 partial sums are flushed to
    float64 every _FLUSH_PIECES pieces.
    """
    first = next(iter(ops.values())).u
    d, dtype, device = first.shape[1], first.dtype, first.device
    rows = {k: (op.hi - op.lo) * op.heads for k, op in ops.items()}
    per_feature = sum(rows.values()) * first.element_size()
    block = max(8, min(_BLOCK, math.isqrt(max(1, work_bytes // per_feature))))
    height = max(block, min(_HEIGHT, work_bytes // (per_feature * block)))
    plan = piece_plan(d, block, height)
    size = max(p.features for p in plan)
    bufs = {k: torch.empty(n * size, dtype=dtype, device=device) for k, n in rows.items()}
    acc = {st: torch.zeros_like(out[st], dtype=dtype) for st in products}
    for i, piece in enumerate(plan):
        k = piece.features
        feats = {}
        for name, op in ops.items():
            feats[name] = bufs[name][:rows[name] * k].view(rows[name], k)
            _build_piece(op.u[op.lo * op.heads:op.hi * op.heads], piece, feats[name])
        for s, t in products:
            fs, ft, hs, ht = feats[s], feats[t], ops[s].heads, ops[t].heads
            ls, lt = ops[s].lo, ops[t].lo
            for sa, sb, ta, tb in blocks:
                acc[(s, t)][sa * hs:sb * hs, ta * ht:tb * ht].addmm_(
                    fs[(sa - ls) * hs:(sb - ls) * hs], ft[(ta - lt) * ht:(tb - lt) * ht].transpose(0, 1),
                    alpha=piece.weight)
        if (i + 1) % _FLUSH_PIECES == 0 or i + 1 == len(plan):
            for st in products:
                out[st].add_(acc[st])
                acc[st].zero_()


def _overlap_pass(src: _Operand, tgt: _Operand, blocks: list[tuple[int, int, int, int]],
                  out: torch.Tensor) -> None:
    """Accumulate ||U_s^T U_t||_F^2 into out [L * Hs, L * Ht] from overlap matrices, tiled."""
    ns, d, rs = src.u.shape
    nt, _, rt = tgt.u.shape
    hs, ht = src.heads, tgt.heads
    t_all = tgt.u.permute(1, 0, 2).reshape(d, nt * rt)
    s_all = src.u.transpose(1, 2).reshape(ns * rs, d)
    for sa, sb, ta, tb in blocks:
        c0, c1 = ta * ht, tb * ht
        per_row = rs * (c1 - c0) * rt * src.u.element_size()
        step = max(1, _TILE_BYTES // max(1, per_row))
        for r0 in range(sa * hs, sb * hs, step):
            r1 = min(sb * hs, r0 + step)
            m = s_all[r0 * rs:r1 * rs] @ t_all[:, c0 * rt:c1 * rt]
            m = m.view(r1 - r0, rs, c1 - c0, rt)
            out[r0:r1, c0:c1] += m.square().sum(dim=(1, 3), dtype=torch.float64)


def _block_area(blocks: list[tuple[int, int, int, int]], hs: int, ht: int) -> int:
    return sum((sb - sa) * hs * (tb - ta) * ht for sa, sb, ta, tb in blocks)


def sq_overlaps(
    bases: dict[Hashable, torch.Tensor],
    products: Sequence[tuple[Hashable, Hashable]],
    *,
    order: str = "forward",
    method: str = "auto",
    work_bytes: int | None = None,
) -> dict[tuple[Hashable, Hashable], torch.Tensor]:
    """||X_s^T X_t||_F^2 for all head pairs of several (source, target) products at once.

    bases: name -> [L, H_name, d, r_name] (same L, d, dtype); products: (source name, target
    name) pairs. Returns float64 [L, Hs, L, Ht] per product; every pair ``order`` keeps is
    computed (the rest is 0). With orthonormal bases this is the Projection Kernel. The
    projector pieces of each name are built once and shared by all its products. method:
    "auto" (cheaper by flop count), "gram" or "overlap"; work_bytes: budget for the pieces of
    one step (default 64 MiB; smaller values use smaller pieces, down to 8 x 8 blocks).
    Bases of different dtypes are promoted to a common one.
    """
    check_order(order)
    if method not in ("auto", "gram", "overlap"):
        raise ValueError(f"method must be one of ['auto', 'gram', 'overlap'], got {method!r}")
    products = list(dict.fromkeys(products))
    dtype = next(iter(bases.values())).dtype
    for v in bases.values():
        dtype = torch.promote_types(dtype, v.dtype)
    bases = {k: v.to(dtype) for k, v in bases.items()}
    shapes = {k: tuple(v.shape) for k, v in bases.items()}
    first = next(iter(shapes.values()))
    for shape in shapes.values():
        if len(shape) != 4 or shape[0] != first[0] or shape[2] != first[2]:
            raise ValueError(f"bases differ in L or d: {shapes}")
    L, d = first[0], first[2]
    out = {(s, t): torch.zeros(L * shapes[s][1], L * shapes[t][1], dtype=torch.float64,
                               device=bases[s].device) for s, t in products}
    blocks = layer_blocks(L, order)
    if not blocks or not products:
        return {st: v.view(L, shapes[st[0]][1], L, shapes[st[1]][1]) for st, v in out.items()}
    s_lo, s_hi = min(b[0] for b in blocks), max(b[1] for b in blocks)
    t_lo, t_hi = min(b[2] for b in blocks), max(b[3] for b in blocks)
    ops: dict[Hashable, _Operand] = {}
    for k in dict.fromkeys(x for st in products for x in st):
        is_s = any(s == k for s, _ in products)
        is_t = any(t == k for _, t in products)
        lo = min(s_lo if is_s else L, t_lo if is_t else L)
        hi = max(s_hi if is_s else 0, t_hi if is_t else 0)
        ops[k] = _Operand(bases[k].reshape(L * shapes[k][1], d, shapes[k][3]), shapes[k][1], lo, hi)
    feats = sum(p.features for p in piece_plan(d))
    pairs = {(s, t): _block_area(blocks, ops[s].heads, ops[t].heads) for s, t in products}
    build = sum((op.hi - op.lo) * op.heads * op.u.shape[-1] for op in ops.values()) * feats
    gram_cost = build + sum(pairs.values()) * feats
    overlap_cost = sum(n * ops[s].u.shape[-1] * ops[t].u.shape[-1] * d for (s, t), n in pairs.items())
    if (gram_cost < overlap_cost) if method == "auto" else method == "gram":
        _gram_pass(ops, products, blocks, out, _WORK_BYTES if work_bytes is None else work_bytes)
    else:
        for s, t in products:
            _overlap_pass(ops[s], ops[t], blocks, out[(s, t)])
    return {st: v.view(L, shapes[st[0]][1], L, shapes[st[1]][1]) for st, v in out.items()}


def pairwise_sq_overlap(
    source: torch.Tensor,
    target: torch.Tensor,
    *,
    order: str = "forward",
    cache: dict[Any, Any] | None = None,
    source_key: Hashable | None = None,
    target_key: Hashable | None = None,
    method: str = "auto",
    work_bytes: int | None = None,
) -> torch.Tensor:
    """||X_s^T Y_t||_F^2 for all head pairs: source [L, Hs, d, rs], target [L, Ht, d, rt].

    Returns float64 [L, Hs, L, Ht] (pairs outside ``order`` are 0). One product of
    :func:`sq_overlaps`; core.composition uses it for Composition Scores. ``cache`` and the
    keys are accepted for compatibility and unused: projector pieces are streamed, never
    stored (a stored stack holds d^2/2 floats per head that must be faulted in and read back).
    """
    del cache, source_key, target_key
    L, hs, d, rs = source.shape
    lt, ht, dt, rt = target.shape
    if lt != L or dt != d:
        raise ValueError(f"source {tuple(source.shape)} and target {tuple(target.shape)} differ in L or d")
    same = source is target or (source.data_ptr() == target.data_ptr() and source.shape == target.shape
                                and source.stride() == target.stride() and source.dtype == target.dtype)
    names = ("s", "s") if same else ("s", "t")
    bases = {"s": source} if same else {"s": source, "t": target}
    return sq_overlaps(bases, [names], order=order, method=method, work_bytes=work_bytes)[names]


def _pk_results(heads: HeadWeights, pairings: list[str], order: str, rank: int | None,
                rtol: float | None) -> dict[str, PairScores]:
    """PairScores of several pairings from one shared pass (bases and projectors built once)."""
    roles = list(dict.fromkeys(r for p in pairings for r in parse_pairing(p)))
    bases = {r: role_bases(heads, r, rank=rank, rtol=rtol) for r in roles}
    idx = heads.info.layer_indices
    # Blocks follow positions; should positions not follow the layer order, compute all pairs.
    monotone = all(a < b for a, b in zip(idx, idx[1:]))
    sq = sq_overlaps({r: b.U for r, b in bases.items()}, [parse_pairing(p) for p in pairings],
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
        out_dtype = sb.U.dtype
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
) -> dict[str, PairScores]:
    """PK for several pairings (default: all 16 of QKVO x QKVO), computed together in one pass
    (each role's bases and projector pieces built once); results are cached per pairing."""
    if pairings is None:
        pairings = [a + b for a in ROLES for b in ROLES]
    for p in pairings:
        parse_pairing(p)
    check_order(order)
    missing = [p for p in dict.fromkeys(pairings) if ("pk", p, order, rank, rtol) not in heads._cache]
    if missing:
        for p, res in _pk_results(heads, missing, order, rank, rtol).items():
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
            "source": f"L{self.layer_indices[self.source_layer]}H{self.source_head}",
            "target": f"L{self.layer_indices[self.target_layer]}H{self.target_head}",
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
    sb = role_bases(heads, s_role, rank=rank, rtol=rtol)
    tb = role_bases(heads, t_role, rank=rank, rtol=rtol)
    for name, value, size in (
        ("source_layer", source_layer, sb.U.shape[0]), ("source_head", source_head, sb.U.shape[1]),
        ("target_layer", target_layer, tb.U.shape[0]), ("target_head", target_head, tb.U.shape[1]),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < size:
            raise ValueError(f"{name} must be an integer position in [0, {size}), got {value!r}")
    r_s = int(effective_ranks(sb)[source_layer, source_head])
    r_t = int(effective_ranks(tb)[target_layer, target_head])
    u_s = sb.U[source_layer, source_head, :, :r_s].to(torch.float64)
    u_t = tb.U[target_layer, target_head, :, :r_t].to(torch.float64)
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


__all__ = [
    "PairDetail", "all_pairings", "check_order", "layer_blocks", "layer_mask", "pair_detail",
    "pairwise_sq_overlap", "parse_pairing", "piece_plan", "projection_kernel", "sq_overlaps",
]
