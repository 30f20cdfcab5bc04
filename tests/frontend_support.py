"""Fixtures the frontend unit tests share: the real API app in process, and a client on it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from headgraph.frontend.api_client import ApiClient
from headgraph.server.app import create_app
from headgraph.server.settings import Settings


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    app = create_app(Settings(cache_dir=tmp_path_factory.mktemp("frontend-units")))
    with TestClient(app) as client:
        yield client


@pytest.fixture(scope="module")
def api(http: TestClient) -> ApiClient:
    return ApiClient("http://testserver", http=http)
