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
    seconds: dict[str, float] = Field(default_factory=dict,
                                      description="each finished stage's wall time, in seconds")
    remaining_s: float | None = Field(
        default=None, description="estimated seconds left as of the current stage's start: the "
                                  "unfinished stages' cost (from the model's shapes) at the speed "
                                  "this job has shown, or before enough of it has run, at this "
                                  "machine's measured matrix-product speed")
    finish_by: float | None = Field(
        default=None, description="when (Unix time, s) the job should be done by that estimate; "
                                  "time left = finish_by - now; null while there is no estimate")


class JobSubmitted(BaseModel):
    job: Job
    created: bool = Field(description="false when the same computation was already running")
    status_url: str


class Queue(BaseModel):
    """The calling client's cold computations: those running and those waiting for a slot."""

    running: list[str] = Field(description="cold computations holding one of this client's slots "
                                           "(resource · model · parameters)")
    queued: list[str] = Field(description="cold computations waiting for a slot, next first")
    per_client: int = Field(description="slots per client (cold computations running at once)")
    queue_per_client: int = Field(description="waiting computations a client may have (429 beyond)")
