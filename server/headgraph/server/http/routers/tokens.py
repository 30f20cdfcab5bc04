"""Per-head descriptions: top unembedding tokens of each role subspace, attention-pattern scores."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request

from headgraph.server.computations.scores import TOKENS_CACHED_K
from headgraph.server.http.deps import ModelDep, ScoresDep
from headgraph.server.http.params import ERRORS, Role
from headgraph.server.http.responses import warm_json
from headgraph.server.http.schemas.tokens import PatternsOut, TokensOut

router = APIRouter(prefix="/api", tags=["tokens"])


@router.get("/tokens", response_model=TokensOut, responses=ERRORS,
            summary="Top tokens of each head's role subspace (optionally one layer / head)")
async def tokens(request: Request, *, ref: ModelDep,
           role: Role = Query("O", description="Q, K, V or O"),
           k: int = Query(10, ge=1, le=TOKENS_CACHED_K),
           layer: int | None = Query(None, ge=0, le=100000, description="original block number"),
           head: int | None = Query(None, ge=0, le=100000, description="head index on the role axis"),
           anisotropic: bool = Query(False, description="also each list against the unembedding-shaped "
                                                        "baseline (200 random planes with the centred "
                                                        "unembedding's covariance), with the count's "
                                                        "binomial test against the 5% chance level"),
           scores: ScoresDep) -> Any:
    return await warm_json(request, TokensOut, ref,
                           lambda: scores.tokens_view(ref, role, k, layer, head, anisotropic))


@router.get("/patterns", response_model=PatternsOut, responses=ERRORS,
            summary="Attention-pattern scores per head (identity, previous, first, duplicate, induction)")
async def patterns(request: Request, *, ref: ModelDep, scores: ScoresDep) -> Any:
    return await warm_json(request, PatternsOut, ref,
                           lambda: {"model": ref.id, **scores.patterns(ref)})
