"""The one vocabulary (roles, pairings, orders, metrics, limits, head names) for clients.

The names are headgraph.core.names'; ``limits`` is every bound the server puts on one request
(headgraph.server.limits). The frontend reads its lists and bounds from here, never its own.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from headgraph.core.names import vocabulary as core_vocabulary
from headgraph.server.http.schemas.vocabulary import VocabularyOut
from headgraph.server.limits import published

router = APIRouter(prefix="/api", tags=["vocabulary"])


def served_vocabulary() -> dict[str, Any]:
    """What ``GET /api/vocabulary`` answers: core's vocabulary and the server's ``limits``."""
    return {**core_vocabulary(), "limits": published()}


@router.get("/vocabulary", response_model=VocabularyOut,
            summary="Roles, pairings, layer orders, metrics, limits and the head-name pattern")
async def vocabulary() -> dict[str, Any]:
    return served_vocabulary()
