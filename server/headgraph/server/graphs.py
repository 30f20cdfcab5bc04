"""Head graphs of a model: the JSON graph, its hub table and GraphML / GEXF exports.

Graphs are built by core.graph.build_graph from the cached forward PK (plus CS, z or FDR
values to threshold on) and cached per parameters and label set.
"""

from __future__ import annotations

from typing import Any

import torch

from headgraph.server.convert import jsonable
from headgraph.server.errors import Invalid
from headgraph.server.labelsets import LabelSets, label_key
from headgraph.server.params import GRAPH_PAIRINGS, check_pairing
from headgraph.server.registry import ModelRef


class Graphs(LabelSets):
    """The head graph in every form the API and downloads serve."""

    def graph(self, ref: ModelRef, *, pairings: list[str], granularity: str, k: int | None,
              threshold: float | None, threshold_on: str, labels: str | None) -> dict[str, Any]:
        """Head graph (core.graph.build_graph) as JSON: node-link, hubs, class counts; cached."""
        for p in pairings:
            check_pairing(p)
        label_set = self.label_set(labels, ref)
        params = {"pairings": ",".join(pairings), "granularity": granularity, "k": k,
                  "threshold": threshold, "threshold_on": threshold_on,
                  "labels": label_key(label_set)}
        kwargs = {"pairings": pairings, "granularity": granularity, "k": k,
                  "threshold": threshold, "threshold_on": threshold_on}
        return self.cached(ref, "graph", params,
                           lambda: jsonable(self.head_graph(ref, **kwargs,
                                                            label_set=label_set).to_dict()),
                           ("graph", (ref,), {**kwargs, "labels": labels}))

    def hubs(self, ref: ModelRef, *, pairings: list[str] | tuple[str, ...] = GRAPH_PAIRINGS,
             k: int = 20) -> dict[str, Any]:
        """Hub table of the paper's head graph: PK, forward order, head granularity, top-``k``
        edges per pairing (paper: OQ/OK/OV, k = 20; on GPT-2 small its top hub is L4H7).

        Read from the cached JSON graph (``graph``), so it is the very table GET /api/graph
        returns for the same parameters: model, pairings, k, graph_rule (edge selection),
        edge_counts, and core.hubs.HubTable.to_dict() (rule, threshold, hubs, rows, top),
        plus top_hub.
        """
        names = [check_pairing(p) for p in dict.fromkeys(pairings)]
        if not 1 <= int(k) <= 1000:
            raise Invalid(f"k must be in 1..1000, got {k}")
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
        if fmt not in ("graphml", "gexf"):
            raise Invalid(f"unknown graph format {fmt!r}; allowed: ['graphml', 'gexf']")
        label_set = self.label_set(labels, ref)
        kwargs = {"pairings": pairings, "granularity": granularity, "k": k,
                  "threshold": threshold, "threshold_on": threshold_on}
        params = {"format": fmt, "pairings": ",".join(pairings), "granularity": granularity,
                  "k": k, "threshold": threshold, "threshold_on": threshold_on,
                  "labels": label_key(label_set)}

        def compute() -> str:
            hg = self.head_graph(ref, **kwargs, label_set=label_set)
            return hg.to_graphml() if fmt == "graphml" else hg.to_gexf()

        return self.cached(ref, "graph_export", params, compute,
                           ("graph_export", (ref, fmt), {**kwargs, "labels": labels}))

    def head_graph(self, ref: ModelRef, *, pairings: list[str], granularity: str, k: int | None,
                   threshold: float | None, threshold_on: str, label_set: Any) -> Any:
        """The core HeadGraph object (core.head_graph; for exports such as GraphML)."""
        from headgraph.core.graph import build_graph

        results = {p: self.pk(ref, p, "forward") for p in pairings}
        cs = {m: self.cs(ref, m, "forward") for m in self.cs_modes_for(pairings)}
        values = None
        if threshold_on == "z":
            values = {p: torch.from_numpy(self.zscores(ref, p, "forward")) for p in pairings}
        elif threshold_on == "fdr":
            values = {p: torch.from_numpy(self.null(ref, p)["significant"]) for p in pairings}
        return build_graph(results, granularity=granularity, k=k, threshold=threshold,
                           threshold_on=threshold_on, values=values, cs=cs or None,
                           labels=label_set, info=self.model_info(ref))
