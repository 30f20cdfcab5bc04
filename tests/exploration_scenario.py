"""Exploration checks of the browser tests, on any model: a pattern class has one colour in the
head graph's legend, the heatmap's class strip (and the legend swatch the browser drew), the
findings report's palette and its graph chart; hovering the busiest node lists its strongest
edges per pairing as GET /api/graph ranks them, and an edge's hover names both heads and its
PK. Run on the demo (tests/browser/test_exploration.py) and on SmolLM2
(tests/browser/test_smollm2.py). Every number is compared with the API's answers.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

from browser import Server, show_point, wait_figure, wait_until
from headgraph.frontend.report.charts import graph_chart, report_palette
from headgraph.frontend.report.numbers import overlay

GRAPH = "/?model={model}&view=graph&pairings=OQ,OK,OV&k=20&rule=topk&rank_on=pk"


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


def hover_text(page: Any, x: float, y: float) -> str:
    """The hover label plotly shows with the pointer on graph point (x, y)."""
    px, py = show_point(page, "graph", x, y)
    page.mouse.move(px, py)
    label = page.locator("#graph .hoverlayer .hovertext")
    label.first.wait_for(timeout=5000)
    return label.first.text_content() or ""


def class_colours_agree(server: Server, page: Any, model: str, timeout: float = 60.0) -> dict[str, str]:
    """Open the graph and the OK heatmap with the ``patterns`` overlay; every class the graph's
    legend shows has one colour everywhere. Returns the graph's class -> colour."""
    sets = api(server, "/api/labels")["label_sets"]
    order = next(s["classes"] for s in sets if s["name"] == "patterns")
    classes = set(api(server, "/api/labels/patterns", model=model)["classes"].values())
    assert classes, "the model's pattern classes are empty"
    page.goto(server.url + GRAPH.format(model=model) + "&overlay=patterns")
    graph = wait_figure(page, "graph", lambda f: set(legend_colours(f)) - {"no class"}, timeout=timeout)
    page.goto(server.url + f"/?model={model}&view=heatmap&pairing=OK&metric=raw&overlay=patterns")
    heatmap = wait_figure(page, "heatmap", lambda f: set(legend_colours(f)) - {"no class"}, timeout=timeout)
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
        numbers = {"model": model, "info": api(server, "/api/models/info", model=model),
                   "overlay": overlay(client, model),
                   "graph": api(server, "/api/graph", model=model, pairings="OQ,OK,OV", k=20)}
    report = report_palette(numbers)
    chart = {re.sub(r" \(\d+\)$", "", tr.name): tr.marker.color for tr in graph_chart(numbers).figure.data
             if tr.meta == "class-legend"}
    colours = {c: v for c, v in legend_colours(graph).items() if c != "no class"}
    for cls, colour in colours.items():
        assert colour == legend_colours(heatmap)[cls] == report[cls] == chart[cls], cls
        if cls in strip_colour:  # the strip shows the classes of the heatmap's source heads
            assert strip_colour[cls] == colour, cls
        rgb = tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5))
        assert swatch[cls].replace(" ", "") == f"rgb({rgb[0]},{rgb[1]},{rgb[2]})"
    assert set(colours) & set(strip_colour), "the heatmap strip shows none of the graph's classes"
    assert list(report)[:len(order)] == order  # the report's palette in the label set's order
    assert len(set(colours.values())) == len(colours)  # one colour per class
    return colours


def node_hover_lists_edges(server: Server, page: Any, model: str, timeout: float = 60.0) -> None:
    """Hover the node with most outgoing edges of the default top-20 graph: per pairing its
    edge count and its three strongest targets with their PK, in the API's rank order; then an
    edge's hover: both heads and its PK."""
    graph = api(server, "/api/graph", model=model, pairings="OQ,OK,OV", k=20, threshold_on="pk")["graph"]
    busiest = max(graph["nodes"], key=lambda n: (n["out_degree"], n["id"]))["id"]
    page.goto(server.url + GRAPH.format(model=model) + "&overlay=")
    fig = wait_figure(page, "graph", lambda f: points(f, "node"), timeout=timeout)
    x, y, _ = next(p for p in points(fig, "node") if p[2][1] == busiest)
    text = wait_until(lambda: hover_text(page, x, y), 10, message="node hover", page=page)
    assert busiest in text
    listed = 0
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
        listed += len(shown)
    assert listed
    # An edge's hover names both heads and its numbers.
    ex, ey, cd = points(fig, "edge")[0]
    edge = next(e for e in graph["edges"] if (e["source"], e["target"], e["pairing"]) == tuple(cd[1:4]))
    page.mouse.move(1, 1)
    text = wait_until(lambda: hover_text(page, ex, ey), 10, message="edge hover", page=page)
    assert f"{edge['source']} → {edge['target']}" in text
    assert float(re.search(r"PK ([0-9.e+-]+)", text)[1]) == pytest.approx(edge["score"], rel=5e-3)
