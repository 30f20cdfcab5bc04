"""The graphs service: the head graph as JSON, its hub table and GraphML / GEXF exports.

Graphs are the registered computations "graph" and "graph_export"
(server/graph_computations.py), cached per parameters and label set (its exact classes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from headgraph.core.vocabulary import GRAPH_PAIRINGS, K_MAX, check_pairing
from headgraph.server.errors import Invalid
from headgraph.server.labelsets import LabelService
from headgraph.server.registry import ModelRef
from headgraph.server.resultcache import ResultCache


class GraphService:
    """The head graph in every form the API, downloads and CLI serve."""

    def __init__(self, cache: ResultCache, labels: LabelService) -> None:
        self.cache = cache
        self.labels = labels

    def graph(self, ref: ModelRef, *, pairings: list[str], granularity: str, k: int | None,
              threshold: float | None, threshold_on: str, labels: str | None) -> dict[str, Any]:
        """Head graph (core.graph.build_graph) as JSON: node-link, hubs, class counts; cached."""
        pairings = [check_pairing(p) for p in pairings]
        return self.cache.get(ref, "graph", pairings=tuple(pairings), granularity=granularity,
                              k=k, threshold=threshold, threshold_on=threshold_on,
                              label_set=self.labels.label_set(labels, ref))

    def hubs(self, ref: ModelRef, *, pairings: Sequence[str] = GRAPH_PAIRINGS,
             k: int = 20) -> dict[str, Any]:
        """Hub table of the paper's head graph: PK, forward order, head granularity, top-``k``
        edges per pairing (paper: OQ/OK/OV, k = 20; on GPT-2 small its top hub is L4H7).

        Read from the cached JSON graph (``graph``), so it is the very table GET /api/graph
        returns for the same parameters: model, pairings, k, graph_rule (edge selection),
        edge_counts, and core.hubs.HubTable.to_dict() (rule, threshold, hubs, rows, top),
        plus top_hub.
        """
        names = [check_pairing(p) for p in dict.fromkeys(pairings)]
        if not 1 <= int(k) <= K_MAX:
            raise Invalid(f"k must be in 1..{K_MAX}, got {k}")
        g = self.graph(ref, pairings=names, granularity="head", k=int(k), threshold=None,
                       threshold_on="pk", labels=None)
        table = g["hubs"]
        rows = table.get("rows", [])
        return {"model": ref.id, "pairings": names, "k": int(k), "graph_rule": g.get("rule"),
                "edge_counts": g.get("edge_counts"), **table,
                "top_hub": rows[0]["name"] if rows else None}

    def graph_export(self, ref: ModelRef, fmt: str, *, pairings: list[str], granularity: str,
                     k: int | None, threshold: float | None, threshold_on: str,
                     labels: str | None) -> str:
        """The head graph as GraphML or GEXF text, cached like the JSON graph."""
        return self.cache.get(ref, "graph_export", format=fmt, pairings=tuple(pairings),
                              granularity=granularity, k=k, threshold=threshold,
                              threshold_on=threshold_on,
                              label_set=self.labels.label_set(labels, ref))
