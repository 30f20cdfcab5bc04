"""Shapes and the error body every endpoint shares."""

from __future__ import annotations

from pydantic import BaseModel

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
