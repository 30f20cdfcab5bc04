"""GET /api/tokens and /api/patterns: per-head descriptions."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


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
    anisotropic: dict[str, Any] | None = Field(None, description=(
        "with anisotropic=true: the lists against the unembedding-shaped baseline: method, samples, "
        "quantile, chance (the share a random plane passes), n_above, n_heads, p_value (one-sided "
        "binomial test against chance), above {head: bool}, thresholds {rank: threshold}, rule"))


class PatternsOut(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    layer_indices: list[int]
    kinds: list[str]
    scores: dict[str, list[list[float | None]]]
