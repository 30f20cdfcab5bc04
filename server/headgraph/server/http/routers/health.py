"""Liveness and cache counters (never blocks: no model work happens here)."""

from __future__ import annotations

import os

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool

from headgraph.core.types import COMPUTE_VERSION
from headgraph.server import __version__
from headgraph.server.http.deps import CatalogDep, StoreDep
from headgraph.server.http.schemas.health import CacheStats, Health

router = APIRouter(prefix="/api", tags=["health"])


@router.get("/health", response_model=Health, summary="Liveness (answers while computations run)")
async def health(*, catalog: CatalogDep) -> Health:
    return Health(version=__version__, compute_version=COMPUTE_VERSION, pid=os.getpid(),
                  device=catalog.device)


@router.get("/cache/stats", response_model=CacheStats,
            summary="Store size and how many real computations ran (all worker processes)")
async def cache_stats(*, store: StoreDep) -> CacheStats:
    def read() -> CacheStats:
        return CacheStats(**store.stats(), counts=store.compute_counts())

    return await run_in_threadpool(read)
