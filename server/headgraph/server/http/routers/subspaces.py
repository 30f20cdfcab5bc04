"""Raw vs norm-aware subspaces of one model: GET /api/subspaces (server.services.subspaces,
core.graphs.agreement): Spearman of the two PK grids, their shared top-k edges and, with a label
set, which recovers its heads better (paired bootstrap ROC-AUC difference)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request

from headgraph.core.names import DEFAULT_K, GraphPairing
from headgraph.server.http.deps import LabelsDep, ModelDep, ScoresDep
from headgraph.server.http.params import ERRORS
from headgraph.server.http.responses import warm_json
from headgraph.server.http.schemas.subspaces import SubspacesOut
from headgraph.server.limits import RECOVERY_K_MAX
from headgraph.server.services.subspaces import compare_subspaces

router = APIRouter(prefix="/api", tags=["recovery"])


@router.get("/subspaces", response_model=SubspacesOut, responses=ERRORS,
            summary="Raw vs norm-aware PK of one model: rank agreement, shared top-k, recovery")
async def subspaces(request: Request, *, ref: ModelDep,
                    pairing: GraphPairing = Query("OK", description="O -> Q / K / V"),
                    k: int = Query(DEFAULT_K, ge=1, le=RECOVERY_K_MAX, description="top edges per mode"),
                    labels: str | None = Query(None, min_length=1, max_length=200,
                                               description="label set whose heads are the reference "
                                                           "(none: no recovery comparison)"),
                    scores: ScoresDep, label_sets: LabelsDep) -> Any:
    # kept under the raw weights' identity: the norm-aware weights are a function of them
    return await warm_json(request, SubspacesOut, ref.with_subspaces("raw"),
                           lambda: compare_subspaces(scores, label_sets, ref, pairing, k, labels),
                           labels=labels)
