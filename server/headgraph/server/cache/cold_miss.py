"""Cache-only mode: a request first tries to answer from the cache alone.

``http.deps.cached_first`` sets CACHE_ONLY while it runs a service call in a worker thread
of its own small budget; every place that would load a model or compute raises ColdMiss
instead, and the call is retried, computing, under the client's cold-work limits. Anonymous
requests in lab mode never get past that first, cache-only attempt.
"""

from __future__ import annotations

from contextvars import ContextVar

# True while a call may read the cache but never load a model or compute.
CACHE_ONLY: ContextVar[bool] = ContextVar("headgraph_cache_only", default=False)


class ColdMiss(Exception):
    """Raised in cache-only mode when a result (or a model identity) is not cached yet."""
