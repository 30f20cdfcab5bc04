"""The HTTP protocol uvicorn serves with: its httptools protocol plus a header timeout and a
cap on one client's open connections.

uvicorn bounds idle keep-alive connections but not a connection that opens and never finishes
its headers; enough of those fill the connection limit (SERVE_CONNECTIONS) and every request
(health included) answers 503 while they are held. Here a request's headers must arrive within
``Settings.header_timeout_s`` of its first byte (of the connection, for the first request),
else the connection is closed; and one address holds at most
``Settings.connections_per_client`` connections of a process at once (a 429 and the connection
closed beyond), so one client alone cannot reach the global limit. A proxy named in
``Settings.forwarded_allow_ips`` speaks for many clients and is not capped.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
from collections import Counter
from functools import cache
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from headgraph.server.errors import error_body
from headgraph.server.settings import Settings

_OPEN: Counter[str] = Counter()  # this process's open connections per client address


@cache
def _settings() -> Settings:
    return Settings.from_env()


def header_timeout_s() -> float:
    """The configured header timeout (read once per process)."""
    return _settings().header_timeout_s


@cache
def _trusted() -> tuple[bool, tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]]:
    """(any address trusted, the trusted networks) of HEADGRAPH_FORWARDED_ALLOW_IPS."""
    items = [x.strip() for x in _settings().forwarded_allow_ips.split(",") if x.strip()]
    nets = []
    for item in items:
        try:
            nets.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            continue  # "*" or a unix socket name
    return "*" in items, tuple(nets)


def capped_client(host: str | None) -> str | None:
    """The address whose connections are counted, or None when it is not capped (unknown, or
    a trusted proxy that speaks for many clients)."""
    if not host:
        return None
    anyone, nets = _trusted()
    if anyone:
        return None
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return host
    return None if any(addr in net for net in nets) else host


def _refusal(limit: int) -> bytes:
    body = json.dumps(error_body(429, f"too many open connections from your address (at most {limit}); "
                                      "close some and retry")).encode()
    return (b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\n"
            b"retry-after: 1\r\nconnection: close\r\ncontent-length: " + str(len(body)).encode()
            + b"\r\n\r\n" + body)


class HeaderTimeoutProtocol(HttpToolsProtocol):
    """HttpToolsProtocol that closes a connection whose request headers take too long, and
    refuses one past its address's connection cap."""

    _header_timer: asyncio.TimerHandle | None = None
    _counted: str | None = None

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
        peer = transport.get_extra_info("peername")
        client = capped_client(str(peer[0]) if isinstance(peer, (tuple, list)) and peer else None)
        if client is not None:
            limit = _settings().connections_per_client
            if _OPEN[client] >= limit:
                transport.write(_refusal(limit))
                transport.close()
                return
            _OPEN[client] += 1
            self._counted = client
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Any) -> None:
        self._disarm()
        if self._counted is not None:
            _OPEN[self._counted] -= 1
            if _OPEN[self._counted] <= 0:
                del _OPEN[self._counted]
            self._counted = None
        super().connection_lost(exc)
