"""Request bodies: capped before they are buffered, and read whole on the event loop in time.

An ASGI middleware around the whole app (API and dashboard). It refuses a body whose
``Content-Length`` is over the cap at once (413), counts the bytes of a body sent without one
and stops at the cap (413), and gives a client ``timeout_s`` to send its whole body (408).
Only a complete body reaches the app, so a slow sender costs one coroutine on the event loop,
never one of the dashboard's WSGI threads (slow bodies must not freeze the page).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from headgraph.server.errors import error_body
from headgraph.server.limits import API_BODY_BYTES_MAX, PAGE_BODY_BYTES_MAX

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

BODY_TIMEOUT_S = 20.0


class BodyLimit:
    """Cap and time-limit request bodies: ``api_limit`` under /api, ``page_limit`` elsewhere."""

    def __init__(self, app: ASGIApp, *, api_limit: int = API_BODY_BYTES_MAX,
                 page_limit: int = PAGE_BODY_BYTES_MAX, timeout_s: float = BODY_TIMEOUT_S) -> None:
        self.app = app
        self.api_limit = api_limit
        self.page_limit = page_limit
        self.timeout_s = timeout_s

    def limit_for(self, path: str) -> int:
        return self.api_limit if path == "/api" or path.startswith("/api/") else self.page_limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope.get("path", ""))
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await _refuse(send, 413, f"request body of {declared} bytes is over this endpoint's "
                                     f"limit of {limit} bytes")
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        chunks: list[bytes] = []
        size = 0
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                await _refuse(send, 408, f"the request body did not arrive within "
                                         f"{self.timeout_s:g} s")
                return
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size > limit:
                await _refuse(send, 413, f"request body is over this endpoint's limit of "
                                         f"{limit} bytes")
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        whole = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": whole, "more_body": False}
            return await receive()  # after the body: only http.disconnect can come

        await self.app(scope, replay, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _refuse(send: Send, status: int, message: str) -> None:
    body = json.dumps(error_body(status, message)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
