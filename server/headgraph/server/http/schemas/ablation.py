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
    verdict: Literal["verified", "no effect", "not measured"] = Field(
        description=VERDICT_RULE + " ('not measured' only with cached=true)")


class VerdictRule(BaseModel):
    min_effect: float = Field(description="the effect both split halves must reach")
    rule: str


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
    verdict_rule: VerdictRule
