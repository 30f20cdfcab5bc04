"""The graphs service: the head graph as JSON, its hub table and GraphML / GEXF exports.

Graphs are the registered computations "graph" and "graph_export"
(server/computations/graphs.py), cached per parameters and label set (its exact classes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from headgraph.core.names import GRAPH_PAIRINGS, check_pairing
from headgraph.server.cache.cold_miss import CACHE_ONLY, ColdMiss
from headgraph.server.compute.results import ResultCache
from headgraph.server.errors import Invalid
from headgraph.server.limits import GRAPH_K_MAX
from headgraph.server.models.offered import ModelRef
from headgraph.server.services.labels import LabelService


class GraphService:
    """The head graph in every form the API, downloads and CLI serve."""

    def __init__(self, cache: ResultCache, labels: LabelService) -> None:
        self.cache = cache
        self.labels = labels

    def _flags(self, ref: ModelRef, flags: bool | None) -> bool:
        """Whether a graph carries sink flags and descriptions: asked (True computes the pattern
        scores), or by default only once they are cached, so a cold model's graph shows as soon
        as its PK and CS exist instead of waiting for a forward pass over the prompts."""
        return self.cache.has(ref, "patterns") if flags is None else bool(flags)

    def default_flags(self, ref: ModelRef, *, may_compute: bool, pairings: list[str],
                      granularity: str, k: int | None, threshold: float | None,
                      threshold_on: str, labels: str | None) -> bool:
        """The ``flags`` a read of this graph gets by default: True once the pattern scores are
        cached, unless the caller may not compute (no token in lab mode) and only the graph
        without flags is cached; that one is then served rather than a 401. Only reads
        (cache-only): a model whose identity is not known yet has no cached patterns, so False,
        never a load."""
        token = CACHE_ONLY.set(True)
        try:
            if not self.cache.has(ref, "patterns"):
                return False
            return may_compute or self.cache.has(
                ref, "graph", pairings=tuple(check_pairing(p) for p in pairings),
                granularity=granularity, k=k, threshold=threshold, threshold_on=threshold_on,
                label_set=self.labels.label_set(labels, ref), flags=True)
        except ColdMiss:
            return False
        finally:
            CACHE_ONLY.reset(token)

    def graph(self, ref: ModelRef, *, pairings: list[str], granularity: str, k: int | None,
              threshold: float | None, threshold_on: str, labels: str | None,
              flags: bool | None = None) -> dict[str, Any]:
        """Head graph (core.graphs.build.build_graph) as JSON: node-link, hubs, class counts, and the
        sink flags when ``flags`` (default: the pattern scores are cached; else null); cached."""
        pairings = [check_pairing(p) for p in pairings]
        return self.cache.get(ref, "graph", pairings=tuple(pairings), granularity=granularity,
                              k=k, threshold=threshold, threshold_on=threshold_on,
                              label_set=self.labels.label_set(labels, ref),
                              flags=self._flags(ref, flags))

    def hubs(self, ref: ModelRef, *, pairings: Sequence[str] = GRAPH_PAIRINGS,
             k: int = 20, flags: bool | None = None) -> dict[str, Any]:
        """Hub table of the paper's head graph: PK, forward order, head granularity, top-``k``
        edges per pairing (paper: OQ/OK/OV, k = 20; on GPT-2 small its top hub is L4H7).

        Read from the cached JSON graph (``graph``), so it is the very table GET /api/graph
        returns for the same parameters: model, pairings, k, graph_rule (edge selection),
        edge_counts, and core.graphs.hubs.HubTable.to_dict() (rule, threshold, hubs, rows, top),
        plus top_hub.
        """
        names = [check_pairing(p) for p in dict.fromkeys(pairings)]
        if not 1 <= int(k) <= GRAPH_K_MAX:
            raise Invalid(f"k must be in 1..{GRAPH_K_MAX}, got {k}")
        g = self.graph(ref, pairings=names, granularity="head", k=int(k), threshold=None,
                       threshold_on="pk", labels=None, flags=flags)
        table = g["hubs"]
        rows = table.get("rows", [])
        return {"model": ref.id, "pairings": names, "k": int(k), "graph_rule": g.get("rule"),
                "edge_counts": g.get("edge_counts"), **table,
                "top_hub": rows[0]["name"] if rows else None}

    def graph_export(self, ref: ModelRef, fmt: str, *, pairings: list[str], granularity: str,
                     k: int | None, threshold: float | None, threshold_on: str,
                     labels: str | None, flags: bool | None = None) -> str:
        """The head graph as GraphML or GEXF text, cached like the JSON graph."""
        return self.cache.get(ref, "graph_export", format=fmt, pairings=tuple(pairings),
                              granularity=granularity, k=k, threshold=threshold,
                              threshold_on=threshold_on,
                              label_set=self.labels.label_set(labels, ref),
                              flags=self._flags(ref, flags))
