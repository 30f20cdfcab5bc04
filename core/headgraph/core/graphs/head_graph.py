"""A selected head graph (core.graphs.build.build_graph's result) and its export formats.

The graph is an ``nx.MultiDiGraph`` keyed by pairing; ``to_node_link`` / ``to_graphml`` /
``to_gexf`` export it and :func:`read_export` reads any of them back into the same graph.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from headgraph.core.errors import InvalidInput
from headgraph.core.graphs.hubs import HubTable


@dataclass
class HeadGraph:
    """A selected head graph plus what was computed on it.

    graph: MultiDiGraph (edge key = pairing). Node attributes: layer, head, kind ("head" or
    "kv_group"), head_name, heads (comma-separated query heads), role (role granularity),
    head_class / in_class (with labels), in_degree, out_degree, degree, weighted_degree,
    pagerank, betweenness, hub_rank, is_hub. Edge attributes: pairing, score (raw), normalized,
    opacity (score / max selected score of the pairing, in (0, 1]), rank (1-based within the
    pairing), cs (Composition Score of the same head pair, when given; for a KV-group target
    the mean over its query heads, named in cs_of: "mean over L2H2, L2H3"), z / q (when
    selected on them), source_class / target_class (with labels). With head flags
    (core.activations.flags): node sink, sink_heads, description, first_token; edge source_sink,
    target_sink; ``flags`` summarizes them (``measured`` False: no node or edge has them;
    ``core.activations.flags.with_null_flags`` writes them as null, "not measured", for JSON APIs).
    """

    graph: nx.MultiDiGraph
    hubs: HubTable
    pairings: tuple[str, ...]
    granularity: str
    rule: str
    class_counts: dict[str, int] | None = None
    recovery: dict[str, float] | None = None
    labels: str | None = None
    edge_counts: dict[str, int] = field(default_factory=dict)
    capped: dict[str, int] = field(default_factory=dict)  # pairing -> edges that passed the rule
    flags: dict[str, Any] | None = None  # sink rule, threshold, sinks, sink_edges (core.graphs.build)

    def to_node_link(self) -> dict[str, Any]:
        """Node-link JSON (``nx.node_link_data(graph, edges="edges")``); read back with
        ``nx.node_link_graph(data, edges="edges")``."""
        return nx.node_link_data(self.graph, edges="edges")

    def to_graphml(self) -> str:
        """GraphML text; read back with ``read_export(text, "graphml")`` (or
        ``nx.read_graphml(f, edge_key_type=str, force_multigraph=True)``)."""
        return "\n".join(nx.generate_graphml(self.graph)) + "\n"

    def to_gexf(self) -> str:
        """GEXF 1.2 text (Gephi); read back with ``read_export(text, "gexf")`` (``nx.read_gexf``
        returns a simple DiGraph when no two edges share ends; the "pairing" attribute keeps
        the key)."""
        return "\n".join(nx.generate_gexf(self.graph)) + "\n"

    def to_dict(self) -> dict[str, Any]:
        """JSON summary for APIs: rule, counts, hubs and the node-link graph."""
        return {"granularity": self.granularity, "pairings": list(self.pairings),
                "rule": self.rule, "edge_counts": dict(self.edge_counts),
                "capped": dict(self.capped),
                "class_counts": self.class_counts, "recovery": self.recovery,
                "labels": self.labels, "hubs": self.hubs.to_dict(),
                "flags": self.flags, "graph": self.to_node_link()}


EXPORT_FORMATS: tuple[str, ...] = ("node-link", "graphml", "gexf")


def read_export(payload: str | bytes | dict[str, Any], fmt: str) -> nx.MultiDiGraph:
    """Read an exported head graph back into a MultiDiGraph keyed by pairing.

    fmt: "node-link" (the dict or its JSON text), "graphml" or "gexf". Reader artefacts are
    dropped (GraphML's node/edge defaults, GEXF's node "label" and edge "id"), so the result
    equals the graph that was exported (GEXF keeps no graph-level attributes).
    """
    if fmt not in EXPORT_FORMATS:
        raise InvalidInput(f"unknown export format {fmt!r}; expected one of {EXPORT_FORMATS}",
                           allowed=list(EXPORT_FORMATS))
    if fmt == "node-link":
        data = json.loads(payload) if isinstance(payload, (str, bytes)) else payload
        return nx.node_link_graph(data, directed=True, multigraph=True, edges="edges")
    if isinstance(payload, dict):
        raise InvalidInput(f"a {fmt} export is text or bytes, not a dict")
    raw = payload.encode() if isinstance(payload, str) else payload
    if fmt == "graphml":
        src = nx.read_graphml(io.BytesIO(raw), edge_key_type=str, force_multigraph=True)
        for key in ("node_default", "edge_default"):
            src.graph.pop(key, None)
    else:
        src = nx.read_gexf(io.BytesIO(raw))
        src.graph.clear()
    g = nx.MultiDiGraph()
    g.graph.update(src.graph)
    for n, d in src.nodes(data=True):
        g.add_node(n, **{a: v for a, v in d.items() if not (fmt == "gexf" and a == "label")})
    for u, v, d in src.edges(data=True):
        attrs = {a: x for a, x in d.items() if not (fmt == "gexf" and a == "id")}
        g.add_edge(u, v, key=attrs["pairing"], **attrs)
    return g


__all__ = ["EXPORT_FORMATS", "HeadGraph", "read_export"]
