"""The HTTP protocol uvicorn serves with: its httptools protocol plus a header timeout.

uvicorn bounds idle keep-alive connections but not a connection that opens and never finishes
its headers; enough of those fill the connection limit and every request (health included)
answers 503 while they are held. Here a request's headers must arrive within
``Settings.header_timeout_s`` of its first byte (of the connection, for the first request),
else the connection is closed.
"""

from __future__ import annotations

import asyncio
from functools import cache
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from headgraph.server.settings import Settings


@cache
def header_timeout_s() -> float:
    """The configured header timeout (read once per process)."""
    return Settings.from_env().header_timeout_s


class HeaderTimeoutProtocol(HttpToolsProtocol):
    """HttpToolsProtocol that closes a connection whose request headers take too long."""

    _header_timer: asyncio.TimerHandle | None = None

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(header_timeout_s(), self._headers_too_slow)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Any) -> None:
        self._disarm()
        super().connection_lost(exc)
