"""Who the caller is to this server: open mode, or lab mode and whether its token is accepted."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from headgraph.server.http.access import caller_of

router = APIRouter(prefix="/api", tags=["health"])


class AuthOut(BaseModel):
    mode: Literal["open", "token"] = Field(
        description="open: no token configured, everyone may compute; token: lab mode")
    authorized: bool = Field(description="this request may compute, upload and overwrite")
    can: list[str] = Field(description="what this request may do: read-cached, compute, upload")


@router.get("/auth", response_model=AuthOut,
            summary="Auth mode and whether this request's 'Authorization: Bearer' token is accepted")
async def auth(request: Request) -> AuthOut:
    mode = "token" if request.app.state.settings.api_token else "open"
    authorized = caller_of(request).authorized
    can = ["read-cached"] + (["compute", "upload"] if authorized else [])
    return AuthOut(mode=mode, authorized=authorized, can=can)
