"""Models: what is offered, what each one is, and precomputing one as a background job."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from headgraph.core.names import parse_pairings
from headgraph.server.compute.results import cached_names_of
from headgraph.server.http.deps import (
    TOKEN_PROTECTED,
    CatalogDep,
    JobsDep,
    ModelDep,
    ScoresDep,
    StoreDep,
    require_token,
)
from headgraph.server.http.params import ERRORS, pairings_query
from headgraph.server.http.responses import render_json
from headgraph.server.http.schemas.common import ErrorBody
from headgraph.server.http.schemas.jobs import Job, JobSubmitted
from headgraph.server.http.schemas.models import ModelInfoOut, ModelList, ModelSummary

router = APIRouter(prefix="/api/models", tags=["models"])


@router.get("", response_model=ModelList, summary="Models offered, their status and cached results")
def list_models(*, catalog: CatalogDep, store: StoreDep, scores: ScoresDep) -> ModelList:
    # A worker thread (a sync endpoint): file-existence checks and a pass over the cache's keys
    # grow with the model root and the cache, so never on the event loop.
    cached = store.cached_names()
    out = []
    for entry in catalog.registry.entries():
        ident = catalog.known_identity(entry.ref)
        out.append(ModelSummary(
            id=entry.ref.id, kind=entry.ref.kind, status=entry.status, message=entry.message,
            info=None if ident is None else ident.info.to_dict(),
            fingerprint=None if ident is None else ident.fingerprint,
            model_fingerprint=None if ident is None else ident.model_fingerprint,
            cached=None if ident is None else cached_names_of(cached, ident, scores.cache.computations)))
    return ModelList(models=out)


@router.get("/info", response_model=ModelInfoOut, responses=ERRORS,
            summary="Shape and provenance of one model (loads it when not yet known)")
async def model_info(request: Request, *, ref: ModelDep,
                     catalog: CatalogDep,
                     scores: ScoresDep) -> Response:
    # Loading an unknown model is cold work (gated: 401 in lab mode without the token); not
    # kept in the response LRU, since what is cached changes.
    def build() -> ModelInfoOut:
        ident = catalog.identity(ref)
        return ModelInfoOut(model=ref.id, fingerprint=ident.fingerprint,
                            model_fingerprint=ident.model_fingerprint, info=ident.info.to_dict(),
                            cached=scores.cache.cached_names(ref) or [])

    return await render_json(request, ModelInfoOut, build)


@router.post("/compute", status_code=202, response_model=JobSubmitted,
             responses={**ERRORS, 401: {"model": ErrorBody}}, dependencies=[Depends(require_token)],
             openapi_extra=TOKEN_PROTECTED,
             summary="Start (or join) a job computing everything the dashboard reads for a model")
def compute(*, ref: ModelDep,
            pairings: str = pairings_query(),
            jobs: JobsDep) -> JSONResponse:
    job, created = jobs.submit(ref, list(parse_pairings(pairings)))
    body = JobSubmitted(job=Job(**job.to_dict()), created=created, status_url=f"/api/jobs/{job.id}")
    return JSONResponse(body.model_dump(), status_code=202)
