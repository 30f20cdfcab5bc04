"""Structured logging: one JSON line per request (method, path, status, ms) on stderr."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

ACCESS_LOGGER = "headgraph.access"


class JsonLineFormatter(logging.Formatter):
    """Render a record as one JSON object; access records carry their fields in ``fields``."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        else:
            entry["msg"] = record.getMessage()
        if record.exc_info:
            entry["traceback"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(level: int = logging.INFO) -> None:
    """Send ``headgraph.*`` loggers to stderr as JSON lines (idempotent)."""
    root = logging.getLogger("headgraph")
    if any(getattr(h, "_headgraph", False) for h in root.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLineFormatter())
    handler._headgraph = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False


class AccessLogMiddleware:
    """Pure ASGI middleware (no body buffering) that logs each HTTP request once."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.log = logging.getLogger(ACCESS_LOGGER)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500
        sent = 0

        async def send_wrapper(message: Message) -> None:
            nonlocal status, sent
            if message["type"] == "http.response.start":
                status = int(message["status"])
            elif message["type"] == "http.response.body":
                sent += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            ms = (time.perf_counter() - started) * 1000
            fields = {"method": scope.get("method"), "path": scope.get("path"),
                      "status": status, "ms": round(ms, 2), "bytes": sent}
            level = logging.WARNING if status >= 500 else logging.INFO
            self.log.log(level, "request", extra={"fields": fields})
