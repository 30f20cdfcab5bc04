"""Helpers the frontend tests share (their fixtures, the API in process and a dashboard app
context on it, are tests/frontend/conftest.py's): a ready record of the demo, a component finder,
a lab-mode dashboard, and the crop of a flattened grid to its valid cells."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from dash.development.base_component import Component
from fastapi.testclient import TestClient

from headgraph.frontend.api.client import ApiClient
from headgraph.frontend.app import create_dash
from headgraph.frontend.api.context import CONFIG_KEY, FrontendContext
from headgraph.frontend.figures.heatmaps import flatten_grid
from headgraph.server.http.app import create_app
from headgraph.server.settings import Settings

READY = {"model": "demo", "token": "t1"}  # a ready record of the demo (its token is arbitrary)


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


def crop(grid: list, valid: list) -> list[list[Any]]:
    """The flattened grid's valid cells, in the rows and columns holding any (None elsewhere)."""
    ok = np.array(flatten_grid(valid), dtype=bool)
    g = flatten_grid(grid)
    return [[g[i][j] if ok[i, j] else None for j in np.flatnonzero(ok.any(0))] for i in np.flatnonzero(ok.any(1))]
