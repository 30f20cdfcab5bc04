"""Browser: exploring the head graph. On the demo (one warm server): a class has the same colour
in the graph, the heatmap's class strip (and its legend) and the findings report's palette;
hovering a node shows its strongest edges per pairing as the API ranks them; ``find`` takes a
class name; heads pinned with Ctrl + click, grouped and labelled in the Subgraph view reopen
from the copied link, export and import as JSON and save as a label set. (SmolLM2's default
graph, 60 nodes, is checked in test_smollm2.py, on its warm job.)

Every number is compared with the API's answers, none hard-coded.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page

import subgraph_scenario
from browser import Server, query_of, show_point, wait_figure, wait_until
from headgraph.frontend.report.charts import graph_chart, report_palette
from headgraph.frontend.report.numbers import overlay

pytestmark = pytest.mark.timeout(600)
GRAPH = "/?model={model}&view=graph&pairings=OQ,OK,OV&k=20&rule=topk&rank_on=pk"


@pytest.fixture(scope="module")
def warm_models() -> tuple[str, ...]:
    return ("demo",)  # computed through the API first


def api(server: Server, path: str, **params: Any) -> Any:
    r = httpx.get(server.url + path, params=params, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def legend_colours(fig: dict[str, Any]) -> dict[str, str]:
    """class -> colour of a figure's class legend entries."""
    return {re.sub(r" \(\d+\)$", "", tr["name"]): tr["marker"]["color"] for tr in fig["data"]
            if tr.get("meta") == "class-legend"}


def points(fig: dict[str, Any], kind: str) -> list[tuple[float, float, list[Any]]]:
    return [(x, y, cd) for tr in fig["data"]
            for x, y, cd in zip(tr.get("x") or [], tr.get("y") or [], tr.get("customdata") or [])
            if isinstance(cd, list) and cd and cd[0] == kind]


def hover_text(page: Page, x: float, y: float) -> str:
    """The hover label plotly shows with the pointer on graph point (x, y)."""
    px, py = show_point(page, "graph", x, y)
    page.mouse.move(px, py)
    label = page.locator("#graph .hoverlayer .hovertext")
    label.first.wait_for(timeout=5000)
    return label.first.text_content() or ""


def test_a_class_has_one_colour_in_graph_heatmap_strip_and_report(server: Server, page: Page) -> None:
    sets = api(server, "/api/labels")["label_sets"]
    order = next(s["classes"] for s in sets if s["name"] == "patterns")
    page.goto(server.url + GRAPH.format(model="demo") + "&overlay=patterns")
    graph = wait_figure(page, "graph", lambda f: legend_colours(f).get("Induction"))
    page.goto(server.url + "/?model=demo&view=heatmap&pairing=OK&metric=raw&overlay=patterns")
    heatmap = wait_figure(page, "heatmap", lambda f: legend_colours(f).get("Induction"))
    strip = next(tr for tr in heatmap["data"] if tr.get("name") == "source class")
    scale = [c for _, c in strip["colorscale"]]
    strip_colour = {row[0]: scale[2 * int(z[0])] for row, z in zip(strip["text"], strip["z"])}
    # The swatch the browser drew in the heatmap's legend, as a user sees it.
    swatch = page.evaluate("""() => { const gd = document.querySelector('#heatmap .js-plotly-plot');
        const out = {};
        gd.querySelectorAll('.legend .traces').forEach((t) => {
            const name = t.querySelector('.legendtext').textContent.replace(/ \\(\\d+\\)$/, '');
            const pt = t.querySelector('.legendpoints path');
            if (pt) out[name] = pt.style.fill; });
        return out; }""")
    with httpx.Client(base_url=server.url, timeout=300) as client:
        numbers = {"model": "demo", "info": api(server, "/api/models/info", model="demo"),
                   "overlay": overlay(client, "demo"),
                   "graph": api(server, "/api/graph", model="demo", pairings="OQ,OK,OV", k=20)}
    report = report_palette(numbers)
    chart = {re.sub(r" \(\d+\)$", "", tr.name): tr.marker.color for tr in graph_chart(numbers).figure.data
             if tr.meta == "class-legend"}
    for cls in legend_colours(graph):
        if cls == "no class":
            continue
        colour = legend_colours(graph)[cls]
        assert colour == legend_colours(heatmap)[cls] == strip_colour[cls] == report[cls] == chart[cls], cls
        rgb = tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5))
        assert swatch[cls].replace(" ", "") == f"rgb({rgb[0]},{rgb[1]},{rgb[2]})"
    assert list(report)[:len(order)] == order  # the report's palette in the label set's order
    assert legend_colours(graph)["Induction"] != legend_colours(graph).get("Previous Token")


def test_hovering_a_node_lists_its_strongest_edges(server: Server, page: Page) -> None:
    graph = api(server, "/api/graph", model="demo", pairings="OQ,OK,OV", k=20, threshold_on="pk")["graph"]
    busiest = max(graph["nodes"], key=lambda n: (n["out_degree"], n["id"]))["id"]
    page.goto(server.url + GRAPH.format(model="demo") + "&overlay=")
    fig = wait_figure(page, "graph", lambda f: points(f, "node"))
    x, y, _ = next(p for p in points(fig, "node") if p[2][1] == busiest)
    text = wait_until(lambda: hover_text(page, x, y), 10, message="node hover", page=page)
    assert busiest in text
    for p in ("OQ", "OK", "OV"):
        ranked = sorted((e for e in graph["edges"] if e["pairing"] == p and e["source"] == busiest),
                        key=lambda e: e["rank"])
        if not ranked:
            continue
        assert f"{p} out ({len(ranked)})" in text
        block = text.split(f"{p} out ({len(ranked)})")[1]
        shown = re.findall(r"→ (L\d+(?:H|KV)\d+): PK ([0-9.e+-]+)", block)[:min(3, len(ranked))]
        assert [s[0] for s in shown] == [e["target"] for e in ranked[:3]]
        assert [float(s[1]) for s in shown] == pytest.approx([e["score"] for e in ranked[:3]], rel=5e-3)
    # An edge's hover names both heads and its numbers.
    ex, ey, cd = points(fig, "edge")[0]
    edge = next(e for e in graph["edges"] if (e["source"], e["target"], e["pairing"]) == tuple(cd[1:4]))
    page.mouse.move(1, 1)
    text = wait_until(lambda: hover_text(page, ex, ey), 10, message="edge hover", page=page)
    assert f"{edge['source']} → {edge['target']}" in text
    assert float(re.search(r"PK ([0-9.e+-]+)", text)[1]) == pytest.approx(edge["score"], rel=5e-3)


def test_find_takes_a_class_name(server: Server, page: Page) -> None:
    classes = api(server, "/api/labels/patterns", model="demo")["classes"]
    induction = sorted(h for h, c in classes.items() if c == "Induction")
    assert induction
    page.goto(server.url + GRAPH.format(model="demo") + "&overlay=patterns")
    wait_figure(page, "graph", lambda f: points(f, "node"))
    box = page.locator("#find-input")
    box.fill("induction")
    box.press("Enter")
    wait_until(lambda: query_of(page.url).get("find") == "induction", 15, message="find in URL", page=page)
    chip = page.locator("#stat-found")
    chip.wait_for(timeout=30_000)
    wait_until(lambda: chip.get_attribute("data-value") == ",".join(induction), 30, message="found chip", page=page)
    fig = wait_figure(page, "graph", lambda f: any(str(tr.get("name", "")).startswith("found") for tr in f["data"]))
    ringed = {cd[1] for tr in fig["data"] if str(tr.get("name", "")).startswith("found") for cd in tr["customdata"]}
    assert ringed == set(induction)
    assert "head" not in query_of(page.url)  # a class opens no head panel


@pytest.mark.slow  # ~25 s: four pins, a group, a label, a second context, export, two imports, a save
def test_pin_group_label_share_export_import_and_save(server: Server, page: Page, browser: Any,
                                                      tmp_path: Any) -> None:
    graph = api(server, "/api/graph", model="demo", pairings="OQ,OK,OV", k=20, threshold_on="pk")["graph"]
    edged = sorted(n["id"] for n in graph["nodes"])  # heads with edges; the first columns (the modebar
    pins = [n for n in edged if n.startswith("L0")][:3] + [n for n in edged if n.startswith("L1")][:1]  # is right)
    subgraph_scenario.run(server, page, browser, tmp_path, model="demo",
                          graph_url=GRAPH.format(model="demo") + "&overlay=", pins=pins)
