"""Behaviour flags of heads from their attention-pattern scores: sinks and short descriptions.

Weight-level findings (PK edges, hubs) are easier to read next to what the heads do. From
``core.activations.patterns.PatternScores`` (mean attention probabilities in [0, 1] per query head):

* **attention sink**: a head whose mean attention to the first position (``first_token``) is
  >= SINK_THRESHOLD (0.9). Such a head puts almost all of its attention on one position, so
  its output barely varies with the input, and PK edges out of (or into) it are weak evidence
  of a circuit: graph edges touching a sink are flagged (core.graphs.build).
* **description**: the pattern kind whose score is highest among the kinds whose score is
  >= its DESCRIBE_THRESHOLDS entry (identity, previous-token, sink, duplicate, induction),
  else "unclassified".

A KV group of a grouped-query model ("L6KV1") is a sink only when every query head it serves
is one (``sink_heads`` lists those that are); its description joins its query heads' distinct
descriptions with " / ". A model without a pattern source has no flags: callers pass None and
every flag reads null ("not measured"), never False.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from headgraph.core.activations.patterns import PATTERN_KINDS, PatternScores
from headgraph.core.errors import InvalidInput
from headgraph.core.names import HeadRef, head_label

SINK_THRESHOLD = 0.9
# Score a pattern kind must reach to describe a head (first_token: the sink threshold).
DESCRIBE_THRESHOLDS: dict[str, float] = {"identity": 0.4, "previous_token": 0.4,
                                         "first_token": SINK_THRESHOLD,
                                         "duplicate_token": 0.4, "induction": 0.4}
KIND_NAMES: dict[str, str] = {"identity": "identity", "previous_token": "previous-token",
                              "first_token": "sink", "duplicate_token": "duplicate",
                              "induction": "induction"}
UNCLASSIFIED = "unclassified"
SINK_RULE = "sink = mean attention to the first position (first_token score) >= {:g}"
DESCRIBE_RULE = ("description = the pattern kind with the highest score among those at or above "
                 "their thresholds (" + ", ".join(f"{KIND_NAMES[k]} {v:g}"
                                                  for k, v in DESCRIBE_THRESHOLDS.items())
                 + "), else 'unclassified'; a KV group joins its query heads' descriptions")


@dataclass(frozen=True)
class HeadFlags:
    """Sink flags and descriptions of every query head.

    first_token / sink: [L, H] (float64 / bool); descriptions: [L][H] strings; layer_indices:
    original block numbers of the rows; threshold: the sink threshold applied.
    """

    layer_indices: tuple[int, ...]
    first_token: torch.Tensor
    sink: torch.Tensor
    descriptions: tuple[tuple[str, ...], ...]
    threshold: float

    def _members(self, name: str) -> list[tuple[int, int]]:
        """(row, head) of the query heads a node name stands for ("L4H7", "L6KV1", "L4H7 O")."""
        ref = HeadRef.parse(name.split(" ")[0])
        if ref.layer not in self.layer_indices:
            raise InvalidInput(f"{name}: layer {ref.layer} has no pattern scores")
        row = self.layer_indices.index(ref.layer)
        n = self.sink.shape[1]
        if not ref.kv:
            if not 0 <= ref.head < n:
                raise InvalidInput(f"{name}: head {ref.head} out of range (0..{n - 1})")
            return [(row, ref.head)]
        raise InvalidInput(f"{name}: a KV group needs its query heads (kv_members)")

    def members_of(self, name: str, heads: list[str] | None = None) -> list[tuple[int, int]]:
        """(row, head) of the query heads behind a node: ``heads`` (node attribute "heads":
        its query heads' names) when given, else the name itself (a query head)."""
        if heads:
            return [m for h in heads for m in self._members(h)]
        return self._members(name)

    def is_sink(self, name: str, heads: list[str] | None = None) -> bool:
        """True when every query head behind the node is a sink."""
        return all(bool(self.sink[r, h]) for r, h in self.members_of(name, heads))

    def sink_heads(self, name: str, heads: list[str] | None = None) -> list[str]:
        """Names of the query heads behind the node that are sinks."""
        return [head_label(self.layer_indices[r], h) for r, h in self.members_of(name, heads)
                if bool(self.sink[r, h])]

    def describe(self, name: str, heads: list[str] | None = None) -> str:
        """The node's description: its query heads' distinct descriptions, " / "-joined."""
        found = [self.descriptions[r][h] for r, h in self.members_of(name, heads)]
        return " / ".join(dict.fromkeys(found))

    def first_token_of(self, name: str, heads: list[str] | None = None) -> float:
        """Mean first_token score of the query heads behind the node."""
        vals = [float(self.first_token[r, h]) for r, h in self.members_of(name, heads)]
        return sum(vals) / len(vals)

    def to_dict(self) -> dict[str, Any]:
        """JSON: rules, threshold, sink head names, descriptions per head name."""
        names = {head_label(layer, h): self.descriptions[i][h]
                 for i, layer in enumerate(self.layer_indices) for h in range(self.sink.shape[1])}
        sinks = [head_label(self.layer_indices[i], h)
                 for i, h in torch.nonzero(self.sink).tolist()]
        return {"measured": True, "threshold": self.threshold,
                "rule": SINK_RULE.format(self.threshold), "describe_rule": DESCRIBE_RULE,
                "sinks": sinks, "descriptions": names}


def not_measured(threshold: float = SINK_THRESHOLD) -> dict[str, Any]:
    """The JSON of ``HeadFlags.to_dict`` for a model without pattern scores (flags null)."""
    return {"measured": False, "threshold": threshold, "rule": SINK_RULE.format(threshold),
            "describe_rule": DESCRIBE_RULE, "sinks": None, "descriptions": None}


def describe_scores(scores: Mapping[str, float],
                    thresholds: Mapping[str, float] = DESCRIBE_THRESHOLDS) -> str:
    """One head's description from its pattern scores ``{kind: score}`` (NaN never passes)."""
    passing = [(float(scores[k]), -i, k) for i, k in enumerate(thresholds)
               if k in scores and not math.isnan(float(scores[k]))
               and float(scores[k]) >= float(thresholds[k])]
    return KIND_NAMES.get(max(passing)[2], max(passing)[2]) if passing else UNCLASSIFIED


def head_flags(patterns: PatternScores, *, sink_threshold: float = SINK_THRESHOLD,
               thresholds: Mapping[str, float] | None = None) -> HeadFlags:
    """Sinks and descriptions of every query head from pattern scores (module docstring).

    ``thresholds`` replaces DESCRIBE_THRESHOLDS (its first_token entry is the sink threshold
    when not given). Ties between kinds go to the kind listed first.
    """
    if not isinstance(patterns, PatternScores):
        raise InvalidInput(f"head_flags needs PatternScores, got {type(patterns).__name__}")
    if not 0.0 < float(sink_threshold) <= 1.0:
        raise InvalidInput(f"sink_threshold must lie in (0, 1], got {sink_threshold!r}")
    thr = dict(DESCRIBE_THRESHOLDS, first_token=float(sink_threshold))
    if thresholds is not None:
        unknown = sorted(set(thresholds) - set(PATTERN_KINDS))
        if unknown:
            raise InvalidInput(f"unknown pattern kinds {unknown}; expected {list(PATTERN_KINDS)}")
        thr = dict(thresholds)
    first = patterns.first_token.detach().to("cpu", torch.float64)
    grids = {k: patterns.grid(k).detach().to("cpu", torch.float64) for k in thr}
    L, H = first.shape
    descriptions = tuple(tuple(describe_scores({k: float(g[i, j]) for k, g in grids.items()}, thr)
                               for j in range(H)) for i in range(L))
    sink = torch.nan_to_num(first, nan=-1.0) >= float(sink_threshold)
    return HeadFlags(layer_indices=tuple(patterns.layer_indices), first_token=first, sink=sink,
                     descriptions=descriptions, threshold=float(sink_threshold))


def pattern_scores_from_dict(data: Mapping[str, Any]) -> PatternScores:
    """``PatternScores.to_dict()`` (as cached as JSON: null for NaN) back into PatternScores."""
    try:
        grids = {k: torch.tensor([[math.nan if v is None else float(v) for v in row]
                                  for row in data["scores"][k]], dtype=torch.float64)
                 for k in PATTERN_KINDS}
        return PatternScores(**grids, layer_indices=tuple(int(x) for x in data["layer_indices"]),
                             n_prompts=int(data.get("n_prompts", 0)),
                             induction_length=int(data.get("induction_length", 0)),
                             seed=int(data.get("seed", 0)))
    except (KeyError, TypeError, ValueError) as err:
        raise InvalidInput(f"not a pattern-scores payload ({err})") from err


NODE_FLAGS: tuple[str, ...] = ("sink", "sink_heads", "description", "first_token")
EDGE_FLAGS: tuple[str, ...] = ("source_sink", "target_sink")


def with_null_flags(node_link: dict[str, Any]) -> dict[str, Any]:
    """Node-link data (a HeadGraph's ``to_node_link()``) in which every node has NODE_FLAGS and
    every edge EDGE_FLAGS: null where the graph was built without flags ("not measured",
    never False). Returns a new dict; nodes and edges are copied."""
    return {**node_link,
            "nodes": [{**{k: None for k in NODE_FLAGS}, **n} for n in node_link.get("nodes", [])],
            "edges": [{**{k: None for k in EDGE_FLAGS}, **e} for e in node_link.get("edges", [])]}
