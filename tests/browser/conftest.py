"""Fixtures of the browser tier: Debian's chromium through Playwright (never ``playwright
install``), a fresh page per test, and the module's server (conftest.py's ``launch_server``).

A module shapes its server by overriding two module-scoped fixtures: ``server_env`` (extra
environment: a token, the offered models, a model root) and ``warm_models`` (models computed
through the API before its first test; none: a cold cache). Every test here is marked
``browser`` (``make test-fast`` leaves them out).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from browser import VIEWPORT, launch_browser
from headgraph.server.http.launch import ServerProcess
from session_support import copy_cache

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test of this folder ``browser`` (the hook sees the whole session's items)."""
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.browser)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Debian's chromium (/usr/bin/chromium, --headless --no-sandbox --disable-gpu and no network
    extras: tests/browser.py's flags), one per test module."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = launch_browser(p)
        yield b
        b.close()


@pytest.fixture()
def page(browser: Any) -> Iterator[Any]:
    """A page in a fresh context (no cookies, no storage), 1500 x 1000, closed after the test."""
    ctx = browser.new_context(viewport=VIEWPORT)
    pg = ctx.new_page()
    yield pg
    ctx.close()


@pytest.fixture(scope="module")
def server_env() -> dict[str, str]:
    """Extra environment of the module's server (none: the default models, an open server)."""
    return {}


@pytest.fixture(scope="module")
def warm_models() -> tuple[str, ...]:
    """Models computed through the API before the module's first test (none: a cold cache)."""
    return ()


@pytest.fixture(scope="module")
def server(request: pytest.FixtureRequest, launch_server: Any, tmp_path_factory: pytest.TempPathFactory,
           server_env: dict[str, str], warm_models: tuple[str, ...]) -> Iterator[ServerProcess]:
    """A real ``headgraph serve`` for the module, on a fresh cache; stopped after its last test."""
    name = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")
    cache = tmp_path_factory.mktemp(name) / "cache"
    if "demo" in warm_models:  # the session's demo cache: warming it then finds every result cached
        copy_cache(request.getfixturevalue("demo_cache"), cache)
    with launch_server(cache, env=server_env, warm=warm_models) as srv:
        yield srv
