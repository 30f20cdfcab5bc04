"""GET /api/auth: who the caller is to this server."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class AuthOut(BaseModel):
    mode: Literal["open", "token"] = Field(
        description="open: no token configured, everyone may compute; token: lab mode")
    authorized: bool = Field(description="this request may compute, upload and overwrite")
    can: list[str] = Field(description="what this request may do: read-cached, compute, upload")
