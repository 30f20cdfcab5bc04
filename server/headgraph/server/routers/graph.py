"""The head graph: top-k (or thresholded) edges per pairing, hubs and class counts."""

from __future__ import annotations

import math
from typing import Any, Literal

from fastapi import APIRouter, Depends, Query

from headgraph.server.deps import cached_first, get_service, model_ref
from headgraph.server.errors import Invalid
from headgraph.server.registry import ModelRef
from headgraph.server.schemas import ErrorBody, GraphOut
from headgraph.server.service import GRAPH_PAIRINGS, PAIRINGS_PATTERN, Service, parse_pairings

router = APIRouter(prefix="/api", tags=["graph"])
ERRORS = {404: {"model": ErrorBody}, 403: {"model": ErrorBody}, 422: {"model": ErrorBody}}
THRESHOLD_LIMIT = 1e6


def graph_params(pairings: str, k: int | None, threshold: float | None
                 ) -> tuple[list[str], int | None, float | None]:
    """Validated (pairings, k, threshold): a threshold, when given, replaces top-k (k ignored);
    otherwise top-k with k defaulting to 20."""
    names = parse_pairings(pairings)
    if threshold is not None:
        if not math.isfinite(threshold):
            raise Invalid("threshold must be a finite number")
        return names, None, threshold
    return names, 20 if k is None else k, None


@router.get("/graph", response_model=GraphOut, responses=ERRORS,
            summary="Head graph (node-link JSON) with hubs and in/out-of-class counts")
async def graph(ref: ModelRef = Depends(model_ref),
          pairings: str = Query(",".join(GRAPH_PAIRINGS), max_length=200, pattern=PAIRINGS_PATTERN,
                                description="comma-separated pairings, e.g. OQ,OK,OV"),
          granularity: Literal["head", "role"] = "head",
          k: int | None = Query(None, ge=1, le=1000, description="top-k edges per pairing (default 20)"),
          threshold: float | None = Query(None, ge=-THRESHOLD_LIMIT, le=THRESHOLD_LIMIT,
                                          description="keep pairs with metric >= threshold (replaces top-k; for fdr: BH q level)"),
          threshold_on: Literal["pk", "normalized", "z", "fdr"] = "pk",
          labels: str | None = Query(None, max_length=128, description="label set name for class overlay"),
          service: Service = Depends(get_service)) -> Any:
    names, k_, thr = graph_params(pairings, k, threshold)
    if threshold_on == "fdr" and thr is None:
        raise Invalid("threshold_on=fdr selects significant pairs: give threshold (e.g. 0.05)")
    out = await cached_first(service.graph, ref, pairings=names, granularity=granularity, k=k_,
                             threshold=thr, threshold_on=threshold_on, labels=labels)
    return {"model": ref.id, **out}
