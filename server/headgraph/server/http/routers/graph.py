"""The head graph: top-k (or thresholded) edges per pairing, hubs and class counts."""

from __future__ import annotations

import math
from typing import Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool

from headgraph.core.names import DEFAULT_K, parse_pairings
from headgraph.server.errors import Invalid
from headgraph.server.http.access import caller_of
from headgraph.server.http.deps import GraphsDep, ModelDep
from headgraph.server.http.params import ERRORS, labels_query, optional_k_query, pairings_query
from headgraph.server.http.responses import warm_json
from headgraph.server.http.schemas.graph import GraphOut
from headgraph.server.limits import THRESHOLD_MAGNITUDE_MAX

router = APIRouter(prefix="/api", tags=["graph"])
Granularity = Literal["head", "role"]
ThresholdOn = Literal["pk", "normalized", "z", "fdr"]


FDR_DEFAULT_Q = 0.05


def graph_params(pairings: str, k: int | None, threshold: float | None, threshold_on: str = "pk"
                 ) -> tuple[list[str], int | None, float | None]:
    """Validated (pairings, k, threshold): a threshold, when given, replaces top-k (k ignored);
    otherwise top-k with k defaulting to DEFAULT_K. threshold_on=fdr selects significant pairs
    at BH level ``threshold`` (default FDR_DEFAULT_Q)."""
    names: list[str] = list(parse_pairings(pairings))
    if threshold_on == "fdr" and threshold is None:
        threshold = FDR_DEFAULT_Q
    if threshold is not None:
        if not math.isfinite(threshold):
            raise Invalid("threshold must be a finite number")
        return names, None, threshold
    return names, DEFAULT_K if k is None else k, None


def threshold_query() -> Any:
    return Query(None, ge=-THRESHOLD_MAGNITUDE_MAX, le=THRESHOLD_MAGNITUDE_MAX,
                 description="keep pairs with metric >= threshold (replaces top-k; for fdr: BH q "
                             "level, default 0.05); rounded to 3 significant digits (0 below 1e-6), at most "
                             "max_edges (GET /api/vocabulary) best edges per pairing")


@router.get("/graph", response_model=GraphOut, responses=ERRORS,
            summary="Head graph (node-link JSON) with hubs and in/out-of-class counts")
async def graph(request: Request, *, ref: ModelDep, pairings: str = pairings_query(),
                granularity: Granularity = "head", k: int | None = optional_k_query(),
                threshold: float | None = threshold_query(), threshold_on: ThresholdOn = "pk",
                labels: str | None = labels_query("label set name for class overlay"),
                graphs: GraphsDep) -> Any:
    names, k_, thr = graph_params(pairings, k, threshold, threshold_on)
    params: dict[str, Any] = dict(pairings=names, granularity=granularity, k=k_, threshold=thr,
                  threshold_on=threshold_on, labels=labels)
    may_compute = caller_of(request).authorized
    flags = await run_in_threadpool(  # reads the cache (label sets, identities): off the event loop
        lambda: graphs.default_flags(ref, may_compute=may_compute, **params))
    return await warm_json(request, GraphOut, ref, lambda: {"model": ref.id, **graphs.graph(
        ref, flags=flags, **params)}, labels=labels, variant=("flags", flags))
