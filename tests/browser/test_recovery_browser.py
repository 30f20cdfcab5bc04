"""The Recovery view and the revised validation view in a real browser on the demo: the recovery
table and its ROC-AUC figure carry GET /api/recovery's numbers, its top-k box writes the URL,
the copied link reopens the same table in a fresh browser context; the validation view, run from
its button, states the sample drawn of the one asked for with its power and shows each paired
verdict as GET /api/validation decided it."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from playwright.sync_api import Page

from headgraph.frontend.callbacks.validation import paired_row_id
from browser import VIEWPORT, Server, controls_settled, query_of, wait_figure, wait_until

pytestmark = pytest.mark.timeout(300)
STATS = ("endpoint_share", "precision", "auc", "precision_diff", "auc_diff")


@pytest.fixture(scope="module")
def warm_models() -> tuple[str, ...]:
    return ("demo",)  # computed through the API first


def api(server: Server, path: str, **params: Any) -> dict[str, Any]:
    r = httpx.get(server.url + path, params={"model": "demo", **params}, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def table_values(page: Page, rows: list[dict[str, Any]]) -> dict[tuple[str, str], list[str | None]]:
    """(metric, statistic) -> the table cell's [data-value, data-low, data-high]."""
    out = {}
    for r in rows:
        for key in STATS:
            cell = page.locator(f"#recovery-{r['metric']}-{key}")
            out[(r["metric"], key)] = [cell.get_attribute(f"data-{end}") for end in ("value", "low", "high")]
    return out


def expected(rows: list[dict[str, Any]]) -> dict[tuple[str, str], list[str | None]]:
    return {(r["metric"], key): ["" if (r[key] or {}).get(end) is None else repr(r[key][end])
                                 for end in ("value", "low", "high")]
            for r in rows for key in STATS}


def test_the_recovery_view_shows_the_apis_table_and_its_link_reopens_it(server: Server, page: Page,
                                                                         browser: Any) -> None:
    page.goto(server.url + "/?model=demo&view=recovery&pairing=OK&k=10")
    page.locator("#recovery-table").wait_for(timeout=120_000)
    # The link named no label set: the demo's own (its attention-pattern classes).
    assert page.locator("#stat-rec-labels").get_attribute("data-value") == "patterns"
    data = api(server, "/api/recovery", pairing="OK", labels="patterns", k=10)
    assert table_values(page, data["rows"]) == expected(data["rows"])
    assert page.locator("#stat-rec-reference").get_attribute("data-value") == str(data["n_reference"])
    fig = wait_figure(page, "recovery", lambda f: len(f["data"]) == 1)
    assert fig["data"][0]["customdata"] == [[r["metric"], r["auc"]["value"], r["auc"]["low"], r["auc"]["high"]]
                                            for r in data["rows"]]
    wait_until(lambda: page.locator("#tab-recovery").get_attribute("class") == "tab tab-selected", 30,
               message="recovery tab selected", page=page)
    # The top-k box writes k to the URL and the table follows.
    controls_settled(page)
    box = page.locator("#recovery-k-input")
    box.fill("5")
    box.press("Enter")
    wait_until(lambda: query_of(page.url).get("k") == "5", 30, message="k=5 in the URL", page=page)
    five = api(server, "/api/recovery", pairing="OK", labels="patterns", k=5)
    wait_until(lambda: table_values(page, five["rows"]) == expected(five["rows"]), 60,
               message="the k=5 table", page=page)
    # The copied link, opened in a fresh context (no storage), shows the same table.
    link = page.locator("#share-url").input_value()
    assert query_of(link)["k"] == "5" and query_of(link)["view"] == "recovery"
    ctx = browser.new_context(viewport=VIEWPORT)
    try:
        other = ctx.new_page()
        other.goto(link)
        other.locator("#recovery-table").wait_for(timeout=60_000)
        assert table_values(other, five["rows"]) == expected(five["rows"])
        assert other.locator("#stat-rec-k").get_attribute("data-value") == "5"
    finally:
        ctx.close()


def test_a_label_set_naming_no_edge_says_so(server: Server, page: Page) -> None:
    r = httpx.post(server.url + "/api/labels", params={"name": "demo-last-layer"},
                   content="head,class\nL1H0,A\nL1H3,B\n", headers={"content-type": "text/csv"}, timeout=60)
    assert r.status_code == 201, r.text
    page.goto(server.url + "/?model=demo&view=recovery&pairing=OK&overlay=demo-last-layer")
    note = page.locator("#recovery-no-edge")
    note.wait_for(timeout=60_000)
    assert "names no edge of the model" in note.inner_text()
    assert page.locator("#recovery-table").count() == 0


def test_the_validation_view_shows_the_paired_verdicts_and_the_power(server: Server, page: Page) -> None:
    page.goto(server.url + "/?model=demo&view=validation&pairing=OK")
    page.locator("#validation-not-computed").wait_for(timeout=60_000)
    assert "200 random pairs asked for" in page.locator("#validation-power").inner_text()
    page.click("#validation-run-btn")  # the API's default sample: 200 asked for, the demo has 64
    page.locator("#validation-paired").wait_for(timeout=180_000)
    data = api(server, "/api/validation", pairing="OK", cached="true")
    assert data["computed"] is True and data["n_sample"] == 64 and data["power"]["requested"] == 200
    power = page.locator("#validation-power").inner_text()
    assert "64 random pairs of the 200 asked for (all the model's 64 valid forward pairs)" in power
    assert f"power {data['power']['power']:.2f} to detect ρ = 0.3" in power
    for prompts, rows in data["paired"].items():
        for d in rows:
            row = page.locator("#" + paired_row_id(prompts, d["metric_b"]))
            assert row.get_attribute("data-verdict") == (d["verdict"] or "")
    pk_cs = next(d for d in data["paired"]["text"] if d["metric_b"] == "CS")
    words = {"A": "PK better", "B": "CS better", "tie": "no difference"}[pk_cs["verdict"]]
    assert f"(paired bootstrap): {words}" in page.locator("#validation-words").inner_text()
