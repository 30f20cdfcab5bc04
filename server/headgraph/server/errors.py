"""API errors and the exception handlers that turn every failure into a JSON answer.

Clients never see a stack trace: the server's ApiError family and core's HeadgraphError
family (InvalidInput, ModelUnavailable, PathNotAllowed, UnsupportedModel) are what a caller
caused and become 4xx with their one-line message (and the allowed values, when there is a
list); anything else, a bare ValueError included, is a bug and becomes a generic 500 whose
traceback is logged server-side only.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from headgraph.core.errors import HeadgraphError, ModelUnavailable, PathNotAllowed
from headgraph.core.names import HEAD_INPUT_PATTERN

log = logging.getLogger("headgraph.errors")


class ApiError(Exception):
    """An expected failure with its HTTP status and a one-line message for the client."""

    status = 400

    def __init__(self, message: str, *, status: int | None = None, allowed: list[str] | None = None):
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        self.allowed = allowed


class NotFound(ApiError):
    """Unknown model, head, label set, job, role or pairing (404)."""

    status = 404


class Invalid(ApiError):
    """A parameter outside what is allowed (422)."""

    status = 422


class Unauthorized(ApiError):
    """A token-protected action (compute, upload, a cold result in lab mode) without the token."""

    status = 401


class Conflict(ApiError):
    """The write would replace something that exists (a label set of that name) (409)."""

    status = 409


class PayloadTooLarge(ApiError):
    """A request body over its documented cap (413), refused before it is buffered."""

    status = 413


class TooManyRequests(ApiError):
    """This client already has its cap of cold computations running (429, Retry-After)."""

    status = 429


class CacheUnavailable(ApiError):
    """The cache cannot store results (read-only folder, disk full): 503 with the reason.
    Warm reads keep working; only new results are refused."""

    status = 503


def one_line(text: object, limit: int = 500) -> str:
    """First line of a message, bounded (messages go into JSON and logs)."""
    s = str(text).strip().splitlines()[0] if str(text).strip() else ""
    return s if len(s) <= limit else s[: limit - 3] + "..."


def error_body(status: int, message: str, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"error": {"status": status, "message": message}}
    body["error"].update({k: v for k, v in extra.items() if v is not None})
    return body


def status_for(err: HeadgraphError) -> int:
    """HTTP status of a core error: offline model 404, refused path 403, other (InvalidInput,
    UnsupportedModel, ...) 422."""
    if isinstance(err, ModelUnavailable):
        return 404
    if isinstance(err, PathNotAllowed):
        return 403
    return 422


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
            msg = e.get("msg", "invalid")
            if (e.get("ctx") or {}).get("pattern") == HEAD_INPUT_PATTERN:
                msg = "not a head name (expected like 'L9H6', or 'L6KV1' for a grouped key/value head)"
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
