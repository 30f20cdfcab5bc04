"""The one vocabulary (roles, pairings, orders, metrics, limits, head names) for clients.

Defined in headgraph.core.names; the frontend reads its lists from here, never its own.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from headgraph.core.names import vocabulary as core_vocabulary

router = APIRouter(prefix="/api", tags=["vocabulary"])


@router.get("/vocabulary", summary="Roles, pairings, layer orders, metrics, limits and the head-name pattern")
async def vocabulary() -> dict[str, Any]:
    return core_vocabulary()
