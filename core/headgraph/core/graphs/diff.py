"""Compare one pairing's scores between two models of the same head layout (or two
checkpoints of one run): the difference grid, the top-k edges gained, lost and changed, and
the hubs of each top-k graph and which moved.

Pure tensor code on two PairScores of the same shape; hubs come from core.graphs.hubs on the
directed graph of each model's top-k edges (degree counted within that graph).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import networkx as nx
import torch

from headgraph.core.graphs.hubs import HubTable, hub_table
from headgraph.core.graphs.timeline import Edge, axis_names, check_same_layout
from headgraph.core.scores.ranking import top_pairs
from headgraph.core.types import PairScores


@dataclass(frozen=True)
class EdgeChange:
    """One edge of either top-k set: its scores in A and B, their difference and ranks."""

    source: str
    target: str
    edge: Edge
    status: str  # "gained" (top-k of B only), "lost" (of A only), "kept" (both)
    score_a: float
    score_b: float
    delta: float  # score_b - score_a
    rank_a: int | None  # 1-based rank in A's top-k, None when not in it
    rank_b: int | None


@dataclass(frozen=True)
class HubMove:
    """A node that is a hub of A's or B's top-k graph: its rank and degree in each."""

    name: str
    status: str  # "hub in both" | "new hub" (B only) | "no longer a hub" (A only)
    rank_a: int | None  # None: not a node of that graph
    rank_b: int | None
    degree_a: int
    degree_b: int


@dataclass(frozen=True)
class ModelDiff:
    """A vs B for one pairing.

    diff: [L, Hs, L, Ht] = B - A of the ranked metric (0 where not valid in both); valid: the
    same shape; gained / lost: [*] EdgeChange best first by B's / A's rank; changed: the kept
    edges by |delta| descending; hubs_a / hubs_b: core.graphs.hubs tables of each top-k graph.
    """

    pairing: str
    metric: str
    k: int
    layer_indices: tuple[int, ...]
    source_labels: tuple[str, ...]
    target_labels: tuple[str, ...]
    a: torch.Tensor  # [L, Hs, L, Ht] the metric in A
    b: torch.Tensor
    diff: torch.Tensor
    valid: torch.Tensor
    gained: tuple[EdgeChange, ...]
    lost: tuple[EdgeChange, ...]
    changed: tuple[EdgeChange, ...]
    hubs_a: HubTable
    hubs_b: HubTable
    hub_moves: tuple[HubMove, ...]

    def summary(self) -> dict[str, Any]:
        """Max and mean |B - A| over the valid cells and the edge-set counts."""
        d = self.diff[self.valid].abs()
        return {"max_abs_diff": float(d.max()) if d.numel() else 0.0,
                "mean_abs_diff": float(d.mean()) if d.numel() else 0.0,
                "n_gained": len(self.gained), "n_lost": len(self.lost), "n_kept": len(self.changed)}


def _metric(ps: PairScores, metric: str) -> torch.Tensor:
    return (ps.normalized if metric == "normalized" else ps.scores).double()


def _top(ps: PairScores, k: int, metric: str) -> list[Edge]:
    t = top_pairs(ps, k, metric=metric)
    return [(int(a), int(b), int(c), int(d)) for a, b, c, d in zip(
        t.source_layer.tolist(), t.source_head.tolist(), t.target_layer.tolist(), t.target_head.tolist())]


def _graph(edges: list[Edge], grid: torch.Tensor, names: tuple[list[str], list[str]],
           hs: int, ht: int) -> nx.MultiDiGraph:
    g = nx.MultiDiGraph()
    for e in edges:
        g.add_edge(names[0][e[0] * hs + e[1]], names[1][e[2] * ht + e[3]], score=float(grid[e]))
    return g


def compare_scores(a: PairScores, b: PairScores, *, k: int = 20, metric: str = "pk",
                   names: tuple[str, str] = ("A", "B"), grouped_target: bool = False,
                   hub_top: int = 10) -> ModelDiff:
    """Difference and top-k edge changes from ``a`` to ``b`` (same pairing and head layout,
    else InvalidInput). metric: "pk" (raw) or "normalized"; ``k`` edges per model."""
    check_same_layout([a, b], list(names))
    va, vb = _metric(a, metric), _metric(b, metric)
    valid = a.valid & b.valid
    diff = torch.where(valid, vb - va, torch.zeros_like(va))
    src, tgt = axis_names(a, grouped_target=grouped_target)
    _, hs, _, ht = a.scores.shape
    top_a, top_b = _top(a, k, metric), _top(b, k, metric)
    rank_a = {e: i + 1 for i, e in enumerate(top_a)}
    rank_b = {e: i + 1 for i, e in enumerate(top_b)}

    def change(e: Edge, status: str) -> EdgeChange:
        return EdgeChange(source=src[e[0] * hs + e[1]], target=tgt[e[2] * ht + e[3]], edge=e,
                          status=status, score_a=float(va[e]), score_b=float(vb[e]),
                          delta=float(vb[e] - va[e]), rank_a=rank_a.get(e), rank_b=rank_b.get(e))

    gained = tuple(change(e, "gained") for e in top_b if e not in rank_a)
    lost = tuple(change(e, "lost") for e in top_a if e not in rank_b)
    kept = sorted((change(e, "kept") for e in top_a if e in rank_b),
                  key=lambda c: (-abs(c.delta), c.rank_a or 0))
    hubs_a = hub_table(_graph(top_a, va, (src, tgt), hs, ht), top=hub_top)
    hubs_b = hub_table(_graph(top_b, vb, (src, tgt), hs, ht), top=hub_top)
    return ModelDiff(pairing=a.pairing, metric=metric, k=k, layer_indices=tuple(a.layer_indices),
                     source_labels=tuple(src), target_labels=tuple(tgt), a=va, b=vb, diff=diff,
                     valid=valid, gained=gained, lost=lost, changed=tuple(kept), hubs_a=hubs_a,
                     hubs_b=hubs_b, hub_moves=hub_moves(hubs_a, hubs_b))


def hub_moves(hubs_a: HubTable, hubs_b: HubTable) -> tuple[HubMove, ...]:
    """Every node that is a hub in A or B, with its rank and degree in both (rank None: not a
    node there), ordered by B's rank then A's."""
    rows_a = {r.name: r for r in hubs_a.rows}
    rows_b = {r.name: r for r in hubs_b.rows}
    names = {r.name for r in hubs_a.rows if r.is_hub} | {r.name for r in hubs_b.rows if r.is_hub}
    out = []
    for n in names:
        ra, rb = rows_a.get(n), rows_b.get(n)
        ha, hb = bool(ra and ra.is_hub), bool(rb and rb.is_hub)
        status = "hub in both" if ha and hb else "new hub" if hb else "no longer a hub"
        out.append(HubMove(name=n, status=status, rank_a=ra.rank if ra else None,
                           rank_b=rb.rank if rb else None, degree_a=ra.degree if ra else 0,
                           degree_b=rb.degree if rb else 0))
    big = 10 ** 9
    return tuple(sorted(out, key=lambda m: (m.rank_b or big, m.rank_a or big, m.name)))
