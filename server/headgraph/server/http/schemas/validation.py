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


class ValidationOut(BaseModel):
    model: str
    pairing: str
    n_sample: int
    k: int
    seed: int
    metrics: list[str]
    summary: dict[str, list[MetricSummary]] = Field(description="per prompt set (text, random)")
    edges: list[dict[str, Any]] = Field(description="every measured pair: source, target, in_sample, "
                                                    "top_of (metrics), effect_text, effect_random, "
                                                    "and each metric's value")
    method: str
    computed: bool = Field(True, description="false: not cached yet (cached=true), no summary")
    cached_only: bool = Field(False, description="true: read from the cache only (cached=true)")
