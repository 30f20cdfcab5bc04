"""The FastAPI application factory: API routers, JSON errors, request logs, optional frontend.

``create_app(settings)`` builds one app; uvicorn runs it directly (one worker) or through the
import string ``headgraph.server.http.app:create_app`` with ``factory=True`` (several workers, each
reading its settings from HEADGRAPH_* environment variables).
"""

from __future__ import annotations

import logging
import multiprocessing
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import entry_points
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from starlette.routing import Match

from headgraph.server import __version__
from headgraph.server.compute.pool import watch_parent
from headgraph.server.errors import error_body
from headgraph.server.http.access import ColdLimiter
from headgraph.server.http.bodylimit import BodyLimit
from headgraph.server.http.deps import TOKEN_MARK
from headgraph.server.http.handlers import install_handlers
from headgraph.server.http.routers import (
    ablation,
    auth,
    circuits,
    compare,
    data_pk,
    downloads,
    graph,
    health,
    jobs,
    labels,
    models,
    recovery,
    reference,
    scores,
    series,
    subgraph,
    subspaces,
    tokens,
    validation,
    vocabulary,
)
from headgraph.server.logs import AccessLogMiddleware, configure_logging
from headgraph.server.services.wiring import build_services
from headgraph.server.settings import Settings

log = logging.getLogger("headgraph.app")
API_ROUTERS = (health.router, auth.router, vocabulary.router, models.router, jobs.router, scores.router, graph.router,
               reference.router, tokens.router, labels.router, downloads.router, ablation.router,
               data_pk.router, validation.router, series.router, compare.router,
               recovery.router, circuits.router, subgraph.router, subspaces.router)
FRONTEND_GROUP = "headgraph.frontends"
API_DESCRIPTION = """\
Attention-head affinity read from weights: Projection Kernel (Yamagiwa et al.,
arXiv:2601.10266) and Composition Score (Elhage et al. 2021).

* **Models** are chosen with the `model` query parameter (ids from `GET /api/models`).
* **Cold results**: a GET whose result is not cached yet computes it synchronously in a compute
  process (once, however many clients ask) and answers when done; `POST /api/models/compute`
  instead starts a background job whose progress `GET /api/jobs/{id}` reports, after which
  every read is served from the cache. `GET /api/models` lists what is cached per model.
* **Errors** are JSON `{"error": {"status", "message"}}`; unknown names list what is allowed.
* **Auth**: with no `HEADGRAPH_API_TOKEN` on the server (open mode) every request may compute.
  With one (lab mode) a request without `Authorization: Bearer <token>` reads only what is
  cached (a cold result is 401); compute jobs, uploads and overwrites need the token.
  `GET /api/auth` says which mode and whether a token is accepted.
* **Limits**: request bodies at most 2 MiB under /api (label sets 1 MiB; 413), sent within
  20 s (408); at most `HEADGRAPH_COLD_PER_CLIENT` cold computations per client at once, more queued (429 when `HEADGRAPH_COLD_QUEUE_PER_CLIENT` are waiting);
  thresholds are rounded to 3 significant digits, percentages to 0.1, and a graph keeps at
  most `max_edges` edges per pairing (`GET /api/vocabulary`).
"""
API_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")


def add_api_fallback(app: FastAPI) -> None:
    """Catch-all for /api and /api/...: 405 (with Allow) for a known path asked with another
    method, else a JSON 404; so the frontend mounted on "/" never answers an /api path with HTML."""

    async def api_fallback(request: Request) -> JSONResponse:
        path = request.url.path
        allowed = set()
        for route in request.app.router.routes:  # API routes precede this one (and the frontend)
            if getattr(route, "endpoint", None) is api_fallback:
                break
            for method in API_METHODS:
                match, _ = route.matches({**request.scope, "method": method})
                if match == Match.FULL:
                    allowed.add(method)
        if allowed:
            methods = ", ".join(sorted(allowed))
            return JSONResponse(error_body(405, f"{request.method} is not allowed on {path}; "
                                                f"use {methods}"),
                                status_code=405, headers={"Allow": methods})
        return JSONResponse(error_body(404, f"no API endpoint {request.method} {path}; see /docs"),
                            status_code=404)

    app.add_api_route("/api/{rest:path}", api_fallback, methods=list(API_METHODS),
                      include_in_schema=False)
    app.add_api_route("/api", api_fallback, methods=list(API_METHODS), include_in_schema=False)


# Operations that read only what the server holds anyway (never compute, never 401/429/503).
LIGHT_OPERATIONS = {("/api/health", "get"), ("/api/auth", "get"), ("/api/vocabulary", "get"),
                    ("/api/models", "get"), ("/api/jobs/{job_id}", "get"), ("/api/labels", "get"),
                    ("/api/cache/stats", "get"), ("/api/series", "get")}
COMMON_ERRORS = {408: "the request body did not arrive in time",
                 413: "the request body is over the limit"}
COLD_ERRORS = {401: "not cached, and computing needs the token (lab mode)",
               429: "this client's queue of cold computations is full; retry later",
               503: "the cache cannot store new results (read-only or full)"}


def _document_errors(path: str, method: str, op: dict[str, Any], lab_mode: bool) -> None:
    """Add the statuses the middleware, auth and cache can answer with to one operation."""
    errors = dict(COMMON_ERRORS)
    if (path, method) not in LIGHT_OPERATIONS:
        errors.update(COLD_ERRORS)
    if method == "post":
        errors[401] = "this endpoint needs the token (lab mode)"
    body = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    responses = op.setdefault("responses", {})
    for status, text in errors.items():
        responses.setdefault(str(status), {"description": text, "content": body})
    if lab_mode and "security" not in op and (path, method) not in LIGHT_OPERATIONS:
        op["security"] = [{}, {"bearer": []}]  # the token is optional: it lets a cold read compute


def install_openapi(app: FastAPI, settings: Settings) -> None:
    """OpenAPI where operations marked ``TOKEN_MARK`` get bearer security, only when the server
    has a token (the mark itself is dropped); result reads take the token optionally; every
    operation lists the error statuses limits and auth can give."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version=app.version, description=app.description,
                             routes=app.routes)
        lab_mode = bool(settings.api_token)
        for path, ops in schema.get("paths", {}).items():
            for method, op in ops.items():
                if not isinstance(op, dict):
                    continue
                if op.pop(TOKEN_MARK, False) and lab_mode:
                    op["security"] = [{"bearer": []}]
                if path.startswith("/api"):
                    _document_errors(path, method, op, lab_mode)
        if lab_mode:
            schema.setdefault("components", {}).setdefault("securitySchemes", {})["bearer"] = {
                "type": "http", "scheme": "bearer",
                "description": "HEADGRAPH_API_TOKEN: needed to compute, upload and overwrite"}
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def mount_frontends(app: FastAPI, settings: Settings) -> list[str]:
    """Attach every installed frontend (entry point group ``headgraph.frontends``); their names.

    The server never imports a frontend: a frontend distribution declares
    ``mount(app, settings)`` under that group. Called last, so a frontend mounted on "/" never
    shadows an /api route. The API works without one; a broken one is logged and skipped.
    """
    mounted = []
    for ep in entry_points(group=FRONTEND_GROUP):
        try:
            ep.load()(app, settings)
        except Exception as err:
            log.error("frontend %s not mounted: %s: %s", ep.name, type(err).__name__, err,
                      exc_info=err)
            continue
        mounted.append(ep.name)
    return mounted


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the headgraph app (settings default to HEADGRAPH_* environment variables)."""
    settings = settings or Settings.from_env()
    configure_logging()
    if settings.compute_processes == 0:  # computations run in this process's threads
        import torch

        torch.set_num_threads(settings.intra_op_threads)
    services = build_services(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if multiprocessing.parent_process() is not None:
            # A uvicorn worker (--workers > 1): exit with the supervisor that spawned it, so a
            # killed server leaves no worker (and, through theirs, no compute process) behind.
            watch_parent()
        log.info("headgraph API ready (cache %s, device %s)", settings.cache_dir, settings.device)
        yield
        services.close()

    app = FastAPI(
        title="headgraph API",
        version=__version__,
        description=API_DESCRIPTION,
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.services = services
    app.state.cold_limiter = ColdLimiter(settings.cold_per_client, settings.cold_queue_per_client)
    install_handlers(app)
    app.add_middleware(BodyLimit, timeout_s=settings.body_timeout_s)  # inside the access log, so refusals are logged too
    app.add_middleware(AccessLogMiddleware)
    for router in API_ROUTERS:
        app.include_router(router)
    add_api_fallback(app)
    install_openapi(app, settings)
    app.state.frontends = mount_frontends(app, settings)
    return app
