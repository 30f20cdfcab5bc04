"""Top pairs, Spearman correlation and PK-vs-CS comparison, as pure tensor operations.

Ties are broken deterministically: score descending, then source layer, source head, target
layer, target head ascending (the row-major order of the [Ls, Hs, Lt, Ht] grid, kept by a
stable sort).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from headgraph.core.errors import InvalidInput
from headgraph.core.names import head_label
from headgraph.core.types import PairScores


@dataclass(frozen=True)
class TopPairs:
    """The k best valid pairs of a grid, best first; all tensors [k] (positions, not blocks)."""

    source_layer: torch.Tensor
    source_head: torch.Tensor
    target_layer: torch.Tensor
    target_head: torch.Tensor
    score: torch.Tensor  # raw score (PK or CS) of each pair
    normalized: torch.Tensor
    value: torch.Tensor  # the value ranked by (score, normalized or the explicit values)
    layer_indices: tuple[int, ...]
    kind: str = "pk"
    pairing: str = ""
    metric: str = "pk"

    def __len__(self) -> int:
        return int(self.score.numel())

    def flat_index(self, shape: tuple[int, ...]) -> torch.Tensor:
        """Indices of the pairs in a flattened grid of ``shape`` [Ls, Hs, Lt, Ht]."""
        _, hs, lt, ht = shape
        return ((self.source_layer * hs + self.source_head) * lt + self.target_layer) * ht + self.target_head

    def to_records(self, extra: dict[str, torch.Tensor] | None = None) -> list[dict[str, Any]]:
        """[{"source": "L{block}H{h}", "target": ..., "pk" (or "cs"): ..., "normalized": ...,
        "value": ..., "rank": i, ...}] with original block numbers; ``extra`` grids (same shape
        as the scored grid) add one key each, read at the selected pairs."""
        idx = [t.tolist() for t in (self.source_layer, self.source_head, self.target_layer, self.target_head)]
        cols: dict[str, list[float]] = {
            self.kind: self.score.tolist(),
            "normalized": self.normalized.tolist(),
            "value": self.value.tolist(),
        }
        for name, grid in (extra or {}).items():
            sel = grid[self.source_layer, self.source_head, self.target_layer, self.target_head]
            cols[name] = sel.tolist()
        records = []
        for i, (sl, sh, tl, th) in enumerate(zip(*idx)):
            rec: dict[str, Any] = {
                "rank": i + 1,
                "source": head_label(self.layer_indices[sl], sh),
                "target": head_label(self.layer_indices[tl], th),
                "source_layer": self.layer_indices[sl], "source_head": sh,
                "target_layer": self.layer_indices[tl], "target_head": th,
            }
            for name, values in cols.items():
                rec[name] = values[i]
            records.append(rec)
        return records


def _ranking_order(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Flat indices of valid, non-NaN cells, best first with row-major tie order."""
    flat = values.reshape(-1)
    ok = valid.reshape(-1) & ~torch.isnan(flat)
    cand = torch.nonzero(ok).flatten()  # ascending flat index
    order = torch.sort(flat[cand], descending=True, stable=True).indices
    return cand[order]


def top_pairs(
    result: PairScores, k: int = 20, *, metric: str = "pk", values: torch.Tensor | None = None
) -> TopPairs:
    """The ``k`` highest-ranked valid pairs (all valid ones when fewer), deterministic ties.

    metric: "pk" ranks raw scores (for CS results: the CS), "normalized" the normalized ones;
    ``values`` (a tensor shaped like the grid, e.g. z-scores) overrides both.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise InvalidInput(f"k must be a non-negative integer, got {k!r}")
    if values is not None:
        if values.shape != result.scores.shape:
            raise InvalidInput(f"values shape {tuple(values.shape)} != grid {tuple(result.scores.shape)}")
        ranked, name = values, "values"
    elif metric in ("pk", "cs", "score"):
        ranked, name = result.scores, "pk"
    elif metric == "normalized":
        ranked, name = result.normalized, "normalized"
    else:
        raise InvalidInput(f"metric must be 'pk' or 'normalized' (or pass values=), got {metric!r}")
    flat = _ranking_order(ranked, result.valid)[:k]
    _, hs, lt, ht = result.scores.shape
    th = flat % ht
    tl = (flat // ht) % lt
    sh = (flat // (ht * lt)) % hs
    sl = flat // (ht * lt * hs)
    return TopPairs(
        source_layer=sl, source_head=sh, target_layer=tl, target_head=th,
        score=result.scores.reshape(-1)[flat], normalized=result.normalized.reshape(-1)[flat],
        value=ranked.reshape(-1)[flat], layer_indices=tuple(result.layer_indices),
        kind=result.kind, pairing=result.pairing, metric=name,
    )


def average_ranks(x: torch.Tensor) -> torch.Tensor:
    """Ranks 1..n of a 1-D tensor, ties sharing their average rank (float64)."""
    n = x.numel()
    sorted_x, order = torch.sort(x, stable=True)
    _, counts = torch.unique_consecutive(sorted_x, return_counts=True)
    ends = torch.cumsum(counts, 0).to(torch.float64)
    avg = ends - (counts.to(torch.float64) - 1) / 2.0  # mean of positions start+1 .. end
    ranks = torch.empty(n, dtype=torch.float64, device=x.device)
    ranks[order] = torch.repeat_interleave(avg, counts)
    return ranks


def spearman(a: torch.Tensor, b: torch.Tensor, valid: torch.Tensor) -> float:
    """Spearman rho of a and b over the cells where ``valid`` (average ranks for ties);
    NaN when fewer than 2 cells or a constant side."""
    x = a[valid].to(torch.float64)
    y = b[valid].to(torch.float64)
    if x.numel() < 2:
        return math.nan
    rx = average_ranks(x)
    ry = average_ranks(y)
    rx = rx - rx.mean()
    ry = ry - ry.mean()
    den = torch.sqrt((rx * rx).sum() * (ry * ry).sum())
    if float(den) == 0.0:
        return math.nan
    return float((rx * ry).sum() / den)


def expand_heads(grid: torch.Tensor, n_source: int, n_target: int) -> torch.Tensor:
    """Repeat a [L, Hs, L, Ht] grid's KV-head axes to query heads (repeat_interleave, the
    layout of TransformerLens's _expand_kv_heads) -> [L, n_source, L, n_target]."""
    _, hs, _, ht = grid.shape
    if hs != n_source:
        if n_source % hs:
            raise InvalidInput(f"cannot expand {hs} source heads to {n_source}")
        grid = grid.repeat_interleave(n_source // hs, dim=1)
    if ht != n_target:
        if n_target % ht:
            raise InvalidInput(f"cannot expand {ht} target heads to {n_target}")
        grid = grid.repeat_interleave(n_target // ht, dim=3)
    return grid


@dataclass(frozen=True)
class KVLevelCS:
    """Composition Scores on a pairing's KV-level target layout (:func:`kv_level_cs`).

    CS depends on the target query head's own W_Q / W_O, so a CS grid has query heads on its
    target axis even where the PK grid (OK / OV of a grouped-query model) has KV groups. Here
    each (source head, target KV group) cell holds the mean CS over the group's served query
    heads whose CS is valid; with ``group == 1`` (no grouping) a cell is the pair's own CS.

    scores [L, Hs, L, Ht] float64, NaN where ``valid`` is False; count [L, Hs, L, Ht] int64:
    how many query heads were averaged; query_valid [L, Hs, L, Ht * group]: the CS grid's own
    validity (which query heads a cell averages); layer_indices: original block numbers.
    """

    scores: torch.Tensor
    valid: torch.Tensor
    count: torch.Tensor
    query_valid: torch.Tensor
    group: int
    layer_indices: tuple[int, ...]

    @property
    def grouped(self) -> bool:
        """Whether target cells are KV groups (averages over several query heads)."""
        return self.group > 1

    def describe(self) -> str:
        """What a cell's CS is, in words (for a download's or a view's metadata)."""
        return ("mean over the target KV group's query heads" if self.grouped
                else "the pair's own Composition Score")

    def members(self, sl: int, sh: int, tl: int, th: int) -> list[int]:
        """Target query heads (indices on the CS grid) averaged into cell (sl, sh, tl, th)."""
        lo = th * self.group
        ok = self.query_valid[sl, sh, tl, lo: lo + self.group].tolist()
        return [lo + j for j, v in enumerate(ok) if v]

    def cs_of(self, sl: int, sh: int, tl: int, th: int) -> str | None:
        """"mean over L2H2, L2H3" (the valid query heads averaged) for a grouped cell; None
        for an ungrouped or invalid one."""
        if not self.grouped:
            return None
        members = self.members(sl, sh, tl, th)
        if not members:
            return None
        layer = self.layer_indices[tl]
        return "mean over " + ", ".join(head_label(layer, h) for h in members)

    def cells(self, sl: torch.Tensor, sh: torch.Tensor, tl: torch.Tensor, th: torch.Tensor
              ) -> tuple[list[float | None], list[str | None]]:
        """(CS, cs_of) of the cells at position tensors sl, sh, tl, th (None where invalid)."""
        vals = self.scores[sl, sh, tl, th].tolist()
        ok = self.valid[sl, sh, tl, th].tolist()
        idx = zip(sl.tolist(), sh.tolist(), tl.tolist(), th.tolist())
        cs = [float(v) if o else None for v, o in zip(vals, ok)]
        of = [self.cs_of(*c) if o else None for c, o in zip(idx, ok)]
        return cs, of


def kv_level_cs(cs: PairScores, n_target: int) -> KVLevelCS:
    """Map a per-query-head CS result ([L, H, L, Hq] scores and validity) onto a KV-level
    target layout [L, H, L, n_target] (n_target = Hkv for a grouped K/V pairing, Hq
    otherwise): each cell is the float64 mean over the valid query heads its KV group serves
    (consecutive query heads, the repeat_interleave layout), valid where any is.

    The one reduction every KV-level view of CS uses (scatter, pair panel, top tables and
    exports, graph edges), so a KV score is compared once, not once per query head.
    """
    grid, valid = cs.scores, cs.valid.to(torch.bool)
    L, hs, L2, hq = grid.shape
    if n_target <= 0 or hq % n_target:
        raise InvalidInput(f"cannot group {hq} query heads into {n_target} KV groups")
    group = hq // n_target
    vals = torch.where(valid, grid.to(torch.float64), torch.zeros((), dtype=torch.float64))
    total = vals.reshape(L, hs, L2, n_target, group).sum(dim=-1)
    count = valid.reshape(L, hs, L2, n_target, group).sum(dim=-1)
    ok = count > 0
    mean = torch.where(ok, total / count.clamp(min=1), torch.full_like(total, torch.nan))
    return KVLevelCS(scores=mean, valid=ok, count=count.to(torch.int64), query_valid=valid,
                     group=group, layer_indices=tuple(cs.layer_indices))


@dataclass(frozen=True)
class Comparison:
    """How PK and CS rank the same pairs.

    quadrant [Ls, Hs, Lt, Ht] int8: 0 in neither metric's top x%, 1 PK only, 2 CS only, 3 both
    (0 for invalid pairs too; see ``valid``), on the grid ``on`` names: "cs" (query heads on
    both axes; pk_values = PK with KV heads expanded) or "pk" (the PK grid's own axes, KV
    heads once; cs_values = CS averaged over each KV group's query heads, ``kv`` the
    :class:`KVLevelCS` they come from).
    """

    rho_all: float
    rho_top: float
    n_valid: int
    n_top: int
    n_union: int
    top_percent: float
    quadrant: torch.Tensor
    valid: torch.Tensor
    pk_values: torch.Tensor
    counts: dict[str, int]
    cs_values: torch.Tensor | None = None  # CS on the compared grid (None: the CS grid itself)
    on: str = "cs"
    kv: KVLevelCS | None = None  # on="pk": the KV-level CS (cs_values = kv.scores)

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON summary (no grids)."""
        nan = lambda v: None if math.isnan(v) else v  # noqa: E731
        return {"rho_all": nan(self.rho_all), "rho_top": nan(self.rho_top), "n_valid": self.n_valid,
                "n_top": self.n_top, "n_union": self.n_union, "top_percent": self.top_percent,
                "counts": dict(self.counts), "on": self.on}


def _top_mask(values: torch.Tensor, valid: torch.Tensor, n_top: int) -> torch.Tensor:
    mask = torch.zeros(values.numel(), dtype=torch.bool, device=values.device)
    mask[_ranking_order(values, valid)[:n_top]] = True
    return mask.reshape(values.shape)


def compare_metrics(
    pk: PairScores, cs: PairScores, *, top_percent: float = 5.0, pk_metric: str = "pk",
    on: str = "cs",
) -> Comparison:
    """Spearman rho between PK and CS over all valid pairs and over the union of each metric's
    top ``top_percent`` % (ceil of that share of valid pairs), plus per-pair quadrant codes.

    CS grids have query heads on both axes; PK grids with KV-head axes (K/V roles on grouped-
    query models) differ. ``on="cs"`` compares on the CS grid, PK expanded to query heads by
    repeat_interleave (each KV score counted once per query head it serves); ``on="pk"``
    compares on the PK grid, CS averaged over each KV group's query heads
    (:func:`kv_level_cs`), so every KV score counts once. Equal axes: the same either way.
    """
    if not 0.0 < top_percent <= 100.0:
        raise InvalidInput(f"top_percent must lie in (0, 100], got {top_percent!r}")
    if pk_metric not in ("pk", "normalized"):
        raise InvalidInput(f"pk_metric must be 'pk' or 'normalized', got {pk_metric!r}")
    if on not in ("cs", "pk"):
        raise InvalidInput(f"on must be 'cs' or 'pk', got {on!r}")
    _L, h_src, _L2, h_tgt = cs.scores.shape
    pk_grid = pk.scores if pk_metric == "pk" else pk.normalized
    cs_vals: torch.Tensor | None = None
    kv: KVLevelCS | None = None
    if on == "pk":
        _, p_src, _, p_tgt = pk_grid.shape
        if p_src != h_src:
            raise InvalidInput(f"PK grid {tuple(pk.scores.shape)} cannot match CS grid {tuple(cs.scores.shape)}")
        pk_vals, pk_valid = pk_grid, pk.valid
        kv = kv_level_cs(cs, p_tgt)
        cs_vals, cs_valid = kv.scores, kv.valid
    else:
        pk_vals = expand_heads(pk_grid, h_src, h_tgt)
        pk_valid = expand_heads(pk.valid, h_src, h_tgt)
        cs_valid = cs.valid
    cs_grid = cs.scores if cs_vals is None else cs_vals
    if pk_vals.shape != cs_grid.shape:
        raise InvalidInput(f"PK grid {tuple(pk.scores.shape)} cannot match CS grid {tuple(cs.scores.shape)}")
    valid = pk_valid & cs_valid
    n_valid = int(valid.sum())
    n_top = math.ceil(top_percent / 100.0 * n_valid) if n_valid else 0
    top_pk = _top_mask(pk_vals, valid, n_top)
    top_cs = _top_mask(cs_grid, valid, n_top)
    union = top_pk | top_cs
    quadrant = (top_pk.to(torch.int8) + 2 * top_cs.to(torch.int8)).to(torch.int8)
    counts = {name: int((quadrant[valid] == code).sum())
              for code, name in enumerate(("neither", "pk_only", "cs_only", "both"))}
    return Comparison(
        rho_all=spearman(pk_vals, cs_grid, valid),
        rho_top=spearman(pk_vals, cs_grid, union),
        n_valid=n_valid, n_top=n_top, n_union=int(union.sum()), top_percent=float(top_percent),
        quadrant=quadrant, valid=valid, pk_values=pk_vals, counts=counts,
        cs_values=cs_vals, on=on, kv=kv,
    )
