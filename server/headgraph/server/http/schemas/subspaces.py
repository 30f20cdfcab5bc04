"""GET /api/subspaces: raw vs norm-aware PK of one model and pairing."""

from __future__ import annotations

from pydantic import BaseModel, Field

from headgraph.server.http.schemas.recovery import Estimate, MetricRow


class SubspacesRecovery(BaseModel):
    n_reference: int = Field(description="valid pairs joining two reference heads")
    base_rate: float
    confidence: float
    n_resamples: int
    rows: list[MetricRow] = Field(description="metric 'raw' (the baseline) and 'norm' (its auc_diff: "
                                              "norm - raw, paired)")


class SubspacesOut(BaseModel):
    model: str = Field(description="the raw model's id")
    raw: str
    norm: str = Field(description="the norm-aware variant's id (MODEL@norm)")
    norm_gains: str | None = Field(description="what the norm-aware model folds in")
    pairing: str
    k: int
    n_valid: int = Field(description="pairs valid in both modes")
    spearman: float | None = Field(description="rank correlation of raw and norm-aware PK over those pairs")
    top_raw: list[str]
    top_norm: list[str]
    shared: list[str] = Field(description="edges in both top-k sets, in the raw order")
    n_shared: int
    labels: str | None = Field(description="the label set whose heads are the reference (none: no recovery)")
    reference_heads: list[str] | None
    recovery: SubspacesRecovery | None
    auc_difference: Estimate | None = Field(description="ROC-AUC(norm) - ROC-AUC(raw), paired bootstrap")
    verdict: str | None = Field(description="norm | raw | tie (the rule), null without a reference")
    rule: str
    method: str
