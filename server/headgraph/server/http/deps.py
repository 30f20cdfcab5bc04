"""FastAPI dependencies: settings, each service, jobs, the ``model=`` parameter and the API token.

The services are the ones the composition root built for this app (``app.state.services``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

import anyio
import anyio.to_thread
from fastapi import Depends, Header, Query, Request
from fastapi.concurrency import run_in_threadpool

from headgraph.server.cache.cold_miss import CACHE_ONLY, ColdMiss
from headgraph.server.cache.store import Store, parse_key
from headgraph.server.errors import CacheUnavailable, Unauthorized
from headgraph.server.http.access import bearer, cold_work, token_matches
from headgraph.server.models.catalog import ModelCatalog
from headgraph.server.models.offered import BUILTIN_MODELS, ModelRef
from headgraph.server.services.ablation import AblationService
from headgraph.server.services.data_pk import DataPKService
from headgraph.server.services.details import DetailService
from headgraph.server.services.graphs import GraphService
from headgraph.server.services.jobs import JobManager
from headgraph.server.services.labels import LabelService
from headgraph.server.services.scores import ScoresService
from headgraph.server.services.subgraphs import SubgraphService
from headgraph.server.services.recovery import RecoveryService
from headgraph.server.services.validation import ValidationService
from headgraph.server.services.views import ViewService
from headgraph.server.services.wiring import Services
from headgraph.server.settings import Settings

T = TypeVar("T")

# openapi_extra mark of token-protected operations (app.install_openapi turns it into security).
TOKEN_MARK = "x-headgraph-token"
TOKEN_PROTECTED = {TOKEN_MARK: True}

# No control characters, no surrounding blanks: OpenAPI states what a model id can be.
MODEL_PATTERN = r"^[^\x00-\x20\x7f](?:[^\x00-\x1f\x7f]*[^\x00-\x20\x7f])?$"
MODEL_QUERY = Query(
    "demo", min_length=1, max_length=512, pattern=MODEL_PATTERN,
    description="model id from GET /api/models: 'demo', a hub name such as 'gpt2', "
                "'local:<folder>' under the model root, or an absolute path inside the root",
)


# Dependencies are ``async def`` on purpose: they only read app state or resolve a name, and
# a sync dependency would cost a thread-pool hop per request.
async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def _service(name: str) -> Callable[[Request], Awaitable[Any]]:
    """The dependency answering this app's service ``name`` (an attribute of ``Services``)."""

    async def get(request: Request) -> Any:
        services: Services = request.app.state.services
        return getattr(services, name)

    get.__name__ = f"get_{name}"
    return get


get_catalog = _service("catalog")


async def model_ref(model: str = MODEL_QUERY, catalog: ModelCatalog = Depends(get_catalog)) -> ModelRef:
    """Resolve ``?model=``: 404 listing the allowed ids, 403 for a path outside the root.

    A built-in id resolves here; any other may look at the model root or list every model
    (an unknown id's 404), so it resolves in a worker thread, never on the event loop."""
    if model in BUILTIN_MODELS:
        return catalog.resolve(model)
    return await run_in_threadpool(catalog.resolve, model)


# What a router declares as a parameter: ``scores: ScoresDep`` gets this app's ScoresService.
SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[Store, Depends(_service("store"))]
CatalogDep = Annotated[ModelCatalog, Depends(get_catalog)]
ScoresDep = Annotated[ScoresService, Depends(_service("scores"))]
LabelsDep = Annotated[LabelService, Depends(_service("labels"))]
ViewsDep = Annotated[ViewService, Depends(_service("views"))]
GraphsDep = Annotated[GraphService, Depends(_service("graphs"))]
DetailsDep = Annotated[DetailService, Depends(_service("details"))]
JobsDep = Annotated[JobManager, Depends(_service("jobs"))]
AblationDep = Annotated[AblationService, Depends(_service("ablation"))]
DataPKDep = Annotated[DataPKService, Depends(_service("data_pk"))]
ValidationDep = Annotated[ValidationService, Depends(_service("validation"))]
RecoveryDep = Annotated[RecoveryService, Depends(_service("recovery"))]
SubgraphsDep = Annotated[SubgraphService, Depends(_service("subgraphs"))]
ModelDep = Annotated[ModelRef, Depends(model_ref)]


async def require_token(
    authorization: str | None = Header(None, include_in_schema=False),
    settings: Settings = Depends(get_settings),
) -> None:
    """Write/compute endpoints: ``Authorization: Bearer <HEADGRAPH_API_TOKEN>`` when a token is set.

    The header is documented in OpenAPI (bearer security) only when a token is configured.
    """
    if not token_matches(bearer(authorization), settings.api_token):
        raise Unauthorized("this needs the lab's API token: sign in on the dashboard, or send "
                           "'Authorization: Bearer <token>' (HEADGRAPH_API_TOKEN is set on the server)")


async def cached_first(request: Request, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a service call in a worker thread, never on the event loop (a warm read still
    unpickles MBs; the loop must stay free for /api/health and cache hits).

    First with CACHE_ONLY set, so it only reads the cache (its own small thread budget, so warm
    reads never queue behind cold computations waiting in the default pool); if something it
    needs is cold (ColdMiss), again computing it, inside ``access.cold_work``: 401 in lab mode
    without the token; over the client's cap of cold computations at once it waits in the
    client's queue (429 only when that is full); a cold result the cache could not store
    (``Store.cannot_store``) is a 503 before anything loads or computes. A cold model
    identity alone is not refused: a read-only cache still serves its stored results."""

    def attempt(cache_only: bool) -> T:
        token = CACHE_ONLY.set(cache_only)
        try:
            return fn(*args, **kwargs)
        finally:
            CACHE_ONLY.reset(token)

    try:
        return await anyio.to_thread.run_sync(attempt, True, limiter=_warm_limiter(request))
    except ColdMiss as miss:
        result = bool(miss.args) and parse_key(str(miss.args[0])) is not None  # not a model identity
    async with cold_work(request):
        if result:  # a result to compute: 503 at once when it could not be stored (no model load)
            store: Store = request.app.state.services.store
            reason = await anyio.to_thread.run_sync(store.cannot_store, limiter=_warm_limiter(request))
            if reason is not None:
                raise CacheUnavailable(reason)
        return await run_in_threadpool(attempt, False)


WARM_THREADS = 8  # cache-only attempts at once per process (each one is CPU-bound: unpickling)


def _warm_limiter(request: Request) -> anyio.CapacityLimiter:
    """The app's limiter of cache-only attempts (created on first use, inside the event loop)."""
    limiter = getattr(request.app.state, "warm_limiter", None)
    if limiter is None:
        limiter = request.app.state.warm_limiter = anyio.CapacityLimiter(WARM_THREADS)
    return limiter
