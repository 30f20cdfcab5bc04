"""Dash app factory and its mount on the FastAPI server (``mount_frontend``).

The dashboard is a Flask-backed Dash app wrapped in ``a2wsgi.WSGIMiddleware`` and mounted on
"/" after every /api route, so /api keeps answering (unknown /api paths stay JSON 404s) and
Dash callbacks run in a2wsgi's thread pool, never on the event loop. Callbacks read data only
through the HTTP API (``ApiClient``) at HEADGRAPH_API_URL, or else at the local address the
request came in on (the same server). The dashboard holds no API token of its own: a user
who signs in stores their token in their browser (cookie ``TOKEN_COOKIE``, SameSite=Strict,
set by the page itself), and each callback forwards it as ``Authorization: Bearer`` to the
API; without it, endpoints that need one answer with the API's own message.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import unquote

from dash import Dash

from headgraph.frontend.api.auth import TOKEN_COOKIE, install_request_guards
from headgraph.frontend.api.client import ApiClient, ClientPool
from headgraph.frontend.api.context import CONFIG_KEY, ApiProvider, FrontendContext
from headgraph.frontend.callbacks import register_callbacks
from headgraph.frontend.callbacks.model import page_data
from headgraph.frontend.layout.page import build_layout


def local_base_url(environ: dict[str, Any]) -> str:
    """http(s)://host:port of the socket a WSGI request arrived on (the server itself)."""
    host = str(environ.get("SERVER_NAME") or "127.0.0.1")
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    scheme = environ.get("wsgi.url_scheme", "http")
    return f"{scheme}://{host}:{environ.get('SERVER_PORT') or 80}"


def api_provider(api_url: str | None = None) -> ApiProvider:
    """A function giving the ApiClient for the current callback's request.

    ``api_url`` (or env HEADGRAPH_API_URL) wins; otherwise the server's own local address.
    """
    pool = ClientPool()
    fixed = api_url or os.environ.get("HEADGRAPH_API_URL") or None

    def get() -> ApiClient:
        import flask

        if not flask.has_request_context():
            return pool.get(fixed) if fixed else pool.get(local_base_url({}))
        cookie = flask.request.cookies.get(TOKEN_COOKIE)
        user_token = unquote(cookie) if cookie else None  # the page sets it URI-encoded
        client = pool.get(fixed) if fixed else pool.get(local_base_url(flask.request.environ))
        return client.as_user(user_token, flask.request.remote_addr)

    return get


def create_dash(*, api_url: str | None = None, requests_pathname_prefix: str = "/") -> Dash:
    """The dashboard as a Flask-backed Dash app (not yet mounted anywhere)."""
    app = Dash(
        __name__,
        title="headgraph",
        update_title=None,  # pyright: ignore[reportArgumentType]  # None: no "Updating..." title (Dash's type says str)
        requests_pathname_prefix=requests_pathname_prefix,
        routes_pathname_prefix="/",
        suppress_callback_exceptions=True,
        serve_locally=True,
    )
    app.server.config[CONFIG_KEY] = FrontendContext(api_provider(api_url))
    app.server.config["HEADGRAPH_DASH_APP"] = app
    install_request_guards(app.server)
    app.layout = lambda: build_layout(**page_data())
    register_callbacks(app)
    return app


def mount_frontend(app: Any, settings: Any = None) -> Dash:
    """Mount the dashboard on ``app`` at "/" (called last by the server's app factory)."""
    from a2wsgi import WSGIMiddleware

    dash_app = create_dash()
    app.mount("/", WSGIMiddleware(dash_app.server, workers=16), name="frontend")
    app.state.dash_app = dash_app
    return dash_app
