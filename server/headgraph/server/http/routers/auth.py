"""Who the caller is to this server: open mode, or lab mode and whether its token is accepted."""

from __future__ import annotations

from fastapi import APIRouter, Request

from headgraph.server.http.access import caller_of
from headgraph.server.http.schemas.auth import AuthOut

router = APIRouter(prefix="/api", tags=["health"])


@router.get("/auth", response_model=AuthOut,
            summary="Auth mode and whether this request's 'Authorization: Bearer' token is accepted")
async def auth(request: Request) -> AuthOut:
    mode = "token" if request.app.state.settings.api_token else "open"
    authorized = caller_of(request).authorized
    can = ["read-cached"] + (["compute", "upload"] if authorized else [])
    return AuthOut(mode=mode, authorized=authorized, can=can)
