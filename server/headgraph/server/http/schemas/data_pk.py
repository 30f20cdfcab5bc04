"""GET /api/datapk: data-weighted PK."""

from __future__ import annotations

from pydantic import BaseModel, Field

from headgraph.server.http.schemas.common import Grid4, Mask4


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
