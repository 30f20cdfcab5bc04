"""GET /api/subgraph: a bounded subgraph (edges among heads, a neighbourhood, a layer range)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class SubgraphNodeOut(BaseModel):
    """A node: a query head or a grouped-query KV group (``heads``: the query heads it serves)."""

    name: str
    layer: int
    head: int
    kind: str
    heads: list[str]


class SubgraphEdgeOut(BaseModel):
    """An edge (one valid score cell), best first."""

    source: str
    target: str
    pairing: str
    score: float = Field(description="raw PK")
    normalized: float = Field(description="normalized PK")
    cs: float | None = Field(None, description="CS of the same head pair (to a KV group: the mean over its "
                                                "query heads); null for pairings without CS")
    z: float | None = Field(None, description="z-score (only when ranked by z)")
    value: float = Field(description="the ranked value (rank_on)")
    rank: int = Field(description="1-based place in this answer")


class SubgraphOut(BaseModel):
    """A query's nodes and at most ``cap`` edges; ``left_out`` edges the query selected but the
    cap cut, ``hint`` how to get them."""

    model: str
    query: str = Field(description="heads | neighbourhood | layers")
    rule: str
    rank_on: str
    pairings: list[str]
    params: dict[str, Any]
    total: int = Field(description="edges the query selected")
    cap: int
    left_out: int = Field(description="selected edges not in this answer (total - len(edges))")
    hint: str | None = Field(None, description="how to get the edges left out (null: none left out)")
    edge_counts: dict[str, int]
    nodes: list[SubgraphNodeOut]
    edges: list[SubgraphEdgeOut]
