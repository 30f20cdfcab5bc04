"""GET /api/recovery: every metric's recovery of a reference (the PK paper's Tables 1 and 2)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class Estimate(BaseModel):
    value: float | None
    low: float | None = Field(description="bootstrap 95% percentile interval, low end")
    high: float | None


class MetricRow(BaseModel):
    metric: str = Field(description="pk, pk_normalized, cs, cka, procrustes, layer_gap or random")
    endpoint_share: Estimate = Field(description="share of the top-k edges' endpoints that are reference heads")
    precision: Estimate = Field(description="precision@k: share of the top-k edges in the reference")
    auc: Estimate = Field(description="ROC-AUC over all valid pairs")
    precision_diff: Estimate | None = Field(description="precision@k minus the baseline's (PK), paired")
    auc_diff: Estimate | None = Field(description="ROC-AUC minus the baseline's (PK), paired")
    top: list[str] = Field(description="the metric's top-k edges, best first")


class RecoveryOut(BaseModel):
    model: str
    labels: str = Field(description="the label set whose heads are the reference")
    pairing: str
    k: int
    n_valid: int = Field(description="valid forward pairs of the pairing")
    n_reference: int = Field(description="valid pairs joining two reference heads")
    base_rate: float = Field(description="n_reference / n_valid: a random ranking's expected precision")
    baseline: str
    confidence: float
    n_resamples: int
    unit: str = Field("heads", description="what the bootstrap resamples: heads (cluster) or edges")
    bootstrap: str = Field("", description="the bootstrap rule in words")
    rows: list[MetricRow]
    reference_heads: list[str]
    unknown_heads: list[str]
    method: str
