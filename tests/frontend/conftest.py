"""Fixtures of the frontend tier (no browser, no server process): the real API app in process
(FastAPI's TestClient, its own cache per module), the dashboard's API client on it, the demo
computed through it, and an app context of a real dashboard whose callbacks reach it. Helpers
(READY, find, lab_dashboard, crop) are in tests/frontend_support.py."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from headgraph.frontend.api.client import ApiClient
from headgraph.frontend.api.context import CONFIG_KEY, FrontendContext
from headgraph.frontend.app import create_dash
from headgraph.server.http.app import create_app
from headgraph.server.settings import Settings
from session_support import copy_cache


@pytest.fixture(scope="module")
def http(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """The API app on the module's own cache: a copy of the session's demo cache when a test of
    the module uses ``computed`` (so its job finds every result cached), else empty."""
    cache = tmp_path_factory.mktemp("frontend-units") / "cache"
    if any("computed" in item.fixturenames for item in request.session.items
           if item.module is request.module):
        copy_cache(request.getfixturevalue("demo_cache"), cache)
    app = create_app(Settings(cache_dir=cache))
    with TestClient(app) as client:
        yield client


@pytest.fixture(scope="module")
def api(http: TestClient) -> ApiClient:
    return ApiClient("http://testserver", http=http)


@pytest.fixture(scope="module")
def computed(api: ApiClient) -> list[str]:
    """Compute the demo model through the API; its cache entries."""
    job = api.compute("demo")["job"]
    while api.job(job["id"])["state"] in ("queued", "running"):
        time.sleep(0.2)
    assert api.job(job["id"])["state"] == "done"
    return next(m for m in api.models() if m["id"] == "demo")["cached"]


@pytest.fixture()
def in_app(api: ApiClient) -> Iterator[None]:
    """An app context of a real dashboard app whose callbacks reach the in-process API."""
    dash_app = create_dash(api_url="http://testserver")
    dash_app.server.config[CONFIG_KEY] = FrontendContext(lambda: api)
    with dash_app.server.app_context():
        yield
