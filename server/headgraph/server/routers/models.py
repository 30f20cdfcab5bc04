"""Models: what is offered, what each one is, and precomputing one as a background job."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query
from fastapi.responses import JSONResponse

from headgraph.server.deps import (TOKEN_PROTECTED, get_jobs, get_service, model_ref,
                                   require_token)
from headgraph.server.jobs import JobManager
from headgraph.server.registry import ModelRef
from headgraph.server.schemas import ErrorBody, JobSubmitted, ModelInfoOut, ModelList, ModelSummary
from headgraph.server.service import GRAPH_PAIRINGS, PAIRINGS_PATTERN, Service, parse_pairings

router = APIRouter(prefix="/api/models", tags=["models"])
ERRORS = {404: {"model": ErrorBody}, 403: {"model": ErrorBody}, 422: {"model": ErrorBody}}


@router.get("", response_model=ModelList, summary="Models offered, their status and cached results")
async def list_models(service: Service = Depends(get_service)) -> ModelList:
    # On the event loop: only file-existence checks and one pass over the cache's keys.
    cached = service.store.cached_names()
    out = []
    for entry in service.registry.entries():
        ident = service.identity(entry.ref, load=False)
        out.append(ModelSummary(
            id=entry.ref.id, kind=entry.ref.kind, status=entry.status, message=entry.message,
            info=None if ident is None else ident.info.to_dict(),
            fingerprint=None if ident is None else ident.fingerprint,
            cached=None if ident is None else cached.get(ident.fingerprint, [])))
    return ModelList(models=out)


@router.get("/info", response_model=ModelInfoOut, responses=ERRORS,
            summary="Shape and provenance of one model (loads it when not yet known)")
def model_info(ref: ModelRef = Depends(model_ref),
               service: Service = Depends(get_service)) -> ModelInfoOut:
    ident = service.identity(ref)
    assert ident is not None
    return ModelInfoOut(model=ref.id, fingerprint=ident.fingerprint, info=ident.info.to_dict(),
                        cached=service.cached_names(ref) or [])


@router.post("/compute", status_code=202, response_model=JobSubmitted,
             responses={**ERRORS, 401: {"model": ErrorBody}}, dependencies=[Depends(require_token)],
             openapi_extra=TOKEN_PROTECTED,
             summary="Start (or join) a job computing everything the dashboard reads for a model")
def compute(ref: ModelRef = Depends(model_ref),
            pairings: str = Query(",".join(GRAPH_PAIRINGS), max_length=200, pattern=PAIRINGS_PATTERN,
                                  description="comma-separated pairings, e.g. OQ,OK,OV"),
            jobs: JobManager = Depends(get_jobs)) -> JSONResponse:
    job, created = jobs.submit(ref, parse_pairings(pairings))
    body = JobSubmitted(job=job.to_dict(), created=created, status_url=f"/api/jobs/{job.id}")
    return JSONResponse(body.model_dump(), status_code=202)
