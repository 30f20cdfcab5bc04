"""Data-weighted PK: GET /api/datapk (core.activations.data_pk), beside PK and CS.

The share of each source head's actual output variance that falls in a later head's read
subspace (out_share), and the share of the variance that head reads which the source
contributes (in_share), from the covariances of one batched forward pass over a prompt set.
Cold results are computed like every other (a compute process, once; in lab mode only with
the token) and cached.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Query, Request

from headgraph.core.names import GraphPairing
from headgraph.server.computations.data_pk import DEFAULT_DATA_PK_TOP
from headgraph.server.http.deps import DataPKDep, ModelDep
from headgraph.server.http.params import ERRORS
from headgraph.server.http.responses import warm_json
from headgraph.server.http.schemas.data_pk import DataPKOut
from headgraph.server.limits import GRAPH_K_MAX

router = APIRouter(prefix="/api", tags=["data-weighted PK"])


@router.get("/datapk", response_model=DataPKOut, responses=ERRORS,
            summary="Data-weighted PK of an O -> Q/K/V pairing: out_share and in_share grids "
                    "from one forward pass, with the top edges beside PK and CS")
async def datapk(request: Request, *, ref: ModelDep,
                 pairing: GraphPairing = Query(
                     "OK", description="O -> Q / K / V: the target input read"),
                 prompts: Literal["text", "random"] = Query(
                     "text", description="text: the bundled prompts; random: repeated random "
                                         "tokens [(bos) r r]"),
                 k: int = Query(DEFAULT_DATA_PK_TOP, ge=1, le=GRAPH_K_MAX,
                                description="edges in 'top'"),
                 rank_on: Literal["out_share", "in_share"] = Query(
                     "out_share", description="what 'top' is ranked by"),
                 data_pk: DataPKDep) -> Any:
    return await warm_json(request, DataPKOut, ref, lambda: data_pk.answer(
        ref, pairing, prompts, k, rank_on))
