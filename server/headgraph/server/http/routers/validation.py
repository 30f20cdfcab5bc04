"""Do the weight metrics predict activation-level effects? GET /api/validation (core.activations.validation).

For one O -> Q/K/V pairing of a runnable model: a seeded random sample of forward pairs
(default 200, all of them when fewer) plus each metric's top-k (PK, CS, data-weighted PK),
their path-ablation effects on both prompt sets, and per metric (and the trivial baselines:
layer gap, source variance share) the Spearman against the effect (sample) and the mean
effect of its top-k, with bootstrap 95% intervals; PK minus each other metric's Spearman with
a paired bootstrap interval (the decision rule) and the sample's power for rho = 0.3. Cold
results are computed like every other (a compute process, once; in lab mode only with the
token) and cached; ``cached=true`` only reads (never computes): what the dashboard shows
before anyone asks.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request

from headgraph.core.names import GraphPairing
from headgraph.server.computations.validation import DEFAULT_SAMPLE, DEFAULT_TOP
from headgraph.server.http.deps import ModelDep, ValidationDep
from headgraph.server.http.params import ERRORS
from headgraph.server.http.responses import render_json, warm_json
from headgraph.server.http.schemas.validation import ValidationOut
from headgraph.server.limits import VALIDATION_SAMPLE_MAX, VALIDATION_TOP_MAX

router = APIRouter(prefix="/api", tags=["validation"])


@router.get("/validation", response_model=ValidationOut, responses=ERRORS,
            summary="PK, CS and data-weighted PK against path-ablation effects: bootstrap CIs, paired differences")
async def validation(request: Request, *, ref: ModelDep,
                     pairing: GraphPairing = Query("OK", description="O -> Q / K / V"),
                     n: int = Query(DEFAULT_SAMPLE, ge=1, le=VALIDATION_SAMPLE_MAX, description="random forward pairs (all of them when the model has fewer)"),
                     k: int = Query(DEFAULT_TOP, ge=1, le=VALIDATION_TOP_MAX, description="top pairs per metric"),
                     seed: int = Query(0, ge=0, le=2**31 - 1, description="the sample's seed"),
                     cached: bool = Query(False, description="only what is cached, never computed "
                                                             "(no 401 in lab mode): computed=false "
                                                             "while this validation is not cached"),
                     validation: ValidationDep) -> Any:
    if cached:  # what is cached changes: rendered each time, never kept
        return await render_json(request, ValidationOut, lambda: validation.answer(
            ref, pairing, n, k, seed, cached=True))
    return await warm_json(request, ValidationOut, ref, lambda: validation.answer(ref, pairing, n, k, seed))
