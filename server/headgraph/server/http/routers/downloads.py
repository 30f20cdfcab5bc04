"""File downloads (Content-Disposition: attachment), one endpoint per resource so OpenAPI states
exactly the formats and metrics each offers: PK, CKA / Procrustes and CS grids, top pairs, head
graphs."""

from __future__ import annotations

import csv
import io
import json
import re
from typing import Any, Literal

import numpy as np
from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from headgraph.core.names import SIMILARITY_KINDS
from headgraph.server.computations.convert import cs_grid_of, grid_axis_labels, jsonable
from headgraph.server.http.access import caller_of
from headgraph.server.http.deps import CatalogDep, GraphsDep, ModelDep, ScoresDep, ViewsDep, cached_first
from headgraph.server.http.params import (
    DEFAULT_K,
    CSMode,
    GridMetric,
    LayerOrder,
    Pairing,
    RankMetric,
    SimilarityMode,
    labels_query,
    optional_k_query,
    pairings_query,
    similarity_query,
)
from headgraph.server.http.routers.graph import Granularity, ThresholdOn, graph_params, threshold_query
from headgraph.server.http.routers.scores import grid_response
from headgraph.server.http.schemas.common import ErrorBody
from headgraph.server.limits import GRAPH_K_MAX
from headgraph.server.models.catalog import ModelCatalog
from headgraph.server.models.offered import ModelRef

router = APIRouter(prefix="/api", tags=["downloads"])
MEDIA = {"csv": "text/csv", "json": "application/json", "npy": "application/octet-stream",
         "graphml": "application/xml", "gexf": "application/xml"}


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "model"


CS_OF_HEADER = "X-Headgraph-CS-Of"  # what a CS download's target axis is (grouped-query models)


def _attachment(body: bytes | str, fmt: str, stem: str, cs_of: str | None = None) -> Response:
    data = body.encode() if isinstance(body, str) else body
    headers = {"Content-Disposition": f'attachment; filename="{stem}.{fmt}"'}
    if cs_of is not None:
        headers[CS_OF_HEADER] = cs_of
    return Response(data, media_type=MEDIA[fmt], headers=headers)


def _grid_csv(catalog: ModelCatalog, ref: ModelRef, grid: np.ndarray, valid: np.ndarray,
              source_role: str, target_role: str, column: str) -> str:
    info = catalog.model_info(ref)
    # a CS grid's K/V axis is per query head even on a grouped-query model
    src = grid_axis_labels(info, source_role, grid.shape[1])
    tgt = grid_axis_labels(info, target_role, grid.shape[3])
    flat, ok = grid.reshape(len(src), len(tgt)), valid.reshape(len(src), len(tgt))
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["source", "target", column])
    for i, j in zip(*np.nonzero(ok)):
        w.writerow([src[i], tgt[j], repr(float(flat[i, j]))])
    return out.getvalue()


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


FILE_RESPONSES: dict[int | str, dict[str, Any]] = {200: {"content": {m: {} for m in set(MEDIA.values())}, "description": "the file"},
                  403: {"model": ErrorBody}, 404: {"model": ErrorBody}, 422: {"model": ErrorBody}}


def _grid_file(catalog: ModelCatalog, ref: ModelRef, ps: Any, grid: np.ndarray, metric: str,
               format: str, stem: str) -> Response:
    """A grid as npy | json | csv; a grouped-query CS grid (per target query head) says so in
    the X-Headgraph-CS-Of header and, in json, its cs_of field."""
    cs_of = cs_grid_of(catalog.model_info(ref), ps)
    if format == "npy":
        return _attachment(_npy(grid), format, stem, cs_of)
    if format == "json":
        return _attachment(json.dumps(grid_response(catalog, ref, ps, grid, metric)), format,
                           stem, cs_of)
    return _attachment(_grid_csv(catalog, ref, grid, ps.valid.numpy(), ps.source_role,
                                 ps.target_role, metric), format, stem, cs_of)


# Each download reads results that may be cold: in a worker thread, cache-only first, a cold
# result only as gated cold work (deps.cached_first: 401 in lab mode without the token, 429).

@router.get("/download/pk", responses=FILE_RESPONSES,
            summary="A PK grid (raw, normalized or z), or a CKA / Procrustes grid, as csv | json | npy")
async def download_pk(*,
    request: Request, ref: ModelDep,
    format: Literal["csv", "json", "npy"] = "csv",
    pairing: Pairing = Query("OK"), order: LayerOrder = "forward", metric: GridMetric = "raw",
    catalog: CatalogDep, views: ViewsDep,
) -> Response:
    def build() -> Response:
        ps, grid = views.metric_grid(ref, pairing, metric, order)
        stem = (f"{_safe(ref.id)}_{metric}_{pairing}_{order}" if metric in SIMILARITY_KINDS
                else f"{_safe(ref.id)}_pk_{pairing}_{metric}_{order}")
        return _grid_file(catalog, ref, ps, grid, metric, format, stem)

    return await cached_first(request, build)


@router.get("/download/cs", responses=FILE_RESPONSES,
            summary="A Composition Score grid (mode Q, K or V) as csv | json | npy; per target "
                    "query head (a grouped-query model's K/V modes say so in X-Headgraph-CS-Of)")
async def download_cs(*,
    request: Request, ref: ModelDep,
    format: Literal["csv", "json", "npy"] = "csv",
    mode: CSMode = Query("K", description="CS mode"), order: LayerOrder = "forward",
    catalog: CatalogDep, scores: ScoresDep,
) -> Response:
    def build() -> Response:
        ps = scores.cs(ref, mode, order)
        return _grid_file(catalog, ref, ps, ps.scores.numpy(), "cs", format,
                          f"{_safe(ref.id)}_cs_{mode}_{order}")

    return await cached_first(request, build)


@router.get("/download/top", responses=FILE_RESPONSES,
            summary="The k best pairs of one pairing as csv | json")
async def download_top(*,
    request: Request, ref: ModelDep,
    format: Literal["csv", "json"] = "csv",
    pairing: Pairing = Query("OK"), order: LayerOrder = "forward", metric: RankMetric = "pk",
    k: int = Query(DEFAULT_K, ge=1, le=GRAPH_K_MAX), similarity: SimilarityMode = similarity_query(),
    views: ViewsDep,
) -> Response:
    def build() -> Response:
        pairs = views.top(ref, pairing, k, metric, order, similarity)
        stem = f"{_safe(ref.id)}_top{k}_{pairing}_{metric}"
        if format == "json":
            body = {"model": ref.id, "pairing": pairing, "metric": metric, "pairs": pairs}
            return _attachment(json.dumps(body), format, stem)
        cols = ["source", "target", "pk", "normalized", "cs"]
        if any("cs_of" in p for p in pairs):  # KV-group targets: CS is the mean over cs_of
            cols.append("cs_of")
        cols += SIMILARITY_KINDS
        cols += [c for c in (pairs[0] if pairs else {}) if c not in cols]
        out = io.StringIO()
        w = csv.DictWriter(out, fieldnames=cols, lineterminator="\n", extrasaction="ignore")
        w.writeheader()
        for p in pairs:
            w.writerow({c: ("" if p.get(c) is None else p.get(c)) for c in cols})
        return _attachment(out.getvalue(), format, stem)

    return await cached_first(request, build)


@router.get("/download/graph", responses=FILE_RESPONSES,
            summary="The head graph as json (node-link) | graphml | gexf")
async def download_graph(*,
    request: Request, ref: ModelDep,
    format: Literal["json", "graphml", "gexf"] = "graphml",
    pairings: str = pairings_query(), granularity: Granularity = "head",
    k: int | None = optional_k_query("edges per pairing (default 20)"),
    threshold: float | None = threshold_query(), threshold_on: ThresholdOn = "pk",
    labels: str | None = labels_query(), graphs: GraphsDep,
) -> Response:
    names, k_, thr = graph_params(pairings, k, threshold, threshold_on)

    params: dict[str, Any] = dict(pairings=names, granularity=granularity, k=k_, threshold=thr,
                                  threshold_on=threshold_on, labels=labels)

    def build() -> Response:
        stem = f"{_safe(ref.id)}_graph_{'-'.join(names)}"
        flags = graphs.default_flags(ref, may_compute=caller_of(request).authorized, **params)
        if format == "json":
            body = graphs.graph(ref, flags=flags, **params)
            return _attachment(json.dumps(jsonable({"model": ref.id, **body})), format, stem)
        return _attachment(graphs.graph_export(ref, format, flags=flags, **params), format, stem)

    return await cached_first(request, build)
