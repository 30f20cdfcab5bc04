"""Checkpoint series and per-edge trajectories: GET /api/series, GET /api/timeline.

A timeline follows edges of one pairing across a series' checkpoints (server.services.comparisons,
core.graphs.timeline): the given ``edge=source,target`` (repeatable) or the last checkpoint's top-k.
``format=csv`` exports the trajectories one row per (edge, checkpoint).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from pydantic import StringConstraints

from headgraph.server.http.deps import CatalogDep, ScoresDep, cached_first
from headgraph.server.http.params import ERRORS, Pairing
from headgraph.server.http.responses import json_response, render
from headgraph.server.http.schemas.series import SeriesOut, TimelineOut
from headgraph.server.limits import TIMELINE_EDGES_MAX
from headgraph.server.services.comparisons import (
    named_series,
    parse_edges,
    resolve_series,
    timeline,
    timeline_csv,
    timeline_json,
)

router = APIRouter(prefix="/api", tags=["series"])


@router.get("/series", response_model=SeriesOut, responses=ERRORS,
            summary="Named checkpoint series (e.g. demo-series) and their model ids")
async def series_list() -> Any:
    return {"series": {name: [{"step": s, "model": m} for s, m in pairs]
                       for name, pairs in named_series().items()}}


TIMELINE_RESPONSES: dict[int | str, dict[str, Any]] = {
    **ERRORS, 200: {"content": {"application/json": {}, "text/csv": {}},
                    "description": "the trajectories (JSON) or, with format=csv, one row per edge and step"}}


# One edge of a timeline: two head names, comma-separated.
EdgeText = Annotated[str, StringConstraints(pattern=r"^[^,]+,[^,]+$")]


@router.get("/timeline", response_model=TimelineOut, responses=TIMELINE_RESPONSES,
            summary="Per-edge PK trajectories over a series of checkpoints (JSON or CSV)")
async def timeline_endpoint(*,
        request: Request,
        series: str = Query(..., min_length=1, max_length=4096,
                            description="a named series (GET /api/series) or a comma list of "
                                        "model ids"),
        pairing: Pairing = Query("OK", description="source role then target role, e.g. OK"),
        k: int = Query(10, ge=1, le=TIMELINE_EDGES_MAX, description="top-k edges of the last checkpoint"),
        metric: Literal["pk", "normalized"] = Query("pk", description="what the top-k ranks by"),
        edge: list[EdgeText] | None = Query(None, description="follow these edges instead "
                                                      "of the top-k: 'source,target', repeatable"),
        format: Literal["json", "csv"] = Query("json", description="csv: one row per edge and step"),
        scores: ScoresDep,
        catalog: CatalogDep) -> Any:
    resolved = resolve_series(catalog, series)
    edges = parse_edges(edge)

    def run() -> Any:
        tl = timeline(scores, catalog, resolved, pairing, k=k, metric=metric, edges=edges)
        if format == "csv":
            return timeline_csv(tl)
        return render(TimelineOut, timeline_json(tl, resolved, k, metric))

    body = await cached_first(request, run)
    if format == "csv":
        name = "".join(c if c.isalnum() or c in "-_" else "_" for c in resolved.name)[:60]
        return Response(body, media_type="text/csv", headers={
            "Content-Disposition": f'attachment; filename="timeline-{name}-{pairing}.csv"'})
    return json_response(body)
