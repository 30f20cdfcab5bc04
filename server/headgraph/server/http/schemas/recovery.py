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


class CircuitReference(BaseModel):
    source: str = Field(description="task (a task circuit), mib (a MIB circuit file) or headgraph "
                                    "(headgraph's circuit answer as a file)")
    task: str | None = None
    content: str | None = Field(None, description="what the task's prompts are (the circuit's cache key)")
    method: str | None = Field(None, description="eap or eap-ig")
    steps: int | None = None
    file: str | None = None
    sha256: str | None = None
    n_edges: int = Field(description="the circuit's ranked edges, every kind")
    size: int = Field(description="edges in the circuit the reference is taken from")
    rule: str = Field(description="how the size was chosen, in words")
    share: float | None = Field(None, description="the share of the metric gap the curve's circuit reaches")
    recovered: float | None = Field(None, description="the share of the gap recovered at this size "
                                                      "(when on the faithfulness curve)")
    n_head_edges: int = Field(description="head -> head edges (Q, K or V) in the circuit")
    n_reference_edges: int = Field(description="of them into the pairing's input: the reference")


class RecoveryOut(BaseModel):
    model: str
    labels: str | None = Field(description="the label set whose heads are the reference (null for a circuit)")
    reference: str = Field("", description="the reference in words (a circuit's: its size rule)")
    circuit: CircuitReference | None = Field(None, description="the circuit the reference edges come from")
    reference_edges: list[str] = Field([], description="a circuit's reference edges (grid cells)")
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
