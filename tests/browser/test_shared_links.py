"""Shared links open the right figure, every time (issue 13).

One real server (warm cache: the demo model computed first through the API), one chromium;
each try opens the link in a FRESH browser context (no cookies, no storage, no
history; three at a time, side by side), as
someone the link was sent to would. Every try must render the figure the link names, checked
against the API's own answer for the same parameters. A try that never gets there is a
failure; the test reports how many of the tries rendered.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page

from browser import VIEWPORT, Server, figure

TRIES = int(os.environ.get("SHARED_LINK_TRIES", "3"))  # one side-by-side batch; SHARED_LINK_TRIES=30 hunts longer
BATCH = 3  # fresh contexts opened side by side (each checked on its own)
PER_TRY_S = 90.0
pytestmark = pytest.mark.timeout(1800)


@pytest.fixture(scope="module")
def warm_models() -> tuple[str, ...]:
    return ("demo",)  # computed through the API first


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
    at_floor = pair["p_haar"] <= pair["p_floor"] * (1 + 1e-9)  # no null sample as large

    def shown(page: Page) -> bool:
        pk = attr(page, "#pair-panel-title", "data-pk")
        return (pk is not None and float(pk) == pair["pk"]
                and attr(page, "#pair-panel-title", "data-pair") == "L0H0,L1H3"
                and attr(page, "#pair-panel-title", "data-pairing") == "OK"
                and page.locator("#pair-panel").is_visible()
                and page.locator("#pair-p-haar").inner_text().startswith("≤ ") == at_floor)

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


CASES: dict[str, Callable[[Server], tuple[str, Callable[[Page], bool]]]] = {"heatmap": heatmap_case, "pair": pair_case, "scatter": scatter_case, "graph-head": graph_head_case}


def callback_line(request: Any) -> str:
    """One Dash callback round trip, for the report of a try that failed: outputs and status."""
    if "_dash-update-component" not in request.url:
        return ""
    try:
        body = request.post_data_json or {}
        resp = request.response()
        return f"{body.get('output', '')[:60]} -> {resp.status if resp else 'no response'}"
    except Exception as err:  # a report helper must not fail the try itself
        return f"? {err}"


def page_state(page: Page) -> dict[str, Any]:
    """What the page shows that tells why a view did not fill in."""
    return page.evaluate("""() => {
        const t = (id) => { const el = document.getElementById(id); return el ? el.innerText.slice(0, 120) : null; };
        const ann = (id) => { const gd = document.querySelector('#' + id + ' .js-plotly-plot');
                              return gd && gd.layout && gd.layout.annotations ?
                                     gd.layout.annotations.map(a => a.text).join('|') : null; };
        return {progress: (document.getElementById('progress') || {}).dataset?.state, info: t('model-info'),
                message: t('model-message'), scatter: ann('scatter'), heatmap: ann('heatmap'), graph: ann('graph'),
                scatterSummary: t('scatter-summary'), controls: document.getElementById('controls-dynamic')?.dataset.rendered};
    }""")


def open_fresh(browser: Any, url: str, shown: Callable[[Page], bool], n: int) -> list[str | None]:
    """Open ``url`` in ``n`` new contexts at once (they load side by side); per context None
    once ``shown`` holds for its page, else what went wrong."""
    contexts = [browser.new_context(viewport=VIEWPORT) for _ in range(n)]
    errors: list[list[str]] = [[] for _ in range(n)]
    calls: list[list[str]] = [[] for _ in range(n)]
    try:
        pages = [c.new_page() for c in contexts]
        for page, errs, log in zip(pages, errors, calls):
            page.on("pageerror", lambda e, errs=errs: errs.append(str(e)))
            page.on("requestfinished", lambda r, log=log: log.append(callback_line(r)))
            page.on("requestfailed", lambda r, log=log: log.append(f"FAILED {r.url} {r.failure}"))
            page.goto(url, wait_until="commit")
        pending = set(range(n))
        deadline = time.monotonic() + PER_TRY_S
        while pending and time.monotonic() < deadline:
            for i in sorted(pending):
                if shown(pages[i]):
                    pending.discard(i)
            if pending:
                pages[0].wait_for_timeout(150)
        return [f"not rendered; page at {pages[i].url}; page errors: {errors[i][:3]}; page: {page_state(pages[i])}; "
                f"callbacks: {[c for c in calls[i] if c]}" if i in pending else None for i in range(n)]
    finally:
        for c in contexts:
            c.close()


@pytest.mark.parametrize("kind", [k for k in CASES if k in os.environ.get("SHARED_LINK_KINDS", ",".join(CASES))])
def test_fresh_link_renders_the_right_figure_every_time(server: Server, browser: Any, kind: str) -> None:
    path, shown = CASES[kind](server)
    results: list[str | None] = []
    while len(results) < TRIES:
        results += open_fresh(browser, server.url + path, shown, min(BATCH, TRIES - len(results)))
    failures = [f"try {i + 1}: {r}" for i, r in enumerate(results) if r]
    print(f"{kind}: {TRIES - len(failures)}/{TRIES} fresh contexts rendered {path}")
    assert not failures, f"{len(failures)}/{TRIES} tries failed:\n" + "\n".join(failures[:5])
    assert not server.server_errors(), server.server_errors()[:3]
