"""FastAPI dependencies: settings, service, jobs, the ``model=`` parameter and the API token."""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi.concurrency import run_in_threadpool

from fastapi import Depends, Header, Query, Request

from headgraph.server.errors import Unauthorized
from headgraph.server.jobs import JobManager
from headgraph.server.registry import ModelRef
from headgraph.server.service import CACHE_ONLY, ColdMiss, Service

from headgraph.server.settings import Settings

T = TypeVar("T")

# openapi_extra mark of token-protected operations (app.install_openapi turns it into security).
TOKEN_MARK = "x-headgraph-token"
TOKEN_PROTECTED = {TOKEN_MARK: True}

MODEL_QUERY = Query(
    "demo", min_length=1, max_length=512,
    description="model id from GET /api/models: 'demo', a hub name such as 'gpt2', "
                "'local:<folder>' under the model root, or an absolute path inside the root",
)


# Dependencies are ``async def`` on purpose: they only read app state or resolve a name, and
# a sync dependency would cost a thread-pool hop per request.
async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_service(request: Request) -> Service:
    return request.app.state.service


async def get_jobs(request: Request) -> JobManager:
    return request.app.state.jobs


async def model_ref(model: str = MODEL_QUERY, service: Service = Depends(get_service)) -> ModelRef:
    """Resolve ``?model=``: 404 listing the allowed ids, 403 for a path outside the root."""
    return service.resolve(model)


async def require_token(
    authorization: str | None = Header(None, include_in_schema=False),
    settings: Settings = Depends(get_settings),
) -> None:
    """Write/compute endpoints: ``Authorization: Bearer <HEADGRAPH_API_TOKEN>`` when a token is set.

    The header is documented in OpenAPI (bearer security) only when a token is configured.
    """
    token = settings.api_token
    if not token:
        return
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
        raise Unauthorized("this endpoint needs 'Authorization: Bearer <token>' "
                           "(HEADGRAPH_API_TOKEN is set on the server)")


async def cached_first(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a service call on the event loop if everything it reads is cached (a diskcache hit
    costs well under a millisecond); otherwise in a worker thread, where it may load a model
    and compute (in a compute process). Saves the thread hop for every warm read."""
    token = CACHE_ONLY.set(True)
    try:
        return fn(*args, **kwargs)
    except ColdMiss:
        pass
    finally:
        CACHE_ONLY.reset(token)
    return await run_in_threadpool(fn, *args, **kwargs)
