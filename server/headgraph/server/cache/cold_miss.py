"""Cache-only mode: a request tries the event loop first and may only read the cache there.

``deps.cached_first`` sets CACHE_ONLY while it runs a service call on the event loop; every
place that would load a model or compute raises ColdMiss instead, and the call is retried in
a worker thread.
"""

from __future__ import annotations

from contextvars import ContextVar

# True while a call runs on the event loop: it may read the cache, never load or compute.
CACHE_ONLY: ContextVar[bool] = ContextVar("headgraph_cache_only", default=False)


class ColdMiss(Exception):
    """Raised in cache-only mode when a result (or a model identity) is not cached yet."""
