"""Bounded subgraph queries on a model's pair scores: a view asks for a few heads' edges, never
for every cell.

:func:`edge_table` flattens the valid cells of some pairings into one edge list, best first by
the ranking scale ``rank_on`` (raw PK, normalized PK, CS or z). Node names are the head graph's
(core.graphs.build, ``kv_nodes="group"``): ``"L4H7"``, and a grouped-query K/V side is its KV
group ``"L6KV1"``. Three queries read the table:

* :func:`edges_among`: every edge whose two ends are in a head set;
* :func:`neighbourhood`: from one head, each reached node's ``k`` strongest incident edges
  (in or out, any pairing), to ``depth`` steps;
* :func:`layer_range`: the ``k`` best edges per pairing with both ends in blocks ``lo..hi``.

Each answer keeps at most ``cap`` edges (the best ones) and says how many it left out
(``left_out``) and how to get them (``hint``), so no answer grows with the model. Ties keep
the table's order: pairing order, then source layer, source head, target layer, target head.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from headgraph.core.errors import InvalidInput
from headgraph.core.names import (CS_MODES, GRAPH_K_MAX, SUBGRAPH_CAP, SUBGRAPH_CAP_MAX, SUBGRAPH_DEPTH_MAX,
                                  SUBGRAPH_HEADS_MAX, SUBGRAPH_QUERIES, SUBGRAPH_RANK_ON, head_label)
from headgraph.core.scores.ranking import kv_level_cs
from headgraph.core.types import ModelInfo, PairScores

DEFAULT_CAP = SUBGRAPH_CAP  # edges one answer keeps unless asked for more
_WORDS = {"pk": "raw PK", "normalized": "normalized PK", "cs": "CS", "z": "z-score"}


@dataclass(frozen=True)
class SubgraphNode:
    """One node: a query head (kind "head") or a grouped-query KV group ("kv_group"); ``heads``
    the query heads it stands for."""

    name: str
    layer: int
    head: int
    kind: str
    heads: tuple[str, ...]


@dataclass(frozen=True)
class SubgraphEdge:
    """One edge (a valid score cell): raw and normalized PK, the CS of the same head pair (to a
    KV group: the mean over its query heads) and the z-score when known, ``value`` the ranked
    one and ``rank`` its 1-based place in the answer."""

    source: str
    target: str
    pairing: str
    score: float
    normalized: float
    cs: float | None
    z: float | None
    value: float
    rank: int


@dataclass(frozen=True)
class EdgeTable:
    """Every valid cell of some pairings as a flat edge list, best first by ``rank_on``.

    nodes: every node name (query heads, then KV groups, by layer); ``source`` / ``target``
    index them, ``pairing`` indexes ``pairings``; ``score`` / ``normalized`` / ``cs`` / ``z`` /
    ``value`` are float64 [E] (NaN: no CS / z for that edge); ``layer`` [N] is each node's
    original block number.
    """

    pairings: tuple[str, ...]
    rank_on: str
    nodes: tuple[SubgraphNode, ...]
    layer: torch.Tensor
    source: torch.Tensor
    target: torch.Tensor
    pairing: torch.Tensor
    score: torch.Tensor
    normalized: torch.Tensor
    cs: torch.Tensor
    z: torch.Tensor
    value: torch.Tensor

    def index_of(self, name: str) -> int:
        """The node index of a head name; InvalidInput naming the model's heads otherwise."""
        idx = self._names().get(name)
        if idx is None:
            names = [n.name for n in self.nodes]
            raise InvalidInput(f"unknown head {name!r}; this model's nodes are {names[0]} .. {names[-1]}"
                               + (" (KV groups named like L0KV0)" if any("KV" in n for n in names) else ""))
        return idx

    def _names(self) -> dict[str, int]:
        return {n.name: i for i, n in enumerate(self.nodes)}

    @property
    def n_edges(self) -> int:
        return int(self.source.numel())


@dataclass(frozen=True)
class Subgraph:
    """A query's answer: its nodes and at most ``cap`` edges, best first.

    total: edges the query selected; left_out = total - len(edges) (cut by ``cap``); hint: how
    to get them (None when nothing was left out).
    """

    query: str
    rule: str
    rank_on: str
    pairings: tuple[str, ...]
    nodes: tuple[SubgraphNode, ...]
    edges: tuple[SubgraphEdge, ...]
    total: int
    cap: int
    left_out: int
    hint: str | None
    params: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """JSON form: query, rule, params, counts, hint, nodes and edges (lists of dicts)."""
        return {"query": self.query, "rule": self.rule, "rank_on": self.rank_on,
                "pairings": list(self.pairings), "params": dict(self.params),
                "total": self.total, "cap": self.cap, "left_out": self.left_out, "hint": self.hint,
                "edge_counts": {p: sum(1 for e in self.edges if e.pairing == p) for p in self.pairings},
                "nodes": [{**asdict(n), "heads": list(n.heads)} for n in self.nodes],
                "edges": [asdict(e) for e in self.edges]}


def _side(role: str, n: int, n_q: int) -> int:
    """KV group size of one side of a grid (1: query heads, or K/V not grouped)."""
    if role in ("K", "V") and n < n_q:
        if n_q % n:
            raise InvalidInput(f"{n_q} query heads cannot share {n} KV heads evenly")
        return n_q // n
    return 1


def _node_table(layers: tuple[int, ...], n_q: int, groups: set[int]
                ) -> tuple[tuple[SubgraphNode, ...], dict[tuple[int, int, int], int]]:
    """Nodes (per layer: query heads, then each KV grouping's groups) and (layer position,
    head, group size) -> node index."""
    nodes: list[SubgraphNode] = []
    index: dict[tuple[int, int, int], int] = {}
    for li, layer in enumerate(layers):
        for h in range(n_q):
            index[(li, h, 1)] = len(nodes)
            nodes.append(SubgraphNode(head_label(layer, h), layer, h, "head", (head_label(layer, h),)))
        for size in sorted(groups):
            for g in range(n_q // size):
                index[(li, g, size)] = len(nodes)
                members = tuple(head_label(layer, g * size + j) for j in range(size))
                nodes.append(SubgraphNode(head_label(layer, g, kv=True), layer, g, "kv_group", members))
    return tuple(nodes), index


def _cs_grid(cs: Mapping[str, PairScores] | None, ps: PairScores) -> torch.Tensor | None:
    """CS of the pairing's cells on its own grid (KV-group targets: the mean over their query
    heads, ranking.kv_level_cs), NaN where invalid; None when the pairing has no CS."""
    if cs is None or ps.source_role != "O" or ps.target_role not in CS_MODES:
        return None
    cs_ps = cs.get(ps.target_role) or cs.get(ps.pairing)
    if cs_ps is None:
        return None
    if tuple(cs_ps.scores.shape[:3]) != tuple(ps.scores.shape[:3]):
        raise InvalidInput(f"CS grid {tuple(cs_ps.scores.shape)} does not match {ps.pairing} "
                           f"{tuple(ps.scores.shape)}")
    kv = kv_level_cs(cs_ps, int(ps.scores.shape[3]))
    return torch.where(kv.valid, kv.scores, torch.full_like(kv.scores, torch.nan))


def edge_table(results: Mapping[str, PairScores], *, rank_on: str = "pk",
               cs: Mapping[str, PairScores] | None = None, z: Mapping[str, torch.Tensor] | None = None,
               info: ModelInfo | None = None) -> EdgeTable:
    """The valid cells of ``results`` (``{pairing: PairScores}`` of PK, one layer set) as one
    edge list, best first by ``rank_on``: "pk" (raw), "normalized", "cs" (``cs``: CS keyed by
    mode or pairing; only cells with a valid CS) or "z" (``z``: per-pairing grids like the
    scores; only finite ones). ``info`` gives the query-head count of a grouped-query model
    (else the largest Q/O side)."""
    if rank_on not in SUBGRAPH_RANK_ON:
        raise InvalidInput(f"rank_on must be one of {list(SUBGRAPH_RANK_ON)}, got {rank_on!r}",
                           allowed=list(SUBGRAPH_RANK_ON))
    if not results:
        raise InvalidInput("no pair scores given")
    layer_sets = {tuple(ps.layer_indices) for ps in results.values()}
    if len(layer_sets) != 1:
        raise InvalidInput(f"results come from different layer sets: {sorted(layer_sets)}")
    layers = next(iter(layer_sets))
    sizes = [ps.scores.shape[1] for ps in results.values() if ps.source_role in ("Q", "O")]
    sizes += [ps.scores.shape[3] for ps in results.values() if ps.target_role in ("Q", "O")]
    n_q = info.n_heads if info is not None else max(sizes or [max(ps.scores.shape[1] for ps in results.values())])
    sides = {p: (_side(ps.source_role, ps.scores.shape[1], n_q), _side(ps.target_role, ps.scores.shape[3], n_q))
             for p, ps in results.items()}
    nodes, index = _node_table(layers, n_q, {s for pair in sides.values() for s in pair if s > 1})
    cols: dict[str, list[torch.Tensor]] = {k: [] for k in ("src", "tgt", "pair", "score", "norm", "cs", "z")}
    for pi, (pairing, ps) in enumerate(results.items()):
        if pairing != ps.pairing:
            raise InvalidInput(f"results key {pairing!r} holds pairing {ps.pairing!r}")
        score = ps.scores.to(torch.float64)
        ok = ps.valid.to(torch.bool) & torch.isfinite(score)
        cs_grid = _cs_grid(cs, ps)
        z_grid = None if z is None or pairing not in z else torch.as_tensor(z[pairing]).to(torch.float64)
        if z_grid is not None and tuple(z_grid.shape) != tuple(score.shape):
            raise InvalidInput(f"z[{pairing!r}] shape {tuple(z_grid.shape)} != scores {tuple(score.shape)}")
        if rank_on == "cs":
            if cs_grid is None:
                raise InvalidInput(f"{pairing} has no Composition Score (CS is O -> Q/K/V); rank by pk")
            ok &= torch.isfinite(cs_grid)
        if rank_on == "z":
            if z_grid is None:
                raise InvalidInput(f"rank_on='z' needs z-scores of {pairing}")
            ok &= torch.isfinite(z_grid)
        sl, sh, tl, th = (t.to(torch.int64) for t in torch.nonzero(ok, as_tuple=True))
        g_s, g_t = sides[pairing]
        lookup_s = torch.tensor([[index[(li, h, g_s)] for h in range(ps.scores.shape[1])]
                                 for li in range(len(layers))], dtype=torch.int64)
        lookup_t = torch.tensor([[index[(li, h, g_t)] for h in range(ps.scores.shape[3])]
                                 for li in range(len(layers))], dtype=torch.int64)
        nan = torch.full((int(sl.numel()),), torch.nan, dtype=torch.float64)
        cols["src"].append(lookup_s[sl, sh])
        cols["tgt"].append(lookup_t[tl, th])
        cols["pair"].append(torch.full_like(sl, pi))
        cols["score"].append(score[ok])
        cols["norm"].append(ps.normalized.to(torch.float64)[ok])
        cols["cs"].append(nan if cs_grid is None else cs_grid.to(torch.float64)[ok])
        cols["z"].append(nan if z_grid is None else z_grid[ok])
    flat = {k: torch.cat(v) for k, v in cols.items()}
    value = {"pk": flat["score"], "normalized": flat["norm"], "cs": flat["cs"], "z": flat["z"]}[rank_on]
    order = torch.sort(-value, stable=True).indices
    return EdgeTable(
        pairings=tuple(results), rank_on=rank_on, nodes=nodes,
        layer=torch.tensor([n.layer for n in nodes], dtype=torch.int64),
        source=flat["src"][order], target=flat["tgt"][order], pairing=flat["pair"][order],
        score=flat["score"][order], normalized=flat["norm"][order], cs=flat["cs"][order],
        z=flat["z"][order], value=value[order])


def _check_cap(cap: int) -> int:
    if isinstance(cap, bool) or int(cap) != cap or not 1 <= int(cap) <= SUBGRAPH_CAP_MAX:
        raise InvalidInput(f"cap must be an integer in 1..{SUBGRAPH_CAP_MAX}, got {cap!r}")
    return int(cap)


def _check_k(k: int) -> int:
    if isinstance(k, bool) or int(k) != k or not 1 <= int(k) <= GRAPH_K_MAX:
        raise InvalidInput(f"k must be an integer in 1..{GRAPH_K_MAX}, got {k!r}")
    return int(k)


def _answer(table: EdgeTable, query: str, rule: str, picked: torch.Tensor, extra_nodes: Sequence[int],
            cap: int, params: dict[str, Any], narrow: str) -> Subgraph:
    """The answer of edges ``picked`` (table positions, any order), cut to the best ``cap``."""
    picked = torch.unique(picked)  # sorted ascending = best first
    total = int(picked.numel())
    kept = picked[:cap]
    left_out = total - int(kept.numel())
    hint = None
    if left_out:
        more = f"ask with cap={min(total, SUBGRAPH_CAP_MAX)}" if total <= SUBGRAPH_CAP_MAX else f"cap is at most {SUBGRAPH_CAP_MAX}"
        hint = f"{left_out} weaker edges left out: {narrow}, or {more}"
    names = [n.name for n in table.nodes]
    edges = []
    for rank, i in enumerate(kept.tolist(), start=1):
        cs_v, z_v = float(table.cs[i]), float(table.z[i])
        edges.append(SubgraphEdge(
            source=names[int(table.source[i])], target=names[int(table.target[i])],
            pairing=table.pairings[int(table.pairing[i])], score=float(table.score[i]),
            normalized=float(table.normalized[i]), cs=None if cs_v != cs_v else cs_v,
            z=None if z_v != z_v else z_v, value=float(table.value[i]), rank=rank))
    used = set(extra_nodes) | set(table.source[kept].tolist()) | set(table.target[kept].tolist())
    return Subgraph(query=query, rule=rule, rank_on=table.rank_on, pairings=table.pairings,
                    nodes=tuple(table.nodes[i] for i in sorted(used)), edges=tuple(edges), total=total,
                    cap=cap, left_out=left_out, hint=hint, params=params)


def edges_among(table: EdgeTable, heads: Sequence[str], *, cap: int = DEFAULT_CAP) -> Subgraph:
    """Every edge with both ends in ``heads`` (node names; a grouped K/V side is its KV group),
    best first, at most ``cap``; every named head is a node of the answer, edges or not."""
    cap = _check_cap(cap)
    names = list(dict.fromkeys(str(h).strip() for h in heads if str(h).strip()))
    if not names:
        raise InvalidInput("name at least one head (heads=L0H1,L1H3)")
    if len(names) > SUBGRAPH_HEADS_MAX:
        raise InvalidInput(f"at most {SUBGRAPH_HEADS_MAX} heads in one set, got {len(names)}")
    idx = torch.tensor([table.index_of(n) for n in names], dtype=torch.int64)
    picked = torch.nonzero(torch.isin(table.source, idx) & torch.isin(table.target, idx)).flatten()
    rule = f"edges among {len(names)} heads, by {_WORDS[table.rank_on]}"
    return _answer(table, "heads", rule, picked, idx.tolist(), cap, {"heads": names},
                   "name fewer heads or pairings")


def _top_incident(table: EdgeTable, frontier: torch.Tensor, k: int) -> torch.Tensor:
    """Table positions of each frontier node's ``k`` strongest incident edges (in or out)."""
    pos = torch.arange(table.n_edges)
    ends = []
    for side in (table.source, table.target):
        hit = torch.isin(side, frontier)
        ends.append((side[hit], pos[hit]))
    node = torch.cat([e[0] for e in ends])
    where = torch.cat([e[1] for e in ends])
    if node.numel() == 0:
        return where
    # a self-edge would count twice for one node: drop the repeat
    order = torch.argsort(node * (table.n_edges + 1) + where)
    node, where = node[order], where[order]
    keep = torch.ones_like(node, dtype=torch.bool)
    keep[1:] = (node[1:] != node[:-1]) | (where[1:] != where[:-1])
    node, where = node[keep], where[keep]
    _, counts = torch.unique_consecutive(node, return_counts=True)
    starts = torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
    rank = torch.arange(node.numel()) - starts
    return where[rank < k]


def neighbourhood(table: EdgeTable, head: str, *, depth: int = 1, k: int = 5,
                  cap: int = DEFAULT_CAP) -> Subgraph:
    """From ``head``: each reached node's ``k`` strongest incident edges (in or out, over the
    table's pairings), followed ``depth`` steps (breadth first; a node reached at step d < depth
    contributes its own k edges at step d + 1); best first, at most ``cap``."""
    cap, k = _check_cap(cap), _check_k(k)
    if isinstance(depth, bool) or int(depth) != depth or not 1 <= int(depth) <= SUBGRAPH_DEPTH_MAX:
        raise InvalidInput(f"depth must be an integer in 1..{SUBGRAPH_DEPTH_MAX}, got {depth!r}")
    centre = table.index_of(str(head).strip())
    reached = torch.zeros(len(table.nodes), dtype=torch.bool)
    reached[centre] = True
    frontier = torch.tensor([centre], dtype=torch.int64)
    picked = torch.zeros(0, dtype=torch.int64)
    for _ in range(int(depth)):
        step = _top_incident(table, frontier, k)
        picked = torch.cat([picked, step])
        ends = torch.unique(torch.cat([table.source[step], table.target[step]]))
        frontier = ends[~reached[ends]]
        reached[frontier] = True
        if frontier.numel() == 0:
            break
    rule = (f"top-{k} incident edges per head, {int(depth)} step{'s' if depth != 1 else ''} from "
            f"{table.nodes[centre].name}, by {_WORDS[table.rank_on]}")
    return _answer(table, "neighbourhood", rule, picked, [centre], cap,
                   {"head": table.nodes[centre].name, "depth": int(depth), "k": k}, "lower k or depth")


def layer_range(table: EdgeTable, lo: int, hi: int, *, k: int = 20, cap: int = DEFAULT_CAP) -> Subgraph:
    """The ``k`` best edges per pairing whose two ends are in blocks ``lo..hi`` (original block
    numbers, both included), best first, at most ``cap``."""
    cap, k = _check_cap(cap), _check_k(k)
    lo, hi = min(int(lo), int(hi)), max(int(lo), int(hi))
    blocks = sorted({n.layer for n in table.nodes})
    if not any(lo <= b <= hi for b in blocks):
        raise InvalidInput(f"no attention layer in blocks {lo}-{hi}; this model's are {blocks[0]}..{blocks[-1]}")
    inside = (table.layer >= lo) & (table.layer <= hi)
    both = inside[table.source] & inside[table.target]
    parts = []
    for pi in range(len(table.pairings)):
        parts.append(torch.nonzero(both & (table.pairing == pi)).flatten()[:k])
    picked = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)
    rule = f"top-{k} per pairing within layers {lo}-{hi}, by {_WORDS[table.rank_on]}"
    return _answer(table, "layers", rule, picked, [], cap, {"layers": [lo, hi], "k": k},
                   "narrow the layer range or lower k")


__all__ = ["DEFAULT_CAP", "SUBGRAPH_QUERIES", "SUBGRAPH_RANK_ON",
           "EdgeTable", "Subgraph", "SubgraphEdge", "SubgraphNode", "edge_table", "edges_among",
           "layer_range", "neighbourhood"]
