"""Compute jobs: status and submission."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class Job(BaseModel):
    """A compute job: state queued|running|done|failed, stage, fraction in [0, 1]."""

    id: str
    model: str
    params: dict[str, Any]
    state: str
    stage: str
    fraction: float
    message: str
    attempt: int
    created: float
    updated: float
    heartbeat: float
    error: str | None = None
    computed: list[str] = Field(default_factory=list, description="stages cached so far, in order")
    plan: list[str] = Field(default_factory=list, description="every stage this job computes")
    unavailable: dict[str, str] = Field(
        default_factory=dict, description="stages this model cannot give -> why (the job still "
                                          "computes the others and ends done)")


class JobSubmitted(BaseModel):
    job: Job
    created: bool = Field(description="false when the same computation was already running")
    status_url: str
