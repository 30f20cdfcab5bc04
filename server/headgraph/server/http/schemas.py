"""Pydantic response models: what OpenAPI (/docs) documents for every JSON endpoint.

Large nested payloads from core (KL grids, node-link graphs, token tables) are typed as
``dict[str, Any]`` inside a typed envelope; the shapes are described in the field docs.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

Grid4 = list[list[list[list[float | None]]]]
Mask4 = list[list[list[list[bool]]]]


class ErrorDetail(BaseModel):
    status: int
    message: str
    allowed: list[str] | None = None
    type: str | None = None


class ErrorBody(BaseModel):
    """Every 4xx/5xx answer: ``{"error": {"status", "message", ...}}``."""

    error: ErrorDetail


class Health(BaseModel):
    status: str = "ok"
    version: str
    compute_version: str
    pid: int
    device: str


class CacheStats(BaseModel):
    """Store counters: entries, bytes, bound and real computations (over all processes)."""

    directory: str
    entries: int
    bytes: int
    size_limit: int
    computations: int
    counts: dict[str, int] = Field(default_factory=dict, description="computations per cache key")


class ModelSummary(BaseModel):
    id: str = Field(description="value to pass as ?model=")
    kind: str = Field(description="builtin | random | hub | local")
    status: str = Field(description="available | not cached | not available offline")
    message: str
    info: dict[str, Any] | None = Field(None, description="ModelInfo once the model was loaded")
    fingerprint: str | None = None
    cached: list[str] | None = Field(None, description="computations in the cache (name?params)")


class ModelList(BaseModel):
    models: list[ModelSummary]


class ModelInfoOut(BaseModel):
    model_config = ConfigDict(protected_namespaces=())

    model: str
    fingerprint: str
    info: dict[str, Any] = Field(description="ModelInfo: shape, layer_indices, processing, source")
    cached: list[str]


class Job(BaseModel):
    """A compute job: state queued|running|done|failed, stage, fraction in [0, 1]."""

    id: str
    model: str
    params: dict[str, Any]
    state: str
    stage: str
    fraction: float
    message: str
    attempt: int
    created: float
    updated: float
    heartbeat: float
    error: str | None = None
    computed: list[str] = Field(default_factory=list, description="stages cached so far, in order")
    plan: list[str] = Field(default_factory=list, description="every stage this job computes")


class JobSubmitted(BaseModel):
    job: Job
    created: bool = Field(description="false when the same computation was already running")
    status_url: str


class ScoreGrid(BaseModel):
    """A [source_layer][source_head][target_layer][target_head] grid of one pairing or CS mode.

    Layers are positions; ``layer_indices`` gives their original block numbers. Invalid cells
    (outside the layer order, zero rank) hold 0 (raw/normalized) or null (z) and are false in
    ``valid``. ``source_labels``/``target_labels`` name the flattened [layer, head] axes.
    """

    model: str
    kind: str = Field(description="pk | cs")
    pairing: str
    metric: str
    order: str
    source_role: str
    target_role: str
    shape: list[int]
    layer_indices: list[int]
    source_labels: list[str]
    target_labels: list[str]
    grid: Grid4
    valid: Mask4
    source_ranks: list[list[int]]
    target_ranks: list[list[int]]
    min: float | None = None
    max: float | None = None
    cs_of: str | None = Field(None, description="CS grids of a grouped-query model's K / V modes: "
                              "the target axis is per query head (KV-level views average a group)")


class TopPair(BaseModel):
    """One ranked pair; a pair whose target is a grouped-query KV group also has ``cs_of``
    (the query heads whose mean CS is given)."""

    model_config = ConfigDict(extra="allow")

    rank: int
    source: str
    target: str
    source_layer: int
    source_head: int
    target_layer: int
    target_head: int
    pk: float | None = None
    normalized: float | None = None
    cs: float | None = None
    z: float | None = None


class TopPairs(BaseModel):
    model: str
    pairing: str
    metric: str
    k: int
    pairs: list[TopPair] = Field(description="ranked records (a KV-group target's CS is the mean "
                                 "over its query heads, named in cs_of)")


class PairOut(BaseModel):
    """One pair: PK, normalized, principal cosines/angles, CS, z, p-values, classes, tokens."""

    model_config = ConfigDict(extra="allow")

    model: str
    pairing: str
    source: str
    target: str
    pk: float
    normalized: float
    cosines: list[float]
    angles: list[float]
    ranks: list[int]
    cs: float | None = None
    z: float | None = None
    p_haar: float | None = None
    p_anisotropic: float | None = None
    null_samples: int | None = Field(None, description="null samples behind the p-values")
    p_floor: float | None = Field(None, description="the smallest Monte-Carlo p-value, "
                                  "1 / (null_samples + 1): a p-value there means no null sample "
                                  "reached the observed PK")
    source_class: str | None = None
    target_class: str | None = None
    source_tokens: list[dict[str, Any]] | None = None
    target_tokens: list[dict[str, Any]] | None = None
    data_pk: dict[str, dict[str, float | None]] | None = Field(None, description=(
        "data-weighted PK (GET /api/datapk) of an OQ / OK / OV pair, per prompt set already "
        "cached (text, random): out_share, in_share, out_share_baseline, in_share_baseline "
        "(null values: not a valid forward pair); null when none is cached (a pair read "
        "never computes it)"))


class HeadOut(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    head: str
    layer: int
    index: int
    tokens: dict[str, Any]
    partners: dict[str, Any]


class GraphOut(BaseModel):
    """Head graph: rule, edge counts, hubs, class counts and the node-link graph."""

    model_config = ConfigDict(extra="allow")

    model: str
    granularity: str
    pairings: list[str]
    rule: str
    edge_counts: dict[str, int]
    capped: dict[str, int] = Field(default_factory=dict, description=(
        "pairings whose rule passed more than max_edges edges (GET /api/vocabulary): how many "
        "passed; only the best max_edges of each are in the graph"))
    hubs: dict[str, Any]
    class_counts: dict[str, int] | None = None
    recovery: dict[str, float] | None = None
    labels: str | None = None
    flags: dict[str, Any] | None = Field(None, description=(
        "attention-sink flags (core.flags): measured, threshold, rule, describe_rule, sinks "
        "(sink head names), sink_edges (per pairing, edges touching a sink); null values when "
        "the model has no pattern scores"))
    graph: dict[str, Any] = Field(description=(
        "networkx node-link data (keys: nodes, edges); nodes carry sink, sink_heads, "
        "description, first_token, edges source_sink, target_sink (null: not measured)"))


class ScatterOut(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    pairing: str
    mode: str
    top_percent: float
    points: dict[str, Any] = Field(description="parallel lists: source, target, pk, cs, quadrant")
    comparison: dict[str, Any] = Field(description="spearman (all / top), quadrant counts")


class ReferenceOut(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    kl: dict[str, Any] = Field(description="4x4 KL grid, histograms, means (core KLGrid.to_dict)")
    haar_moments: Any
    nulls: dict[str, Any] = Field(description=(
        "per pairing: anisotropic (summary), Haar (summary_haar) and random-initialization "
        "(summary_random_init, above_random_init_q95 of valid_pairs) null summaries"))


class TokensOut(BaseModel):
    model: str
    role: str
    k: int
    formula: str
    baseline: dict[str, Any] | None = Field(None, description=(
        "random-subspace baseline: method, rule, samples, seed, quantile, by_rank {rank: "
        "{rank, k, rank_mean, rank_threshold, mean_topk_mean, mean_topk_threshold}} (lists "
        "indexed by list depth - 1)"))
    n_above_baseline: int | None = Field(None, description="heads listed whose list is above baseline")
    heads: list[dict[str, Any]] = Field(description=(
        "per head: name, layer, head, rank, mean_score, baseline_threshold, above_baseline, "
        "tokens [{id, score, text, display, baseline, above_baseline}]"))


class PatternsOut(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    layer_indices: list[int]
    kinds: list[str]
    scores: dict[str, list[list[float | None]]]


class LabelSetSummary(BaseModel):
    """One label set. ``per_model``: computed for each model on request (``patterns``: head
    classes from that model's attention-pattern scores), so ``n_heads`` is None here and
    ``classes`` lists the classes it can give; read it with ``?model=``."""

    name: str
    description: str
    model: str | None = None
    builtin: bool
    per_model: bool = False
    n_heads: int | None
    classes: list[str]


class LabelSetList(BaseModel):
    label_sets: list[LabelSetSummary]


class LabelSetOut(BaseModel):
    name: str
    description: str
    model: str | None = None
    builtin: bool
    per_model: bool = False
    thresholds: dict[str, float] | None = Field(
        None, description="per-model pattern sets: the score threshold of each pattern kind")
    classes: dict[str, str]
