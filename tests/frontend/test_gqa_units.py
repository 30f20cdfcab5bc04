"""Grouped-query (GQA) models in the dashboard, without a browser or a server.

KV-group nodes ("L6KV1") placed over the query heads they serve, KV names through the URL and
every click, KV column labels in the head grid, CS and PK hovers across query / KV axes, and
the KV group's head panel. Inputs are small hand-made API answers (the shapes GET /api/graph,
/api/pk and /api/cs give a 3-layer model with 6 query heads in 3 KV groups).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from headgraph.server.http.routers.vocabulary import served_vocabulary as vocabulary
from headgraph.frontend.callbacks.graph import all_head_nodes
from headgraph.frontend.callbacks.panels import head_body, pair_body
from headgraph.frontend.figures import graph_figure, head_grid_figure, head_slice, score_heatmap
from headgraph.frontend.figures.heatmaps import align_axis, axis_head, grid_labels
from headgraph.frontend.figures.positions import KV_ROW_OFFSET, grid_positions
from headgraph.frontend.state.url import default_state, parse_query, to_query
from headgraph.frontend.state.transitions import apply_click
from headgraph.frontend.api.names import Vocabulary

VOCAB = Vocabulary.from_json(vocabulary())
LAYERS = [0, 3, 6]  # original block numbers (not positions)
H, KV = 6, 3  # 6 query heads, 3 KV groups of 2
INFO = {"layer_indices": LAYERS, "n_heads": H, "n_kv_heads": KV}


def names(kv: bool) -> list[str]:
    return [f"L{layer}{'KV' if kv else 'H'}{h}" for layer in LAYERS for h in range(KV if kv else H)]


def grid_json(pairing: str, n_tgt: int, *, kv: bool, kind: str = "pk", labels: list[str] | None = None
              ) -> dict[str, Any]:
    """A /api/pk-shaped answer: forward pairs valid, value = 100*sl + 10*sh + tl + th/10."""
    L = len(LAYERS)
    grid = [[[[100 * sl + 10 * sh + tl + th / 10 for th in range(n_tgt)] for tl in range(L)]
             for sh in range(H)] for sl in range(L)]
    valid = [[[[sl < tl for _ in range(n_tgt)] for tl in range(L)] for _ in range(H)] for sl in range(L)]
    return {"model": "m", "kind": kind, "pairing": pairing, "order": "forward", "source_role": "O",
            "target_role": pairing[1], "layer_indices": LAYERS, "source_labels": names(False),
            "target_labels": labels if labels is not None else names(kv), "grid": grid, "valid": valid}


# -- node placement ---------------------------------------------------------------------------

def test_kv_nodes_sit_on_their_layer_between_the_query_heads_they_serve() -> None:
    backdrop = {"nodes": all_head_nodes(INFO)}
    kv_nodes = [n for n in backdrop["nodes"] if n["kind"] == "kv_group"]
    assert [n["id"] for n in kv_nodes] == names(True)
    assert next(n for n in kv_nodes if n["id"] == "L6KV1")["heads"] == "L6H2,L6H3"
    pos = grid_positions(backdrop, LAYERS)
    heads = {n: p for n, p in pos.items() if "KV" not in n}
    for node in kv_nodes:
        members = node["heads"].split(",")
        x, y = pos[node["id"]]
        assert x == pytest.approx(sum(heads[m][0] for m in members) / len(members))
        assert y == pytest.approx(heads[members[0]][1] - KV_ROW_OFFSET)
        assert all(abs(x - hx) + abs(y - hy) > 0.25 for hx, hy in heads.values())  # never on a head
    # The API's graph nodes (kind kv_group, heads = members) get the same places.
    api_node = {"id": "L6KV1", "layer": 6, "head": 1, "kind": "kv_group", "head_name": "L6KV1",
                "heads": "L6H2,L6H3"}
    assert grid_positions({"nodes": [api_node]}, LAYERS)["L6KV1"] == pos["L6KV1"]
    assert all_head_nodes({"layer_indices": [0], "n_heads": 4, "n_kv_heads": 4}) == [
        {"id": f"L0H{h}", "layer": 0, "head": h, "kind": "head"} for h in range(4)]


def test_graph_figure_kv_nodes_hover_names_members_and_clicks_open_them() -> None:
    nodes = [{"id": "L3H4", "layer": 3, "head": 4, "kind": "head", "heads": "L3H4", "degree": 1},
             {"id": "L6KV1", "layer": 6, "head": 1, "kind": "kv_group", "heads": "L6H2,L6H3",
              "degree": 1, "is_hub": True}]
    edge = {"source": "L3H4", "target": "L6KV1", "pairing": "OK", "score": 2.0, "opacity": 1.0}
    data = {"graph": {"nodes": nodes, "edges": [edge]}, "pairings": ["OK"], "hubs": {"hubs": ["L6KV1"]}}
    backdrop = all_head_nodes(INFO)
    head_pos = grid_positions({"nodes": backdrop}, LAYERS)
    fig = graph_figure({**data, "layer_indices": LAYERS}, grid_positions(data["graph"], LAYERS), layout="grid",
                       all_heads=[n["id"] for n in backdrop], head_pos=head_pos, backdrop=backdrop)
    points = {}
    for tr in fig.data:
        for x, y, cd in zip(tr.x or [], tr.y or [], tr.customdata or []):
            if cd is not None and cd[0] == "node":
                points[cd[1]] = (x, y, list(cd), tr)
    x, y, cd, tr = points["L6KV1"]
    assert (x, y) == pytest.approx((2.5, 2 - KV_ROW_OFFSET))
    assert "L6H2, L6H3" in cd[7] and "%{customdata[7]}" in tr.hovertemplate
    assert apply_click(default_state(VOCAB), "graph", {"points": [{"customdata": cd}]}, VOCAB).head == "L6KV1"
    _, _, cd0, tr0 = points["L0KV2"]  # a KV group without edges: backdrop, still clickable
    assert "L0H4, L0H5" in cd0[2] and "diamond" in tr0.marker.symbol
    assert list(fig.layout.xaxis.ticktext) == [f"H{h}" for h in range(H)]
    assert "KV group" in fig.layout.xaxis.title.text


# -- URL and clicks ----------------------------------------------------------------------------

def test_kv_names_through_the_url_and_every_click() -> None:
    s = parse_query("?model=m&view=graph&pairing=OK&pair=L4H1,L6KV1", VOCAB)
    assert s.pair == ("L4H1", "L6KV1") and parse_query(to_query(s), VOCAB) == s
    assert parse_query("?head=L29KV0", VOCAB).head == "L29KV0"
    edge = {"points": [{"customdata": ["edge", "L3H4", "L6KV1", "OV"]}]}
    assert apply_click(s, "graph", edge, VOCAB).pair == ("L3H4", "L6KV1")
    assert apply_click(s, "graph", edge, VOCAB).pairing == "OV"
    cell = {"points": [{"x": "L6KV2", "y": "L0H5", "z": 1.0}]}
    assert apply_click(s, "heatmap", cell, VOCAB).pair == ("L0H5", "L6KV2")
    out = s.with_(head="L0H1", pair=None)
    assert apply_click(out, "head-grid", {"points": [{"x": "KV1", "y": "L6"}]}, VOCAB).pair == ("L0H1", "L6KV1")
    into = s.with_(head="L6KV1", pair=None, direction="in")
    assert apply_click(into, "head-grid", {"points": [{"x": "H3", "y": "L0"}]}, VOCAB).pair == ("L0H3", "L6KV1")
    point = {"points": [{"customdata": ["L3H0", "L6KV0"]}]}
    assert apply_click(s, "scatter", point, VOCAB).pair == ("L3H0", "L6KV0")


# -- heatmaps: KV columns, query <-> KV axes ---------------------------------------------------

def test_head_grid_labels_kv_columns_and_maps_query_heads_to_their_group() -> None:
    ok = grid_json("OK", KV, kv=True)
    fig = head_grid_figure(ok, "L0H1", "out", metric="raw")
    assert list(fig.data[0].x) == ["KV0", "KV1", "KV2"] and list(fig.data[0].y) == ["L0", "L3", "L6"]
    assert fig.data[0].z[2][1] == ok["grid"][0][1][2][1]
    # Incoming scores of a query head on the KV axis: its group's (L6H5 reads L6KV2).
    assert axis_head(ok, "L6H5", "in") == "L6KV2"
    rows, _, n = head_slice(ok, "L6H5", "in")
    assert n == H and rows[0][3] == ok["grid"][0][3][2][2]
    assert "L6KV2" in head_grid_figure(ok, "L6H5", "in", metric="raw").layout.title.text
    with pytest.raises(KeyError, match="direction 'in'"):
        head_slice(ok, "L6KV2", "out")  # a KV group is no source of OK
    assert list(head_grid_figure(grid_json("OQ", H, kv=False), "L0H1", "out", metric="raw").data[0].x) == [
        f"H{h}" for h in range(H)]


def test_heatmap_hovers_translate_between_query_and_kv_axes() -> None:
    pk = grid_json("OK", KV, kv=True)
    cs = grid_json("OK", H, kv=False, kind="cs", labels=names(True))  # KV labels on a query-head grid
    assert grid_labels(cs)["target_labels"] == names(False) and grid_labels(pk) == pk
    q, k = names(False), names(True)
    assert align_axis(q, k)[q.index("L6H5")] == [k.index("L6KV2")]  # group size from the full axes
    assert align_axis(k, q)[k.index("L6KV1")] == [q.index("L6H2"), q.index("L6H3")]
    assert align_axis(["L6H5", "L3KV0"], k, group=2) == [[k.index("L6KV2")], [k.index("L3KV0")]]
    fig = score_heatmap(pk, metric="raw", hover_grids={"CS": cs})
    src, tgt = list(fig.data[0].y), list(fig.data[0].x)
    i, j = src.index("L0H1"), tgt.index("L6KV1")
    mean = (cs["grid"][0][1][2][2] + cs["grid"][0][1][2][3]) / 2
    assert float(fig.data[0].customdata[i][j][0]) == pytest.approx(mean, rel=1e-6)
    assert "CS (KV group: mean over its query heads): %{customdata[0]:.4g}" in fig.data[0].hovertemplate
    fig = score_heatmap(cs, metric="cs", hover_grids={"PK": pk})  # PK hover on the CS grid
    tgt = list(fig.data[0].x)
    assert tgt == names(False)
    assert float(fig.data[0].customdata[i][tgt.index("L6H3")][0]) == pytest.approx(pk['grid'][0][1][2][1], rel=1e-6)
    assert np.isnan(fig.data[0].customdata[i][tgt.index("L0H3")][0])  # not forward
    assert "PK: %{customdata[0]:.4g}" in fig.data[0].hovertemplate  # one query head: no mean


# -- panels ------------------------------------------------------------------------------------

def test_kv_group_head_panel_and_pair_panel() -> None:
    state = default_state(VOCAB, model="m", head="L6KV1")
    d = {"model": "m", "head": "L6KV1", "kind": "kv_group", "layer": 6, "index": 1,
         "heads": ["L6H2", "L6H3"], "class": None, "tokens": {}, "patterns": None,
         "partners": {"OK": {"out": [], "in": [{"head": "L3H4", "pk": 3.5}]}}}
    body = head_body(d, state)
    title = next(c for c in body if getattr(c, "id", None) == "head-panel-title")
    assert getattr(title, "data-head") == "L6KV1" and getattr(title, "data-members") == "L6H2,L6H3"
    members = next(c for c in body if getattr(c, "id", None) == "head-members")
    links = [c for c in members.children if hasattr(c, "href")]
    assert [parse_query(link.href, VOCAB).head for link in links] == ["L6H2", "L6H3"]
    partners = next(c for c in body if getattr(c, "id", None) == "head-partners")
    link = partners.children.children[0].children[1].children[0]
    assert parse_query(link.href, VOCAB).pair == ("L3H4", "L6KV1")
    pair = {"source": "L3H4", "target": "L6KV1", "pairing": "OK", "pk": 3.5, "normalized": 0.2,
            "cs": 0.125, "cs_of": "mean over L6H2, L6H3", "ranks": [16, 16]}
    table = pair_body(pair, state)[3]
    cells = {tr.children[1].id: tr.children[1].children for tr in table.children.children}
    assert cells["pair-cs"] == "0.125 (mean over L6H2, L6H3)"


def test_head_grid_csv_names_kv_heads() -> None:
    from headgraph.frontend.figures.export import head_grid_csv

    ok = grid_json("OK", KV, kv=True)
    ok["metric"] = "raw"
    lines = head_grid_csv(ok, "L0H1", "out").strip().splitlines()
    assert lines[0] == "head,target,raw" and lines[1].startswith("L0H1,L3KV0,")
    assert {line.split(",")[1] for line in lines[1:]} == set(names(True)) - {"L0KV0", "L0KV1", "L0KV2"}


def test_no_marker_covers_another_markers_centre_in_a_smollm2_shaped_graph() -> None:
    """Plotly hovers the smallest marker under the pointer, so a click on a node or edge handle
    reaches it only if no other marker covers its centre. SmolLM2's shape: 30 layers, 9 query
    heads, 3 KV groups, OK and OV edges into every KV group from the layer below (the shortest
    edges there are), OQ edges between query heads; checked in pixels at the narrowest plot."""
    from headgraph.frontend.figures.graph import MARGIN_Y_PX, MIN_PLOT_WIDTH_PX

    layers, heads, groups = list(range(30)), 9, 3
    rng = np.random.default_rng(0)
    nodes = [{"id": f"L{la}H{h}", "layer": la, "head": h, "degree": int(rng.integers(1, 9))}
             for la in layers for h in range(heads)]
    nodes += [{"id": f"L{la}KV{g}", "layer": la, "head": g, "kind": "kv_group", "degree": int(rng.integers(1, 9)),
               "heads": ",".join(f"L{la}H{3 * g + i}" for i in range(3))} for la in layers for g in range(groups)]
    edges = [{"source": f"L{la - 1}H{int(rng.integers(heads))}", "target": f"L{la}KV{g}", "pairing": p,
              "score": 1.0, "opacity": 1.0} for la in layers[1:] for g in range(groups) for p in ("OK", "OV")]
    edges += [{"source": f"L{la - 1}H{int(rng.integers(heads))}", "target": f"L{la}H{h}", "pairing": "OQ",
               "score": 1.0, "opacity": 1.0} for la in layers[1:] for h in range(heads) if rng.random() < 0.3]
    data = {"graph": {"nodes": nodes, "edges": edges}, "pairings": ["OQ", "OK", "OV"], "layer_indices": layers}
    fig = graph_figure(data, grid_positions(data["graph"], layers), layout="grid")
    y0, y1 = fig.layout.yaxis.range
    xs = [x for tr in fig.data if tr.customdata is not None for x in tr.x]
    sy = (fig.layout.height - MARGIN_Y_PX) / (y1 - y0)
    sx = MIN_PLOT_WIDTH_PX / (max(xs) - min(xs) + 1.0)  # plotly pads the x range: wider in truth
    markers = []  # (x px, y px, radius px, what)
    for tr in fig.data:
        if tr.customdata is None:
            continue
        sizes = tr.marker.size if isinstance(tr.marker.size, (list, tuple)) else [tr.marker.size] * len(tr.x)
        markers += [(x * sx, y * sy, s / 2, tuple(cd[:4])) for x, y, s, cd in zip(tr.x, tr.y, sizes, tr.customdata)]
    assert sum(m[3][0] == "edge" for m in markers) == len(edges)
    assert sum(m[3][0] == "node" for m in markers) == len(nodes)
    xy = np.array([(m[0], m[1]) for m in markers])
    r = np.array([m[2] for m in markers])
    d = np.linalg.norm(xy[:, None] - xy[None], axis=2)
    np.fill_diagonal(d, np.inf)
    covered = np.argwhere(d < r[None, :])  # [i, j]: marker j covers marker i's centre
    assert not len(covered), [(markers[i][3], markers[j][3]) for i, j in covered[:10]]
    assert fig.layout.height >= 30 * 40  # the rows grew so a KV sub-row fits between them
