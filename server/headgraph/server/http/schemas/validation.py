"""GET /api/validation: weight metrics against path-ablation effects."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class Interval(BaseModel):
    value: float | None
    low: float | None = Field(description="bootstrap 95% percentile interval, low end")
    high: float | None
    n: int


class MetricSummary(BaseModel):
    metric: str
    random_rho: Interval = Field(description="Spearman of the metric against the effect over the random sample")
    top_mean_effect: Interval = Field(description="mean effect of the metric's top-k pairs")
    top_rho: Interval = Field(description="Spearman within the metric's top-k pairs")


class PairedDifference(BaseModel):
    metric_a: str = Field(description="PK")
    metric_b: str = Field(description="the metric PK is compared with")
    rho_a: float | None
    rho_b: float | None
    difference: float | None = Field(description="rho_a - rho_b on the same random pairs")
    low: float | None = Field(description="paired bootstrap 95% percentile interval, low end")
    high: float | None
    n: int = Field(description="random pairs where both metrics are defined")
    confidence: float
    verdict: str | None = Field(description="the decision rule: 'A' (PK better: interval above 0), "
                                            "'B' (below 0), 'tie' (holds 0); null when undefined")


class SamplePower(BaseModel):
    requested: int = Field(description="random pairs asked for (n)")
    n: int = Field(description="random pairs drawn: min(n, available)")
    available: int | None = Field(description="valid forward pairs of the pairing (null: not known yet)")
    rho: float
    alpha: float
    power: float | None = Field(description="power of a two-sided level-alpha Spearman test to detect rho "
                                            "with n pairs")
    n_for_80: int = Field(description="random pairs that reach 80% power")


class MatchedNull(BaseModel):
    share: float = Field(description="the held-out verified share of each top edge's stratum, averaged")
    expected_verified: float = Field(description="the verified count the matched null expects of the top-k")
    p_value: float = Field(description="exact Poisson-binomial P(verified >= observed) under the matched null")
    strata: str = Field(description="the matching rule")


class Precision(BaseModel):
    metric: str
    k: int = Field(description="the metric's top-k pairs tested")
    verified: int | None = Field(description="of them verified against the random-pair null (null: unresolved)")
    precision: float | None = Field(description="verified / k")
    n_calibration: int = Field(0, description="random-sample pairs outside the top-k that set the thresholds")
    n_null: int = Field(description="held-out random-sample pairs outside the top-k (judged, never calibrating)")
    null_verified: int | None = Field(description="of them above the same thresholds")
    null_share: float | None
    expected_share: float | None = Field(None, description="what null_share should be: 0.05 / k")
    achieved_fwer: float | None = Field(None, description="k x null_share (capped at 1): the family-wise "
                                                          "error the held-out half measures")
    odds_ratio: float | None
    p_value: float | None = Field(description="one-sided Fisher exact test: the top-k verified more often "
                                              "than the held-out pairs")
    quantile: float | None = Field(description="1 - 0.05 / (k x prompt sets): the null quantile")
    thresholds: dict[str, float | None] = Field(description="per prompt set: the calibration half's quantile "
                                                            "of the smaller split-half effect (null: unresolved)")
    method: dict[str, str] = Field({}, description="per prompt set: empirical | gpd | unresolved")
    resolved: bool = Field(description="some prompt set's threshold is resolved (else no verdict)")
    split: str = Field("", description="the calibration / held-out split rule")
    matched: MatchedNull | None = Field(None, description="the stratified matched null (null: no baselines)")


class Association(BaseModel):
    metric: str
    spearman: float | None
    partial: dict[str, Any] | None = Field(description="partial Spearman with the effect given the trivial "
                                                       "baselines: rho, p_value, n, given")
    normalised_spearman: float | None = Field(description="Spearman with the effect / the source's variance share")


class HeldOut(BaseModel):
    set: str = Field(description="the summary / paired key of the held-out rows")
    fit: str
    tested: str
    metrics: list[str] = Field(description="the metrics refit on the fitting half")


class ValidationOut(BaseModel):
    model: str
    pairing: str
    n_sample: int
    k: int
    seed: int
    metrics: list[str] = Field(description="the metrics, then the trivial baselines")
    baselines: list[str] = Field([], description="which of metrics are trivial baselines (no top-k): "
                                                 "layer gap, source variance")
    summary: dict[str, list[MetricSummary]] = Field(description="per prompt set (text, random) and the held-out "
                                                                "set 'text (held-out)'")
    paired: dict[str, list[PairedDifference]] = Field(
        {}, description="per prompt set: PK minus every other metric's Spearman, paired bootstrap")
    power: SamplePower | None = Field(None, description="the random sample's power for rho = 0.3")
    rule: str = Field("", description="the decision rule's version (part of the cache key)")
    precision: list[Precision] = Field([], description="per metric: its top-k's verified share against "
                                                       "held-out random pairs, Fisher exact test")
    precision_normalised: list[Precision] = Field(
        [], description="the same on the effect divided by the source's variance share ([]: no source variance)")
    association: dict[str, list[Association]] = Field(
        {}, description="per prompt set: each metric's Spearman, partial Spearman given the trivial baselines "
                        "and Spearman with the normalised effect")
    held_out: HeldOut | None = Field(None, description="data-weighted PK fit on one half of the text prompts, "
                                                       "tested on the other (null: no data-weighted PK)")
    edges: list[dict[str, Any]] = Field(description="every measured pair: source, target, in_sample, "
                                                    "top_of (metrics), effect_text, effect_random, "
                                                    "and each metric's value")
    method: str
    computed: bool = Field(True, description="false: not cached yet (cached=true), no summary")
    cached_only: bool = Field(False, description="true: read from the cache only (cached=true)")
