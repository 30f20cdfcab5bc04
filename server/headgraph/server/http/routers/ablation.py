"""Activation-level verification of edges: GET /api/ablation (path ablation, core.ablation).

The top-k edges of an O -> Q/K/V pairing by PK (or one named edge, ``edge=L0H0,L1H3``), each source head's output
mean-ablated on its target's Q, K or V input only, on the bundled text prompts and on
repeated random tokens, with split-half reliability. Cold results are computed like every
other (a compute process, once; in lab mode only with the token) and cached. Each edge has a
``verdict`` (ablation_computations.VERDICT_RULE); ``cached=true`` only reads what is cached
(never computes, so never a 401 in lab mode): what the dashboard shows before anyone asks.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field

from headgraph.core.names import GraphPairing
from headgraph.server.computations.ablation import (ABLATION_TOP_MAX, DEFAULT_ABLATION_TOP,
                                                    VERDICT_RULE)

from headgraph.server.services.ablation import EDGE_PATTERN, parse_edge
from headgraph.server.http.deps import AblationDep, ModelDep
from headgraph.server.http.params import ERRORS
from headgraph.server.http.responses import render_json, warm_json

router = APIRouter(prefix="/api", tags=["ablation"])


class AblationEdge(BaseModel):
    source: str
    target: str = Field(description="a query head (Q path) or, on grouped-query models, a KV "
                                    "group like L6KV1 (K / V paths)")
    pairing: str
    path: str
    measure: str = Field(description="tvd: mean total-variation distance of the target's "
                                     "attention rows (Q, K); relative_output: relative change "
                                     "of the target's output (V)")
    effect_text: float | None = Field(description="effect on the bundled natural-text prompts")
    effect_random: float | None = Field(description="effect on repeated random tokens [r r]")
    halves: dict[str, list[float | None]] = Field(
        description="per prompt set: the effect on the even and the odd half of its prompts")
    pk: float | None
    cs: float | None = Field(description="Composition Score (a KV group: mean over its query heads)")
    verdict: Literal["verified", "no effect", "not measured"] = Field(
        description=VERDICT_RULE + " ('not measured' only with cached=true)")


class VerdictRule(BaseModel):
    min_effect: float = Field(description="the effect both split halves must reach")
    rule: str


class AblationOut(BaseModel):
    model: str
    pairing: str
    selection: str
    edges: list[AblationEdge]
    reliability: dict[str, dict[str, Any]] = Field(
        description="per prompt set: r_half (Spearman between the halves over these edges), "
                    "reliability (Spearman-Brown, in [-1, 1]; null with fewer than 3 edges); "
                    "with cached=true only when exactly this edge set is cached, else {}")
    n_prompts: dict[str, int]
    induction_length: int | None = Field(description="null: nothing measured (cached=true)")
    method: str | None
    cached_only: bool = Field(description="true: read from the cache only (cached=true)")
    verdict_rule: VerdictRule


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
                   cached: bool = Query(
                       False, description="only what is cached, never computed: an edge no "
                                          "cached ablation of this pairing measured is 'not "
                                          "measured'; no edges while the model's PK is not cached"),
                   ablation: AblationDep) -> Any:
    one = None if edge is None else parse_edge(edge)
    if cached:  # what is cached changes: rendered each time, never kept
        return await render_json(request, AblationOut, lambda: ablation.answer(
            ref, pairing, top, one, cached=True))
    return await warm_json(request, AblationOut, ref, lambda: ablation.answer(
        ref, pairing, top, one))
