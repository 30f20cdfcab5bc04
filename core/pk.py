"""Projection Kernel between every pair of heads' role subspaces, batched.

PK(U_s, U_t) = ||U_s^T U_t||_F^2 = <P_s, P_t>_F with P = U U^T (the sum of squared cosines of the
principal angles). Two exact formulas, chosen by cost:

* projector Gram: P is symmetric, so its upper triangle (by bands of rows, entries right of
  the diagonal band scaled by sqrt 2) is a vector of ~d^2/2 entries and all PKs of a tile are
  matrix products over those features (~d^2/2 per pair, plus ~d^2 r/2 per head to build P).
  Partial sums of chunks of <= 32768 features are added in float64, which keeps float32
  results within ~1e-6 of a float64 computation.
* overlap: ||U_s^T U_t||_F^2 from the [r_s, r_t] overlap matrices, ~r_s r_t d per pair.

Both are tiled by source layers (only forward blocks for ``order="forward"``) and by projector
feature chunks, so memory stays bounded whatever the model size: features built on the fly
are streamed within a 768 MiB working set, and per-role stacks are cached only when small
(<= 512 MiB each, <= 1 GiB per HeadWeights).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Hashable

import torch

from headgraph.core.subspaces import effective_ranks, role_bases
from headgraph.core.types import LAYER_ORDERS, ROLES, HeadWeights, PairScores

# A projector stack is cached in heads._cache only when it is at most this big ...
_CACHE_STACK_BYTES = 512 * 1024 * 1024
# ... and all cached stacks of one HeadWeights stay under this.
_CACHE_TOTAL_BYTES = 1024 * 1024 * 1024
# Working set for projector blocks built on the fly (streamed when a stack is larger).
_WORK_BYTES = 768 * 1024 * 1024
# Largest temporary of one tile product in the overlap path (the overlap matrices).
_TILE_BYTES = 128 * 1024 * 1024
# Target rows (source heads) per tile: smaller tiles skip more non-forward pairs, larger
# tiles make better matrix products.
_TILE_ROWS = 64
# Projector rows per feature band, and entries per float32-summed feature chunk.
_BAND = 32
_CHUNK_ELEMS = 32768
_SQRT2 = math.sqrt(2.0)


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


def _tiles(n_layers: int, order: str, heads_per_layer: int) -> list[tuple[int, int, int, int]]:
    """(source layer start, stop, target layer start, stop) tiles covering ``order``'s pairs."""
    step = max(1, min(n_layers, _TILE_ROWS // max(1, heads_per_layer)))
    tiles = []
    for a in range(0, n_layers, step):
        b = min(n_layers, a + step)
        if order == "forward":
            if a + 1 < n_layers:
                tiles.append((a, b, a + 1, n_layers))
        elif order == "same-layer":
            tiles.append((a, b, a, b))
        else:
            tiles.append((a, b, 0, n_layers))
    return tiles


def _chunk_plan(d: int) -> list[tuple[int, int, int, int]]:
    """Feature chunks (row start, row stop, col start, col stop) of the upper triangle of a
    d x d projector: rows in bands of _BAND, columns from the band's diagonal on, each chunk at
    most _CHUNK_ELEMS entries (its products are summed in float32, chunks in float64)."""
    width = max(_BAND, _CHUNK_ELEMS // _BAND)
    plan = []
    for r0 in range(0, d, _BAND):
        r1 = min(d, r0 + _BAND)
        for c0 in range(r0, d, width):
            plan.append((r0, r1, c0, min(d, c0 + width)))
    return plan


def _transposed(x: torch.Tensor) -> torch.Tensor:
    """x^T per head [N, r, d]: a contiguous copy (faster right operands) when it is small."""
    if x.numel() * x.element_size() <= _WORK_BYTES // 4:
        return x.transpose(1, 2).contiguous()
    return x.transpose(1, 2)


def _build_chunks(x: torch.Tensor, plan: list[tuple[int, int, int, int]],
                  xt: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Projector features of every head: x [N, d, r] -> one [N, rows*cols] tensor per chunk.

    Chunk entries are those of P = x x^T, times sqrt 2 right of the diagonal band, so that the
    dot products of two heads' features sum to <P_s, P_t>_F. ``xt``: x^T [N, r, d], if at hand.
    """
    out = []
    xt = _transposed(x) if xt is None else xt
    for r0, r1, c0, c1 in plan:
        block = torch.matmul(x[:, r0:r1], xt[:, :, c0:c1])
        if c0 >= r1:
            block.mul_(_SQRT2)
        elif c1 > r1:
            block[:, :, r1 - c0:].mul_(_SQRT2)
        out.append(block.reshape(x.shape[0], -1))
    return out


def _chunk_bytes(chunks: Any) -> int:
    if isinstance(chunks, torch.Tensor):
        return chunks.numel() * chunks.element_size()
    if isinstance(chunks, (list, tuple)):
        return sum(_chunk_bytes(c) for c in chunks)
    return 0


def _cached_bytes(cache: dict[Any, Any]) -> int:
    return sum(_chunk_bytes(v) for k, v in cache.items() if isinstance(k, tuple) and k and k[0] == "stack")


def _stack(x: torch.Tensor, cache: dict[Any, Any] | None, key: Hashable | None,
           plan: list[tuple[int, int, int, int]]) -> list[torch.Tensor] | None:
    """Whole projector feature stack of x from the cache, or built and cached when small enough."""
    nbytes = x.shape[0] * sum((r1 - r0) * (c1 - c0) for r0, r1, c0, c1 in plan) * x.element_size()
    if cache is None or key is None or nbytes > _CACHE_STACK_BYTES:
        return None
    full_key = ("stack", key)
    hit = cache.get(full_key)
    if hit is not None:
        return hit
    if _cached_bytes(cache) + nbytes > _CACHE_TOTAL_BYTES:
        return None
    stack = _build_chunks(x, plan)
    cache[full_key] = stack
    return stack


def _is_cached(cache: dict[Any, Any] | None, key: Hashable | None) -> bool:
    return cache is not None and key is not None and ("stack", key) in cache


def _gram_path(src: torch.Tensor, tgt: torch.Tensor, tiles: list[tuple[int, int, int, int]],
               hs: int, ht: int, out: torch.Tensor, cache: dict[Any, Any] | None,
               source_key: Hashable | None, target_key: Hashable | None, work_bytes: int) -> None:
    """Accumulate <P_s, P_t> into out [Ns, Nt] (float64) via projector-feature products."""
    plan = _chunk_plan(src.shape[1])
    same = source_key is not None and source_key == target_key
    s_stack = _stack(src, cache, source_key, plan)
    t_stack = s_stack if same else _stack(tgt, cache, target_key, plan)
    heads_built = (0 if s_stack is not None else src.shape[0]) + (
        0 if (t_stack is not None or same) else tgt.shape[0])
    src_t = tgt_t = None
    start = 0
    while start < len(plan):
        # Group chunks so the features built on the fly fit in the working budget.
        stop, used = start, 0
        while stop < len(plan):
            r0, r1, c0, c1 = plan[stop]
            size = heads_built * (r1 - r0) * (c1 - c0) * src.element_size()
            if stop > start and used + size > work_bytes:
                break
            used += size
            stop += 1
        sel = plan[start:stop]
        if s_stack is not None:
            s_ch = s_stack[start:stop]
        else:
            src_t = _transposed(src) if src_t is None else src_t
            s_ch = _build_chunks(src, sel, src_t)
        if t_stack is not None:
            t_ch = t_stack[start:stop]
        elif same:
            t_ch = s_ch
        else:
            tgt_t = _transposed(tgt) if tgt_t is None else tgt_t
            t_ch = _build_chunks(tgt, sel, tgt_t)
        for sa, sb, ta, tb in tiles:
            rows = slice(sa * hs, sb * hs)
            cols = slice(ta * ht, tb * ht)
            for a, b in zip(s_ch, t_ch):
                out[rows, cols] += a[rows] @ b[cols].transpose(0, 1)
        start = stop


def _overlap_path(src: torch.Tensor, tgt: torch.Tensor, tiles: list[tuple[int, int, int, int]],
                  hs: int, ht: int, out: torch.Tensor) -> None:
    """Accumulate ||U_s^T U_t||_F^2 into out [Ns, Nt] from overlap matrices, tiled."""
    ns, d, rs = src.shape
    nt, _, rt = tgt.shape
    t_all = tgt.permute(1, 0, 2).reshape(d, nt * rt)
    s_all = src.transpose(1, 2).reshape(ns * rs, d)
    for sa, sb, ta, tb in tiles:
        c0, c1 = ta * ht, tb * ht
        per_row = rs * (c1 - c0) * rt * src.element_size()
        step = max(1, _TILE_BYTES // max(1, per_row))
        for r0 in range(sa * hs, sb * hs, step):
            r1 = min(sb * hs, r0 + step)
            m = s_all[r0 * rs:r1 * rs] @ t_all[:, c0 * rt:c1 * rt]
            m = m.view(r1 - r0, rs, c1 - c0, rt)
            out[r0:r1, c0:c1] += m.square().sum(dim=(1, 3), dtype=torch.float64)


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

    Returns float64 [L, Hs, L, Ht]. Every pair ``order`` keeps is computed (some others inside
    a tile may be too; callers mask). With orthonormal bases this is the Projection Kernel;
    core.composition uses it for Composition Scores. ``cache``/keys let projector stacks of a
    role be reused across pairings. method: "auto" (cheaper by flop count), "gram" or
    "overlap"; work_bytes: budget for projector features built on the fly (default 768 MiB).
    """
    check_order(order)
    if method not in ("auto", "gram", "overlap"):
        raise ValueError(f"method must be one of ['auto', 'gram', 'overlap'], got {method!r}")
    L, hs, d, rs = source.shape
    lt, ht, dt, rt = target.shape
    if lt != L or dt != d:
        raise ValueError(f"source {tuple(source.shape)} and target {tuple(target.shape)} differ in L or d")
    src = source.reshape(L * hs, d, rs)
    tgt = target.reshape(L * ht, d, rt)
    out = torch.zeros(L * hs, L * ht, dtype=torch.float64, device=source.device)
    tiles = _tiles(L, order, hs)
    area = sum((sb - sa) * hs * (tb - ta) * ht for sa, sb, ta, tb in tiles)
    if area == 0:
        return out.view(L, hs, L, ht)
    feats = sum((r1 - r0) * (c1 - c0) for r0, r1, c0, c1 in _chunk_plan(d))
    build = feats * (0 if _is_cached(cache, source_key) else src.shape[0] * rs)
    if not (source_key is not None and source_key == target_key):
        build += feats * (0 if _is_cached(cache, target_key) else tgt.shape[0] * rt)
    gram_cost = build + area * feats
    overlap_cost = area * rs * rt * d
    use_gram = gram_cost < overlap_cost if method == "auto" else method == "gram"
    if use_gram:
        _gram_path(src, tgt, tiles, hs, ht, out, cache, source_key, target_key,
                   _WORK_BYTES if work_bytes is None else work_bytes)
    else:
        _overlap_path(src, tgt, tiles, hs, ht, out)
    return out.view(L, hs, L, ht)


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
    zero-rank head are invalid and hold 0. Cached in ``heads._cache``.
    """
    s_role, t_role = parse_pairing(pairing)
    check_order(order)
    key = ("pk", pairing, order, rank, rtol)
    hit = heads._cache.get(key)
    if hit is not None:
        return hit
    sb = role_bases(heads, s_role, rank=rank, rtol=rtol)
    tb = role_bases(heads, t_role, rank=rank, rtol=rtol)
    sq = pairwise_sq_overlap(
        sb.U, tb.U, order=order, cache=heads._cache,
        source_key=("projectors", s_role, rank, rtol), target_key=("projectors", t_role, rank, rtol),
    )
    rs = effective_ranks(sb).to(torch.float64)
    rt = effective_ranks(tb).to(torch.float64)
    bound = torch.minimum(rs[:, :, None, None], rt[None, None])
    scores = torch.minimum(sq.clamp(min=0.0), bound)
    device = sq.device
    valid = (layer_mask(heads.info.layer_indices, order, device)[:, None, :, None]
             & (rs > 0)[:, :, None, None] & (rt > 0)[None, None])
    denom = torch.sqrt(rs[:, :, None, None] * rt[None, None]).clamp(min=1.0)
    out_dtype = sb.U.dtype
    normalized = torch.where(valid, scores / denom, 0.0).to(out_dtype)
    scores = torch.where(valid, scores, 0.0).to(out_dtype)
    result = PairScores(
        kind="pk", pairing=pairing, source_role=s_role, target_role=t_role,
        scores=scores, normalized=normalized, valid=valid,
        layer_indices=tuple(heads.info.layer_indices), order=order,
        source_ranks=sb.ranks, target_ranks=tb.ranks, source_rank=sb.rank, target_rank=tb.rank,
    )
    heads._cache[key] = result
    return result


def all_pairings(
    heads: HeadWeights,
    *,
    order: str = "forward",
    pairings: list[str] | None = None,
    rank: int | None = None,
    rtol: float | None = None,
) -> dict[str, PairScores]:
    """PK for several pairings (default: all 16 of QKVO x QKVO); bases/projectors are reused."""
    if pairings is None:
        pairings = [a + b for a in ROLES for b in ROLES]
    for p in pairings:
        parse_pairing(p)
    check_order(order)
    return {p: projection_kernel(heads, p, order=order, rank=rank, rtol=rtol) for p in pairings}


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
    "PairDetail", "all_pairings", "check_order", "layer_mask", "pair_detail",
    "pairwise_sq_overlap", "parse_pairing", "projection_kernel",
]
