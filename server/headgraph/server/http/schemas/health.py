"""GET /api/health: liveness and cache counters."""

from __future__ import annotations

from pydantic import BaseModel, Field


class Health(BaseModel):
    status: str = "ok"
    version: str
    compute_version: str
    pid: int
    device: str


class CacheStats(BaseModel):
    """Store counters: entries, bytes, bound and real computations (over all processes)."""

    directory: str
    entries: int
    bytes: int
    size_limit: int
    computations: int
    counts: dict[str, int] = Field(default_factory=dict, description="computations per cache key")
