"""What a callback reaches besides its arguments: the API client and the API's vocabulary.

``create_dash`` stores one :class:`FrontendContext` in its Flask app's config; callbacks read
it through ``flask.current_app`` (they run inside a Flask request), so there is no global of
our own and a test can call any callback inside ``dash_app.server.app_context()``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import flask

from headgraph.frontend.api.client import ApiClient
from headgraph.frontend.api.names import Vocabulary, VocabularyCache

CONFIG_KEY = "HEADGRAPH_FRONTEND"
ApiProvider = Callable[[], ApiClient]


class RenderedViews:
    """A bounded LRU of rendered view outputs, keyed by what they were drawn from (the view's
    parameters with the results' fingerprint, callbacks/router.py ``render_key``): a warm view
    opened again is answered without re-reading and re-drawing its grids (thread-safe)."""

    def __init__(self, capacity: int = 64) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, tuple[Any, ...]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> tuple[Any, ...] | None:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: str, value: tuple[Any, ...]) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)


@dataclass
class FrontendContext:
    """The ApiClient provider of one Dash app, its lazily fetched vocabulary and its rendered
    views."""

    provider: ApiProvider
    vocabulary_cache: VocabularyCache = field(default_factory=VocabularyCache)
    rendered: RenderedViews = field(default_factory=RenderedViews)

    def api(self) -> ApiClient:
        return self.provider()

    def vocabulary(self) -> Vocabulary:
        """GET /api/vocabulary, fetched once per app process (thread-safe)."""
        return self.vocabulary_cache.get(lambda: self.provider().vocabulary())


def current() -> FrontendContext:
    """The context of the Dash app serving the current request (or app context)."""
    return flask.current_app.config[CONFIG_KEY]


def api() -> ApiClient:
    """The ApiClient for the current callback."""
    return current().api()


def rendered_views() -> RenderedViews:
    """The current app's rendered-view LRU."""
    return current().rendered


def vocab() -> Vocabulary:
    """The API's vocabulary for the current callback."""
    return current().vocabulary()
