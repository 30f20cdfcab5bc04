"""Who may do what, and how much cold work one client may start at once.

The auth model (docs: operations, "Access"): with no ``HEADGRAPH_API_TOKEN`` the server is a single
user's (open mode): every read may compute. With a token (lab mode) a request without
``Authorization: Bearer <token>`` reads only what is already cached; a cold result, a compute
job, an upload or an overwrite needs the token (401 otherwise). Either way a client (one
token holder or one address) runs at most ``cold_per_client`` cold computations at once (429
beyond that), so nobody queues the compute processes full by themselves.
"""

from __future__ import annotations

import hmac
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import Request

from headgraph.server.errors import TooManyRequests, Unauthorized

COLD_NEEDS_TOKEN = ("this result is not cached yet, and computing it needs the lab's API token "
                    "('Authorization: Bearer <token>'; in the dashboard: Sign in)")


@dataclass(frozen=True)
class Caller:
    """The client of one request: whether it holds the token, and the key its limits use."""

    authorized: bool
    client: str


def bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (None when absent or another scheme)."""
    scheme, _, given = (header or "").strip().partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        return None
    return given.strip()


def token_matches(given: str | None, token: str | None) -> bool:
    """Constant-time comparison; no server token means everyone is authorized (open mode)."""
    if not token:
        return True
    return given is not None and hmac.compare_digest(given.encode(), token.encode())


def caller_of(request: Request) -> Caller:
    """Caller of ``request`` under the app's settings (open mode: always authorized)."""
    token = request.app.state.settings.api_token
    given = bearer(request.headers.get("authorization"))
    authorized = token_matches(given, token)
    if token and authorized:
        client = "token"  # the lab's token holders share one budget, wherever they connect from
    else:
        client = request.client.host if request.client else "unknown"
    return Caller(authorized=authorized, client=client)


class ColdLimiter:
    """Per-client count of running cold computations, capped (thread-safe, in-process)."""

    def __init__(self, per_client: int) -> None:
        self.per_client = max(1, per_client)
        self._guard = threading.Lock()
        self._running: dict[str, int] = {}

    def enter(self, client: str) -> None:
        with self._guard:
            n = self._running.get(client, 0)
            if n >= self.per_client:
                raise TooManyRequests(f"{n} cold computations of this client are already running "
                                      f"(the cap is {self.per_client}); retry when one is done")
            self._running[client] = n + 1

    def leave(self, client: str) -> None:
        with self._guard:
            n = self._running.get(client, 1) - 1
            if n <= 0:
                self._running.pop(client, None)
            else:
                self._running[client] = n

    def running(self, client: str) -> int:
        with self._guard:
            return self._running.get(client, 0)


@asynccontextmanager
async def cold_work(request: Request) -> AsyncIterator[Caller]:
    """Around a cold computation started by ``request``: 401 in lab mode without the token,
    429 over the client's cap; otherwise hold one of the client's slots while it runs."""
    caller = caller_of(request)
    if not caller.authorized:
        raise Unauthorized(COLD_NEEDS_TOKEN)
    limiter: ColdLimiter = request.app.state.cold_limiter
    limiter.enter(caller.client)
    try:
        yield caller
    finally:
        limiter.leave(caller.client)
