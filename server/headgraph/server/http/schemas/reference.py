"""GET /api/reference: the random reference."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class ReferenceOut(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    kl: dict[str, Any] = Field(description="4x4 KL grid, histograms, means (core KLGrid.to_dict)")
    haar_moments: Any
    nulls: dict[str, Any] = Field(description=(
        "per pairing: anisotropic (summary), Haar (summary_haar) and random-initialization "
        "(summary_random_init, above_random_init_q95 of valid_pairs) null summaries"))
