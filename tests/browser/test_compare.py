"""Browser: the compare and timeline views (issue 16) on a real server, and a copied link of
each opened in a fresh context. Every figure is checked against the API's JSON for the same
parameters (the views' figures without a browser: tests/frontend/test_compare_units.py).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from playwright.sync_api import Error as PlaywrightError

from headgraph.core.models.series import demo_series

from browser import VIEWPORT, Server, controls_settled, figure, query_of, wait_figure, wait_until
from frontend_support import crop

SERIES = demo_series()
FIRST, LAST = SERIES[0], SERIES[-1]


def _z(fig: dict[str, Any], i: int) -> list[list[Any]]:
    return fig["data"][i]["z"]


@pytest.mark.timeout(240)
def test_browser_compare_and_timeline_views_and_copied_links(server: Server, browser: Any) -> None:
    ctx = browser.new_context(viewport=VIEWPORT)
    page = ctx.new_page()
    try:
        page.goto(server.url + f"/?view=compare&a={FIRST.model_id}&b=demo&pairing=OK&k=10")
        heat = wait_figure(page, "compare-heatmaps", lambda f: f and len(f["data"]) == 3, timeout=90)
        data = httpx.get(server.url + "/api/compare", params={"a": FIRST.model_id, "b": "demo", "pairing": "OK",
                                                               "k": 10}, timeout=60).json()
        assert _z(heat, 2) == crop(data["diff"], data["valid"])
        graph = wait_figure(page, "compare-graph", lambda f: f and any(
            str(t.get("name", "")).startswith("gained") for t in f["data"]))
        assert any(t.get("name") == f"gained (B's top-k only): {len(data['gained'])}" for t in graph["data"])
        assert page.locator("#compare-edges tbody tr").count() == len(data["gained"]) + len(data["lost"]) \
            + len(data["changed"])
        share = page.locator("#share-url")
        wait_until(lambda: query_of(share.input_value()).get("b") == "demo", 15, message="share link", page=page)
        page.locator("#copy-link").click()
        link = share.input_value()
        assert query_of(link)["view"] == "compare" and query_of(link)["a"] == FIRST.model_id

        page.click("#tab-timeline")
        tl = wait_figure(page, "timeline", lambda f: f and f["data"] and len(f["data"][0]["x"]) == len(SERIES),
                         timeout=90)
        api_tl = httpx.get(server.url + "/api/timeline", params={"series": "demo-series", "pairing": "OK",
                                                                 "k": 10}, timeout=60).json()
        assert [t["y"] for t in tl["data"]] == [e["pk"] for e in api_tl["edges"]]
        grid = wait_figure(page, "timeline-grid", lambda f: f and f"step {LAST.step}" in f["layout"]["title"]["text"])
        # the slider moves the shown checkpoint: a click at the start of its track (again if a
        # re-render of the page swallowed it, or replaced the slider, which the timeline
        # returns anew with each render, under the pointer)
        for attempt in range(3):
            controls_settled(page)
            try:
                page.locator("#step-slider").scroll_into_view_if_needed(timeout=10_000)
                track = page.locator("#step-slider .dash-slider-track").bounding_box(timeout=10_000)
                assert track is not None
                page.mouse.click(track["x"] + 2, track["y"] + track["height"] / 2)
                wait_until(lambda: query_of(page.url).get("checkpoint") == "0", 10, message="slider", page=page)
                break
            except (AssertionError, PlaywrightError):
                if attempt == 2:
                    raise
        grid2 = wait_figure(page, "timeline-grid",
                            lambda f: f and f"step {FIRST.step} " in f["layout"]["title"]["text"])
        assert _z(grid2, 0) != _z(grid, 0)
        wait_until(lambda: query_of(share.input_value()).get("checkpoint") == "0", 15,
                   message="share link checkpoint", page=page)
        tl_link = share.input_value()
    finally:
        ctx.close()
    # fresh contexts open the copied links
    for url, fig_id, check in ((link, "compare-heatmaps", lambda f: f and len(f["data"]) == 3
                                and f["data"][2]["z"] == _z(heat, 2)),
                               (tl_link, "timeline-grid", lambda f: f and f"step {FIRST.step} "
                                in f["layout"]["title"]["text"] and f["data"][0]["z"] == _z(grid2, 0))):
        other = browser.new_context(viewport=VIEWPORT)
        try:
            pg = other.new_page()
            pg.goto(url)
            wait_figure(pg, fig_id, check, timeout=60)
            assert figure(pg, fig_id)
        finally:
            other.close()
