"""Score grids and rankings: PK, CS, CKA / Procrustes, top pairs, one pair, one head, PK-vs-CS
scatter.

All GET. A warm read is answered from the rendered-response LRU on the event loop, or read and
rendered in a worker thread (responses.warm_json); a cold result is computed synchronously from
a worker thread (single flight across processes, in a compute process; in lab mode only with
the token) and cached; POST /api/models/compute precomputes with progress instead.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool

from headgraph.core.names import GraphPairing
from headgraph.core.types import PairScores
from headgraph.server.computations.convert import cs_grid_of, grid_axis_labels, jsonable
from headgraph.server.computations.data_pk import cached_data_pk_sets, data_pk_failures
from headgraph.server.http.deps import CatalogDep, DetailsDep, ModelDep, ScoresDep, ViewsDep
from headgraph.server.http.params import (
    DEFAULT_K,
    ERRORS,
    CSMode,
    GridMetric,
    LayerOrder,
    Pairing,
    RankMetric,
    SimilarityMode,
    head_query,
    labels_query,
    similarity_query,
)
from headgraph.server.http.responses import render_json, warm_json
from headgraph.server.http.schemas.scores import HeadOut, PairOut, ScatterOut, ScoreGrid, TopPairs
from headgraph.server.limits import GRAPH_K_MAX
from headgraph.server.models.catalog import ModelCatalog
from headgraph.server.models.offered import ModelRef
from headgraph.server.services.bounds import (
    bounded_points,
    grid_too_big,
    layer_overview,
    overview_note,
)

router = APIRouter(prefix="/api", tags=["scores"])


PARTIAL_QUERY: Any = Query(
    False, description="while the model's job runs: read tokens, pattern scores, z and p-values "
                       "only when cached, naming the missing ones in 'pending' (never kept)")


def pairing_query() -> Any:
    return Query("OK", description="source role then target role, e.g. OK (QKVO x QKVO)")


def download_query() -> Any:
    return Query(False, description="the full grid even when it exceeds the API's bound "
                 "(a model with many heads otherwise answers its layer overview)")


def grid_response(catalog: ModelCatalog, ref: ModelRef, ps: PairScores, grid: np.ndarray,
                  metric: str, download: bool = False) -> dict[str, Any]:
    """ScoreGrid JSON of one PairScores and the chosen metric's grid; above the grid bound
    (services.bounds) and without ``download``, its layer overview."""
    info = catalog.model_info(ref)
    valid = ps.valid.numpy()
    shown = grid[valid] if valid.any() else np.zeros(0)
    shown = shown[np.isfinite(shown)]
    source_labels = grid_axis_labels(info, ps.source_role, grid.shape[1])
    target_labels = grid_axis_labels(info, ps.target_role, grid.shape[3])
    source_ranks, target_ranks = ps.source_ranks.tolist(), ps.target_ranks.tolist()
    overview = None
    if grid_too_big(grid.shape) and not download:
        overview = overview_note(grid.shape)
        grid, valid = layer_overview(grid, valid)
        source_labels = target_labels = [f"L{i}" for i in ps.layer_indices]
        source_ranks = [[max(r)] for r in source_ranks]
        target_ranks = [[max(r)] for r in target_ranks]
    return {
        "model": ref.id, "kind": ps.kind, "pairing": ps.pairing, "metric": metric,
        "order": ps.order, "source_role": ps.source_role, "target_role": ps.target_role,
        "shape": list(grid.shape), "layer_indices": list(ps.layer_indices),
        "source_labels": source_labels, "target_labels": target_labels,
        "grid": jsonable(grid), "valid": valid.tolist(),
        "source_ranks": source_ranks, "target_ranks": target_ranks,
        "min": float(shown.min()) if shown.size else None,
        "max": float(shown.max()) if shown.size else None,
        "cs_of": cs_grid_of(info, ps), "overview": overview,
    }


@router.get("/pk", response_model=ScoreGrid, responses=ERRORS,
            summary="Projection Kernel grid of one pairing (raw, normalized or z-score), or its "
                    "linear CKA / orthogonal Procrustes grid (metric=cka | procrustes)")
async def pk(request: Request, *, ref: ModelDep, pairing: Pairing = pairing_query(),
             order: LayerOrder = "forward",
             metric: GridMetric = Query("raw", description="raw | normalized | z (of PK), or cka | "
                                        "procrustes: the PK paper's baselines on the same pairs"),
             download: bool = download_query(), views: ViewsDep,
             catalog: CatalogDep) -> Any:
    def run() -> dict[str, Any]:
        ps, grid = views.metric_grid(ref, pairing, metric, order)
        return grid_response(catalog, ref, ps, grid, metric, download)

    return await warm_json(request, ScoreGrid, ref, run)


@router.get("/cs", response_model=ScoreGrid, responses=ERRORS,
            summary="Composition Score grid (Elhage et al. 2021) of one mode Q, K or V")
async def cs(request: Request, *, ref: ModelDep,
             mode: CSMode = Query("K", description="Composition Score mode: Q, K or V"),
             order: LayerOrder = "forward", download: bool = download_query(),
             scores: ScoresDep, catalog: CatalogDep) -> Any:
    def run() -> dict[str, Any]:
        ps = scores.cs(ref, mode, order)
        return grid_response(catalog, ref, ps, ps.scores.numpy(), "cs", download)

    return await warm_json(request, ScoreGrid, ref, run)


@router.get("/top", response_model=TopPairs, responses=ERRORS,
            summary="The k highest-scoring valid pairs of one pairing")
async def top(request: Request, *, ref: ModelDep, pairing: Pairing = pairing_query(),
              k: int = Query(DEFAULT_K, ge=1, le=GRAPH_K_MAX), metric: RankMetric = "pk",
              order: LayerOrder = "forward", similarity: SimilarityMode = similarity_query(),
              views: ViewsDep, scores: ScoresDep) -> Any:
    # which grids the rows read also decides the answer (a grid cached later changes it)
    sims = await run_in_threadpool(scores.cached_similarity_kinds, ref, pairing, order)
    return await warm_json(request, TopPairs, ref, lambda: {
        "model": ref.id, "pairing": pairing, "metric": metric, "k": k,
        "pairs": views.top(ref, pairing, k, metric, order, similarity)},
        variant=("similarity", sims))


@router.get("/pair", response_model=PairOut, responses=ERRORS,
            summary="One head pair: PK, principal angles, CS, CKA, Procrustes, z, p-values, classes, tokens")
async def pair(request: Request, *, ref: ModelDep, pairing: Pairing = pairing_query(),
               source: str = head_query("L0H0"), target: str = head_query("L1H0"),
               labels: str | None = labels_query(),
               k: int = Query(5, ge=1, le=50, description="top tokens per head"),
               partial: bool = PARTIAL_QUERY,
               details: DetailsDep, scores: ScoresDep) -> Any:
    def optional() -> tuple[tuple[str, ...], dict[str, str], tuple[str, ...]]:  # off the loop
        return (cached_data_pk_sets(details.cache, ref, pairing),  # never computes them
                data_pk_failures(details.cache, ref, pairing),
                scores.cached_similarity_kinds(ref, pairing))  # nor these

    sets, failures, sims = await run_in_threadpool(optional)

    def build() -> Any:
        return details.pair(ref, pairing, source, target, labels, k, sets, failures, sims, partial)

    if partial:  # what is pending changes as the job runs: rendered anew every time
        return await render_json(request, PairOut, build)
    return await warm_json(request, PairOut, ref, build, labels=labels,
                           variant=("data_pk", sets, tuple(sorted(failures)), sims))


@router.get("/head", response_model=HeadOut, responses=ERRORS,
            summary="One head: class, top tokens per role, pattern scores, strongest partners")
async def head(request: Request, *, ref: ModelDep, head: str = head_query("L0H0"),
               labels: str | None = labels_query(), k: int = Query(5, ge=1, le=50),
               partial: bool = PARTIAL_QUERY, details: DetailsDep) -> Any:
    def build() -> Any:
        return details.head(ref, head, labels, k, partial)

    if partial:  # what is pending changes as the job runs: rendered anew every time
        return await render_json(request, HeadOut, build)
    return await warm_json(request, HeadOut, ref, build, labels=labels)


@router.get("/scatter", response_model=ScatterOut, responses=ERRORS,
            summary="PK vs CS of every valid pair: quadrants and Spearman correlations")
async def scatter(request: Request, *, ref: ModelDep,
                  pairing: GraphPairing = Query("OK", description="an O -> Q/K/V pairing (CS exists)"),
                  top_percent: float = Query(5.0, gt=0.0, le=100.0,
                                             description="top share of pairs compared, in percent; "
                                             "rounded to a multiple of 0.1"),
                  download: bool = Query(False, description="every point even above the API's "
                                         "bound (otherwise the top quadrants and a sample)"),
                  views: ViewsDep) -> Any:
    def run() -> dict[str, Any]:
        answer = dict(views.scatter(ref, pairing, top_percent))
        if not download:
            answer["points"], answer["left_out"] = bounded_points(answer["points"])
        return {"model": ref.id, **answer}

    return await warm_json(request, ScatterOut, ref, run)
