"""Liveness and cache counters (never blocks: no model work happens here)."""

from __future__ import annotations

import os

from fastapi import APIRouter, Depends
from fastapi.concurrency import run_in_threadpool

from headgraph.server import __version__
from headgraph.core.types import COMPUTE_VERSION
from headgraph.server.deps import get_service
from headgraph.server.schemas import CacheStats, Health
from headgraph.server.service import Service

router = APIRouter(prefix="/api", tags=["health"])


@router.get("/health", response_model=Health, summary="Liveness (answers while computations run)")
async def health(service: Service = Depends(get_service)) -> Health:
    return Health(version=__version__, compute_version=COMPUTE_VERSION, pid=os.getpid(),
                  device=service.device)


@router.get("/cache/stats", response_model=CacheStats,
            summary="Store size and how many real computations ran (all worker processes)")
async def cache_stats(service: Service = Depends(get_service)) -> CacheStats:
    def read() -> CacheStats:
        stats = service.store.stats()
        return CacheStats(**stats, counts=service.store.compute_counts())

    return await run_in_threadpool(read)
