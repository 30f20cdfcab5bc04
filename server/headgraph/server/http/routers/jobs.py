"""Compute job status (any worker process answers: job records live in the shared store)."""

from __future__ import annotations

from fastapi import APIRouter, Path, Request

from headgraph.server.errors import NotFound
from headgraph.core.names import parse_pairings
from headgraph.server.http.deps import JobsDep, ModelDep
from headgraph.server.http.params import ERRORS, pairings_query
from headgraph.server.http.schemas.common import ErrorBody
from headgraph.server.http.access import ColdLimiter, caller_of
from headgraph.server.http.schemas.jobs import Job, Queue

router = APIRouter(prefix="/api", tags=["jobs"])


@router.get("/jobs", response_model=Job, responses=ERRORS,
            summary="The newest compute job of a model (running or finished), without starting one")
def latest_job(*, ref: ModelDep, pairings: str = pairings_query(), jobs: JobsDep) -> Job:
    job = jobs.latest(ref, list(parse_pairings(pairings)))
    if job is None:
        raise NotFound(f"no compute job of {ref.id} yet (POST /api/models/compute starts one)")
    return Job(**job.to_dict())


@router.get("/jobs/{job_id}", response_model=Job, responses={404: {"model": ErrorBody}},
            summary="State, stage and progress fraction of a compute job")
def get_job(*, job_id: str = Path(..., min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$"),
            jobs: JobsDep) -> Job:
    job = jobs.get(job_id)
    if job is None:
        raise NotFound(f"unknown job {job_id!r}")
    return Job(**job.to_dict())


@router.get("/queue", response_model=Queue,
            summary="This client's cold computations: running, and waiting for a slot (in order)")
async def queue(request: Request) -> Queue:
    """What the dashboard shows while its views wait: nothing is loaded or computed."""
    limiter: ColdLimiter = request.app.state.cold_limiter
    running, queued = limiter.listing(caller_of(request).client)
    return Queue(running=running, queued=queued, per_client=limiter.per_client,
                 queue_per_client=limiter.queue_per_client)
