"""Score grids, rankings, one pair, one head, the PK-vs-CS scatter."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from headgraph.server.http.schemas.common import Grid4, Mask4


class ScoreGrid(BaseModel):
    """A [source_layer][source_head][target_layer][target_head] grid of one pairing or CS mode.

    Layers are positions; ``layer_indices`` gives their original block numbers. Invalid cells
    (outside the layer order, zero rank) hold 0 (raw/normalized) or null (z) and are false in
    ``valid``. ``source_labels``/``target_labels`` name the flattened [layer, head] axes.
    """

    model: str
    kind: str = Field(description="pk | cs | cka | procrustes: the scores the grid is of (a "
                      "PK grid's metric is raw, normalized or z; a cs metric of /api/pk is CS on "
                      "PK's pairs)")
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
    overview: dict[str, Any] | None = Field(
        None, description="set when the grid exceeded the API's bound: the grid is the layer "
        "overview [Ls, 1, Lt, 1] (max over each layer pair's head pairs); says the full shape, "
        "the cells left out and how to ask for them (download=true)")


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
    cka: float | None = Field(None, description="linear CKA of the pair (a KV-group target: the "
                              "KV head's own, as PK); null outside its grid's valid cells or "
                              "while that grid is not cached (similarity=compute computes it)")
    procrustes: float | None = Field(None, description="orthogonal Procrustes similarity, as cka")


class TopPairs(BaseModel):
    model: str
    pairing: str
    metric: str
    k: int
    pairs: list[TopPair] = Field(description="ranked records (a KV-group target's CS is the mean "
                                 "over its query heads, named in cs_of)")


class PairOut(BaseModel):
    """One pair: PK, normalized, principal cosines/angles, CS, CKA, Procrustes, z, p-values,
    classes, tokens."""

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
    cka: float | None = Field(None, description="linear CKA of the pair, read from the forward "
                              "grid when cached (never computed here: a CKA heatmap, ranking or "
                              "recovery table computes it); null otherwise, for a pair that is "
                              "not forward, or outside the grid's valid cells")
    procrustes: float | None = Field(None, description="orthogonal Procrustes similarity, as cka")
    similarity_cached: list[str] = Field(default_factory=list, description=(
        "the similarity kinds (cka, procrustes) whose forward grid of the pairing was cached "
        "and read: a kind missing here is 'not computed', not 'not valid'"))
    z: float | None = None
    p_haar: float | None = None
    p_anisotropic: float | None = None
    null_samples: int | None = Field(None, description="null samples behind the p-values")
    p_floor: float | None = Field(None, description="the smallest Monte-Carlo p-value, "
                                  "1 / (null_samples + 1): a p-value there means no null sample "
                                  "reached the observed PK")
    pending: list[str] = Field(default_factory=list, description=(
        "with partial=true: the results not cached yet that this answer left out (job stages "
        "such as 'tokens K', 'null OK', 'z OK', 'patterns'); empty when complete"))
    source_class: str | None = None
    target_class: str | None = None
    source_tokens: list[dict[str, Any]] | None = None
    target_tokens: list[dict[str, Any]] | None = None
    data_pk: dict[str, dict[str, float | None]] | None = Field(None, description=(
        "data-weighted PK (GET /api/datapk) of an OQ / OK / OV pair, per prompt set already "
        "cached (text, random): out_share, in_share, out_share_baseline, in_share_baseline "
        "(null values: not a valid forward pair); null when none is cached (a pair read "
        "never computes it)"))
    data_pk_unavailable: dict[str, str] | None = Field(None, description=(
        "prompt sets whose data-weighted PK this model cannot give, with the reason (a "
        "post-attention norm, a model that cannot run here); null when none failed"))


class HeadOut(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    head: str
    layer: int
    index: int
    pending: list[str] = Field(default_factory=list, description=(
        "with partial=true: the results not cached yet that this answer left out (job stages "
        "such as 'tokens K', 'null OK', 'z OK', 'patterns'); empty when complete"))
    tokens: dict[str, Any]
    partners: dict[str, Any]


class ScatterOut(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    pairing: str
    mode: str
    top_percent: float
    points: dict[str, Any] = Field(description="parallel lists: source, target, pk, cs, quadrant")
    comparison: dict[str, Any] = Field(description="spearman (all / top), quadrant counts")
    left_out: dict[str, Any] | None = Field(
        None, description="set when the points exceeded the API's bound: how many were shown and "
        "left out, how they were chosen, how to ask for all (download=true)")
