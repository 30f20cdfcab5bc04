"""The subgraph scenario of the browser tests, on any model: pin heads with Ctrl + click on the
head graph, group all but the last, relabel the last, reopen the copied link in a fresh
context, export the subgraph as JSON and import it into a fresh page (a bad file first), and
save the group as a label set (the overlay). Run on the demo (tests/browser/test_exploration.py)
and on SmolLM2 (tests/browser/test_smollm2.py). Every drawn number is compared with
GET /api/subgraph: a drawn edge is the sum of the pair edges between its two drawn nodes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from browser import controls_settled, query_of, show_point, wait_until

GROUP = "previous-token heads"
LABEL = "the reader"


def graph_points(fig: dict[str, Any], kind: str) -> list[tuple[float, float, list[Any]]]:
    return [(x, y, cd) for tr in fig["data"]
            for x, y, cd in zip(tr.get("x") or [], tr.get("y") or [], tr.get("customdata") or [])
            if isinstance(cd, list) and cd and cd[0] == kind]


def drawn_subgraph(page: Any) -> tuple[str, str]:
    """The subgraph view's drawn nodes (id -> label) and edges, as the view states them."""
    el = page.locator("#sub-drawn")
    el.wait_for(state="attached", timeout=60_000)
    return el.get_attribute("data-nodes") or "", el.get_attribute("data-edges") or ""


def pin_by_ctrl_click(page: Any, nodes: dict[str, tuple[float, float]], pins: list[str]) -> None:
    """Ctrl + click each head's node in turn (a pin, no head panel); the URL's pins follow."""
    for i, head in enumerate(pins):
        want = ",".join(pins[: i + 1])
        for _ in range(4):  # a click while the graph redraws (it labels the pins) misses
            if query_of(page.url).get("pins") == want:  # a click that landed late
                break
            x, y = nodes[head]
            px, py = show_point(page, "graph", x, y)
            page.mouse.move(px + 6, py + 6)
            page.mouse.move(px, py)
            try:  # the graph redraws once a pin is in the URL (pins are labelled): hover again
                page.locator("#graph .hoverlayer .hovertext").first.wait_for(timeout=3000)
            except PlaywrightTimeout:
                page.wait_for_timeout(500)
                continue
            if query_of(page.url).get("pins") == want:  # the page's pins decide what a click
                break  # means (pin or unpin): a click after the late one landed would unpin
            page.keyboard.down("Control")
            page.mouse.click(px, py)
            page.keyboard.up("Control")
            try:  # a loaded machine takes seconds to write the URL: wait before clicking again
                wait_until(lambda: query_of(page.url).get("pins") == want, 20,  # noqa: B023
                           message=f"{head} pinned", page=page)
                break
            except AssertionError:
                if query_of(page.url).get("pins", "").count(",") > i:
                    raise
        assert query_of(page.url).get("pins") == want, (head, page.url)
    assert "head" not in query_of(page.url)


def expected_edges(answer: dict[str, Any], members: list[str]) -> tuple[dict[tuple[str, str, str], tuple[float, int]], int]:
    """(drawn edge -> (summed value, pair edges), edges inside the group) for the pair edges of
    ``answer`` with ``members`` drawn as the group's one node."""
    gid = "group:" + GROUP

    def node(h: str) -> str:
        return gid if h in members else h

    want: dict[tuple[str, str, str], tuple[float, int]] = {}
    internal = 0
    for e in answer["edges"]:
        s, t = node(e["source"]), node(e["target"])
        if s == t:
            internal += 1
            continue
        v, n = want.get((s, t, e["pairing"]), (0.0, 0))
        want[(s, t, e["pairing"])] = (v + e["value"], n + 1)
    return want, internal


def run(server: Any, page: Any, browser: Any, tmp_path: Path, *, model: str, graph_url: str,
        pins: list[str]) -> None:
    """The scenario (module docstring) on ``model``'s graph at ``graph_url``: ``pins`` in click
    order, the last one the labelled reader and the others the group."""
    page.goto(server.url + graph_url)
    from browser import wait_figure

    fig = wait_figure(page, "graph", lambda f: all(any(cd[1] == p for _, _, cd in graph_points(f, "node"))
                                                   for p in pins), timeout=120)
    nodes = {cd[1]: (x, y) for x, y, cd in graph_points(fig, "node")}
    pin_by_ctrl_click(page, nodes, pins)
    controls_settled(page)  # the tabs link to the current URL
    page.locator("#tab-subgraph").click()
    wait_until(lambda: len(json.loads(drawn_subgraph(page)[0] or "{}")) == len(pins), 60,
               message=f"{len(pins)} pinned nodes drawn", page=page)
    members, reader = pins[:-1], pins[-1]
    for head in members:
        page.locator("#sub-select label", has_text=head).click()
    page.locator("#sub-group-name").fill(GROUP)
    page.locator("#sub-group-btn").click()
    wait_until(lambda: "groups" in query_of(page.url), 15, message="group in URL", page=page)
    page.locator("#sub-label-target label", has_text=reader).click()
    page.locator("#sub-label-text").fill(LABEL)
    page.locator("#sub-label-btn").click()
    wait_until(lambda: "labels" in query_of(page.url), 15, message="label in URL", page=page)
    wait_until(lambda: LABEL in drawn_subgraph(page)[0], 60, message="label drawn", page=page)
    drawn = drawn_subgraph(page)
    assert json.loads(drawn[0]) == {"group:" + GROUP: GROUP, reader: LABEL}
    r = httpx.get(server.url + "/api/subgraph", params={"model": model, "heads": ",".join(pins), "cap": 500},
                  timeout=300)
    assert r.status_code == 200, r.text
    answer = r.json()
    want, internal = expected_edges(answer, members)
    got = {(s, t, p): (v, n) for s, t, p, v, n in json.loads(drawn[1])}
    assert want and got.keys() == want.keys()
    assert all(got[k][1] == want[k][1] and got[k][0] == pytest.approx(want[k][0]) for k in want)
    assert sum(n for _, n in got.values()) + internal == answer["total"]  # every pair edge drawn once
    # the copied link in a fresh browser context draws the same subgraph
    link = page.locator("#share-url").input_value()
    other = browser.new_context(viewport=page.viewport_size)
    fresh = other.new_page()
    fresh.goto(link)
    wait_until(lambda: drawn_subgraph(fresh) == drawn, 60, message="same subgraph from the link", page=fresh)
    # export JSON, import it into a fresh page (a bad file first: a message, no change)
    with page.expect_download() as dl:
        page.locator("#sub-export-json-btn").click()
    path = tmp_path / "subgraph.json"
    dl.value.save_as(path)
    record = json.loads(path.read_text())
    assert record["model"] == model and record["pins"] == pins and record["labels"] == {reader: LABEL}
    assert [e["value"] for e in record["edges"]] == pytest.approx([e["value"] for e in answer["edges"]])
    fresh.goto(server.url + f"/?model={model}&view=subgraph")
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "headgraph-subgraph", "pins": ["nope"]}')
    fresh.locator("#sub-import input[type=file]").set_input_files(str(bad))
    fresh.locator("#sub-msg", has_text="import rejected").wait_for(timeout=15_000)
    assert "pins" not in query_of(fresh.url)
    fresh.locator("#sub-import input[type=file]").set_input_files(str(path))
    wait_until(lambda: drawn_subgraph(fresh) == drawn, 60, message="imported subgraph drawn", page=fresh)
    other.close()
    # the group saved as a label set: the overlay, listed in its dropdown
    page.locator("#sub-save-btn").click()
    saved = f"groups-{model}"
    wait_until(lambda: query_of(page.url).get("overlay") == saved, 30, message="saved overlay", page=page)
    page.locator("#overlay-select", has_text=saved).wait_for(timeout=15_000)
    classes = httpx.get(server.url + f"/api/labels/{saved}", timeout=60).json()["classes"]
    heads = {h for n in answer["nodes"] if n["name"] in members for h in (n.get("heads") or [n["name"]])}
    assert classes == {h: GROUP for h in heads}
