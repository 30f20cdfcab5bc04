"""Activation-level verification of edges: GET /api/ablation (path ablation, core.activations.ablation).

The top-k edges of an O -> Q/K/V pairing by PK (or one named edge, ``edge=L0H0,L1H3``), each source head's output
mean-ablated on its target's Q, K or V input only, on the bundled text prompts and on
repeated random tokens, with split-half reliability. Cold results are computed like every
other (a compute process, once; in lab mode only with the token) and cached; ``ablation=resample``
replaces the source's output by its value on another prompt instead of its mean. Each edge has a
``verdict`` against the random-pair null (ablation_computations.VERDICT_RULE); ``cached=true`` only reads what is cached
(never computes, so never a 401 in lab mode): what the dashboard shows before anyone asks.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Query, Request

from headgraph.core.names import GraphPairing
from headgraph.server.computations.ablation import DEFAULT_ABLATION_TOP
from headgraph.server.http.deps import AblationDep, ModelDep
from headgraph.server.http.params import ERRORS
from headgraph.server.http.responses import render_json, warm_json
from headgraph.server.http.schemas.ablation import AblationOut
from headgraph.server.limits import ABLATION_TOP_MAX
from headgraph.server.services.ablation import EDGE_PATTERN, parse_edge

router = APIRouter(prefix="/api", tags=["ablation"])


@router.get("/ablation", response_model=AblationOut, responses=ERRORS,
            summary="Path-ablation effects of the top-k edges of a pairing (or one edge), with "
                    "split-half reliability")
async def ablation(request: Request, *, ref: ModelDep,
                   pairing: GraphPairing = Query(
                       "OK", description="O -> Q / K / V: the target input that is ablated"),
                   top: int = Query(DEFAULT_ABLATION_TOP, ge=1, le=ABLATION_TOP_MAX,
                                    description="the k highest-PK forward edges"),
                   edge: str | None = Query(
                       None, max_length=64, pattern=EDGE_PATTERN,
                       description="one edge instead of the top k: 'source,target', e.g. "
                                   "'L0H0,L1H3' or 'L16H0,L17KV1' (a KV group)"),
                   kind: Literal["mean", "resample"] = Query(
                       "mean", alias="ablation",
                       description="what replaces the source's output: its mean over the prompt "
                                   "set, or its value on the next prompt at the same position "
                                   "(resample ablation); the verdicts' null uses the same"),
                   cached: bool = Query(
                       False, description="only what is cached, never computed: an edge no "
                                          "cached ablation of this pairing measured is 'not "
                                          "measured'; no edges while the model's PK is not cached"),
                   ablation: AblationDep) -> Any:
    one = None if edge is None else parse_edge(edge)
    if cached:  # what is cached changes: rendered each time, never kept
        return await render_json(request, AblationOut, lambda: ablation.answer(
            ref, pairing, top, one, cached=True, ablation=kind))
    return await warm_json(request, AblationOut, ref, lambda: ablation.answer(
        ref, pairing, top, one, ablation=kind))
