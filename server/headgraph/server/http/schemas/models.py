"""GET /api/models and /api/models/info."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class ModelSummary(BaseModel):
    id: str = Field(description="value to pass as ?model=")
    kind: str = Field(description="builtin | random | hub | local")
    status: str = Field(description="available | not cached | not available offline")
    message: str
    info: dict[str, Any] | None = Field(None, description="ModelInfo once the model was loaded")
    fingerprint: str | None = Field(None, description="weights fingerprint: the head weights, "
                                                     "W_U and tokenizer (keys weight-level results)")
    model_fingerprint: str | None = Field(None, description="model fingerprint: the whole runnable "
                                                           "model (keys activation-level results)")
    cached: list[str] | None = Field(None, description="computations in the cache (name?params)")


class ModelList(BaseModel):
    models: list[ModelSummary]


class ModelInfoOut(BaseModel):
    model_config = ConfigDict(protected_namespaces=())

    model: str
    fingerprint: str = Field(description="weights fingerprint (keys weight-level results)")
    model_fingerprint: str = Field(description="model fingerprint: the whole runnable model "
                                               "(keys activation-level results)")
    info: dict[str, Any] = Field(description="ModelInfo: shape, layer_indices, processing, source, "
                                             "subspaces (raw | norm: MODEL@norm) and norm_gains "
                                             "(what a norm-aware model folds in)")
    cached: list[str]
