"""GET /api/ablation: path-ablation effects and verdicts."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from headgraph.server.computations.ablation import VERDICT_RULE


class AblationEdge(BaseModel):
    source: str
    target: str = Field(description="a query head (Q path) or, on grouped-query models, a KV "
                                    "group like L6KV1 (K / V paths)")
    pairing: str
    path: str
    measure: str = Field(description="tvd: mean total-variation distance of the target's "
                                     "attention rows (Q, K); relative_output: relative change "
                                     "of the target's output (V)")
    effect_text: float | None = Field(description="effect on the bundled natural-text prompts")
    effect_random: float | None = Field(description="effect on repeated random tokens [r r]")
    halves: dict[str, list[float | None]] = Field(
        description="per prompt set: the effect on the even and the odd half of its prompts")
    pk: float | None
    cs: float | None = Field(description="Composition Score (a KV group: mean over its query heads)")
    verdict: Literal["verified", "no effect", "not measured", "null not computed", "null too small"] = Field(
        description=VERDICT_RULE + " ('not measured' only with cached=true)")
    statistic: dict[str, float | None] = Field(
        description="per prompt set: the smaller of the two split-half effects (what the verdict "
                    "compares with the null's threshold)")
    verdict_note: str | None = Field(description="the rule in words with its quantile and thresholds")
    null_quantile: float | None = Field(description="the random-pair null quantile the verdict used")


class VerdictRule(BaseModel):
    rule: str
    alpha: float = Field(description="family-wise level over the tested edges and prompt sets")
    correction: str = Field(description="the multiple-testing rule: bonferroni")
    n_tests: int | None = Field(description="tested edges x prompt sets (null: no null)")
    quantile: float | None = Field(description="1 - alpha / n_tests: the null quantile each "
                                               "statistic must exceed")
    n_null: dict[str, int] = Field(description="per prompt set: the null pairs (the tested edges "
                                               "left out), split into calibration and held-out halves")
    n_calibration: dict[str, int] = Field(description="per prompt set: the null pairs the threshold "
                                                      "is calibrated on")
    n_held_out: dict[str, int] = Field(description="per prompt set: the held-out null pairs it is "
                                                   "checked on")
    thresholds: dict[str, float | None] = Field(description="per prompt set: the calibration half's "
                                                            "quantile (null: unresolved)")
    method: dict[str, str] = Field(description="per prompt set: empirical | gpd (a conservative "
                                               "generalized Pareto tail) | unresolved")
    resolved: dict[str, bool] = Field(description="per prompt set: a threshold exists (method is not "
                                                  "unresolved)")
    held_out_share: dict[str, float | None] = Field(
        description="per prompt set: the share of held-out null pairs above the threshold (the "
                    "achieved per-test error; expected: expected_share)")
    expected_share: float | None = Field(description="1 - quantile: the per-test error the rule allows")
    achieved_fwer: float | None = Field(
        description="the family-wise error the held-out halves measure: n_tests x the mean held-out "
                    "share over prompt sets, capped at 1 (expected at most alpha)")
    split: str | None = Field(description="the calibration / held-out split rule")
    null_seed: int | None
    null_sample: int | None = Field(description="random forward pairs the null measured")
    null_requested: int
    tested_edges: int
    ablation: str
    computed: bool = Field(description="false: the null is not cached yet (cached=true)")
    summary: str


class AblationOut(BaseModel):
    model: str
    pairing: str
    selection: str
    edges: list[AblationEdge]
    reliability: dict[str, dict[str, Any]] = Field(
        description="per prompt set: r_half (Spearman between the halves over these edges), "
                    "reliability (Spearman-Brown, in [-1, 1]; null with fewer than 3 edges); "
                    "with cached=true only when exactly this edge set is cached, else {}")
    n_prompts: dict[str, int]
    induction_length: int | None = Field(description="null: nothing measured (cached=true)")
    method: str | None
    cached_only: bool = Field(description="true: read from the cache only (cached=true)")
    ablation: Literal["mean", "resample"] = Field(
        description="what replaced the source's output: its mean over the prompt set, or its value "
                    "on the next prompt at the same position (resample)")
    verdict_rule: VerdictRule
