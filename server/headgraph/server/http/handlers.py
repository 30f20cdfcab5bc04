"""The exception handlers that turn every failure into a JSON answer (``errors.error_body``).

API errors and core's HeadgraphError family become 4xx with their one-line message (and the
allowed values, when there is a list); request validation errors a 422 naming each field;
anything else a generic 500 whose traceback is logged server-side only.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from headgraph.core.errors import HeadgraphError
from headgraph.server.errors import ApiError, error_body, one_line, status_for
from headgraph.server.http.params import PATTERN_MESSAGES

log = logging.getLogger("headgraph.errors")


def install_handlers(app: FastAPI) -> None:
    """Register JSON handlers for API, core, validation, HTTP and unexpected errors."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, err: ApiError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if err.status == 401 else None
        if err.status in (429, 503):
            headers = {"Retry-After": "5"}
        return JSONResponse(error_body(err.status, err.message, allowed=err.allowed),
                            status_code=err.status, headers=headers)

    @app.exception_handler(HeadgraphError)
    async def _core_error(request: Request, err: HeadgraphError) -> JSONResponse:
        status = status_for(err)
        log.warning("%s %s -> %d %s: %s", request.method, request.url.path, status,
                    type(err).__name__, one_line(err))
        return JSONResponse(error_body(status, one_line(err, 1000), type=type(err).__name__,
                                       allowed=getattr(err, "allowed", None)),
                            status_code=status)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, err: RequestValidationError) -> JSONResponse:
        details = []
        for e in err.errors():
            loc = ".".join(str(p) for p in e.get("loc", ()) if p not in ("query", "body", "path"))
            got = e.get("input")
            shown = f" (got {got!r:.80})" if isinstance(got, (str, int, float)) else ""
            pattern = str((e.get("ctx") or {}).get("pattern"))
            msg = PATTERN_MESSAGES.get(pattern, e.get("msg", "invalid"))
            details.append(f"{loc or 'request'}: {msg}{shown}")
        message = "; ".join(details) or "invalid request"
        return JSONResponse(error_body(422, one_line(message, 1000)), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, err: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(error_body(err.status_code, one_line(err.detail)),
                            status_code=err.status_code, headers=getattr(err, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, err: Exception) -> JSONResponse:
        # ValueError, TypeError, ComputeFailed...: never the caller's message or traceback.
        log.error("%s %s -> 500 %s: %s", request.method, request.url.path, type(err).__name__,
                  one_line(err), exc_info=err)
        return JSONResponse(error_body(500, "internal error; see the server log"), status_code=500)
