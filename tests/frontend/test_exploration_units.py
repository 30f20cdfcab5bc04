"""Graph exploration without a browser: one class palette in every view and the report, labels
and arrowheads at scale, KV groups on their layer's row, too-big graphs by layer, find by class,
and hovers that list a node's strongest edges.

The demo is computed through the real API in process (tests/frontend/conftest.py); the
palette's distances are measured in CIELAB under the Machado et al. (2009) colour-vision
simulations written out here, independently of the palette module.
"""

from __future__ import annotations

import itertools
import math
import re
from typing import Any

import dash
import numpy as np
import pytest
from fastapi.testclient import TestClient

from frontend_support import READY, find
from headgraph.server.http.routers.vocabulary import served_vocabulary as vocabulary
from headgraph.frontend.api.client import ApiClient
from headgraph.frontend.api.names import Vocabulary
from headgraph.frontend.callbacks import graph as graph_callbacks
from headgraph.frontend.callbacks.graph import all_head_nodes, graph_view
from headgraph.frontend.callbacks.heatmap import heatmap_view
from headgraph.frontend.figures.common import PAIRING_COLORS
from headgraph.frontend.figures.graph import ARROW_PX, BACKDROP_SIZE, LABEL_ALL_MAX, LABEL_TOP_EDGES, graph_figure
from headgraph.frontend.figures.graph_filters import find_matches, verdict_map
from headgraph.frontend.figures.graph_layers import layer_graph_figure
from headgraph.frontend.figures.palette import CLASS_PALETTE, NO_CLASS_COLOR, class_palette, label_set_order
from headgraph.frontend.figures.positions import force_positions, grid_positions
from headgraph.frontend.report.charts import graph_chart, report_palette
from headgraph.frontend.report.numbers import overlay
from headgraph.frontend.state.readiness import view_params
from headgraph.frontend.state.transitions import apply_click, next_state
from headgraph.frontend.state.url import default_state, parse_query

VOCAB = Vocabulary.from_json(vocabulary())
EDGE_GREYS = ("#e3e6ea",)  # an edgeless head's backdrop marker (figures.graph)


# -- colour science (CIELAB, Machado 2009 severity 1.0), written out for the test -------------

MACHADO = {
    "normal": np.eye(3),
    "protan": np.array([[0.152286, 1.052583, -0.204868], [0.114503, 0.786281, 0.099216],
                        [-0.003882, -0.048116, 1.051998]]),
    "deutan": np.array([[0.367322, 0.860646, -0.227968], [0.280085, 0.672501, 0.047413],
                        [-0.011820, 0.042940, 0.968881]]),
    "tritan": np.array([[1.255528, -0.076749, -0.178779], [-0.078411, 0.930809, 0.147602],
                        [0.004733, 0.691367, 0.303900]]),
}
SRGB_TO_XYZ = np.array([[0.4124564, 0.3575761, 0.1804375], [0.2126729, 0.7151522, 0.0721750],
                        [0.0193339, 0.1191920, 0.9503041]])
D65 = np.array([0.95047, 1.0, 1.08883])


def _linear(hex_color: str) -> np.ndarray:
    c = np.array([int(hex_color.lstrip("#")[i:i + 2], 16) / 255 for i in (0, 2, 4)])
    return np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)


def _lab(linear_rgb: np.ndarray) -> np.ndarray:
    xyz = SRGB_TO_XYZ @ np.clip(linear_rgb, 0, 1) / D65
    f = np.where(xyz > (6 / 29) ** 3, np.cbrt(xyz), xyz / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def worst_delta_e(a: str, b: str) -> float:
    """The smallest CIE76 distance of two colours over normal vision and the three dichromacies."""
    return min(float(np.linalg.norm(_lab(m @ _linear(a)) - _lab(m @ _linear(b)))) for m in MACHADO.values())


def test_palette_is_colour_blind_safe_and_apart_from_the_edge_colours() -> None:
    first = CLASS_PALETTE[:6]
    pairwise = min(worst_delta_e(a, b) for a, b in itertools.combinations(first, 2))
    assert pairwise >= 15, f"two of the first six class colours are {pairwise:.1f} apart for some viewer"
    edges = min(worst_delta_e(c, e) for c in CLASS_PALETTE for e in PAIRING_COLORS.values())
    assert edges >= 12, f"a class colour is {edges:.1f} from an edge colour for some viewer"
    greys = min(worst_delta_e(c, g) for c in CLASS_PALETTE for g in (NO_CLASS_COLOR, *EDGE_GREYS))
    assert greys >= 15
    assert len(set(CLASS_PALETTE)) == len(CLASS_PALETTE)


def test_a_class_colour_follows_its_label_sets_order_not_the_figure() -> None:
    order = ("Previous Token", "Induction", "Duplicate Token")
    alone = class_palette(order, {"Induction"})
    every = class_palette(order, {"Duplicate Token", "Previous Token", "Induction"})
    assert alone["Induction"] == every["Induction"] == CLASS_PALETTE[1]
    # A KV group's joined class takes its first known part's colour; classes outside the set
    # follow its order, sorted.
    joined = class_palette(order, {"Induction / Previous Token", "zeta", "alpha"})
    assert joined["Induction / Previous Token"] == CLASS_PALETTE[1]
    assert (joined["alpha"], joined["zeta"]) == (CLASS_PALETTE[3], CLASS_PALETTE[4])
    sets = [{"name": "patterns", "classes": list(order)}, {"name": "other", "classes": ["A"]}]
    assert label_set_order(sets, "patterns") == order and label_set_order(sets, "missing") == ()


# -- the demo through the API and the dashboard's own callbacks --------------------------------

def graph_params(search: str) -> dict[str, Any]:
    params = view_params(parse_query(search, VOCAB), "graph", READY)
    assert params is not None
    return params


def class_colours(fig: Any) -> dict[str, str]:
    """class -> colour of a figure's class legend entries (graph circles, heatmap squares)."""
    return {re.sub(r" \(\d+\)$", "", str(t.name)): t.marker.color for t in fig.data if t.meta == "class-legend"}


def node_colours(fig: Any) -> dict[str, str]:
    """head -> the colour its graph node is drawn in."""
    out = {}
    for t in fig.data:
        for cd in t.customdata or []:
            if isinstance(cd, (list, tuple)) and cd and cd[0] == "node" and t.name != "no edge":
                out[cd[1]] = t.marker.color
    return out


def strip_colours(fig: Any) -> dict[str, str]:
    """class -> colour of the heatmap's source class strip (its colorscale at the class's code)."""
    strip = next(t for t in fig.data if t.name == "source class")
    scale = [c for _, c in strip.colorscale]
    return {row[0]: scale[2 * int(z[0])] for row, z in zip(strip.text, strip.z)}


def test_one_class_one_colour_in_graphs_heatmap_strip_and_report(in_app: None, api: ApiClient, http: TestClient,
                                                                 computed: list[str]) -> None:
    classes = api.get("/api/labels/patterns", model="demo")["classes"]
    order = label_set_order(api.labels(), "patterns")
    assert "Induction" in classes.values() and order == ("Previous Token", "Induction", "Duplicate Token")
    expected = {c: CLASS_PALETTE[i] for i, c in enumerate(order)}
    base = "?model=demo&view=graph&pairings=OQ,OK,OV&overlay=patterns"
    views = {"k=20": base + "&rule=topk&k=20", "k=100": base + "&rule=topk&k=100",
             "FDR": base + "&rule=threshold&threshold_on=fdr&threshold=0.05"}
    seen: dict[str, dict[str, str]] = {}
    for name, search in views.items():
        fig = graph_view(graph_params(search))[0]
        legend, nodes = class_colours(fig), node_colours(fig)
        assert legend and all(legend[c] == expected[c] for c in legend if c in expected), name
        for head, colour in nodes.items():  # every node in its class's colour
            if "KV" not in head:
                assert colour == expected.get(classes.get(head, ""), NO_CLASS_COLOR), (name, head)
        seen[name] = legend
    assert all(seen[v]["Induction"] == expected["Induction"] for v in seen)
    # The heatmap's class strip and its legend.
    hm = view_params(parse_query("?model=demo&view=heatmap&pairing=OK&overlay=patterns", VOCAB), "heatmap", READY)
    fig = heatmap_view(hm)[0]
    assert class_colours(fig)["Induction"] == strip_colours(fig)["Induction"] == expected["Induction"]
    assert all(t.marker.symbol == "square" for t in fig.data if t.meta == "class-legend")
    # The findings report: its graph and the palette it prints.
    numbers = {"model": "demo", "info": api.model_info("demo"), "overlay": overlay(http, "demo"),
               "graph": api.graph("demo", ["OQ", "OK", "OV"], k=20)}
    chart = graph_chart(numbers).figure
    assert report_palette(numbers)["Induction"] == class_colours(chart)["Induction"] == expected["Induction"]
    assert all(node_colours(chart)[h] == expected[c] for h, c in classes.items() if h in node_colours(chart))


def test_class_legends_never_use_the_kv_diamond() -> None:
    info = {"layer_indices": [0, 1], "n_heads": 4, "n_kv_heads": 2}
    nodes = [{"id": "L0H1", "layer": 0, "head": 1, "degree": 1, "head_class": "Induction"},
             {"id": "L1KV0", "layer": 1, "head": 0, "kind": "kv_group", "heads": "L1H0,L1H1", "degree": 1,
              "head_class": "Induction"}]
    data = {"graph": {"nodes": nodes, "edges": [{"source": "L0H1", "target": "L1KV0", "pairing": "OK",
                                                 "score": 1.0, "rank": 1}]}, "pairings": ["OK"]}
    backdrop = all_head_nodes(info)
    fig = graph_figure({**data, "layer_indices": [0, 1]}, grid_positions(data["graph"], [0, 1]), layout="grid",
                       all_heads=[n["id"] for n in backdrop], head_pos=grid_positions({"nodes": backdrop}, [0, 1]),
                       backdrop=backdrop, class_order=("Induction",))
    legend = [t for t in fig.data if t.showlegend and t.marker is not None and t.mode == "markers"]
    assert legend and all(t.marker.symbol == "circle" for t in legend)
    assert [t.name for t in legend] == ["Induction (2)"]


# -- readable at scale -------------------------------------------------------------------------

def smollm2_like(seed: int = 0) -> tuple[dict[str, Any], dict[str, Any]]:
    """An API-shaped graph over a 30-layer, 9-query / 3-KV-head model (SmolLM2's shape): top-20
    edges per pairing by a seeded score, ranked as the API ranks (score order), one hub."""
    info = {"layer_indices": list(range(30)), "n_heads": 9, "n_kv_heads": 3}
    heads = {n["id"]: n for n in all_head_nodes(info)}
    rng = np.random.default_rng(seed)
    edges = []
    for pairing in ("OQ", "OK", "OV"):
        rows = []
        for _ in range(20):
            sl, tl = sorted(rng.choice(30, 2, replace=False))
            src = f"L{sl}H{rng.integers(9)}"
            tgt = f"L{tl}H{rng.integers(9)}" if pairing == "OQ" else f"L{tl}KV{rng.integers(3)}"
            rows.append({"source": src, "target": tgt, "pairing": pairing, "score": float(rng.random())})
        rows.sort(key=lambda e: -e["score"])
        edges += [{**e, "rank": i + 1, "opacity": e["score"] / rows[0]["score"]} for i, e in enumerate(rows)]
    ids = sorted({e["source"] for e in edges} | {e["target"] for e in edges})
    nodes = [{**heads[i], "degree": sum(i in (e["source"], e["target"]) for e in edges)} for i in ids]
    hub = max(nodes, key=lambda n: (n["degree"], n["id"]))
    hub["is_hub"] = True
    return {"graph": {"nodes": nodes, "edges": edges}, "pairings": ["OQ", "OK", "OV"],
            "hubs": {"hubs": [hub["id"]]}}, info


def labels_of(fig: Any) -> set[str]:
    return {cd[1] for t in fig.data if t.mode == "markers+text"
            for cd, text in zip(t.customdata, t.text) if text}


def test_above_48_nodes_the_strongest_edges_hubs_and_pinned_heads_are_labelled() -> None:
    data, info = smollm2_like()
    nodes, edges = data["graph"]["nodes"], data["graph"]["edges"]
    assert len(nodes) > LABEL_ALL_MAX
    layers = info["layer_indices"]
    backdrop = all_head_nodes(info)
    fig = graph_figure({**data, "layer_indices": layers}, grid_positions(data["graph"], layers), layout="grid",
                       all_heads=[n["id"] for n in backdrop], head_pos=grid_positions({"nodes": backdrop}, layers),
                       backdrop=backdrop, selected="L0H0" if any(n["id"] == "L0H0" for n in nodes) else None,
                       pinned=[nodes[5]["id"]])
    strongest = set()
    for p in ("OQ", "OK", "OV"):  # independently: each pairing's LABEL_TOP_EDGES highest scores
        for e in sorted((e for e in edges if e["pairing"] == p), key=lambda e: -e["score"])[:LABEL_TOP_EDGES]:
            strongest |= {e["source"], e["target"]}
    expected = strongest | set(data["hubs"]["hubs"]) | {nodes[5]["id"]}
    assert labels_of(fig) == expected
    assert len(labels_of(fig)) < len(nodes)  # not every node: the ones that matter
    # At or under 48 nodes every node keeps its name.
    small = {**data, "graph": {"nodes": nodes[:10], "edges": []}}
    fig = graph_figure(small, grid_positions(small["graph"], layers), layout="grid")
    assert labels_of(fig) == {n["id"] for n in nodes[:10]}


def test_kv_groups_sit_on_their_layers_row_between_their_query_heads() -> None:
    info = {"layer_indices": [16, 17], "n_heads": 9, "n_kv_heads": 3}
    nodes = all_head_nodes(info)
    pos = grid_positions({"nodes": nodes}, [16, 17])
    for n in (n for n in nodes if n["kind"] == "kv_group"):
        members = [pos[m] for m in n["heads"].split(",")]
        x, y = pos[n["id"]]
        assert y == members[0][1]  # its own layer's row, not half a row below
        assert min(m[0] for m in members) < x < max(m[0] for m in members)
        assert all(abs(x - hx) >= 0.5 for hx, hy in pos.values() if hy == y and (hx, hy) != (x, y))
    # The SmolLM2 induction edge L16H0 -> L17KV1 climbs one whole row.
    assert pos["L17KV1"][1] - pos["L16H0"][1] == 1.0


@pytest.mark.parametrize("layout", ["grid", "force"])
def test_every_edge_has_an_arrowhead_on_its_targets_rim(api: ApiClient, computed: list[str], layout: str) -> None:
    data = api.graph("demo", ["OQ", "OK", "OV"], k=20)
    info = api.model_info("demo")["info"]
    pos = grid_positions(data["graph"], info["layer_indices"]) if layout == "grid" else force_positions(data["graph"])
    fig = graph_figure({**data, "layer_indices": info["layer_indices"]}, pos, layout=layout)
    tips = []
    for t in fig.data:
        if t.marker is not None and t.marker.symbol == "arrow":
            assert t.marker.angleref == "previous" and t.hoverinfo == "skip"
            for i, size in enumerate(t.marker.size):
                if size == ARROW_PX:
                    # the tip stands off the target's centre by its radius, in pixels (at any zoom)
                    assert t.marker.standoff[i] > BACKDROP_SIZE / 2
                    tips.append(((t.x[i - 1], t.y[i - 1]), (t.x[i], t.y[i])))
    assert len(tips) == len(data["graph"]["edges"])
    for e in data["graph"]["edges"]:
        s, g = np.array(pos[e["source"]]), np.array(pos[e["target"]])
        near = [(np.array(a), np.array(b)) for a, b in tips
                if np.linalg.norm(np.array(b) - g) < np.linalg.norm(np.array(b) - s)]
        # Some arrow lies on this edge's line (it is shifted sideways per pairing), before its target.
        ok = False
        for a, b in near:
            d, v = g - s, b - a
            cross = abs(d[0] * v[1] - d[1] * v[0]) / (np.linalg.norm(d) * np.linalg.norm(v) + 1e-12)
            ok = ok or (cross < 1e-6 and np.dot(v, d) > 0 and 0 < np.linalg.norm(b - a) < np.linalg.norm(d) + 0.2)
        assert ok, e


def test_too_many_edges_are_drawn_as_counts_per_layer_pair(in_app: None, api: ApiClient, computed: list[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    search = "?model=demo&view=graph&pairings=OQ,OK,OV&rule=threshold&threshold_on=normalized&threshold=0&overlay="
    data = api.graph("demo", ["OQ", "OK", "OV"], k=None, threshold=0.0, threshold_on="normalized")
    edges = data["graph"]["edges"]
    layers = api.model_info("demo")["info"]["layer_indices"]
    fig = layer_graph_figure(edges, layers, limit=50)
    count = np.zeros((len(layers), len(layers)))
    for e in edges:  # independently: parse the names
        count[layers.index(int(re.match(r"L(\d+)", e["source"])[1])),
              layers.index(int(re.match(r"L(\d+)", e["target"])[1]))] += 1
    z = np.nan_to_num(np.array(fig.data[0].z, dtype=float))
    np.testing.assert_array_equal(z, count)
    assert fig.layout.meta["edges"] == len(edges)
    # Through the view: over the limit, the figure is the layer count grid and says why.
    monkeypatch.setattr(graph_callbacks, "EDGE_DRAW_LIMIT", len(edges) - 1)
    fig, chips, *_ = graph_view(graph_params(search))
    assert fig.data[0].type == "heatmap" and fig.layout.meta["aggregated"]
    note = find(chips, "graph-aggregated")
    assert note is not None and "layers" in note.children and getattr(note, "data-edges") == str(len(edges))
    # A click on a cell draws that layer range's heads.
    i, j = np.argwhere(count > 0)[0]
    click = {"points": [{"customdata": fig.data[0].customdata[i][j]}]}
    state = apply_click(parse_query(search, VOCAB), "graph", click, VOCAB)
    assert state.layers == (min(layers[i], layers[j]), max(layers[i], layers[j]))
    monkeypatch.setattr(graph_callbacks, "EDGE_DRAW_LIMIT", len(edges))
    fig = graph_view(graph_params(search))[0]
    assert all(t.type == "scatter" for t in fig.data)


def test_find_takes_a_class_name(in_app: None, api: ApiClient, computed: list[str]) -> None:
    classes = api.get("/api/labels/patterns", model="demo")["classes"]
    induction = sorted(h for h, c in classes.items() if c == "Induction")
    assert parse_query("?find=induction", VOCAB).find == "induction"
    assert parse_query("?find=l1h3", VOCAB).find == "L1H3"
    state = next_state(default_state(VOCAB), "find-input", "Induction", VOCAB)
    assert state.find == "Induction" and state.head is None  # a class opens no panel
    assert find_matches(["L1H0", "L1KV0"], "previous-token", {"L1KV0": "Induction / Previous Token"}) == ["L1KV0"]
    search = "?model=demo&view=graph&pairings=OQ,OK,OV&k=20&overlay=patterns&find=induction"
    fig, chips, *_ = graph_view(graph_params(search))
    assert getattr(find(chips, "stat-found"), "data-value") == ",".join(induction)
    ringed = {cd[1] for t in fig.data if str(t.name).startswith("found") for cd in t.customdata}
    assert ringed == set(induction)


# -- hover ----------------------------------------------------------------------------------------

def test_node_hover_lists_its_strongest_edges_and_edge_hover_both_heads(api: ApiClient, computed: list[str]) -> None:
    data = api.graph("demo", ["OQ", "OK", "OV"], k=20, labels="patterns")
    info = api.model_info("demo")["info"]
    ablation = api.ablation("demo", "OK", top=2)  # two measured edges: their verdicts in the hovers
    verdicts = verdict_map([ablation])
    fig = graph_figure({**data, "layer_indices": info["layer_indices"]},
                       grid_positions(data["graph"], info["layer_indices"]), layout="grid", verdicts=verdicts)
    edges = data["graph"]["edges"]
    hovers = {cd[1]: (cd[9], t.hovertemplate) for t in fig.data if t.mode == "markers+text" for cd in t.customdata}
    for node, (text, template) in hovers.items():
        assert "%{customdata[9]}" in template
        for p in ("OQ", "OK", "OV"):
            for direction, mine, other in (("out", "source", "target"), ("in", "target", "source")):
                ranked = sorted((e for e in edges if e["pairing"] == p and e[mine] == node), key=lambda e: -e["score"])
                if not ranked:
                    assert f"{p} {direction}</b>" not in text
                    continue
                block = text.split(f"<b>{p} {direction}</b> ({len(ranked)})")[1].split("<b>")[0]
                shown = re.findall(r"[→←] (L\d+(?:H|KV)\d+): PK ([^ ]+) · norm ([^ <]+)", block)
                assert [s[0] for s in shown] == [e[other] for e in ranked[:3]]
                for (_, pk, norm), e in zip(shown, ranked):
                    assert float(pk) == pytest.approx(e["score"], rel=1e-2)
                    assert float(norm) == pytest.approx(e["normalized"], rel=1e-2)
                if len(ranked) > 3:
                    assert f"… {len(ranked) - 3} more" in block
    for e in ablation["edges"]:  # a measured edge says its verdict in both ends' hovers
        assert f"→ {e['target']}: PK" in hovers[e["source"]][0]
        line = next(ln for ln in hovers[e["source"]][0].split("<br>") if f"→ {e['target']}: PK" in ln)
        assert line.endswith(e["verdict"])
    node_class = {n["id"]: n.get("head_class") or "no class" for n in data["graph"]["nodes"]}
    handles = {(cd[1], cd[2], cd[3]): text for t in fig.data if t.customdata is not None and t.text is not None
               for cd, text in zip(t.customdata, t.text) if cd[0] == "edge"}
    assert len(handles) == len(edges)
    for e in edges:
        text = handles[(e["source"], e["target"], e["pairing"])]
        assert f"{e['source']} → {e['target']}" in text
        assert f"{node_class[e['source']]} → {node_class[e['target']]}" in text
        pk = float(re.search(r"PK ([^ ]+) ·", text)[1])
        assert math.isclose(pk, e["score"], rel_tol=1e-2)


# -- subgraph: pins, groups, labels, export / import ------------------------------------------------

def test_subgraph_pins_groups_and_labels_live_in_the_link(in_app: None, api: ApiClient, computed: list[str]) -> None:
    import io
    import json

    import networkx as nx

    from headgraph.frontend.callbacks.subgraph import render_subgraph
    from headgraph.frontend.figures.subgraph import (
        SubgraphImportError,
        export_graphml,
        export_record,
        label_set_body,
        parse_import,
    )
    from headgraph.frontend.state.url import to_query

    state = default_state(VOCAB, model="demo", view="subgraph", overlay="")
    for head in ("L0H1", "L0H4", "L0H6", "L1H3", "L1H0", "L1H0"):  # the second L1H0 click unpins it
        state = next_state(state, "sub-action", {"op": "pin", "head": head}, VOCAB)
    assert state.pins == ("L0H1", "L0H4", "L0H6", "L1H3")
    # A click carries what it meant (the page's pins when it happened): a second pin of a head
    # sent before the first one's URL came back repeats the pin, it does not undo it.
    with_l1h1 = next_state(state, "sub-action", {"op": "pin", "head": "L1H1", "on": True}, VOCAB)
    assert with_l1h1.pins == ("L0H1", "L0H4", "L0H6", "L1H3", "L1H1")
    assert next_state(with_l1h1, "sub-action", {"op": "pin", "head": "L1H1", "on": True}, VOCAB) == with_l1h1
    assert next_state(with_l1h1, "sub-action", {"op": "pin", "head": "L1H1", "on": False}, VOCAB).pins == state.pins
    assert next_state(state, "sub-action", {"op": "pin", "head": "L1H1", "on": False}, VOCAB) == state
    state = next_state(state, "sub-action", {"op": "group", "name": "prev: tok;", "heads": ["L0H1", "L0H4", "L0H6"]},
                       VOCAB)
    state = next_state(state, "sub-action", {"op": "label", "key": "L1H3", "text": "induction head"}, VOCAB)
    assert state.groups == (("prev tok", ("L0H1", "L0H4", "L0H6")),) and state.labels == (("L1H3", "induction head"),)
    search = to_query(state)
    assert parse_query(search, VOCAB) == state  # the link alone reproduces the subgraph
    fig, chips, ticks, _ = render_subgraph(search, READY, None)
    drawn = getattr(find(chips, "sub-drawn"), "data-edges")
    answer = api.subgraph("demo", heads=list(state.pins), pairings=list(state.pairings), cap=500)
    want: dict[tuple[str, str], tuple[float, int]] = {}
    for e in answer["edges"]:  # every edge leaves the group (layer 0) for L1H3 (layer 1)
        assert e["source"] in ("L0H1", "L0H4", "L0H6") and e["target"] == "L1H3"
        v, n = want.get(("group:prev tok", e["pairing"]), (0.0, 0))
        want[("group:prev tok", e["pairing"])] = (v + e["value"], n + 1)
    got = {(s, p): (v, n) for s, t, p, v, n in json.loads(drawn)}
    assert got.keys() == want.keys() and all(got[k][1] == want[k][1] == 3 for k in want)
    assert all(abs(got[k][0] - want[k][0]) < 1e-9 for k in want)
    texts = {t for tr in fig.data if tr.mode == "markers+text" for t in tr.text}
    assert {"prev tok", "induction head"} <= texts
    assert [t["value"] for t in ticks] == ["group:prev tok", "L1H3"]
    record = export_record(model="demo", metric=state.metric, pairings=state.pairings, pins=state.pins,
                           groups=state.groups, labels=dict(state.labels), answer=answer,
                           drawn={"nodes": [], "edges": []})
    action = parse_import(json.dumps(record).encode(), VOCAB.is_head)
    fresh = next_state(default_state(VOCAB), "sub-action", action, VOCAB)
    assert (fresh.view, fresh.pins, fresh.groups, fresh.labels) == ("subgraph", state.pins, state.groups, state.labels)
    for bad, words in ((b"{", "not a JSON file"), (b'{"pins": ["L0H1"]}', "not a headgraph subgraph"),
                       (b'{"format": "headgraph-subgraph", "pins": ["X"]}', "pins must be"),
                       (b'{"format": "headgraph-subgraph", "pins": ["L0H1"], "groups": {"g": ["L1H1"]}}',
                        "not pinned")):
        with pytest.raises(SubgraphImportError, match=words):
            parse_import(bad, VOCAB.is_head)
    assert label_set_body("demo", state.groups, answer)["classes"] == {h: "prev tok" for h in ("L0H1", "L0H4", "L0H6")}
    graphml = export_graphml({**record, "nodes": [{"id": "group:prev tok", "label": "prev tok", "kind": "group",
                                                   "layer": 0, "members": ["L0H1"]},
                                                  {"id": "L1H3", "label": "induction head", "kind": "head", "layer": 1}],
                              "drawn_edges": [{"source": "group:prev tok", "target": "L1H3", "pairing": "OK",
                                               "value": 1.5, "count": 3, "members": ["L0H1>L1H3"]}]})
    g = nx.read_graphml(io.StringIO(graphml), force_multigraph=True)
    assert g.graph["model"] == "demo" and g.nodes["L1H3"]["label"] == "induction head"


def test_the_server_picks_heads_to_pin_a_neighbourhood_or_a_layer_ranges_top_edges(
        in_app: None, api: ApiClient, computed: list[str]) -> None:
    """'pin from the model': the heads of GET /api/subgraph's neighbourhood / layer-range answer
    (strongest edge first) become one pin-many record that the URL writer adds to the pins."""
    import contextvars

    from dash._callback_context import context_value
    from dash._utils import AttributeDict

    from headgraph.frontend.callbacks.subgraph import pin_from_query
    from headgraph.frontend.state.url import to_query

    def click(button: str, *args: Any) -> Any:
        def run() -> Any:
            context_value.set(AttributeDict(triggered_inputs=[{"prop_id": f"{button}.n_clicks", "value": 1}]))
            return pin_from_query(1, 1, *args)
        return contextvars.copy_context().run(run)

    state = default_state(VOCAB, model="demo", view="graph", overlay="", pins=("L1H2",))
    search = to_query(state)
    action, msg = click("sub-pin-neighbourhood-btn", "L0H0", 1, None, 10, search)
    answer = api.subgraph("demo", head="L0H0", depth=1, pairings=list(state.pairings), cap=50)
    want = list(dict.fromkeys(h for e in sorted(answer["edges"], key=lambda e: e["rank"])
                              for h in (e["source"], e["target"])))
    assert action["op"] == "pin-many" and action["heads"] == want and "L0H0" in want
    assert f"pinned {len(want)} heads of the neighbourhood of L0H0 (depth 1)" in msg
    after = next_state(state, "sub-action", action, VOCAB)
    assert after.view == "subgraph" and after.pins == tuple(dict.fromkeys(("L1H2", *want)))
    action, msg = click("sub-pin-layers-btn", None, 1, "0-1", 3, search)
    top = api.subgraph("demo", layers="0-1", k=3, cap=3, pairings=list(state.pairings))
    assert len(top["edges"]) == 3
    assert set(action["heads"]) == {h for e in top["edges"] for h in (e["source"], e["target"])}
    no, refusal = click("sub-pin-neighbourhood-btn", "L9H9", 1, None, 10, search)  # no such head: the API's 422
    assert no is dash.no_update and "not pinned" in str(refusal)


def test_free_layout_edges_meet_their_nodes_whatever_the_layout_spans() -> None:
    """In a free (force) layout each pairing's edges sit SHIFT_PX pixels aside of the line
    between their nodes (at the narrowest plot), not a share of the layout's span: one node far
    out put every edge tens of pixels off its nodes; arrowheads stand off by the target's radius."""
    from headgraph.frontend.figures.graph import MARGIN_Y_PX, MIN_PLOT_WIDTH_PX, SHIFT_PX

    names = [f"L1H{h}" for h in range(4)] + ["L0H0", "L0H1"]
    pos = {n: (0.3 * (i % 3), 0.3 * (i // 3)) for i, n in enumerate(names[:-1])}
    pos["L0H1"] = (20.0, 20.0)  # far out
    nodes = [{"id": n, "layer": int(n[1]), "head": int(n[-1]), "degree": 2} for n in names]
    edges = [{"source": s, "target": t, "pairing": p, "score": 1.0, "opacity": 1.0}
             for s in ("L0H0", "L0H1") for t in names[:4] for p in ("OQ", "OK", "OV")]
    fig = graph_figure({"graph": {"nodes": nodes, "edges": edges}, "pairings": ["OQ", "OK", "OV"],
                        "layer_indices": [0, 1]}, pos, layout="force")
    xs, ys = [x for x, _ in pos.values()], [y for _, y in pos.values()]
    px = min(600 - MARGIN_Y_PX, MIN_PLOT_WIDTH_PX) / (1.1 * max(max(xs) - min(xs), max(ys) - min(ys)))
    ends = [(x, y) for tr in fig.data if tr.mode == "lines" and tr.name and "(" in tr.name
            for x, y in zip(tr.x, tr.y) if x is not None]
    assert len(ends) == 2 * len(edges)
    for x, y in ends:  # every end of a drawn edge lies SHIFT_PX (or less) from some node's centre
        nearest = min(math.hypot(x - nx, y - ny) for nx, ny in pos.values()) * px
        assert nearest <= SHIFT_PX + 1e-6, nearest


def test_a_group_pairs_edge_values_do_not_overlap() -> None:
    """The OQ, OK and OV values of one pair of nodes (two groups' summed edges) are written
    apart along the edge (at 0.3, 0.5 and 0.7 of it), at least a text line apart in pixels;
    they were stacked at its middle ("2.25 ×210.5 ×2…")."""
    from headgraph.frontend.figures.subgraph import subgraph_figure

    nodes = [{"id": "G:a", "label": "a", "name": "a", "kind": "group", "layer": 0, "head": 0, "degree": 3},
             {"id": "G:b", "label": "b", "name": "b", "kind": "group", "layer": 1, "head": 0, "degree": 3}]
    edges = [{"source": "G:a", "target": "G:b", "pairing": p, "value": v, "score": v, "count": 2, "rank": 1,
              "opacity": 1.0} for p, v in (("OQ", 2.25), ("OK", 10.5), ("OV", 3.5))]
    fig = subgraph_figure({"nodes": nodes, "edges": edges}, rank_on_="pk")
    values = next(tr for tr in fig.data if tr.meta == "edge-values")
    assert list(values.text) == ["2.25 ×2", "10.5 ×2", "3.5 ×2"]
    px_per_row = (fig.layout.height - 160) / 1  # two layers: one row apart
    ys = sorted(float(y) for y in values.y)
    assert min(b - a for a, b in zip(ys, ys[1:])) * px_per_row >= 20  # 9-px text, well apart
