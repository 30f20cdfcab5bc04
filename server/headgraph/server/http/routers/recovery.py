"""Recovery tables (the PK paper's Tables 1 and 2) for any model: GET /api/recovery (core.stats.recovery).

For one pairing and a label set as the reference (an edge is in it when both heads are
labelled): per metric (PK raw / normalized, CS, CKA, Procrustes, layer gap, random) the share
of its top-k edges' endpoints on reference heads, precision@k and ROC-AUC over all valid
forward pairs, with bootstrap 95% intervals and paired differences vs PK. Cold results are
computed like every other (a compute process, once; in lab mode only with the token) and cached.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request

from headgraph.core.names import DEFAULT_K, GraphPairing
from headgraph.server.computations.recovery import K_MAX
from headgraph.server.http.deps import ModelDep, RecoveryDep
from headgraph.server.http.params import ERRORS
from headgraph.server.http.responses import warm_json
from headgraph.server.http.schemas.recovery import RecoveryOut

router = APIRouter(prefix="/api", tags=["recovery"])


@router.get("/recovery", response_model=RecoveryOut, responses=ERRORS,
            summary="Each metric's recovery of a label set's circuit: top-k share, precision@k, ROC-AUC")
async def recovery(request: Request, *, ref: ModelDep,
                   pairing: GraphPairing = Query("OK", description="O -> Q / K / V"),
                   labels: str = Query(..., min_length=1, max_length=200,
                                       description="label set whose heads are the reference "
                                                   "(a built-in, an uploaded one or 'patterns')"),
                   k: int = Query(DEFAULT_K, ge=1, le=K_MAX, description="top edges per metric"),
                   recovery: RecoveryDep) -> Any:
    return await warm_json(request, RecoveryOut, ref, lambda: recovery.answer(ref, pairing, labels, k),
                           labels=labels)
