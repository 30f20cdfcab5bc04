"""Data-weighted PK: GET /api/datapk (core.data_pk), beside PK and CS.

The share of each source head's actual output variance that falls in a later head's read
subspace (out_share), and the share of the variance that head reads which the source
contributes (in_share), from the covariances of one batched forward pass over a prompt set.
Cold results are computed like every other (a compute process, once; in lab mode only with
the token) and cached.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field

from headgraph.core.names import GraphPairing
from headgraph.server.computations.data_pk import DEFAULT_DATA_PK_TOP
from headgraph.server.http.deps import DataPKDep, ModelDep
from headgraph.server.http.params import ERRORS, K_MAX
from headgraph.server.http.responses import warm_json
from headgraph.server.http.schemas import Grid4, Mask4

router = APIRouter(prefix="/api", tags=["data-weighted PK"])


class DataPKEdge(BaseModel):
    rank: int
    source: str
    target: str = Field(description="a query head (OQ) or, on grouped-query models, a KV group "
                                    "like L6KV1 (OK / OV)")
    pk: float
    cs: float | None = Field(description="Composition Score (a KV group: mean over its query heads)")
    out_share: float | None
    in_share: float | None
    out_share_baseline: float | None = Field(description="r_T / d_model: a random plane's "
                                                         "expected out_share")
    in_share_baseline: float | None = Field(description="tr(C_S) / tr(C_X): the source's share "
                                                        "of all variance entering the layer")


class DataPKOut(BaseModel):
    """Grids [source_layer][source_head][target_layer][target_head] (positions; block numbers
    in ``layer_indices``), null where not valid (only forward pairs are)."""

    model: str
    pairing: str
    prompts: str
    rank_on: str
    k: int
    shape: list[int]
    layer_indices: list[int]
    source_labels: list[str]
    target_labels: list[str]
    out_share: Grid4 = Field(description="tr(U_T^T C_S U_T) / tr(C_S), in [0, 1]")
    in_share: Grid4 = Field(description="tr(U_T^T C_S U_T) / tr(U_T^T C_X U_T), >= 0 (cross-"
                                        "covariances can take it past 1)")
    valid: Mask4
    out_share_baseline: list[list[float | None]] = Field(description="[target_layer][target_head]")
    in_share_baseline: list[list[list[float | None]]] = Field(
        description="[source_layer][source_head][target_layer]")
    source_variance: list[list[float | None]] = Field(description="tr(C_S) [layer][head]")
    input_variance: list[float | None] = Field(description="tr(C_X) of each layer's input")
    target_input_variance: list[list[float | None]] = Field(
        description="tr(U_T^T C_X U_T) [layer][target head]")
    n_positions: int
    n_prompts: int
    method: str
    top: list[DataPKEdge] = Field(description="the k best valid edges by rank_on")


@router.get("/datapk", response_model=DataPKOut, responses=ERRORS,
            summary="Data-weighted PK of an O -> Q/K/V pairing: out_share and in_share grids "
                    "from one forward pass, with the top edges beside PK and CS")
async def datapk(request: Request, *, ref: ModelDep,
                 pairing: GraphPairing = Query(
                     "OK", description="O -> Q / K / V: the target input read"),
                 prompts: Literal["text", "random"] = Query(
                     "text", description="text: the bundled prompts; random: repeated random "
                                         "tokens [(bos) r r]"),
                 k: int = Query(DEFAULT_DATA_PK_TOP, ge=1, le=K_MAX,
                                description="edges in 'top'"),
                 rank_on: Literal["out_share", "in_share"] = Query(
                     "out_share", description="what 'top' is ranked by"),
                 data_pk: DataPKDep) -> Any:
    return await warm_json(request, DataPKOut, ref, lambda: data_pk.answer(
        ref, pairing, prompts, k, rank_on))
