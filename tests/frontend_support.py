"""Fixtures the frontend unit tests share: the real API app in process, a client on it, the demo
computed through it, a dashboard app context on it, and a component finder."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from dash.development.base_component import Component
from fastapi.testclient import TestClient

from headgraph.frontend.api.client import ApiClient
from headgraph.frontend.app import create_dash
from headgraph.frontend.api.context import CONFIG_KEY, FrontendContext
from headgraph.server.http.app import create_app
from headgraph.server.settings import Settings


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    app = create_app(Settings(cache_dir=tmp_path_factory.mktemp("frontend-units")))
    with TestClient(app) as client:
        yield client


@pytest.fixture(scope="module")
def api(http: TestClient) -> ApiClient:
    return ApiClient("http://testserver", http=http)


READY = {"model": "demo", "token": "t1"}  # a ready record of the demo (its token is arbitrary)


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


def find(component: Any, cid: str) -> Any:
    """The component with id ``cid`` in a Dash component tree (or list of trees), else None."""
    if isinstance(component, (list, tuple)):
        return next((f for c in component if (f := find(c, cid)) is not None), None)
    if getattr(component, "id", None) == cid:
        return component
    children = getattr(component, "children", None)
    return find(children, cid) if isinstance(children, (list, tuple, Component)) else None


@contextmanager
def lab_dashboard(cache_dir: Path, token: str) -> Iterator[TestClient]:
    """A lab-mode API (``token`` required for cold work) in process, and an app context of a
    dashboard whose callbacks reach it as a reader without that token; yields the API client."""
    settings = Settings(cache_dir=cache_dir, api_token=token, compute_processes=0)
    with TestClient(create_app(settings)) as http:
        client = ApiClient("http://testserver", http=http)
        dash_app = create_dash(api_url="http://testserver")
        dash_app.server.config[CONFIG_KEY] = FrontendContext(lambda: client)
        with dash_app.server.app_context():
            yield http
