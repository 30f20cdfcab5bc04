"""GET /api/series and /api/timeline: checkpoint series and per-edge trajectories."""

from __future__ import annotations

from pydantic import BaseModel, Field


class Checkpoint(BaseModel):
    step: int
    model: str = Field(description="model id, usable as ?model= everywhere")


class SeriesOut(BaseModel):
    series: dict[str, list[Checkpoint]] = Field(description="named series -> checkpoints in step order")


class Trajectory(BaseModel):
    source: str
    target: str
    pk: list[float | None] = Field(description="raw PK at each step (null: not a valid pair)")
    normalized: list[float | None]
    change: float | None = Field(description="PK at the last step minus PK at the first")


class TimelineOut(BaseModel):
    series: str
    pairing: str
    metric: str
    k: int
    selection: str
    steps: list[int]
    models: list[str]
    edges: list[Trajectory]
    method: str
