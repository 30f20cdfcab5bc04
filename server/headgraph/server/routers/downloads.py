"""File downloads (Content-Disposition: attachment): PK/CS grids, top pairs, head graphs."""

from __future__ import annotations

import csv
import io
import json
import re
from typing import Literal

import numpy as np
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response

from headgraph.server.catalog import ModelCatalog
from headgraph.server.convert import axis_labels, jsonable
from headgraph.server.deps import cached_first, get_catalog, get_graphs, get_scores, get_views, model_ref
from headgraph.server.errors import Invalid
from headgraph.server.graphs import GraphService
from headgraph.server.params import (DEFAULT_K, CSMode, LayerOrder, Pairing, labels_query, optional_k_query,
                                     pairings_query)
from headgraph.server.registry import ModelRef
from headgraph.server.routers.graph import Granularity, ThresholdOn, graph_params, threshold_query
from headgraph.server.routers.scores import grid_response
from headgraph.server.schemas import ErrorBody
from headgraph.server.scores import ScoresService
from headgraph.server.views import ViewService

router = APIRouter(prefix="/api", tags=["downloads"])
FORMATS: dict[str, tuple[str, ...]] = {
    "pk": ("csv", "json", "npy"),
    "cs": ("csv", "json", "npy"),
    "top": ("csv", "json"),
    "graph": ("json", "graphml", "gexf"),
}
MEDIA = {"csv": "text/csv", "json": "application/json", "npy": "application/octet-stream",
         "graphml": "application/xml", "gexf": "application/xml"}


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "model"


def _attachment(body: bytes | str, fmt: str, stem: str) -> Response:
    data = body.encode() if isinstance(body, str) else body
    return Response(data, media_type=MEDIA[fmt],
                    headers={"Content-Disposition": f'attachment; filename="{stem}.{fmt}"'})


def _grid_csv(catalog: ModelCatalog, ref: ModelRef, grid: np.ndarray, valid: np.ndarray,
              source_role: str, target_role: str, column: str) -> str:
    info = catalog.model_info(ref)
    src, tgt = axis_labels(info, source_role), axis_labels(info, target_role)
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


@router.get("/download", responses={200: {"content": {m: {} for m in set(MEDIA.values())},
                                          "description": "the file"},
                                     404: {"model": ErrorBody}, 422: {"model": ErrorBody}},
            summary="Download pk | cs | top | graph as csv | json | npy | graphml | gexf")
async def download(
    request: Request,
    what: Literal["pk", "cs", "top", "graph"] = "pk",
    format: Literal["csv", "json", "npy", "graphml", "gexf"] = "csv",
    ref: ModelRef = Depends(model_ref),
    pairing: Pairing = Query("OK", description="pairing (what=pk, top)"),
    mode: CSMode = Query("K", description="CS mode (what=cs)"),
    order: LayerOrder = "forward",
    metric: Literal["raw", "normalized", "z", "pk", "cs"] = "raw",
    k: int | None = optional_k_query("pairs (what=top, default 20) or edges per pairing (what=graph)"),
    threshold: float | None = threshold_query(),
    threshold_on: ThresholdOn = "pk",
    pairings: str = pairings_query(),
    granularity: Granularity = "head",
    labels: str | None = labels_query(),
    catalog: ModelCatalog = Depends(get_catalog),
    scores: ScoresService = Depends(get_scores),
    views: ViewService = Depends(get_views),
    graphs: GraphService = Depends(get_graphs),
) -> Response:
    if format not in FORMATS[what]:
        raise Invalid(f"format {format!r} is not offered for {what!r}; allowed: {list(FORMATS[what])}",
                      allowed=list(FORMATS[what]))
    # Reading results may compute them: in a worker thread, cache-only first, a cold result
    # only as gated cold work (deps.cached_first: 401 in lab mode without the token, 429).
    def build() -> Response:
        stem = _safe(ref.id)
        if what == "pk":
            if metric not in ("raw", "normalized", "z", "pk"):
                raise Invalid("metric for pk downloads must be raw, normalized or z")
            shown = "raw" if metric == "pk" else metric
            ps, grid = views.metric_grid(ref, pairing, shown, order)
            stem = f"{stem}_pk_{pairing}_{shown}_{order}"
            if format == "npy":
                return _attachment(_npy(grid), format, stem)
            if format == "json":
                return _attachment(json.dumps(grid_response(catalog, ref, ps, grid, shown)), format, stem)
            return _attachment(_grid_csv(catalog, ref, grid, ps.valid.numpy(), ps.source_role,
                                         ps.target_role, shown), format, stem)
        if what == "cs":
            ps = scores.cs(ref, mode, order)
            grid = ps.scores.numpy()
            stem = f"{stem}_cs_{mode}_{order}"
            if format == "npy":
                return _attachment(_npy(grid), format, stem)
            if format == "json":
                return _attachment(json.dumps(grid_response(catalog, ref, ps, grid, "cs")), format, stem)
            return _attachment(_grid_csv(catalog, ref, grid, ps.valid.numpy(), ps.source_role,
                                         ps.target_role, "cs"), format, stem)
        if what == "top":
            rank_metric = {"raw": "pk"}.get(metric, metric)
            kk = DEFAULT_K if k is None else k
            pairs = views.top(ref, pairing, kk, rank_metric, order)
            stem = f"{stem}_top{kk}_{pairing}_{rank_metric}"
            if format == "json":
                body = {"model": ref.id, "pairing": pairing, "metric": rank_metric, "pairs": pairs}
                return _attachment(json.dumps(body), format, stem)
            cols = ["source", "target", "pk", "normalized", "cs"]
            cols += [c for c in (pairs[0] if pairs else {}) if c not in cols]
            out = io.StringIO()
            w = csv.DictWriter(out, fieldnames=cols, lineterminator="\n", extrasaction="ignore")
            w.writeheader()
            for p in pairs:
                w.writerow({c: ("" if p.get(c) is None else p.get(c)) for c in cols})
            return _attachment(out.getvalue(), format, stem)
        names, k_, thr = graph_params(pairings, k, threshold)
        stem = f"{stem}_graph_{'-'.join(names)}"
        if format == "json":
            body = graphs.graph(ref, pairings=names, granularity=granularity, k=k_, threshold=thr,
                                 threshold_on=threshold_on, labels=labels)
            return _attachment(json.dumps(jsonable({"model": ref.id, **body})), format, stem)
        text = graphs.graph_export(ref, format, pairings=names, granularity=granularity, k=k_,
                                    threshold=thr, threshold_on=threshold_on, labels=labels)
        return _attachment(text, format, stem)

    return await cached_first(request, build)
