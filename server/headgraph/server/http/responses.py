"""Warm responses: JSON bodies rendered once, off the event loop, and answered from memory.

A result never changes under its key (store keys hold the weights or model fingerprint and
COMPUTE_VERSION), so neither does its rendered JSON: ``warm_json`` keeps the bytes in a
per-process, byte-bounded LRU (``HEADGRAPH_RESPONSE_CACHE_MB``, default 256; 0 turns it off)
keyed by path, model id, model fingerprint (the whole runnable model: a response may hold
activation-level results) and query. A hit is one dict lookup on the event
loop and a prebuilt ``Response``; a miss runs the service call, the response-model validation
and the JSON encoding in a worker thread (``deps.cached_first``: cache-only first, a cold
result only under ``access.cold_work``), so a score grid of MBs never holds the loop, and
/api/health answers while 32 clients read.

Not kept (rendered in a thread every time): responses whose weights have no known identity
yet (the model was never loaded here), and those reading an uploaded label set (``labels=``
naming one: it can be replaced under the same name).
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel

from headgraph.core.errors import HeadgraphError
from headgraph.core.models.random_weights import RANDOM_PREFIX, RANDOM_PRESETS, parse_random_spec
from headgraph.core.types import COMPUTE_VERSION
from headgraph.server.http.deps import cached_first
from headgraph.server.models.offered import ModelRef
from headgraph.server.services.labels import PATTERN_LABELS

MiB = 1 << 20
DEFAULT_CACHE_MB = 256
JSON = "application/json"


class ResponseLRU:
    """Rendered bodies by key, least recently used evicted past ``max_bytes`` (thread-safe)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max(0, max_bytes)
        self._items: OrderedDict[Hashable, bytes] = OrderedDict()
        self._bytes = 0
        self._guard = threading.Lock()
        self.hits = self.misses = 0

    def get(self, key: Hashable) -> bytes | None:
        with self._guard:
            body = self._items.get(key)
            if body is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return body

    def put(self, key: Hashable, body: bytes) -> None:
        if len(body) > self.max_bytes // 4:  # one body never takes more than a quarter
            return
        with self._guard:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= len(old)
            self._items[key] = body
            self._bytes += len(body)
            while self._bytes > self.max_bytes:
                _, dropped = self._items.popitem(last=False)
                self._bytes -= len(dropped)

    def stats(self) -> dict[str, int]:
        with self._guard:
            return {"entries": len(self._items), "bytes": self._bytes, "max_bytes": self.max_bytes,
                    "hits": self.hits, "misses": self.misses}


class _WarmState:
    """One app's LRU and its renders in flight (touched on the event loop only)."""

    def __init__(self, max_bytes: int) -> None:
        self.lru = ResponseLRU(max_bytes)
        self.inflight: dict[Hashable, asyncio.Future[bytes]] = {}


def warm_state(app: FastAPI) -> _WarmState:
    state = getattr(app.state, "warm_responses", None)
    if state is None:
        mb = app.state.settings.response_cache_mb
        state = app.state.warm_responses = _WarmState(int(mb * MiB))
    return state


def _model_version(request: Request, ref: ModelRef) -> str | None:
    """What the model ``ref`` is, cheaply: its known model fingerprint; for a ``random:`` model
    its spec (its weights are a function of the spec, the config and the installed libraries,
    which do not change under a running process) with, for a config file, the file's size and
    mtime; None when unknown (nothing is kept)."""
    ident = request.app.state.services.catalog.known_identity(ref)
    if ident is not None:
        return ident.model_fingerprint
    if ref.kind != "random" or not ref.spec.startswith(RANDOM_PREFIX):
        return None
    try:
        body, _ = parse_random_spec(ref.spec)
        if body in RANDOM_PRESETS:
            return "spec:" + ref.spec
        path = Path(body).expanduser()
        st = (path / "config.json" if path.is_dir() else path).stat()
    except (OSError, ValueError, HeadgraphError):
        return None
    return f"spec:{ref.spec}|{st.st_size}|{st.st_mtime_ns}"


def response_key(request: Request, ref: ModelRef, labels: str | None = None,
                 variant: Hashable = None) -> Hashable | None:
    """LRU key of this request's response, or None when it must not be kept; ``variant``: what
    else the answer depends on besides the query (whether optional inputs are cached, say)."""
    if labels and labels != PATTERN_LABELS \
            and labels not in request.app.state.services.labels.builtin_label_sets():
        return None  # an uploaded set (or an unknown name: its 404 is rendered each time)
    version = _model_version(request, ref)
    if version is None:
        return None
    # sorted by name only: the sort is stable, so repeated names keep their order (the last wins)
    query = tuple(sorted(request.query_params.multi_items(), key=lambda kv: kv[0]))
    return (request.url.path, ref.id, version, COMPUTE_VERSION, query, variant)


def render(schema: type[BaseModel], content: Any) -> bytes:
    """``content`` validated against ``schema`` and encoded as compact JSON (what FastAPI's
    ``response_model`` would send; NaN/inf become null)."""
    return schema.model_validate(content).model_dump_json().encode()


def json_response(body: bytes) -> Response:
    return Response(body, media_type=JSON)


async def render_json(request: Request, schema: type[BaseModel], build: Callable[[], Any]
                      ) -> Response:
    """``build()`` rendered as ``schema`` JSON in a worker thread (cache-only first, cold work
    gated: deps.cached_first), never kept: for answers that change (what is cached, say)."""
    return json_response(await cached_first(request, lambda: render(schema, build())))


async def warm_json(request: Request, schema: type[BaseModel], ref: ModelRef,
                    build: Callable[[], Any], *, labels: str | None = None,
                    variant: Hashable = None) -> Response:
    """The ``schema`` JSON of ``build()``, a pure function of ``ref``'s weights, the query
    (``labels``: the label set it reads, if any) and ``variant`` (response_key): from the LRU when rendered before (on the
    event loop, no thread), else rendered in a worker thread (``render_json``; concurrent
    requests for the same key share one render) and kept."""
    state = warm_state(request.app)
    key = response_key(request, ref, labels, variant) if state.lru.max_bytes else None
    if key is None:
        return await render_json(request, schema, build)
    body = state.lru.get(key)
    if body is not None:
        return json_response(body)
    pending = state.inflight.get(key)
    if pending is not None:
        try:
            return json_response(await asyncio.shield(pending))
        except BaseException:
            if not pending.done():  # this request was cancelled, not the render
                raise
            # the first request failed (its own 401, say): try on this request's own terms
        return await render_json(request, schema, build)
    future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
    state.inflight[key] = future
    try:
        response = await render_json(request, schema, build)
        body = bytes(response.body)
        state.lru.put(key, body)
        future.set_result(body)
        return response
    except BaseException as err:
        future.set_exception(err if isinstance(err, Exception) else RuntimeError("cancelled"))
        future.exception()  # retrieved: no "never retrieved" warning without waiters
        raise
    finally:
        state.inflight.pop(key, None)
