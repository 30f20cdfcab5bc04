"""Head-class label sets."""

from __future__ import annotations

from pydantic import BaseModel, Field


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
