"""Shared helpers for the browser tests (tests/browser/) and the screenshot script.

The tests get their server and chromium from fixtures (conftest.py's ``launch_server``,
tests/browser/conftest.py's ``server``, ``browser`` and ``page``); ``start_server`` and
``launch_browser`` here are the same launches for scripts (scripts/screenshots.py). Chromium is
Debian's (never ``playwright install``). The rest reads what Plotly actually rendered (figure
data, point positions) so tests can click nodes, edges and points.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from headgraph.server.http.launch import ServerProcess
from server_support import CHROMIUM, OFFLINE_ENV

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1500, "height": 1000}  # the tests' pages (tests/browser/conftest.py's ``page``)
Server = ServerProcess


def start_server(cache_dir: Path, *, extra_env: dict[str, str] | None = None, workers: int = 1) -> ServerProcess:
    """A started ``ServerProcess`` on ``cache_dir`` (offline; chromium for image exports)."""
    return ServerProcess(cache_dir, workers=workers, env={**OFFLINE_ENV, **(extra_env or {})}).start()


def launch_browser(playwright: Any) -> Any:
    """Debian's chromium, headless, no network extras."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


def figure(page: Any, graph_id: str) -> dict[str, Any]:
    """The figure Plotly rendered in dcc.Graph ``graph_id``: {"data": [...], "layout": {...}}."""
    return page.evaluate(
        """(id) => {
            const el = document.getElementById(id);
            const gd = el && el.querySelector('.js-plotly-plot');
            if (!gd || !gd.data) return null;
            // Binary arrays (plotly's typed-array specs, decoded into _inputArray) as lists.
            const plain = (k, v) => {
                if (ArrayBuffer.isView(v)) return Array.from(v);
                if (v && typeof v === "object" && v.bdata !== undefined && v._inputArray) {
                    const a = v._inputArray;
                    return ArrayBuffer.isView(a) ? Array.from(a) : a;
                }
                return v; };
            return {data: JSON.parse(JSON.stringify(gd.data, plain)),
                    layout: {title: gd.layout.title, height: gd.layout.height}};
        }""", graph_id)


def wait_figure(page: Any, graph_id: str, predicate: Any, timeout: float = 60.0) -> dict[str, Any]:
    """Poll the rendered figure until ``predicate(figure)`` holds; return it."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = figure(page, graph_id)
        if last is not None:
            try:
                if predicate(last):
                    return last
            except (KeyError, IndexError, TypeError):
                pass
        page.wait_for_timeout(200)
    title = (last or {}).get("layout", {}).get("title")
    raise AssertionError(f"figure {graph_id!r} never satisfied the condition; last title: {title}")


def point_xy(page: Any, graph_id: str, x: float, y: float) -> tuple[float, float]:
    """Page coordinates of data point (x, y) in a cartesian dcc.Graph (for mouse clicks)."""
    return tuple(page.evaluate(
        """([id, x, y]) => {
            const gd = document.getElementById(id).querySelector('.js-plotly-plot');
            const fl = gd._fullLayout, xa = fl.xaxis, ya = fl.yaxis;
            const box = gd.getBoundingClientRect();
            return [box.left + xa._offset + xa.l2p(x), box.top + ya._offset + ya.l2p(y)];
        }""", [graph_id, x, y]))


def show_point(page: Any, graph_id: str, x: float, y: float) -> tuple[float, float]:
    """Scroll the page until data point (x, y) of a graph is inside the viewport (a tall
    figure does not fit in it); the point's page coordinates then."""
    page.locator(f"#{graph_id}").scroll_into_view_if_needed()
    px, py = point_xy(page, graph_id, x, y)
    height = page.evaluate("() => window.innerHeight")
    if not 40 <= py <= height - 40:
        page.evaluate("(dy) => window.scrollBy(0, dy)", py - height / 2)
        page.wait_for_timeout(100)
        px, py = point_xy(page, graph_id, x, y)
    return px, py


def click_point(page: Any, graph_id: str, x: float, y: float, *, expect: Any = None,
                attempts: int = 3, timeout_ms: int = 10_000) -> None:
    """Hover then click a data point, as a user would (Plotly clicks act on the hovered point).

    The graph is scrolled into view and the point's pixel position read just before the
    click, since opening a side panel resizes and redraws the plot. With ``expect`` (a
    locator), a click that did not land (plot still redrawing) is repeated, as a user would,
    until ``expect`` is visible; the last failure is raised.
    """
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for attempt in range(attempts):
        page.wait_for_timeout(150)
        px, py = show_point(page, graph_id, x, y)
        page.mouse.move(px, py)
        page.wait_for_timeout(150)
        page.mouse.click(px, py)
        if expect is None:
            return
        try:
            expect.wait_for(timeout=timeout_ms)
            return
        except PlaywrightTimeout:
            if attempt == attempts - 1:
                raise


def controls_settled(page: Any, timeout_ms: int = 60_000) -> None:
    """Wait until the controls show the page's current URL (they are rebuilt from it on every
    change, so typing into a control that is about to be replaced would be lost)."""
    page.wait_for_function(
        """() => { const el = document.getElementById('controls-dynamic');
                   return el && el.dataset.rendered === window.location.search; }""", timeout=timeout_ms)


def query_of(url: str) -> dict[str, str]:
    from urllib.parse import parse_qs, urlparse

    return {k: v[-1] for k, v in parse_qs(urlparse(url).query).items()}


def wait_until(fn: Any, timeout: float = 30.0, interval: float = 0.2, message: str = "condition",
               page: Any = None) -> Any:
    """Poll ``fn`` until truthy; on timeout name the condition (and the page URL when given).

    With ``page`` the wait goes through Playwright (page.wait_for_timeout), which also lets the
    sync API process browser events: ``page.url`` is a cached value that only moves then.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        if page is not None:
            page.wait_for_timeout(interval * 1000)
        else:
            time.sleep(interval)
    where = f" (page at {page.url})" if page is not None else ""
    raise AssertionError(f"timed out waiting for {message}{where}")


if __name__ == "__main__":  # pragma: no cover - manual smoke run
    s = start_server(Path(sys.argv[1]))
    print(s.url)
    try:
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        s.stop()
