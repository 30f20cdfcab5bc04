"""GET /api/vocabulary: the names the API understands and the bounds it puts on one request."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Limits(BaseModel):
    """Every bound on one request, under the server's name for it lower-cased
    (headgraph.server.limits): a request past one is a 422 (a body past its size, a 413)."""

    model_config = ConfigDict(extra="forbid")

    graph_k_max: int = Field(description="k of a top-k graph or ranking: GET /api/graph, /api/top, "
                             "/api/compare, /api/datapk, /api/subgraph and the downloads")
    threshold_edges_max: int = Field(description="the best edges per pairing a thresholded graph keeps "
                                     "(its `capped` names the pairings cut)")
    threshold_magnitude_max: float = Field(description="|threshold| of GET /api/graph")
    subgraph_cap_max: int = Field(description="cap of GET /api/subgraph")
    subgraph_depth_max: int = Field(description="depth of GET /api/subgraph")
    subgraph_heads_max: int = Field(description="head names in heads= of GET /api/subgraph")
    timeline_edges_max: int = Field(description="k (and edge= count) of GET /api/timeline")
    timeline_series_max: int = Field(description="checkpoints in one series of GET /api/timeline")
    ablation_top_max: int = Field(description="top (and edge= count) of GET /api/ablation")
    validation_sample_max: int = Field(description="n of GET /api/validation")
    validation_top_max: int = Field(description="k of GET /api/validation")
    circuit_top_max: int = Field(description="top of GET /api/circuit")
    circuit_lookup_max: int = Field(description="edge= names of GET /api/circuit")
    circuit_steps_max: int = Field(description="steps (EAP-IG) of GET /api/circuit and /api/recovery")
    circuit_pairs_min: int = Field(description="pairs (a bundled task's first n) of GET /api/circuit "
                                   "and /api/recovery: the fewest")
    circuit_pairs_max: int = Field(description="pairs of GET /api/circuit and /api/recovery: the most "
                                   "(every pair of a bundled task, the default)")
    recovery_k_max: int = Field(description="k of GET /api/recovery and /api/subspaces")
    recovery_heads_max: int = Field(description="heads in one reference set of a recovery")
    recovery_edges_max: int = Field(description="edges in one reference edge set of a recovery")
    task_rows_max: int = Field(description="prompt pairs in one task (POST /api/tasks)")
    task_tokens_max: int = Field(description="tokens in one prompt of a task")
    label_upload_bytes_max: int = Field(description="bytes of one label set (POST /api/labels)")
    task_upload_bytes_max: int = Field(description="bytes of one task (POST /api/tasks)")
    api_body_bytes_max: int = Field(description="bytes of any request body under /api")
    page_body_bytes_max: int = Field(description="bytes of one dashboard callback's request body")


class VocabularyOut(BaseModel):
    """Roles, pairings, layer orders, metrics, the head-name pattern and every request limit."""

    roles: list[str]
    pairings: list[str] = Field(description="source role then target role, e.g. OK")
    graph_pairings: list[str] = Field(description="the pairings a graph draws (O -> Q / K / V)")
    orders: list[str] = Field(description="layer orders of a grid: forward, all, same-layer")
    cs_modes: list[str]
    grid_metrics: list[str]
    rank_metrics: list[str]
    k_max: int = Field(description="the most k of a top-k graph or ranking (limits.graph_k_max)")
    default_k: int
    max_edges: int = Field(description="the best edges per pairing a thresholded graph keeps "
                           "(limits.threshold_edges_max)")
    threshold_digits: int = Field(description="significant digits a threshold is rounded to")
    percent_step: float = Field(description="top-percent parameters are multiples of this")
    head_pattern: str = Field(description="a head's name: L{layer}H{head}, or L{layer}KV{group}")
    limits: Limits
