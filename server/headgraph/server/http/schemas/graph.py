"""GET /api/graph: the head graph as node-link JSON."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class GraphOut(BaseModel):
    """Head graph: rule, edge counts, hubs, class counts and the node-link graph."""

    model_config = ConfigDict(extra="allow")

    model: str
    granularity: str
    pairings: list[str]
    rule: str
    edge_counts: dict[str, int]
    capped: dict[str, int] = Field(default_factory=dict, description=(
        "pairings whose rule passed more than max_edges edges (GET /api/vocabulary): how many "
        "passed; only the best max_edges of each are in the graph"))
    hubs: dict[str, Any]
    class_counts: dict[str, int] | None = None
    recovery: dict[str, float] | None = None
    labels: str | None = None
    flags: dict[str, Any] | None = Field(None, description=(
        "attention-sink flags (core.activations.flags): measured, threshold, rule, describe_rule, sinks "
        "(sink head names), sink_edges (per pairing, edges touching a sink); null values when "
        "the model has no pattern scores"))
    graph: dict[str, Any] = Field(description=(
        "networkx node-link data (keys: nodes, edges); nodes carry sink, sink_heads, "
        "description, first_token, edges source_sink, target_sink (null: not measured)"))
