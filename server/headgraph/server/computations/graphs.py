"""Registered computations of head graphs: the JSON graph and its GraphML / GEXF text.

Both build core.graphs.build.build_graph from the model's cached forward PK (plus CS, z or FDR
values to threshold on) and a label set; the label set's exact classes are part of the key.
An edge's CS to a KV group is core.scores.ranking.kv_level_cs's mean over its query heads.
Nodes, edges and hub rows carry the sink flags and descriptions of core.activations.flags, from the
model's cached pattern scores (null without a pattern source): a graph with flags reads a
forward pass, so it is keyed by the model fingerprint, one without by the weights fingerprint.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import torch

from headgraph.core.activations.flags import head_flags, pattern_scores_from_dict, with_null_flags
from headgraph.core.errors import UnsupportedModel
from headgraph.core.graphs.build import build_graph
from headgraph.core.names import CS_MODES, check_pairing, cs_mode_of, quantize_threshold
from headgraph.server.computations.convert import jsonable
from headgraph.server.computations.scores import NULL_SAMPLES
from headgraph.server.compute.registry import (
    MODEL,
    WEIGHTS,
    Computation,
    Inputs,
    any_value,
    optional,
    positive_int,
)
from headgraph.server.errors import Invalid
from headgraph.server.limits import THRESHOLD_EDGES_MAX

GRAPH_FORMATS = ("graphml", "gexf")


def hash_classes(classes: dict[str, str]) -> str:
    return hashlib.sha256(repr(sorted(classes.items())).encode()).hexdigest()[:12]


def label_key(label_set: Any) -> str:
    """Cache-key part naming a label set and its exact classes ("" for none)."""
    return "" if label_set is None else f"{label_set.name}:{hash_classes(label_set.classes)}"


def cs_modes_for(pairings: list[str] | tuple[str, ...]) -> list[str]:
    """The CS modes comparable to some of ``pairings``, in CS_MODES order."""
    modes = {cs_mode_of(p) for p in pairings}
    return [m for m in CS_MODES if m in modes]


def head_graph(src: Inputs, *, pairings: tuple[str, ...], granularity: str, k: int | None,
               threshold: float | None, threshold_on: str, label_set: Any, flags: bool) -> Any:
    """The core HeadGraph object (core.graphs.build.build_graph) of the model's forward scores; with
    ``flags``, nodes and edges carry the sink flags and descriptions of its pattern scores."""
    results = {p: src.result("pk", pairing=p, order="forward") for p in pairings}
    cs = {m: src.result("cs", mode=m, order="forward") for m in cs_modes_for(pairings)}
    values = None
    if threshold_on == "z":
        values = {p: torch.from_numpy(src.result("z", pairing=p, order="forward")) for p in pairings}
    elif threshold_on == "fdr":  # BH q-values from the anisotropic null's p-values
        from headgraph.core.stats.nulls import bh_qvalues

        values = {p: bh_qvalues(torch.from_numpy(src.result("null", pairing=p, samples=NULL_SAMPLES)["p"]),
                                results[p].valid) for p in pairings}
    return build_graph(results, granularity=granularity, k=k, threshold=threshold,
                       threshold_on=threshold_on, values=values, cs=cs or None,
                       labels=label_set, info=src.info, max_edges=THRESHOLD_EDGES_MAX,
                       flags=head_flags_of(src) if flags else None)


def head_flags_of(src: Inputs) -> Any:
    """core.activations.flags.HeadFlags from the model's cached pattern scores; None when the model has no
    pattern source (flags then read null, "not measured")."""
    try:
        patterns = src.result("patterns")
    except UnsupportedModel:
        return None
    return head_flags(pattern_scores_from_dict(patterns))


def graph(src: Inputs, **params: Any) -> dict[str, Any]:
    """Head graph as JSON: node-link, hubs, class counts, flags (null when not measured)."""
    out = head_graph(src, **params).to_dict()
    out["graph"] = with_null_flags(out["graph"])
    return jsonable(out)


def graph_export(src: Inputs, *, format: str, **params: Any) -> str:
    """The head graph as GraphML or GEXF text."""
    hg = head_graph(src, **params)
    return hg.to_graphml() if format == "graphml" else hg.to_gexf()


def _pairings(value: Any) -> tuple[str, ...]:
    return tuple(check_pairing(p) for p in value)


def _format(value: Any) -> str:
    if value not in GRAPH_FORMATS:
        raise Invalid(f"unknown graph format {value!r}; allowed: {list(GRAPH_FORMATS)}",
                      allowed=list(GRAPH_FORMATS))
    return value


GRAPH_CHECKS = {"pairings": _pairings, "granularity": str, "k": optional(positive_int),
                "threshold": optional(quantize_threshold), "threshold_on": str, "label_set": any_value,
                "flags": bool}


def _graph_key(p: dict[str, Any]) -> dict[str, Any]:
    key = {"pairings": ",".join(p["pairings"]), "granularity": p["granularity"], "k": p["k"],
           "threshold": p["threshold"], "threshold_on": p["threshold_on"],
           "labels": label_key(p["label_set"])}
    if p["threshold_on"] == "fdr":
        key["fdr"] = "bh-q"  # selected by BH q-values at the given level (was one 0.05 mask)
    # Edge CS to a KV group: mean over its valid query heads, named in cs_of (graphs cached
    # before had no cs_of; their keys are not read back).
    key["cs"] = "kv-mean"
    # Sink flags and hub descriptions from pattern scores (core.activations.flags; older graphs lack them).
    # Without them (pattern scores not computed yet) the graph does not wait for the patterns.
    key["flags"] = "sink-0.9" if p["flags"] else "none"
    return key


def _graph_reads(key: Mapping[str, Any]) -> str:
    """A graph with sink flags reads the model's pattern scores (a forward pass); one
    without reads the head weights' scores only."""
    return WEIGHTS if key.get("flags") == "none" else MODEL


def graph_computations() -> list[Computation]:
    return [
        Computation("graph", graph, GRAPH_CHECKS, key=_graph_key, reads=_graph_reads),
        Computation("graph_export", graph_export, {"format": _format, **GRAPH_CHECKS},
                    key=lambda p: {"format": p["format"], **_graph_key(p)}, reads=_graph_reads),
    ]
