"""Browser: only the visible view's callbacks run, a view whose inputs did not change is not
redrawn, and large grids travel as binary arrays (issue 17, item 3).

A real server on the demo (computed through the API first), Debian's chromium; every
callback request the page makes is recorded with the outputs it asked for.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import numpy as np
import pytest
from playwright.sync_api import Page

from headgraph.frontend.figures.validation import scatter_keys
from browser import Server, click_point, figure, query_of, wait_figure, wait_until

pytestmark = pytest.mark.timeout(300)
VIEW_FIGURES = {"graph": "graph.figure", "heatmap": "heatmap.figure", "scatter": "scatter.figure",
                "reference": "kl-grid.figure", "tokens": "token-grid.figure", "validation": "validation.figure"}


@pytest.fixture(scope="module")
def warm_models() -> tuple[str, ...]:
    return ("demo",)  # computed through the API first


class Calls:
    """Every /_dash-update-component request of a page: its outputs and response body."""

    def __init__(self, page: Page) -> None:
        self.records: list[tuple[str, str]] = []
        page.on("requestfinished", self._done)

    def _done(self, request: Any) -> None:
        if "/_dash-update-component" not in request.url:
            return
        output = json.loads(request.post_data or "{}").get("output", "")
        response = request.response()
        self.records.append((output, response.text() if response else ""))

    def outputs(self) -> list[str]:
        return [o for o, _ in self.records]

    def views(self) -> set[str]:
        # A multi-output callback's output reads "..a.figure...b.children..": split it into its parts.
        parts = {part for o in self.outputs() for part in o.strip(".").split("...")}
        return {v for v, fig in VIEW_FIGURES.items() if fig in parts}


def settle(page: Page) -> None:
    """Let late callbacks (controls, the URL write) finish."""
    page.wait_for_timeout(1500)


def test_a_warm_load_runs_only_the_visible_views_callbacks(server: Server, page: Page) -> None:
    calls = Calls(page)
    page.goto(server.url + "/?model=demo&view=heatmap&pairing=OK&overlay=patterns")
    fig = wait_figure(page, "heatmap", lambda f: f["data"] and f["data"][0]["type"] == "heatmap")
    settle(page)
    assert calls.views() == {"heatmap"}, calls.outputs()
    assert not any("head-panel-body" in o or "pair-panel-body" in o for o in calls.outputs())
    # The grid travels as a binary typed array, not as a list of numbers.
    body = next(text for o, text in calls.records if "heatmap.figure" in o)
    assert '"bdata"' in body and '"dtype":"f4"' in body.replace(" ", "")
    grid = httpx.get(server.url + "/api/pk", params={"model": "demo", "pairing": "OK"}, timeout=60).json()
    want = np.array(grid["grid"], dtype=float).reshape(16, 16)
    valid = np.array(grid["valid"], dtype=bool).reshape(16, 16)
    shown = np.array([[np.nan if v is None else v for v in row] for row in fig["data"][0]["z"]], dtype=float)
    np.testing.assert_allclose(shown[valid], want[valid], rtol=1e-6)
    assert np.isnan(shown[~valid]).all()
    # The class overlay is drawn as one strip cell per head, with the API's classes.
    classes = httpx.get(server.url + "/api/labels/patterns", params={"model": "demo"}, timeout=60).json()["classes"]
    rows = next(t for t in fig["data"] if t.get("name") == "source class")
    cols = next(t for t in fig["data"] if t.get("name") == "target class")
    assert [r[0] for r in rows["text"]] == [classes.get(h, "no class") for h in grid["source_labels"]]
    assert cols["text"][0] == [classes.get(h, "no class") for h in grid["target_labels"]]


def test_switching_tabs_runs_the_shown_view_only_and_keeps_an_unchanged_one(server: Server, page: Page) -> None:
    page.goto(server.url + "/?model=demo&view=heatmap&pairing=OK&overlay=")
    wait_figure(page, "heatmap", lambda f: f["data"] and f["data"][0]["type"] == "heatmap")
    settle(page)
    calls = Calls(page)
    page.click("#tab-scatter")
    wait_until(lambda: query_of(page.url).get("view") == "scatter", 15, message="scatter tab", page=page)
    wait_figure(page, "scatter", lambda f: any(len(t.get("x") or []) for t in f["data"]))
    settle(page)
    assert calls.views() == {"scatter"}, calls.outputs()
    calls.records.clear()
    page.click("#tab-heatmap")
    wait_until(lambda: query_of(page.url).get("view") == "heatmap", 15, message="heatmap tab", page=page)
    settle(page)
    # Same pairing, metric and overlay as drawn before: the heatmap is shown again as it was,
    # without a request for it.
    assert "heatmap" not in calls.views(), calls.outputs()
    fig = figure(page, "heatmap")
    assert fig and fig["data"][0]["type"] == "heatmap" and "OK" in fig["layout"]["title"]["text"]


def test_layer_overview_drills_down_to_a_block_of_heads(server: Server, page: Page) -> None:
    """Dense models: the heatmap's layer overview (one cell per layer block, its mean) and a
    click on a block opening that block's head pairs."""
    page.goto(server.url + "/?model=demo&view=heatmap&pairing=OK&grain=layers&overlay=")
    fig = wait_figure(page, "heatmap", lambda f: f["data"] and f["data"][0]["x"] == ["L0", "L1"])
    grid = httpx.get(server.url + "/api/pk", params={"model": "demo", "pairing": "OK"}, timeout=60).json()
    g, ok = grid["grid"], grid["valid"]
    for si in range(2):  # the block means, from the API's nested lists in plain Python
        for ti in range(2):
            vals = [g[si][sh][ti][th] for sh in range(8) for th in range(8) if ok[si][sh][ti][th]]
            shown = fig["data"][0]["z"][si][ti]
            if vals:
                assert shown == pytest.approx(sum(vals) / len(vals), rel=1e-6)
            else:
                assert shown is None  # no forward pair in the block (layer 1 -> layer 0)
    assert fig["data"][0]["z"][0][1] is not None
    click_point(page, "heatmap", 1, 0)  # source L0 -> target L1
    wait_until(lambda: query_of(page.url).get("zoom") == "L0,L1" and query_of(page.url).get("grain") == "heads",
               15, message="zoom in the URL", page=page)
    block = wait_figure(page, "heatmap", lambda f: len(f["data"][0]["x"]) == 8)
    assert block["data"][0]["y"] == grid["source_labels"][:8] and block["data"][0]["x"] == grid["target_labels"][8:]
    want = [[g[0][sh][1][th] for th in range(8)] for sh in range(8)]
    assert [v for row in block["data"][0]["z"] for v in row] == pytest.approx([v for row in want for v in row],
                                                                             rel=1e-6)
    # A cell of the block opens its pair, as in the whole grid.
    title = page.locator("#pair-panel-title")
    click_point(page, "heatmap", 2, 3, expect=title)
    assert title.get_attribute("data-pair") == f"{grid['source_labels'][3]},{grid['target_labels'][8 + 2]}"
    # The overview control goes back (and leaves the block).
    page.check("#grain-radio input[value='layers']")
    wait_until(lambda: query_of(page.url).get("grain") == "layers" and "zoom" not in query_of(page.url), 15,
               message="back to the overview", page=page)
    wait_figure(page, "heatmap", lambda f: f["data"][0]["x"] == ["L0", "L1"])


def _props(output: str) -> list[str]:
    """A /_dash-dependencies output ("a.b" or "..a.b...c.d..", an "@hash" after a duplicate) as "id.prop"s."""
    parts = output.strip(".").split("...") if output.startswith("..") else [output]
    return [p.split("@")[0] for p in parts]


def test_no_chain_of_callbacks_leads_from_the_url_back_to_the_url_writer(server: Server) -> None:
    """dash-renderer holds a requested callback back while another pending one could, through
    any chain of callbacks (inputs only), write one of its inputs (``getReadyCallbacks``). Were
    a view's output an input of the URL writer (the timeline once wrote the step slider's value),
    every URL-driven callback of a page load would wait on another one's answer: the view's
    request left ~0.3 s late. Read from the dependency list the page itself loads."""
    deps = httpx.get(server.url + "/_dash-dependencies", timeout=60).json()
    ins = [[f"{i['id']}.{i['property']}" for i in d["inputs"]] for d in deps]
    outs = [_props(d["output"]) for d in deps]

    def downstream(start: int) -> set[str]:
        touched, todo = set(), [start]
        while todo:
            new = [o for o in outs[todo.pop()] if o not in touched]
            touched.update(new)
            todo += [j for j, i in enumerate(ins) if set(i) & set(new)]
        return touched

    on_load = [k for k, d in enumerate(deps) if not d.get("prevent_initial_call")]
    url_driven = [k for k in on_load if "url.search" in ins[k]]
    assert len(url_driven) >= 5
    for k in url_driven:
        assert "url.search" not in downstream(k), deps[k]["output"]
    # As the renderer decides at page load: the router (a browser-side callback) and the model
    # bar's record are ready at once, with every other URL-driven callback that reads no view's output.
    pending = set().union(*(downstream(k) for k in on_load))
    ready = [k for k in on_load if not (set(ins[k]) - set(outs[k])) & pending]
    ready_outputs = {o for k in ready for o in outs[k]}
    assert {"in-graph-search.data", "ready-store.data", "view-graph.style", "share-url.value"} <= ready_outputs


def test_the_layout_brings_label_sets_and_a_cached_models_ready_record(server: Server) -> None:
    """So a warm view's callback starts with the page, not after the model bar's answer."""
    def stores(referer: str | None) -> dict[str, Any]:
        headers = {"Referer": referer} if referer else {}
        tree = httpx.get(server.url + "/_dash-layout", headers=headers, timeout=60).json()
        found: dict[str, Any] = {}

        def walk(node: Any) -> None:
            if isinstance(node, dict):
                props = node.get("props") or {}
                if node.get("type") == "Store":
                    found[props.get("id")] = props.get("data")
                if str(props.get("id", "")).startswith("view-") and "style" in props:
                    found[props["id"]] = (props.get("style") or {}).get("display")
                walk(props.get("children"))
            elif isinstance(node, list):
                for child in node:
                    walk(child)
        walk(tree)
        return found

    demo = next(m for m in httpx.get(server.url + "/api/models", timeout=60).json()["models"] if m["id"] == "demo")
    got = stores(server.url + "/?model=demo&view=heatmap")
    assert got["ready-initial"] == {"model": "demo", "token": demo.get("fingerprint") or "demo"}
    listed = httpx.get(server.url + "/api/labels", timeout=60).json()["label_sets"]
    assert [s["name"] for s in got["labels-store"]] == [s["name"] for s in listed]
    assert stores("http://elsewhere.example/?model=demo")["ready-initial"] is None  # another site's link
    assert stores(server.url + "/?model=random:nope")["ready-initial"] is None  # not cached
    # Only the link's own view is displayed at mount (the others' figures wait unplotted).
    shown = {k: v for k, v in got.items() if k.startswith("view-")}
    assert shown["view-heatmap"] == "block" and set(shown.values()) == {"block", "none"}
    assert [k for k, v in shown.items() if v == "block"] == ["view-heatmap"]
    assert [k for k, v in stores(server.url + "/?model=demo").items() if v == "block"] == ["view-graph"]


def test_the_validation_view_reads_the_cache_then_runs_and_draws_the_apis_numbers(server: Server, page: Page) -> None:
    """Opening it never computes ("not computed" and the run button); the button computes (the
    API's default sample), and the forest plot and scatter then carry the API's numbers."""
    calls = Calls(page)
    page.goto(server.url + "/?model=demo&view=validation&pairing=OV")
    page.locator("#validation-not-computed").wait_for(timeout=60_000)
    assert page.locator("#validation-state").get_attribute("data-computed") == "false"
    cached = httpx.get(server.url + "/api/validation", params={"model": "demo", "pairing": "OV", "cached": "true"},
                       timeout=60).json()
    assert cached["computed"] is False  # opening the view computed nothing
    settle(page)
    assert calls.views() == {"validation"}, calls.outputs()
    page.click("#validation-run-btn")
    page.locator("#validation-run-done").wait_for(timeout=120_000)
    data = httpx.get(server.url + "/api/validation", params={"model": "demo", "pairing": "OV", "cached": "true"},
                     timeout=60).json()
    # two traces (random-pair rho, top-k mean effect) per prompt set the API summarises
    fig = wait_figure(page, "validation", lambda f: len(f["data"]) == 2 * len(data["summary"]), timeout=60)
    assert data["computed"] is True and data["pairing"] == "OV"
    for trace in fig["data"]:  # a point per metric: [metric, value, low, high, n] as the API has them
        prompts, key = trace["meta"]["prompts"], trace["meta"]["stat"]
        want = [[r["metric"], r[key]["value"], r[key]["low"], r[key]["high"], r[key]["n"]]
                for r in data["summary"][prompts]]
        assert trace["customdata"] == want and trace["x"] == [w[1] for w in want]
    assert {(t["meta"]["prompts"], t["meta"]["stat"]) for t in fig["data"]} == {
        (p, k) for p in data["summary"] for k in ("random_rho", "top_mean_effect")}
    assert page.locator("#stat-val-n").get_attribute("data-value") == str(data["n_sample"])
    assert page.locator("#stat-val-edges").get_attribute("data-value") == str(len(data["edges"]))
    assert not page.locator("#validation-run-btn").is_visible()
    scatter = wait_figure(page, "validation-scatter", lambda f: len(f["data"]) > 0)
    sample = [e for e in data["edges"] if e["in_sample"]]
    for trace in scatter["data"]:
        if trace["meta"]["pairs"] == "sample":
            # the held-out set reads the refit metrics against the other half's effects
            metric, effect = scatter_keys(data, trace["meta"]["prompts"], trace["meta"]["metric"])
            shown = [e for e in sample if e[metric] is not None]
            assert trace["customdata"] == [[e["source"], e["target"]] for e in shown]
            assert trace["y"] == [e[effect] for e in shown]
    # Opened again (a shared link), it reads the cached answer at once: no button.
    page.goto(server.url + "/?model=demo&view=validation&pairing=OV")
    again = wait_figure(page, "validation", lambda f: len(f["data"]) == len(fig["data"]))
    assert [t["customdata"] for t in again["data"]] == [t["customdata"] for t in fig["data"]]
    assert not page.locator("#validation-run-btn").is_visible()


# What each figure element holds: drawn by Plotly, waiting unplotted (assets/deferred-plots.js), or nothing.
PLOT_STATES = """() => Object.fromEntries([...document.querySelectorAll('.dash-graph')].map(el => [el.id,
    (el.querySelector('.js-plotly-plot') || {})._fullLayout ? 'drawn'
    : [el, ...el.querySelectorAll('*')].some(n => n.__headgraphPending) ? 'deferred' : 'none']))"""


def test_hidden_figures_wait_unplotted_until_shown_then_answer_clicks(server: Server, page: Page) -> None:
    """A page load plots only the shown view's figure: the hidden views' and panels' figures are
    kept (with the handlers dcc.Graph binds) and drawn when shown; a click on a figure drawn that
    way still opens its panel."""
    page.goto(server.url + "/?model=demo&view=graph&pairings=OK&k=3&overlay=")
    wait_figure(page, "graph", lambda f: any(t.get("customdata") for t in f["data"]))
    settle(page)
    states = page.evaluate(PLOT_STATES)
    assert states["graph"] == "drawn" and {"heatmap", "scatter", "kl-grid", "token-grid"} <= set(states)
    assert {k for k, v in states.items() if v == "drawn"} == {"graph"}, states
    page.click("#tab-heatmap")
    wait_figure(page, "heatmap", lambda f: f["data"] and f["data"][0]["type"] == "heatmap")
    assert page.evaluate(PLOT_STATES)["scatter"] == "deferred"  # still hidden: still not plotted
    grid = httpx.get(server.url + "/api/pk", params={"model": "demo", "pairing": "OK"}, timeout=60).json()
    title = page.locator("#pair-panel-title")
    click_point(page, "heatmap", 11, 0, expect=title)  # source row 0, target column 11
    assert title.get_attribute("data-pair") == f"{grid['source_labels'][0]},{grid['target_labels'][11]}"


def test_a_figure_out_of_sight_draws_after_the_one_in_sight(server: Server, browser: Any) -> None:
    """In a short window the tokens view's pattern grid lies below the token grid: it waits
    (assets/deferred-plots.js) until the token grid is drawn and the page is idle, then draws,
    unscrolled, the same figure a tall window draws at once."""
    link = server.url + "/?model=demo&view=tokens&overlay="
    short = browser.new_context(viewport={"width": 1500, "height": 350})
    tall = browser.new_context(viewport={"width": 1500, "height": 1400})
    try:
        page = short.new_page()
        page.goto(link)
        late = wait_figure(page, "patterns", lambda f: f["data"] and f["data"][0].get("z"))
        top = page.evaluate("document.getElementById('patterns').getBoundingClientRect().top")
        assert top > 350 + 150, top  # out of sight (the margin assets/deferred-plots.js allows)
        log = [e for e in page.evaluate("window.__headgraphPlots") if e[0] in ("token-grid", "patterns")]
        waited = log.index(["patterns", "waiting: out of sight"])
        assert ["token-grid", "drawn"] in log[:waited] and ["patterns", "drawn"] in log[waited:], log
        other = tall.new_page()
        other.goto(link)
        at_once = wait_figure(other, "patterns", lambda f: f["data"] and f["data"][0].get("z"))
        assert late["data"] == at_once["data"]
        assert ["patterns", "waiting: out of sight"] not in other.evaluate("window.__headgraphPlots")
    finally:
        short.close()
        tall.close()
