"""Directed head graphs from pair scores (paper Fig. 1): edges = selected (source, target) pairs.

Two granularities:

* ``"head"``: a node per head, ``"L{layer}H{head}"`` (layer = ORIGINAL block number);
* ``"role"``: a node per (head, role), ``"L4H7 O"`` -> ``"L5H5 K"``.

The graph is an ``nx.MultiDiGraph`` whose edge key is the pairing ("OQ", "OK", ...), so two heads
joined by several pairings keep one edge per pairing and every export round-trips (the result
type, HeadGraph, and its exports live in core.graphs.head_graph).

Grouped-query attention: a K/V subspace belongs to a KV head shared by ``n_heads / n_kv_heads``
query heads. By default (``kv_nodes="group"``) a K/V side becomes its own node ``"L{l}KV{g}"``
(attribute ``heads`` lists the query heads it serves): edges stay one per score cell, so top-k
gives exactly k edges and no score is duplicated. ``kv_nodes="query"`` instead copies each KV
cell to every query head sharing it (grid expanded by ``repeat_interleave``, the convention
TransformerLens and Hugging Face use) before selection, so nodes are query heads only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import networkx as nx
import torch

from headgraph.core.activations.flags import HeadFlags, not_measured
from headgraph.core.errors import InvalidInput
from headgraph.core.graphs.head_graph import HeadGraph
from headgraph.core.graphs.hubs import hub_table
from headgraph.core.graphs.labels import LabelSet, class_counts, class_recovery
from headgraph.core.names import GRAPH_PAIRINGS, ROLES, head_label
from headgraph.core.scores.pk import projection_kernel
from headgraph.core.scores.ranking import kv_level_cs, top_pairs
from headgraph.core.types import HeadWeights, ModelInfo, PairScores

GRANULARITIES: tuple[str, ...] = ("head", "role")
THRESHOLD_ON: tuple[str, ...] = ("pk", "normalized", "z", "fdr")
KV_NODES: tuple[str, ...] = ("group", "query")
DEFAULT_PAIRINGS: tuple[str, ...] = GRAPH_PAIRINGS
_ROLE_ORDER = {r: i for i, r in enumerate(ROLES)}


def _select(ps: PairScores, grids: dict[str, torch.Tensor], metric: torch.Tensor,
            ok: torch.Tensor, k: int | None) -> torch.Tensor:
    """Flat indices of the selected cells, best first, via ``ranking.top_pairs`` (ties: lower
    source layer, source head, target layer, target head first).

    With ``k``: the k best cells among ``ok``; else every ``ok`` cell.
    """
    n_ok = int(ok.sum())
    grid = replace(ps, scores=grids["score"], normalized=grids["normalized"], valid=ok)
    top = top_pairs(grid, n_ok if k is None else min(k, n_ok), values=metric)
    return top.flat_index(tuple(ok.shape))


def _expand(t: torch.Tensor, dims: tuple[int, ...], reps: tuple[int, ...]) -> torch.Tensor:
    for d, r in zip(dims, reps):
        if r > 1:
            t = t.repeat_interleave(r, dim=d)
    return t


def _n_query_heads(results: Mapping[str, PairScores], info: ModelInfo | None) -> int | None:
    if info is not None:
        return info.n_heads
    sizes = [ps.scores.shape[1] for ps in results.values() if ps.source_role in ("Q", "O")]
    sizes += [ps.scores.shape[3] for ps in results.values() if ps.target_role in ("Q", "O")]
    return max(sizes) if sizes else None


def _metric_words(kind: str, on: str) -> str:
    name = "CS" if kind == "cs" else "PK"
    return {"pk": f"raw {name}", "normalized": f"normalized {name}", "z": "z-score",
            "fdr": "FDR significance"}[on]


def _rule(kind: str, k: int | None, threshold: float | None, on: str, fdr_bool: bool) -> str:
    if k is not None:
        return f"top-{k} per pairing by {_metric_words(kind, on)}"
    if on == "fdr":
        return "FDR-significant pairs (Benjamini-Hochberg)" if fdr_bool else f"FDR q <= {threshold:g}"
    return f"{_metric_words(kind, on)} >= {threshold:g}"


def _check_args(results: Mapping[str, PairScores], granularity: str, k: int | None,
                threshold: float | None, threshold_on: str,
                values: Mapping[str, torch.Tensor] | None, kv_nodes: str) -> tuple[int, ...]:
    """Validate build_graph's arguments; returns the (shared) original layer numbers."""
    if granularity not in GRANULARITIES:
        raise InvalidInput(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
    if threshold_on not in THRESHOLD_ON:
        raise InvalidInput(f"threshold_on must be one of {THRESHOLD_ON}, got {threshold_on!r}")
    if kv_nodes not in KV_NODES:
        raise InvalidInput(f"kv_nodes must be one of {KV_NODES}, got {kv_nodes!r}")
    fdr_mask_only = (threshold_on == "fdr" and k is None and threshold is None
                     and values is not None
                     and all(v.dtype == torch.bool for v in values.values()))
    if (k is None) == (threshold is None) and not fdr_mask_only:
        raise InvalidInput("give exactly one of k (top-k per pairing) or threshold")
    if k is not None and (int(k) != k or k < 1):
        raise InvalidInput(f"k must be a positive integer, got {k!r}")
    if k is not None and threshold_on == "fdr":
        raise InvalidInput("top-k cannot rank by 'fdr'; use threshold mode with an FDR mask")
    if not results:
        raise InvalidInput("no pair scores given")
    layer_sets = {tuple(ps.layer_indices) for ps in results.values()}
    if len(layer_sets) != 1:
        raise InvalidInput(f"results come from different layer sets: {sorted(layer_sets)}")
    for key, ps in results.items():
        if key != ps.pairing:
            raise InvalidInput(f"results key {key!r} holds pairing {ps.pairing!r}")
        if ps.source_role not in ROLES or ps.target_role not in ROLES:
            raise InvalidInput(f"pairing {key!r} has unknown roles {ps.source_role}/{ps.target_role}")
        if threshold_on in ("z", "fdr"):
            if values is None or key not in values:
                raise InvalidInput(f"threshold_on={threshold_on!r} needs values[{key!r}]")
            if tuple(values[key].shape) != tuple(ps.scores.shape):
                raise InvalidInput(f"values[{key!r}] shape {tuple(values[key].shape)} != scores "
                                 f"{tuple(ps.scores.shape)}")
    return next(iter(layer_sets))


def _pairing_grids(ps: PairScores, value: torch.Tensor | None, n_q: int | None,
                   kv_nodes: str) -> tuple[dict[str, torch.Tensor], tuple[int, int]]:
    """The pairing's grids (score, normalized, valid, value) and the KV group size of each side
    (1 = a query head / non-grouped node); with ``kv_nodes="query"`` grids are expanded to
    query heads and both group sizes are 1."""
    grids = {"score": ps.scores, "normalized": ps.normalized, "valid": ps.valid.to(torch.bool)}
    if value is not None:
        grids["value"] = value.to(ps.scores.device)
    group = []
    for role, dim in ((ps.source_role, 1), (ps.target_role, 3)):
        n, size = ps.scores.shape[dim], 1
        if role in ("K", "V") and n_q is not None and n < n_q:  # grouped KV heads
            if n_q % n:
                raise InvalidInput(f"{n_q} query heads cannot share {n} KV heads evenly")
            size = n_q // n
        group.append(size)
    if kv_nodes == "query":
        grids = {name: _expand(t, (1, 3), tuple(group)) for name, t in grids.items()}
        group = [1, 1]
    return grids, (group[0], group[1])


def _selected(ps: PairScores, grids: dict[str, torch.Tensor], on: str, k: int | None,
              threshold: float | None) -> torch.Tensor:
    """Flat indices of the cells that become edges, best first."""
    score = grids["score"]
    ok = grids["valid"] & torch.isfinite(score)
    picked = {"pk": score, "normalized": grids["normalized"]}.get(on, grids.get("value"))
    if picked is None:
        raise InvalidInput(f"threshold_on={on!r} needs values for {ps.pairing}")
    metric = picked
    if on == "fdr" and metric.dtype == torch.bool:
        ok, metric = ok & metric, score  # significant cells, ranked by score
    elif on == "fdr":
        if threshold is None:
            raise InvalidInput("FDR q-values need a threshold (or give a bool mask)")
        ok = ok & torch.isfinite(metric) & (metric <= float(threshold))
        metric = -metric  # ranked by q, smallest first
    else:
        metric = metric if metric.is_floating_point() else metric.double()
        ok = ok & torch.isfinite(metric)
        if threshold is not None:
            ok = ok & (metric >= float(threshold))
    return _select(ps, grids, metric, ok, k)


def _cs_cells(cs: Mapping[str, PairScores] | None, ps: PairScores, shape: torch.Size,
              idx: torch.Tensor) -> tuple[list[float | None], list[str | None]] | None:
    """(CS, cs_of) of the selected cells (None where CS is invalid), from the mode of the
    target role; a KV-group target gets the mean over its query heads (ranking.kv_level_cs)."""
    if cs is None or ps.source_role != "O" or ps.target_role not in ("Q", "K", "V"):
        return None
    cs_ps = cs.get(ps.target_role) or cs.get(ps.pairing)
    if cs_ps is None:
        return None
    c = cs_ps.scores
    if c.shape[0] != shape[0] or c.shape[1] != shape[1] or c.shape[2] != shape[2]:
        raise InvalidInput(f"CS grid {tuple(c.shape)} does not match {ps.pairing} {tuple(shape)}")
    kv = kv_level_cs(cs_ps, int(shape[3]))
    cells = torch.unravel_index(idx.to(kv.scores.device), tuple(shape))
    return kv.cells(*cells)


def _edge_rows(grids: dict[str, torch.Tensor], idx: torch.Tensor, on: str,
               cs_cells: tuple[list[float | None], list[str | None]] | None
               ) -> list[dict[str, Any]]:
    """Attributes of each selected edge, in rank order."""
    score = grids["score"].flatten()[idx].double()
    top = float(score.max())
    opacity = (score / top if top > 0 else torch.ones_like(score)).tolist()
    norm = grids["normalized"].flatten()[idx].tolist()
    value = grids.get("value")
    extra = None
    if value is not None and value.dtype != torch.bool:
        extra = ("z" if on == "z" else "q", value.flatten()[idx].tolist())
    rows = []
    for i, s in enumerate(score.tolist()):
        row: dict[str, Any] = {"score": s, "normalized": float(norm[i]),
                               "opacity": float(opacity[i]), "rank": i + 1}
        if cs_cells is not None and cs_cells[0][i] is not None:
            row["cs"] = cs_cells[0][i]
            if cs_cells[1][i] is not None:
                row["cs_of"] = cs_cells[1][i]
        if extra is not None:
            row[extra[0]] = float(extra[1][i])
        rows.append(row)
    return rows


def _node(nodes: dict[str, dict[str, Any]], granularity: str, role: str, layer: int,
          head: int, group: int) -> str:
    """Register (once) and return the node id of one side of an edge."""
    if group > 1:
        ident = head_label(layer, head, kv=True)
        members = ",".join(head_label(layer, head * group + j) for j in range(group))
        kind = "kv_group"
    else:
        ident = head_label(layer, head)
        members = ident
        kind = "head"
    name = ident if granularity == "head" else f"{ident} {role}"
    if name not in nodes:
        data: dict[str, Any] = {"layer": int(layer), "head": int(head), "kind": kind,
                                "head_name": ident, "heads": members,
                                "_sort": (int(layer), kind != "head", int(head),
                                          _ROLE_ORDER.get(role, 9) if granularity == "role" else 0)}
        if granularity == "role":
            data["role"] = role
        nodes[name] = data
    return name


def _assemble(nodes: dict[str, dict[str, Any]], edges: list[tuple[str, str, str, dict[str, Any]]],
              labels: LabelSet | None) -> nx.MultiDiGraph:
    """MultiDiGraph with nodes in (layer, head, role) order, class overlay, then hub stats."""
    g = nx.MultiDiGraph()
    for name in sorted(nodes, key=lambda n: nodes[n]["_sort"]):
        data = {a: v for a, v in nodes[name].items() if not a.startswith("_")}
        if labels is not None:
            classes = [labels.classes[h] for h in data["heads"].split(",") if h in labels.classes]
            data["in_class"] = bool(classes)
            if classes:
                data["head_class"] = " / ".join(dict.fromkeys(classes))
        g.add_node(name, **data)
    for src, dst, key, attrs in edges:
        if labels is not None:
            for end, node in (("source_class", src), ("target_class", dst)):
                if "head_class" in g.nodes[node]:
                    attrs[end] = g.nodes[node]["head_class"]
        g.add_edge(src, dst, key=key, **attrs)
    return g


def _annotate_flags(g: nx.MultiDiGraph, flags: HeadFlags) -> dict[str, int]:
    """Set node sink / sink_heads / description / first_token and edge source_sink /
    target_sink from head flags; returns the number of edges touching a sink per pairing."""
    for n, data in g.nodes(data=True):
        heads = str(data["heads"]).split(",") if data.get("heads") else None
        data.update(sink=flags.is_sink(str(n), heads),
                    sink_heads=",".join(flags.sink_heads(str(n), heads)),
                    description=flags.describe(str(n), heads),
                    first_token=flags.first_token_of(str(n), heads))
    counts: dict[str, int] = {}
    for u, v, data in g.edges(data=True):
        data.update(source_sink=bool(g.nodes[u]["sink"]), target_sink=bool(g.nodes[v]["sink"]))
        p = str(data.get("pairing", ""))
        counts[p] = counts.get(p, 0) + int(data["source_sink"] or data["target_sink"])
    return counts


def build_graph(
    results: Mapping[str, PairScores],
    *,
    granularity: str = "head",
    k: int | None = 20,
    threshold: float | None = None,
    threshold_on: str = "pk",
    values: Mapping[str, torch.Tensor] | None = None,
    cs: Mapping[str, PairScores] | None = None,
    labels: LabelSet | None = None,
    info: ModelInfo | None = None,
    kv_nodes: str = "group",
    max_edges: int | None = None,
    flags: HeadFlags | None = None,
) -> HeadGraph:
    """Select edges from each pairing's scores and build the head graph.

    results: ``{pairing: PairScores}`` (e.g. OQ/OK/OV from ``projection_kernel``; layer order is
    already in ``valid``, and an invalid cell never becomes an edge).
    Selection, per pairing, exactly one of:
      * ``k``: the k best valid cells (paper rule k=20), ranked by ``threshold_on`` ("pk" raw
        score, "normalized", or "z" = ``values[pairing]``); ties -> lower (layer, head) first;
      * ``threshold``: valid cells with metric >= threshold; for "fdr", ``values[pairing]`` is a
        bool mask of significant cells (threshold may be None; ignored) or BH q-values (kept
        when <= threshold).
    cs: Composition Scores keyed by mode ("Q"/"K"/"V") or pairing; an O->X edge gets the CS of
    the same head pair from mode X (to a KV-group node: the mean over the group's query heads,
    ``ranking.kv_level_cs``, with ``cs_of`` naming them). labels/info: class overlay and model
    shape (for GQA).
    kv_nodes: how grouped-query K/V heads become nodes (module docstring).
    max_edges: at most this many edges per pairing (the best ones); a pairing whose rule
    passed more is listed in ``capped`` with how many passed, so a low threshold cannot
    build an unbounded graph.
    flags: head flags from attention-pattern scores (core.activations.flags.head_flags): nodes get sink
    (a KV group: all its query heads are sinks), sink_heads, description and first_token,
    edges source_sink / target_sink, hub rows descriptions; None (no pattern source): nodes
    and edges have none of them (``core.activations.flags.with_null_flags`` writes them as null, "not
    measured", never False) and the hub rows' description / sink are None.
    """
    layers = _check_args(results, granularity, k, threshold, threshold_on, values, kv_nodes)
    n_q = _n_query_heads(results, info)
    nodes: dict[str, dict[str, Any]] = {}
    edges: list[tuple[str, str, str, dict[str, Any]]] = []
    counts: dict[str, int] = {}
    capped: dict[str, int] = {}
    if max_edges is not None and int(max_edges) < 1:
        raise InvalidInput(f"max_edges must be >= 1 (got {max_edges})")
    for pairing, ps in results.items():
        value = values[pairing] if values is not None and threshold_on in ("z", "fdr") else None
        grids, (g_src, g_tgt) = _pairing_grids(ps, value, n_q, kv_nodes)
        idx = _selected(ps, grids, threshold_on, None if k is None else int(k), threshold)
        if max_edges is not None and idx.numel() > int(max_edges):
            capped[pairing] = int(idx.numel())
            idx = idx[: int(max_edges)]
        counts[pairing] = int(idx.numel())
        if idx.numel() == 0:
            continue
        shape = grids["score"].shape
        rows = _edge_rows(grids, idx, threshold_on, _cs_cells(cs, ps, shape, idx))
        cells = zip(*(t.tolist() for t in torch.unravel_index(idx, shape)))
        for (sl, sh, tl, th), row in zip(cells, rows):
            src = _node(nodes, granularity, ps.source_role, layers[sl], sh, g_src)
            dst = _node(nodes, granularity, ps.target_role, layers[tl], th, g_tgt)
            edges.append((src, dst, pairing, {"pairing": pairing, **row}))

    g = _assemble(nodes, edges, labels)
    sink_edges = None if flags is None else _annotate_flags(g, flags)
    hubs = hub_table(g, flags=flags)
    for r in hubs.rows:
        g.nodes[r.name].update(
            in_degree=r.in_degree, out_degree=r.out_degree, degree=r.degree,
            weighted_degree=r.weighted_degree, pagerank=r.pagerank, betweenness=r.betweenness,
            hub_rank=r.rank, is_hub=r.is_hub, degree_rank=r.degree_rank, degree_tie=r.tie)
    kinds = {ps.kind for ps in results.values()}
    fdr_mask = (threshold_on == "fdr" and values is not None
                and all(v.dtype == torch.bool for v in values.values()))
    rule = _rule(kinds.pop() if len(kinds) == 1 else "pk", None if k is None else int(k),
                 threshold, threshold_on, fdr_mask)
    g.graph.update(granularity=granularity, rule=rule, pairings=",".join(results),
                   threshold_on=threshold_on, kv_nodes=kv_nodes)
    optional = {"k": None if k is None else int(k),
                "threshold": None if threshold is None else float(threshold),
                "model": None if info is None else info.name,
                "labels": None if labels is None else labels.name}
    g.graph.update({a: v for a, v in optional.items() if v is not None})
    return HeadGraph(
        graph=g, hubs=hubs, pairings=tuple(results), granularity=granularity, rule=rule,
        class_counts=None if labels is None else class_counts(g, labels),
        recovery=None if labels is None else class_recovery(g, labels),
        labels=None if labels is None else labels.name, edge_counts=counts, capped=capped,
        flags=_flags_summary(flags, sink_edges, counts))


def _flags_summary(flags: HeadFlags | None, sink_edges: dict[str, int] | None,
                   counts: dict[str, int]) -> dict[str, Any]:
    """The graph's "flags" entry: sink rule, threshold, the model's sink heads and how many
    selected edges per pairing touch a sink (null without pattern scores)."""
    if flags is None:
        return {**{k: v for k, v in not_measured().items() if k != "descriptions"},
                "sink_edges": None}
    return {**{k: v for k, v in flags.to_dict().items() if k != "descriptions"},
            "sink_edges": {p: (sink_edges or {}).get(p, 0) for p in counts}}


def check_paper_hub(heads: HeadWeights, *, k: int = 20,
                    pairings: tuple[str, ...] = DEFAULT_PAIRINGS) -> str:
    """Build the paper's head graph (PK, forward layer order, top-``k`` edges per pairing of
    OQ/OK/OV, head granularity) from ``heads`` and return its top hub's name.

    On GPT-2 small the paper's answer is "L4H7".
    """
    results = {p: projection_kernel(heads, p, order="forward") for p in pairings}
    top = build_graph(results, granularity="head", k=k, info=heads.info).hubs.top_hub
    if top is None:
        raise InvalidInput("the graph has no edges (no valid head pairs)")
    return top
