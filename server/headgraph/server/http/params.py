"""Query parameters and error answers the routers share, derived from core's vocabulary.

The names, Literal types and checks themselves live in headgraph.core.names (one
vocabulary for core, server and frontend); the Literal types listed here are core's, so
OpenAPI documents exactly the allowed values and FastAPI rejects others with 422.
"""

from __future__ import annotations

from typing import Any

from fastapi import Query

from headgraph.core.names import (
    DEFAULT_K,
    GRAPH_PAIRINGS,
    HEAD_INPUT_PATTERN,
    CSMode,
    GridMetric,
    LayerOrder,
    Pairing,
    RankMetric,
    Role,
    SimilarityMode,
)
from headgraph.server.http.schemas.common import ErrorBody
from headgraph.server.limits import GRAPH_K_MAX

__all__ = ["CIRCUIT_EDGE_PATTERN", "DEFAULT_K", "ERRORS", "PAIRINGS_PATTERN", "PATTERN_MESSAGES", "CSMode", "GridMetric",
           "LayerOrder", "Pairing", "RankMetric", "Role", "SimilarityMode", "head_query", "labels_query",
           "optional_k_query", "pairings_query"]

# Comma-separated pairings (case-insensitive): core.names.parse_pairings checks each.
PAIRINGS_PATTERN = r"^[QKVOqkvo]{2}(,[QKVOqkvo]{2})*$"
# A task circuit's edge to look up: WRITER>READER in core.circuits' node names (L0H0>L1H3.K).
CIRCUIT_EDGE_PATTERN = r"^[A-Za-z0-9_.]{1,40}>[A-Za-z0-9_.]{1,40}$"
# What a 422 says of a query value that misses one of these patterns (instead of the regex).
PATTERN_MESSAGES = {
    HEAD_INPUT_PATTERN: "not a head name (expected like 'L9H6', or 'L6KV1' for a grouped key/value head)",
    CIRCUIT_EDGE_PATTERN: "not an edge (expected WRITER>READER, like 'L0H0>L1H3.K')",
}
ERRORS: dict[int | str, dict[str, Any]] = {404: {"model": ErrorBody}, 403: {"model": ErrorBody},
                                           422: {"model": ErrorBody}}


def pairings_query() -> Any:
    return Query(",".join(GRAPH_PAIRINGS), max_length=200, pattern=PAIRINGS_PATTERN,
                 description="comma-separated pairings, e.g. OQ,OK,OV")


def optional_k_query(description: str = f"top-k edges per pairing (default {DEFAULT_K})") -> Any:
    return Query(None, ge=1, le=GRAPH_K_MAX, description=description)


def similarity_query() -> Any:
    return Query("cached", description="the rows' cka / procrustes: from grids already cached "
                 "(null for one that is not; the ranked one is always computed), or compute both "
                 "(each costs about as much as the PK grid on a cold model)")


def head_query(default: str) -> Any:
    return Query(default, min_length=1, max_length=32, pattern=HEAD_INPUT_PATTERN,
                 description="head name like L1H3 (original block number), or L6KV1 for a "
                             "grouped key/value head")


def labels_query(description: str = "label set name") -> Any:
    return Query(None, max_length=128, description=description)
