"""Sums of squared overlaps ||X_s^T X_t||_F^2 between every pair of heads, batched.

With orthonormal bases this is the Projection Kernel, PK(U_s, U_t) = <P_s, P_t>_F with
P = U U^T; core.scores.composition_score uses the same sums for Composition Scores. Two exact formulas,
chosen by flop count:

* projector Gram (~d^2/2 per pair plus ~d^2 r/2 per head): P is symmetric, so <P_s, P_t> is a
  sum over its lower triangle with off-diagonal entries counted twice. Each 128-column band of
  the triangle, from its square diagonal block (counted once, whole) down, is one piece (cut
  shorter only when the step's memory budget asks for it). A piece is built for many heads by
  one batched product U[:, c] U[:, r]^T into a reused buffer (one row of features per head)
  and consumed at once, so no projector stack is ever stored: memory stays bounded at any
  model size. Roles used as a source are built for all their layers; roles used only as
  targets are built a few layers at a time (about _GROUP_ROWS heads) and multiplied right
  away, one product per source covering every target role and layer of the group (pairs the
  order drops are zeroed at the end). float32 partial sums are flushed to float64 every
  _FLUSH_FEATURES features. All products are plain torch (core.scores.gemm), on any device.
* overlap (~r_s r_t d per pair): ||U_s^T U_t||_F^2 from the [r_s, r_t] overlap matrices.

Only the head pairs ``order`` keeps are computed (see core.scores.layer_order): no lower-triangle work
for "forward".

Operands are either stacked bases X [L, H, d, r] or :class:`Factored` ones, X_h = A_h R_h^T with A
shared by groups of heads (grouped-query K/V weights, in their stored precision) and small
R [r, r] per head: a piece of X X^T is then A[c] (A[r] R^T R)^T, built from rows of A upcast
piece by piece, so X itself ([L, H, d, r] in the compute dtype) never exists on the Gram path.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from headgraph.core.errors import InvalidInput
from headgraph.core.scores.gemm import addmm_nt_, bmm_nt
from headgraph.core.scores.layer_order import (
    Rect,
    check_order,
    group_cover,
    group_rects,
    layer_blocks,
    layer_mask,
    rect_area,
)

# Projector pieces: bands _BLOCK wide, cut at most _HEIGHT tall from the diagonal down (fewer,
# larger products; measured on the GPT-2 shape, one thread).
_BLOCK = 128
_HEIGHT = 768
# Target-only roles are built for groups of layers holding about this many heads together.
_GROUP_ROWS = 96
# A source reading every target-only role multiplies a group's features in one product over
# a covering rectangle when it holds at most this many times the kept layer pairs.
_COVER_SLACK = 1.5
# Features summed in the input precision between float64 flushes.
_FLUSH_FEATURES = 65536
# Budget for the pieces of one step (all operands together); the block shrinks to fit it.
_WORK_BYTES = 128 * 1024 * 1024
# Largest temporary of one tile product in the overlap path (the overlap matrices).
_TILE_BYTES = 128 * 1024 * 1024

Product = tuple[str, str]  # (source name, target name)


@dataclass(frozen=True)
class Factored:
    """Bases X [L, H, d, r] given as factors, never formed on the projector-Gram path:
    X[l, h] = a[l, h // (H // Ha)] @ r[l, h]^T.

    a: [L, Ha, d, r] in any floating dtype (e.g. bf16 weights, read a piece at a time; Ha
    divides H, so grouped K/V weights are shared, not repeated); r: [L, H, r, r] in the
    compute dtype (float32 or float64), which sets the dtype of the result.
    """

    a: torch.Tensor
    r: torch.Tensor

    @property
    def shape(self) -> tuple[int, int, int, int]:
        L, H, w, _ = self.r.shape
        return L, H, self.a.shape[2], w

    @property
    def dtype(self) -> torch.dtype:
        return self.r.dtype

    @property
    def device(self) -> torch.device:
        return self.r.device

    def dense(self) -> torch.Tensor:
        """X [L, H, d, r] in r's dtype (the overlap path only; the Gram path never forms it)."""
        L, H, d, w = self.shape
        return _expand_heads(self.a.to(self.r.dtype), H).view(L, H, d, w) @ self.r.transpose(-2, -1)


def _expand_heads(a: torch.Tensor, heads: int) -> torch.Tensor:
    """a [n, Ha, rows, r] repeated to [n * heads, rows, r] (head h reads a[:, h // (heads // Ha)]);
    a view when Ha == heads."""
    n, ha, rows, w = a.shape
    if ha == heads:
        return a.reshape(n * heads, rows, w)
    if heads % ha:
        raise InvalidInput(f"{ha} shared factors cannot serve {heads} heads")
    return a.unsqueeze(2).expand(n, ha, heads // ha, rows, w).reshape(n * heads, rows, w)


@dataclass(frozen=True)
class Piece:
    """Projector block P[c0:c1, r0:r1] (c0 >= r0), held per head as one row of features
    (the block's rows one after another: feature f is P[c0 + f // width, r0 + f % width]).

    A piece starting on the diagonal (c0 == r0) holds the square diagonal block P[r0:r1, r0:r1]
    first (counted once: a whole symmetric square) and the rows below it after (counted twice,
    for their mirror image above the diagonal).
    """

    r0: int
    r1: int
    c0: int
    c1: int

    @property
    def features(self) -> int:
        return (self.r1 - self.r0) * (self.c1 - self.c0)

    @property
    def spans(self) -> tuple[tuple[int, int, float], ...]:
        """(first feature, stop, weight): <A, B>_F over the entries the piece stands for is
        sum weight * <A_piece[a:b], B_piece[a:b]> over the spans (at most two)."""
        square = (self.r1 - self.r0) ** 2 if self.c0 == self.r0 else 0
        spans = [(0, square, 1.0), (square, self.features, 2.0)]
        return tuple(s for s in spans if s[1] > s[0])


def piece_plan(d: int, block: int = _BLOCK, height: int | None = None) -> list[Piece]:
    """Pieces of a d x d symmetric matrix on or below the diagonal whose weighted span
    products sum to <A, B>_F. Columns come in bands of ``block``; each band's rows, from its
    diagonal block down, are cut into about equal pieces about ``height`` (>= block) tall, in
    whole multiples of ``block`` rows; the first piece holds the diagonal block."""
    block = max(1, min(block, d))
    height = max(block, _HEIGHT if height is None else height)
    plan = []
    for r0 in range(0, d, block):
        r1 = min(d, r0 + block)
        rows = d - r0
        per_piece = -(-rows // -(-rows // height))  # rows / ceil(rows / height), rounded up
        step = -(-per_piece // block) * block  # whole blocks: the first holds the diagonal square
        cuts = list(range(r0, d, step)) + [d]
        plan += [Piece(r0, r1, a, b) for a, b in zip(cuts, cuts[1:])]
    return plan


def _feature_rows(buf: torch.Tensor, rows: int, piece: Piece) -> torch.Tensor:
    """A [rows, piece.features] view of the front of a flat buffer (one row per head)."""
    return buf[:rows * piece.features].view(rows, piece.features)


def _addmm_piece(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, piece: Piece) -> None:
    """acc [M, N] += weighted <a, b> over the piece's features (a: [M, F], b: [N, F])."""
    for f0, f1, w in piece.spans:
        addmm_nt_(acc, a[:, f0:f1], b[:, f0:f1], w)


def _build(u: torch.Tensor, piece: Piece, out: torch.Tensor) -> None:
    """Features of one piece for every head of u [N, d, r] into out [N, features]: one batched
    product U[c0:c1] U[r0:r1]^T."""
    n = u.shape[0]
    bmm_nt(u[:, piece.c0:piece.c1], u[:, piece.r0:piece.r1],
           out=out.view(n, piece.c1 - piece.c0, piece.r1 - piece.r0))


@dataclass(frozen=True)
class _Operand:
    """One role's bases and the layer positions [lo, hi) it needs: stacked in the flat layout
    ``u`` [L * H, d, r], or factored (``a`` [L, Ha, d, r] and ``mid`` = R^T R [L * H, r, r])."""

    u: torch.Tensor | None
    heads: int
    lo: int
    hi: int
    a: torch.Tensor | None = None
    mid: torch.Tensor | None = None

    @property
    def ref(self) -> torch.Tensor:
        """The tensor that sets dtype and device of the work (bases, or the middle factors)."""
        out = self.u if self.u is not None else self.mid
        assert out is not None
        return out

    @property
    def d(self) -> int:
        return self.u.shape[1] if self.u is not None else self.a.shape[2]  # type: ignore[union-attr]

    @property
    def width(self) -> int:
        return self.ref.shape[-1]

    def build(self, a: int, b: int, piece: Piece, out: torch.Tensor) -> None:
        """Features of one piece for the heads of layers [a, b) into out [(b - a) * H, features]."""
        if self.u is not None:
            _build(self.u[a * self.heads:b * self.heads], piece, out)
            return
        assert self.a is not None and self.mid is not None
        dtype, h = self.mid.dtype, self.heads
        rows = self.a[a:b, :, piece.r0:piece.r1].to(dtype)
        right = torch.bmm(_expand_heads(rows, h), self.mid[a * h:b * h])  # A[r] R^T R
        cols = _expand_heads(self.a[a:b, :, piece.c0:piece.c1].to(dtype), h)
        bmm_nt(cols, right, out=out.view(cols.shape[0], piece.c1 - piece.c0, piece.r1 - piece.r0))


@dataclass(frozen=True)
class _Groups:
    """Target-only roles, built together a few layers at a time, layer-major: the rows of
    layer l are [role 1 heads, role 2 heads, ...], ``per_layer`` rows in all."""

    names: list[str]
    offsets: dict[str, int]  # first row of each role within a layer
    per_layer: int
    bounds: list[tuple[int, int]]

    @property
    def rows(self) -> int:
        """Rows of the largest group."""
        return max((g1 - g0 for g0, g1 in self.bounds), default=0) * self.per_layer


def _plan_groups(ops: dict[str, _Operand], names: list[str]) -> _Groups:
    offsets, per_layer = {}, 0
    for t in names:
        offsets[t] = per_layer
        per_layer += ops[t].heads
    if not names:
        return _Groups([], {}, 0, [])
    lo, hi = ops[names[0]].lo, ops[names[0]].hi  # target-only roles share one layer range
    size = max(1, round(_GROUP_ROWS / per_layer))
    return _Groups(names, offsets, per_layer, [(g, min(hi, g + size)) for g in range(lo, hi, size)])


def _gram_pass(ops: dict[str, _Operand], products: list[Product], order: str,
               out: dict[Product, torch.Tensor], work_bytes: int) -> None:
    """Accumulate <P_s, P_t> into out[(s, t)] [L * Hs, L * Ht] (float64) for every kept pair.

    Piece by piece: every source role's features are built once for all its layers (one batched
    product); target-only roles are built per group of layers and multiplied right away
    against every source that reads them (one product for all those roles when the source
    reads them all, into a "wide" accumulator [L * Hs, L * per_layer]).
    """
    sources = list(dict.fromkeys(s for s, _ in products))
    groups = _plan_groups(ops, [t for t in dict.fromkeys(t for _, t in products) if t not in sources])
    first = ops[sources[0]].ref
    d, dtype, device = ops[sources[0]].d, first.dtype, first.device
    n_layers = max(op.hi for op in ops.values())
    full_rows = {k: (ops[k].hi - ops[k].lo) * ops[k].heads for k in sources}
    per_feature = (sum(full_rows.values()) + groups.rows) * first.element_size()
    block = max(8, min(_BLOCK, math.isqrt(max(1, work_bytes // per_feature))))
    height = max(block, min(_HEIGHT, work_bytes // (per_feature * block)))
    plan = piece_plan(d, block, height)
    size = max(p.features for p in plan)
    fbuf = {k: torch.empty(n * size, dtype=dtype, device=device) for k, n in full_rows.items()}
    gbuf = torch.empty(groups.rows * size, dtype=dtype, device=device)
    acc = {st: torch.zeros_like(out[st], dtype=dtype) for st in products}
    wide = {s: torch.zeros(n_layers * ops[s].heads, n_layers * groups.per_layer, dtype=dtype,
                           device=device)
            for s in sources if groups.names and all((s, t) in acc for t in groups.names)}
    blocks = layer_blocks(n_layers, order)
    pending = 0
    for i, piece in enumerate(plan):
        feats = {}
        for s in sources:
            feats[s] = _feature_rows(fbuf[s], full_rows[s], piece)
            ops[s].build(ops[s].lo, ops[s].hi, piece, feats[s])
        for s, t in products:  # targets that are sources too: read their full features
            if t not in feats:
                continue
            hs, ht, ls, lt = ops[s].heads, ops[t].heads, ops[s].lo, ops[t].lo
            for sa, sb, ta, tb in blocks:
                sa, sb, ta, tb = max(sa, ls), min(sb, ops[s].hi), max(ta, lt), min(tb, ops[t].hi)
                if sa < sb and ta < tb:
                    _addmm_piece(acc[(s, t)][sa * hs:sb * hs, ta * ht:tb * ht],
                                 feats[s][(sa - ls) * hs:(sb - ls) * hs],
                                 feats[t][(ta - lt) * ht:(tb - lt) * ht], piece)
        for bounds in groups.bounds:
            _group_products(ops, order, piece, bounds, groups, feats, gbuf, wide, acc)
        pending += piece.features
        if pending >= _FLUSH_FEATURES or i + 1 == len(plan):
            for st in products:
                out[st].add_(acc[st])
                acc[st].zero_()
            for s, wacc in wide.items():
                rows = wacc.view(wacc.shape[0], n_layers, groups.per_layer)
                for t in groups.names:
                    ht, off = ops[t].heads, groups.offsets[t]
                    out[(s, t)].view(wacc.shape[0], n_layers, ht).add_(rows[:, :, off:off + ht])
                wacc.zero_()
            pending = 0
    if wide:  # covering products also summed pairs the order drops
        keep = layer_mask(tuple(range(n_layers)), order, device)
        for st in products:
            hs, ht = ops[st[0]].heads, ops[st[1]].heads
            out[st].view(n_layers, hs, n_layers, ht).mul_(keep[:, None, :, None])


def _group_products(ops: dict[str, _Operand], order: str, piece: Piece,
                    bounds: tuple[int, int], groups: _Groups, feats: dict[str, torch.Tensor],
                    gbuf: torch.Tensor, wide: dict[str, torch.Tensor],
                    acc: dict[Product, torch.Tensor]) -> None:
    """Build the target-only roles' features for layers [g0, g1) and add every source's
    products with them."""
    g0, g1 = bounds
    per = groups.per_layer
    flat = _feature_rows(gbuf, (g1 - g0) * per, piece)

    def rows(layer: int, t: str) -> torch.Tensor:  # role t's rows of one layer
        start = (layer - g0) * per + groups.offsets[t]
        return flat[start:start + ops[t].heads]

    for layer in range(g0, g1):
        for t in groups.names:
            ops[t].build(layer, layer + 1, piece, rows(layer, t))
    for s, fs in feats.items():
        hs, ls = ops[s].heads, ops[s].lo
        rects = group_rects(order, g0, g1, ls, ops[s].hi)
        cover = group_cover(order, g0, g1, ls, ops[s].hi)
        if s in wide and cover and rect_area([cover]) <= _COVER_SLACK * rect_area(rects):
            rects = [cover]  # one large product; the dropped pairs are zeroed at the end
        for sa, sb, ta, tb in rects:
            a = fs[(sa - ls) * hs:(sb - ls) * hs]
            if s in wide:
                _addmm_piece(wide[s][sa * hs:sb * hs, ta * per:tb * per], a,
                             flat[(ta - g0) * per:(tb - g0) * per], piece)
                continue
            for t in groups.names:  # a source reading only some of the roles
                if (s, t) not in acc:
                    continue
                ht = ops[t].heads
                for layer in range(ta, tb):
                    _addmm_piece(acc[(s, t)][sa * hs:sb * hs, layer * ht:(layer + 1) * ht],
                                 a, rows(layer, t), piece)


def _overlap_pass(src: torch.Tensor, tgt: torch.Tensor, hs: int, ht: int, blocks: list[Rect],
                  out: torch.Tensor) -> None:
    """Accumulate ||U_s^T U_t||_F^2 into out [L * Hs, L * Ht] from overlap matrices, tiled
    (src [L * Hs, d, rs], tgt [L * Ht, d, rt])."""
    ns, d, rs = src.shape
    nt, _, rt = tgt.shape
    t_all = tgt.permute(1, 0, 2).reshape(d, nt * rt)
    s_all = src.transpose(1, 2).reshape(ns * rs, d)
    for sa, sb, ta, tb in blocks:
        c0, c1 = ta * ht, tb * ht
        per_row = rs * (c1 - c0) * rt * src.element_size()
        step = max(1, _TILE_BYTES // max(1, per_row))
        for r0 in range(sa * hs, sb * hs, step):
            r1 = min(sb * hs, r0 + step)
            m = s_all[r0 * rs:r1 * rs] @ t_all[:, c0 * rt:c1 * rt]
            m = m.view(r1 - r0, rs, c1 - c0, rt)
            out[r0:r1, c0:c1] += m.square().sum(dim=(1, 3), dtype=torch.float64)


def _block_area(blocks: list[Rect], hs: int, ht: int) -> int:
    return sum((sb - sa) * hs * (tb - ta) * ht for sa, sb, ta, tb in blocks)


def sq_overlaps(
    bases: Mapping[str, torch.Tensor | Factored],
    products: Sequence[Product],
    *,
    order: str = "forward",
    method: str = "auto",
    work_bytes: int | None = None,
) -> dict[Product, torch.Tensor]:
    """||X_s^T X_t||_F^2 for all head pairs of several (source, target) products at once.

    bases: name -> [L, H_name, d, r_name] (same L, d, dtype), stacked or :class:`Factored`;
    products: (source name, target name) pairs. Returns float64 [L, Hs, L, Ht] per product;
    every pair ``order`` keeps is computed (the rest is 0). With orthonormal bases this is the
    Projection Kernel. The projector pieces of each name are built once and shared by all its
    products. method: "auto" (cheaper by flop count), "gram" or "overlap" (forms factored
    bases); work_bytes: budget for the pieces of one step (default 128 MiB; smaller values use
    smaller pieces, down to 8 x 8 blocks; factored operands add temporaries of about that
    size). Bases of different dtypes are promoted to a common one.
    """
    check_order(order)
    if method not in ("auto", "gram", "overlap"):
        raise InvalidInput(f"method must be one of ['auto', 'gram', 'overlap'], got {method!r}")
    products = list(dict.fromkeys(products))
    unknown = sorted({x for st in products for x in st} - set(bases))
    if not bases or unknown:
        raise InvalidInput(f"products name bases that were not given: {unknown or 'no bases'}")
    dtype = next(iter(bases.values())).dtype
    for v in bases.values():
        dtype = torch.promote_types(dtype, v.dtype)
    bases = {k: Factored(v.a, v.r.to(dtype)) if isinstance(v, Factored) else v.to(dtype)
             for k, v in bases.items()}
    shapes = {k: tuple(v.shape) for k, v in bases.items()}
    first = next(iter(shapes.values()))
    for shape in shapes.values():
        if len(shape) != 4 or shape[0] != first[0] or shape[2] != first[2]:
            raise InvalidInput(f"bases differ in L or d: {shapes}")
    L, d = first[0], first[2]
    device = next(iter(bases.values())).device
    out = {(s, t): torch.zeros(L * shapes[s][1], L * shapes[t][1], dtype=torch.float64,
                               device=device) for s, t in products}
    blocks = layer_blocks(L, order)
    if not blocks or not products:
        return {st: v.view(L, shapes[st[0]][1], L, shapes[st[1]][1]) for st, v in out.items()}
    s_lo, s_hi = min(b[0] for b in blocks), max(b[1] for b in blocks)
    t_lo, t_hi = min(b[2] for b in blocks), max(b[3] for b in blocks)
    ops: dict[str, _Operand] = {}
    for k in dict.fromkeys(x for st in products for x in st):
        is_s = any(s == k for s, _ in products)
        is_t = any(t == k for _, t in products)
        lo = min(s_lo if is_s else L, t_lo if is_t else L)
        hi = max(s_hi if is_s else 0, t_hi if is_t else 0)
        v, (_, h, _, w) = bases[k], shapes[k]
        if isinstance(v, Factored):
            mid = v.r.reshape(L * h, w, w)
            ops[k] = _Operand(None, h, lo, hi, a=v.a, mid=mid.transpose(1, 2) @ mid)
        else:
            ops[k] = _Operand(v.reshape(L * h, d, w), h, lo, hi)
    feats = sum(p.features for p in piece_plan(d))
    pairs = {(s, t): _block_area(blocks, ops[s].heads, ops[t].heads) for s, t in products}
    build = sum((op.hi - op.lo) * op.heads * op.width for op in ops.values()) * feats
    gram_cost = build + sum(pairs.values()) * feats
    overlap_cost = sum(n * ops[s].width * ops[t].width * d for (s, t), n in pairs.items())
    if (gram_cost < overlap_cost) if method == "auto" else method == "gram":
        _gram_pass(ops, products, order, out, _WORK_BYTES if work_bytes is None else work_bytes)
    else:
        dense = {}
        for k in ops:
            v = bases[k]
            dense[k] = (v.dense() if isinstance(v, Factored) else v).reshape(L * shapes[k][1], d, -1)
        for s, t in products:
            _overlap_pass(dense[s], dense[t], ops[s].heads, ops[t].heads, blocks, out[(s, t)])
    return {st: v.view(L, shapes[st[0]][1], L, shapes[st[1]][1]) for st, v in out.items()}


def pairwise_sq_overlap(
    source: torch.Tensor,
    target: torch.Tensor,
    *,
    order: str = "forward",
    method: str = "auto",
    work_bytes: int | None = None,
) -> torch.Tensor:
    """||X_s^T Y_t||_F^2 for all head pairs: source [L, Hs, d, rs], target [L, Ht, d, rt].

    Returns float64 [L, Hs, L, Ht] (pairs outside ``order`` are 0). One product of
    :func:`sq_overlaps`.
    """
    L, _hs, d, _rs = source.shape
    lt, _ht, dt, _rt = target.shape
    if lt != L or dt != d:
        raise InvalidInput(f"source {tuple(source.shape)} and target {tuple(target.shape)} differ in L or d")
    same = source is target or (source.data_ptr() == target.data_ptr() and source.shape == target.shape
                                and source.stride() == target.stride() and source.dtype == target.dtype)
    names = ("s", "s") if same else ("s", "t")
    bases = {"s": source} if same else {"s": source, "t": target}
    return sq_overlaps(bases, [names], order=order, method=method, work_bytes=work_bytes)[names]


__all__ = ["Factored", "Piece", "pairwise_sq_overlap", "piece_plan", "sq_overlaps"]
