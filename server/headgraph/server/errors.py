"""API errors: what a caller caused, with its HTTP status and a one-line message.

``http.handlers`` turns every failure into a JSON answer. Clients never see a stack trace: the server's ApiError family and core's HeadgraphError
family (InvalidInput, ModelUnavailable, PathNotAllowed, UnsupportedModel) are what a caller
caused and become 4xx with their one-line message (and the allowed values, when there is a
list); anything else, a bare ValueError included, is a bug and becomes a generic 500 whose
traceback is logged server-side only.
"""

from __future__ import annotations

from typing import Any

from headgraph.core.errors import HeadgraphError, ModelUnavailable, PathNotAllowed


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
