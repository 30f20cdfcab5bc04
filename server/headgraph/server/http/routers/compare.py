"""Two models (or checkpoints) of one head layout compared: GET /api/compare.

B - A of one pairing's PK, the top-k edges gained, lost and changed, and the hubs of each
top-k graph with which moved (server.services.comparisons, core.graphs.diff). Different head layouts
are a 422 naming both.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Query, Request

from headgraph.server.http.deps import MODEL_PATTERN, CatalogDep, ScoresDep, cached_first
from headgraph.server.http.params import ERRORS, Pairing
from headgraph.server.http.responses import json_response, render
from headgraph.server.http.schemas.compare import CompareOut
from headgraph.server.limits import GRAPH_K_MAX
from headgraph.server.services.comparisons import compare, compare_json

router = APIRouter(prefix="/api", tags=["compare"])


def model_query(description: str) -> Any:
    return Query(..., min_length=1, max_length=512, pattern=MODEL_PATTERN, description=description)


@router.get("/compare", response_model=CompareOut, responses=ERRORS,
            summary="Two models of one head layout: difference grid, edges gained/lost/changed, hubs")
async def compare_endpoint(*,
        request: Request,
        a: str = model_query("model A (e.g. demo@step-30)"),
        b: str = model_query("model B (e.g. demo)"),
        pairing: Pairing = Query("OK", description="source role then target role, e.g. OK"),
        k: int = Query(20, ge=1, le=GRAPH_K_MAX, description="top-k edges per model"),
        metric: Literal["pk", "normalized"] = Query("pk", description="raw or normalized PK"),
        scores: ScoresDep,
        catalog: CatalogDep) -> Any:
    ref_a, ref_b = catalog.resolve(a), catalog.resolve(b)

    def run() -> bytes:
        d = compare(scores, catalog, ref_a, ref_b, pairing, k=k, metric=metric)
        return render(CompareOut, compare_json(d, ref_a, ref_b, catalog))

    return json_response(await cached_first(request, run))
