"""The Task view in a real browser on the demo: a link to the induction task (EAP) computes its
circuit on request under the view's loading state, then shows the task metric, the table of
the top edges and the faithfulness curve carrying GET /api/circuit's numbers; the copied link
reopens the same circuit in a fresh browser context. A JSONL upload with a bad row is refused
naming the row; a good one is selected (in the link) and its circuit shown."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page

from browser import VIEWPORT, Server, query_of, wait_figure, wait_until

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]
KEYS = ("rank", "writer", "reader", "path", "score", "in_circuit")
LINK = "/?model=demo&view=task&task=induction&method=eap&k=15"


def circuit(server: Server) -> dict[str, Any]:
    r = httpx.get(server.url + "/api/circuit", params={"model": "demo", "task": "induction", "method": "eap",
                                                       "steps": 1, "top": 15}, timeout=600)
    assert r.status_code == 200, r.text
    return r.json()


def table_values(page: Page, edges: list[dict[str, Any]]) -> dict[tuple[int, str], str | None]:
    """(rank, key) -> the table cell's data-value."""
    return {(e["rank"], key): page.locator(f"#task-{e['rank']}-{key}").get_attribute("data-value")
            for e in edges for key in KEYS}


def expected(edges: list[dict[str, Any]]) -> dict[tuple[int, str], str | None]:
    return {(e["rank"], key): repr(e[key]) for e in edges for key in KEYS}


def check_page(page: Page, data: dict[str, Any]) -> None:
    """The metric chips, the table and the curve show ``data``."""
    m = data["metrics"]
    assert page.locator("#stat-task-clean").get_attribute("data-value") == str(m["clean"])
    assert page.locator("#stat-task-clean-acc").get_attribute("data-value") == str(m["clean_accuracy"])
    assert page.locator("#stat-task-able").get_attribute("data-value") == "yes"
    words = page.locator("#task-words-0")  # filled by its own callback, after the chips
    wait_until(lambda: words.inner_text().startswith("demo does 'induction'"), 60,
               message="the task's sentence", page=page)
    assert table_values(page, data["edges"]) == expected(data["edges"])
    assert page.locator("#task-table tbody tr").count() == len(data["edges"]) == 15
    f = data["faithfulness"]
    fig = wait_figure(page, "task-curve", lambda g: len(g["data"]) == 2)
    assert fig["data"][0]["x"] == f["sizes"] and fig["data"][0]["y"] == f["recovered"]
    assert fig["data"][1]["x"] == [f["circuit_size"]]
    size = page.locator("#stat-task-circuit-size").get_attribute("data-value")
    assert size == str(data["circuit_size"]) == str(f["circuit_size"])
    assert page.locator("#stat-task-spearman").get_attribute("data-value") == str(data["patching"]["spearman"])


def test_the_task_view_computes_the_circuit_and_its_link_reopens_it(server: Server, page: Page,
                                                                     browser: Any) -> None:
    page.goto(server.url + LINK)
    # A cold circuit: the view says it is computed on request while it waits.
    assert "computed on request" in page.locator("#view-task").inner_text()
    # Meanwhile the progress bar names the stage and the share of the run done (GET /api/circuit/progress).
    bar, seen = page.locator("#task-progress"), []
    while not page.locator("#task-table").count():
        if bar.get_attribute("data-state") == "running":
            seen.append((float(bar.get_attribute("data-fraction") or 0), page.locator("#task-progress-label").inner_text()))
        page.wait_for_timeout(300)
    assert seen and [f for f, _ in seen] == sorted(f for f, _ in seen) and seen[-1][0] <= 1
    assert {label.split(" · ")[0] for _, label in seen} <= {"start", "load", "attribution", "faithfulness",
                                                            "patching", "store"}
    # ... and, in full, the time left (an estimate once 5% of the run is done).
    assert all(label.endswith((" left", "estimating time left…", "(past the estimate)"))
               for _, label in seen), seen
    wait_until(lambda: not bar.is_visible(), 30, message="the progress bar hidden when done", page=page)
    data = circuit(server)  # cached now: what the page read
    assert data["method"] == "eap" and data["task"]["name"] == "induction"
    check_page(page, data)
    # The circuit drawn on the head graph's layered layout: its head -> Q / K / V edges.
    want = {(e["writer"], e["reader"].rsplit(".", 1)[0], "O" + e["path"]) for e in data["circuit"]
            if e["writer_kind"] == "head" and e["path"] in ("Q", "K", "V")}
    graph = wait_figure(page, "task-graph", lambda g: any(
        isinstance(cd, list) and cd[:1] == ["edge"] for tr in g["data"] for cd in tr.get("customdata") or []))
    assert {tuple(cd[1:4]) for tr in graph["data"] for cd in tr.get("customdata") or []
            if isinstance(cd, list) and cd[:1] == ["edge"]} == want
    wait_until(lambda: page.locator("#tab-task").get_attribute("class") == "tab tab-selected", 30,
               message="task tab selected", page=page)
    assert page.locator("#ctl-task").is_visible()
    wait_until(lambda: "induction" in page.locator("#task-select").inner_text(), 30,
               message="the task dropdown shows induction", page=page)
    # The copied link, opened in a fresh context (no storage), shows the same circuit.
    link = page.locator("#share-url").input_value()
    q = query_of(link)
    assert (q["view"], q["task"], q["method"], q["k"]) == ("task", "induction", "eap", "15")
    ctx = browser.new_context(viewport=VIEWPORT)
    try:
        other = ctx.new_page()
        other.goto(link)
        other.locator("#task-table").wait_for(timeout=120_000)
        check_page(other, data)
    finally:
        ctx.close()


ROWS = [{"clean": "t01 t02 t03 t01", "corrupt": "t05 t06 t07 t01", "answer": "t02", "distractor": "t09"},
        {"clean": "t04 t08 t03 t04", "corrupt": "t05 t06 t07 t04", "answer": "t08", "distractor": "t09"}]


def test_an_uploaded_task_is_selected_and_its_circuit_shown(server: Server, page: Page, tmp_path: Any) -> None:
    page.goto(server.url + LINK)
    page.locator("#task-upload").wait_for(timeout=60_000)
    bad = tmp_path / "broken.jsonl"
    bad.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps({**ROWS[0], "corrupt": "t05 t06 t01"}) + "\n")
    page.locator("#task-upload input[type=file]").set_input_files(str(bad))
    wait_until(lambda: "line 2" in page.locator("#task-upload-msg").inner_text(), 60,
               message="the bad row named", page=page)
    assert query_of(page.url)["task"] == "induction"  # nothing selected
    good = tmp_path / "two rows.jsonl"
    good.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    page.locator("#task-upload input[type=file]").set_input_files(str(good))
    wait_until(lambda: query_of(page.url).get("task") == "two-rows", 60, message="task=two-rows in the URL",
               page=page)
    assert "2 prompt pairs" in page.locator("#task-upload-msg").inner_text()
    wait_until(lambda: page.locator("#stat-task-name").get_attribute("data-value") == "two-rows", 600,
               message="the uploaded task's circuit", page=page)
    r = httpx.get(server.url + "/api/circuit", params={"model": "demo", "task": "two-rows", "method": "eap",
                                                       "steps": 1, "top": 15}, timeout=600)
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["metrics"]["n_pairs"] == 2
    assert table_values(page, data["edges"]) == expected(data["edges"])
