"""Score grids and rankings: PK, CS, top pairs, one pair, one head, PK-vs-CS scatter.

All GET. Warm reads are answered on the event loop (deps.cached_first); a cold result is
computed synchronously from a worker thread (single flight across processes, in a compute
process) and cached; POST /api/models/compute precomputes with progress instead.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from fastapi import APIRouter, Depends, Query

from headgraph.core.types import PairScores
from headgraph.server.convert import axis_labels, jsonable
from headgraph.server.deps import cached_first, get_service, model_ref
from headgraph.server.registry import ModelRef
from headgraph.server.schemas import (ErrorBody, HeadOut, PairOut, ScatterOut, ScoreGrid,
                                      TopPairs)
from headgraph.server.service import ModeName, PairingName, Service

router = APIRouter(prefix="/api", tags=["scores"])
ERRORS = {404: {"model": ErrorBody}, 403: {"model": ErrorBody}, 422: {"model": ErrorBody}}
Order = Literal["forward", "all", "same-layer"]
PAIRING_Q = Query("OK", description="source role then target role, e.g. OK (QKVO x QKVO)")
HEAD_Q = dict(min_length=1, max_length=32, description="head name like L1H3 (original block number)")


def grid_response(service: Service, ref: ModelRef, ps: PairScores, grid: np.ndarray,
                  metric: str) -> dict[str, Any]:
    """ScoreGrid JSON of one PairScores and the chosen metric's grid."""
    info = service.model_info(ref)
    valid = ps.valid.numpy()
    shown = grid[valid] if valid.any() else np.zeros(0)
    shown = shown[np.isfinite(shown)]
    return {
        "model": ref.id, "kind": ps.kind, "pairing": ps.pairing, "metric": metric,
        "order": ps.order, "source_role": ps.source_role, "target_role": ps.target_role,
        "shape": list(grid.shape), "layer_indices": list(ps.layer_indices),
        "source_labels": axis_labels(info, ps.source_role),
        "target_labels": axis_labels(info, ps.target_role),
        "grid": jsonable(grid), "valid": valid.tolist(),
        "source_ranks": ps.source_ranks.tolist(), "target_ranks": ps.target_ranks.tolist(),
        "min": float(shown.min()) if shown.size else None,
        "max": float(shown.max()) if shown.size else None,
    }


@router.get("/pk", response_model=ScoreGrid, responses=ERRORS,
            summary="Projection Kernel grid of one pairing (raw, normalized or z-score)")
async def pk(ref: ModelRef = Depends(model_ref), pairing: PairingName = PAIRING_Q, order: Order = "forward",
       metric: Literal["raw", "normalized", "z"] = "raw",
       service: Service = Depends(get_service)) -> Any:
    def run() -> dict[str, Any]:
        ps, grid = service.metric_grid(ref, pairing, metric, order)
        return grid_response(service, ref, ps, grid, metric)

    return await cached_first(run)


@router.get("/cs", response_model=ScoreGrid, responses=ERRORS,
            summary="Composition Score grid (Elhage et al. 2021) of one mode Q, K or V")
async def cs(ref: ModelRef = Depends(model_ref),
       mode: ModeName = Query("K", description="Composition Score mode: Q, K or V"),
       order: Order = "forward", service: Service = Depends(get_service)) -> Any:
    def run() -> dict[str, Any]:
        ps = service.cs(ref, mode, order)
        return grid_response(service, ref, ps, ps.scores.numpy(), "cs")

    return await cached_first(run)


@router.get("/top", response_model=TopPairs, responses=ERRORS,
            summary="The k highest-scoring valid pairs of one pairing")
async def top(ref: ModelRef = Depends(model_ref), pairing: PairingName = PAIRING_Q,
        k: int = Query(20, ge=1, le=1000),
        metric: Literal["pk", "normalized", "cs", "z"] = "pk", order: Order = "forward",
        service: Service = Depends(get_service)) -> Any:
    pairs = await cached_first(service.top, ref, pairing, k, metric, order)
    return {"model": ref.id, "pairing": pairing, "metric": metric, "k": k, "pairs": pairs}


@router.get("/pair", response_model=PairOut, responses=ERRORS,
            summary="One head pair: PK, principal angles, CS, z, p-values, classes, tokens")
async def pair(ref: ModelRef = Depends(model_ref), pairing: PairingName = PAIRING_Q,
         source: str = Query("L0H0", **HEAD_Q), target: str = Query("L1H0", **HEAD_Q),
         labels: str | None = Query(None, max_length=128, description="label set name"),
         k: int = Query(5, ge=1, le=50, description="top tokens per head"),
         service: Service = Depends(get_service)) -> Any:
    return await cached_first(service.pair, ref, pairing, source, target, labels, k)


@router.get("/head", response_model=HeadOut, responses=ERRORS,
            summary="One head: class, top tokens per role, pattern scores, strongest partners")
async def head(ref: ModelRef = Depends(model_ref), head: str = Query("L0H0", **HEAD_Q),
         labels: str | None = Query(None, max_length=128, description="label set name"),
         k: int = Query(5, ge=1, le=50), service: Service = Depends(get_service)) -> Any:
    return await cached_first(service.head, ref, head, labels, k)


@router.get("/scatter", response_model=ScatterOut, responses=ERRORS,
            summary="PK vs CS of every valid pair: quadrants and Spearman correlations")
async def scatter(ref: ModelRef = Depends(model_ref), pairing: PairingName = PAIRING_Q,
            top_percent: float = Query(5.0, gt=0.0, le=100.0),
            service: Service = Depends(get_service)) -> Any:
    out = await cached_first(service.scatter, ref, pairing, top_percent)
    return {"model": ref.id, **out}
