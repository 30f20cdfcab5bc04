"""GET /api/compare: two models of one head layout compared."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class EdgeChangeOut(BaseModel):
    source: str
    target: str
    status: str = Field(description="gained (B's top-k only), lost (A's only) or kept")
    a: float
    b: float
    delta: float = Field(description="B - A")
    rank_a: int | None
    rank_b: int | None


class HubOut(BaseModel):
    name: str
    rank: int
    degree: int
    is_hub: bool
    weighted_degree: float


class HubMoveOut(BaseModel):
    name: str
    status: str = Field(description="hub in both | new hub (B only) | no longer a hub (A only)")
    rank_a: int | None
    rank_b: int | None
    degree_a: int
    degree_b: int


class CompareOut(BaseModel):
    a: str
    b: str
    pairing: str
    metric: str
    k: int
    shape: list[int]
    layer_indices: list[int]
    source_labels: list[str]
    target_labels: list[str]
    grid_a: list[Any] = Field(description="[L][Hs][L][Ht] the metric in A, null where not valid in both")
    grid_b: list[Any]
    diff: list[Any] = Field(description="B - A, null where not valid in both")
    valid: list[Any]
    summary: dict[str, float | int]
    gained: list[EdgeChangeOut]
    lost: list[EdgeChangeOut]
    changed: list[EdgeChangeOut]
    hubs_a: list[HubOut]
    hubs_b: list[HubOut]
    hub_moves: list[HubMoveOut]
    method: str
