"""What a callback reaches besides its arguments: the API client and the API's vocabulary.

``create_dash`` stores one :class:`FrontendContext` in its Flask app's config; callbacks read
it through ``flask.current_app`` (they run inside a Flask request), so there is no global of
our own and a test can call any callback inside ``dash_app.server.app_context()``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import flask

from headgraph.frontend.api_client import ApiClient
from headgraph.frontend.vocab import Vocabulary, VocabularyCache

CONFIG_KEY = "HEADGRAPH_FRONTEND"
ApiProvider = Callable[[], ApiClient]


@dataclass
class FrontendContext:
    """The ApiClient provider of one Dash app and its lazily fetched vocabulary."""

    provider: ApiProvider
    vocabulary_cache: VocabularyCache = field(default_factory=VocabularyCache)

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


def vocab() -> Vocabulary:
    """The API's vocabulary for the current callback."""
    return current().vocabulary()
