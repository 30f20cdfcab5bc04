"""Shared links open the right figure, every time (issue 13).

One real server (warm cache: the demo model computed first through the API), one chromium;
each try opens the link in a FRESH browser context (no cookies, no storage, no history), as
someone the link was sent to would. Every try must render the figure the link names, checked
against the API's own answer for the same parameters. A try that never gets there is a
failure; the test reports how many of the tries rendered.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, sync_playwright

from browser import Server, figure, launch_browser, start_server

TRIES = 30
PER_TRY_S = 60.0
pytestmark = pytest.mark.timeout(1800)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("shared-links") / "cache")
    try:
        with httpx.Client(base_url=srv.url, timeout=300) as http:
            job = http.post("/api/models/compute", params={"model": "demo"}).json()["job"]
            while (rec := http.get(f"/api/jobs/{job['id']}").json())["state"] in ("queued", "running"):
                time.sleep(0.2)
            assert rec["state"] == "done", rec
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_playwright() as p:
        b = launch_browser(p)
        yield b
        b.close()


def api(server: Server, path: str, **params: Any) -> Any:
    r = httpx.get(server.url + path, params=params, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def flat(grid: list) -> list[list[Any]]:
    return [[v for tl in sh for v in tl] for sl in grid for sh in sl]


def attr(page: Page, selector: str, name: str) -> str | None:
    loc = page.locator(selector)
    return loc.get_attribute(name) if loc.count() else None


# -- what each link must show, as a check over the page (True once it does) ------------------

def heatmap_case(server: Server) -> tuple[str, Callable[[Page], bool]]:
    grid = api(server, "/api/pk", model="demo", pairing="OV", metric="normalized")
    expected = [[v if ok else None for v, ok in zip(row, oks)]
                for row, oks in zip(flat(grid["grid"]), flat(grid["valid"]))]
    assert sum(v is not None for row in expected for v in row) > 0

    def shown(page: Page) -> bool:
        fig = figure(page, "heatmap")
        if not fig or not fig["data"] or fig["data"][0].get("type") != "heatmap":
            return False
        title = fig["layout"]["title"]["text"]
        return (title.startswith("OV:") and "normalized PK" in title and fig["data"][0]["z"] == expected
                and fig["data"][0]["y"] == grid["source_labels"] and fig["data"][0]["x"] == grid["target_labels"])

    return "/?model=demo&view=heatmap&pairing=OV&metric=normalized", shown


def pair_case(server: Server) -> tuple[str, Callable[[Page], bool]]:
    pair = api(server, "/api/pair", model="demo", pairing="OK", source="L0H0", target="L1H3")

    def shown(page: Page) -> bool:
        pk = attr(page, "#pair-panel-title", "data-pk")
        return (pk is not None and float(pk) == pair["pk"]
                and attr(page, "#pair-panel-title", "data-pair") == "L0H0,L1H3"
                and attr(page, "#pair-panel-title", "data-pairing") == "OK"
                and page.locator("#pair-panel").is_visible())

    return "/?model=demo&view=heatmap&pair=L0H0,L1H3&pairing=OK", shown


def scatter_case(server: Server) -> tuple[str, Callable[[Page], bool]]:
    data = api(server, "/api/scatter", model="demo", pairing="OV", top_percent=10)
    n = len(data["points"]["pk"])
    assert n > 0

    def shown(page: Page) -> bool:
        fig = figure(page, "scatter")
        if not fig:
            return False
        points = sum(len(t.get("x") or []) for t in fig["data"] if t.get("customdata"))
        return points == n and attr(page, "#stat-points", "data-value") == str(n)

    return "/?model=demo&view=scatter&pairing=OV&top_percent=10", shown


def graph_head_case(server: Server) -> tuple[str, Callable[[Page], bool]]:
    graph = api(server, "/api/graph", model="demo", pairings="OQ,OK,OV", k=20)
    n_edges = sum(graph["edge_counts"].values())
    head = api(server, "/api/head", model="demo", head="L0H0")
    partner = head["partners"]["OK"]["out"][0]

    def shown(page: Page) -> bool:
        fig = figure(page, "graph")
        if not fig:
            return False
        edges = sum(1 for t in fig["data"] for cd in t.get("customdata") or []
                    if isinstance(cd, list) and cd and cd[0] == "edge")
        if edges != n_edges or attr(page, "#graph-summary", "data-edges") != str(n_edges):
            return False
        if attr(page, "#head-panel-title", "data-head") != "L0H0":
            return False
        partners = page.locator("#head-partners")
        return partners.count() == 1 and f"{partner['head']} {partner['pk']:.3g}" in partners.inner_text()

    return "/?model=demo&view=graph&head=L0H0", shown


CASES = {"heatmap": heatmap_case, "pair": pair_case, "scatter": scatter_case, "graph-head": graph_head_case}


def open_fresh(browser: Any, url: str, shown: Callable[[Page], bool]) -> str | None:
    """Open ``url`` in a new context; None once ``shown`` holds, else what went wrong."""
    ctx = browser.new_context(viewport={"width": 1500, "height": 1000})
    errors: list[str] = []
    try:
        page = ctx.new_page()
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(url)
        deadline = time.monotonic() + PER_TRY_S
        while time.monotonic() < deadline:
            if shown(page):
                return None
            page.wait_for_timeout(150)
        return f"not rendered; page at {page.url}; page errors: {errors[:3]}"
    finally:
        ctx.close()


@pytest.mark.parametrize("kind", list(CASES))
def test_fresh_link_renders_the_right_figure_every_time(server: Server, browser: Any, kind: str) -> None:
    path, shown = CASES[kind](server)
    failures = []
    for i in range(TRIES):
        problem = open_fresh(browser, server.url + path, shown)
        if problem:
            failures.append(f"try {i + 1}: {problem}")
    print(f"{kind}: {TRIES - len(failures)}/{TRIES} fresh contexts rendered {path}")
    assert not failures, f"{len(failures)}/{TRIES} tries failed:\n" + "\n".join(failures[:5])
    assert not server.server_errors(), server.server_errors()[:3]
