"""Figures and exports built from the real API's JSON (each shows exactly the numbers the API
gave), the API client, and the Dash app mounted on the server."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import networkx as nx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from headgraph.server.http.routers.vocabulary import served_vocabulary as vocabulary
from headgraph.frontend.api.client import ApiClient, ApiError
from headgraph.frontend.app import local_base_url
from headgraph.frontend.api.context import CONFIG_KEY, FrontendContext
from headgraph.frontend.state.url import default_state, parse_query
from headgraph.frontend.api.names import Vocabulary
from headgraph.frontend.figures import (graph_figure, head_grid_figure, kl_grid_figure, reference_figure,
                                        scatter_figure, score_heatmap, top_cutoffs)
from headgraph.frontend.figures.positions import force_positions, grid_positions
from headgraph.frontend.figures import export as exports

VOCAB = Vocabulary.from_json(vocabulary())


# -- figures from the real API JSON -----------------------------------------------------------

def _grid(data: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    g = np.array(data["grid"], dtype=float)
    v = np.array(data["valid"], dtype=bool)
    return g.reshape(g.shape[0] * g.shape[1], -1), v.reshape(v.shape[0] * v.shape[1], -1)


def test_score_heatmap_is_the_api_grid(api: ApiClient) -> None:
    data = api.pk("demo", "OK", "normalized")
    fig = score_heatmap(data, metric="normalized", hover_grids={"CS": api.cs("demo", "K")})
    z = np.asarray(fig.data[0].z, dtype=float)
    grid, valid = _grid(data)
    assert z.shape == (16, 16)
    np.testing.assert_allclose(z[valid], grid[valid], rtol=1e-6)  # float32 on the wire
    assert np.isnan(z[~valid]).all()
    assert list(fig.data[0].x) == data["target_labels"] and list(fig.data[0].y) == data["source_labels"]
    assert list(fig.layout.xaxis.ticktext) == ["L0", "L1"]
    cs_grid, _ = _grid(api.cs("demo", "K"))
    i, j = np.argwhere(valid)[0]
    assert float(fig.data[0].customdata[i][j][0]) == pytest.approx(cs_grid[i, j], rel=1e-6)
    assert "CS: %{customdata[0]:.4g}" in fig.data[0].hovertemplate


@pytest.mark.parametrize("direction", ["out", "in"])
def test_head_grid_is_a_slice_of_the_4d_grid(api: ApiClient, direction: str) -> None:
    data = api.pk("demo", "OV", "raw")
    g4 = np.array(data["grid"], dtype=float)
    v4 = np.array(data["valid"], dtype=bool)
    head = "L0H5" if direction == "out" else "L1H2"
    fig = head_grid_figure(data, head, direction, metric="raw")
    z = np.array([[np.nan if v is None else v for v in row] for row in fig.data[0].z])
    expect = np.where(v4[0, 5], g4[0, 5], np.nan) if direction == "out" else np.where(v4[:, :, 1, 2], g4[:, :, 1, 2], np.nan)
    np.testing.assert_array_equal(np.isnan(z), np.isnan(expect))
    np.testing.assert_allclose(z[~np.isnan(z)], expect[~np.isnan(expect)])
    assert list(fig.data[0].y) == ["L0", "L1"] and list(fig.data[0].x)[3] == "H3"


def test_graph_figure_has_one_handle_per_edge_and_paper_colours(api: ApiClient) -> None:
    data = api.graph("demo", ["OQ", "OK", "OV"], k=20)
    info = api.model_info("demo")["info"]
    pos = grid_positions(data["graph"], info["layer_indices"])
    for n in data["graph"]["nodes"]:
        assert pos[n["id"]] == (float(n["head"]), float(info["layer_indices"].index(n["layer"])))
    fig = graph_figure(data, pos, layout="grid")
    handles = [(x, y, cd) for t in fig.data if t.customdata is not None
               for x, y, cd in zip(t.x, t.y, t.customdata) if cd[0] == "edge"]
    assert len(handles) == 60
    assert len({(round(x, 6), round(y, 6)) for x, y, _ in handles}) == 60, "edge handles must not overlap"
    assert {(cd[1], cd[2], cd[3]) for _, _, cd in handles} == {
        (e["source"], e["target"], e["pairing"]) for e in data["graph"]["edges"]}
    paper = {"OQ": "rgba(214,39,40,", "OK": "rgba(44,160,44,", "OV": "rgba(31,119,180,"}  # red/green/blue
    lines = [t for t in fig.data if t.mode == "lines"]
    assert {t.legendgroup for t in lines} == set(paper)
    assert all(t.line.color.startswith(paper[t.legendgroup]) for t in lines)
    # Opacity = score / max per pairing: the strongest edge of each pairing is drawn opaque.
    assert {t.legendgroup for t in lines if t.line.color.endswith(",1.000)")} == set(paper)
    hubs = [cd[1] for t in fig.data if t.customdata is not None for cd in t.customdata
            if cd[0] == "node" and cd[5] == "yes"]
    assert hubs == data["hubs"]["hubs"]


def test_force_layout_is_seeded_spring_layout(api: ApiClient) -> None:
    data = api.graph("demo", ["OK"], k=10)
    pos = force_positions(data["graph"])
    g = nx.Graph()
    g.add_nodes_from(n["id"] for n in data["graph"]["nodes"])
    for e in data["graph"]["edges"]:
        g.add_edge(e["source"], e["target"], weight=e["score"])
    ref = nx.spring_layout(g, seed=0, weight="weight")
    assert set(pos) == set(ref)
    for n in ref:
        assert pos[n] == pytest.approx(tuple(ref[n]))


def test_scatter_cutoffs_and_quadrants(api: ApiClient) -> None:
    data = api.scatter("demo", "OK", 10.0)
    pts = data["points"]
    pk_cut, cs_cut = top_cutoffs(pts)
    n_top = data["comparison"]["n_top"]
    assert pk_cut == pytest.approx(np.sort(pts["pk"])[::-1][n_top - 1])
    assert cs_cut == pytest.approx(np.sort(pts["cs"])[::-1][n_top - 1])
    fig = scatter_figure(data)
    counts = {t.name.split(" (")[0]: len(t.x) for t in fig.data if t.customdata is not None}
    c = data["comparison"]["counts"]
    assert counts == {"both": c["both"], "PK only": c["pk_only"], "CS only": c["cs_only"], "others": c["neither"]}


def test_a_large_scatter_draws_the_top_sets_as_points_and_the_rest_as_a_density() -> None:
    """Above DENSE_POINTS pairs: every top-set pair stays a clickable point, the "others"
    quadrant becomes counts that add up to it (nothing dropped), and no WebGL trace is needed."""
    from headgraph.frontend.figures.scatter import DENSE_POINTS

    rng = np.random.default_rng(0)
    n = DENSE_POINTS * 3
    pk, cs = rng.gamma(2.0, 0.1, n), rng.normal(0.0, 1.0, n)
    pk_top, cs_top = pk >= np.quantile(pk, 0.9), cs >= np.quantile(cs, 0.9)
    quad = (pk_top * 1 + cs_top * 2).tolist()
    heads = [f"L{i // 9}H{i % 9}" for i in range(n)]
    data = {"pairing": "OK", "mode": "K", "top_percent": 10.0, "comparison": {},
            "points": {"pk": pk.tolist(), "cs": cs.tolist(), "quadrant": quad, "source": heads, "target": heads[::-1]}}
    fig = scatter_figure(data)
    points = [t for t in fig.data if t.type in ("scatter", "scattergl") and t.mode == "markers"]
    dens = [t for t in fig.data if t.type == "heatmap"]
    assert len(dens) == 1 and all(t.type == "scatter" for t in points)
    assert sum(len(t.x) for t in points) == int(np.count_nonzero(pk_top | cs_top))
    assert np.nansum(np.asarray(dens[0].customdata, dtype=float)) == n - np.count_nonzero(pk_top | cs_top)
    clicked = [t for t in points if t.name.startswith("both")][0]
    i = int(np.nonzero(pk_top & cs_top)[0][0])
    assert list(clicked.customdata[0]) == [heads[i], heads[::-1][i]]
    assert clicked.x[0] == pytest.approx(cs[i], rel=1e-6)


def test_reference_figures(api: ApiClient) -> None:
    ref = api.reference("demo")
    kl = kl_grid_figure(ref["kl"], "OK")
    assert [list(r) for r in kl.data[0].z] == ref["kl"]["kl"]
    hist = reference_figure(ref["kl"], "OK", ref["nulls"]["OK"]["summary"])
    bars = [t for t in hist.data if t.type == "bar"][0]
    assert list(bars.y) == ref["kl"]["histograms"]["OK"]["model_density"]
    # Densities integrate to ~1 over the bins (a real density, not counts).
    widths = np.diff(ref["kl"]["histograms"]["OK"]["bin_edges"])
    assert float(np.sum(np.array(bars.y) * widths)) == pytest.approx(1.0, abs=0.05)


# -- exports ------------------------------------------------------------------------------------

def test_csv_exports_match_the_api(api: ApiClient) -> None:
    grid = api.pk("demo", "OQ", "raw")
    mine = list(csv.DictReader(io.StringIO(exports.grid_csv(grid))))
    body, name = api.download(what="pk", format="csv", model="demo", pairing="OQ", metric="raw")
    theirs = list(csv.DictReader(io.StringIO(body.decode())))
    assert name.endswith(".csv") and len(mine) == len(theirs) == 64
    for a, b in zip(mine, theirs):
        assert (a["source"], a["target"]) == (b["source"], b["target"])
        assert float(a["raw"]) == pytest.approx(float(b["raw"]), rel=1e-12)
    g = api.graph("demo", ["OQ", "OK", "OV"], k=5)
    rows = list(csv.DictReader(io.StringIO(exports.graph_csv(g))))
    assert len(rows) == 15 and {r["pairing"] for r in rows} == {"OQ", "OK", "OV"}
    ref = api.reference("demo")
    kl_rows = list(csv.reader(io.StringIO(exports.kl_csv(ref["kl"]))))[1:]
    assert [float(r[1]) for r in kl_rows] == [v for row in ref["kl"]["kl"] for v in row]


@pytest.mark.slow  # PNG / SVG export through kaleido's chromium: ~10 s
def test_figure_image_export_with_system_chromium(api: ApiClient) -> None:
    fig = kl_grid_figure(api.reference("demo")["kl"])
    png = exports.figure_image(fig, "png", width=500)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    svg = exports.figure_image(fig.to_plotly_json(), "svg", width=500)
    assert b"<svg" in svg[:200]
    with pytest.raises(ValueError):
        exports.figure_image(fig, "gif")


# -- client and Dash wiring ---------------------------------------------------------------------

def test_api_client_surfaces_the_api_message(api: ApiClient, http: TestClient) -> None:
    with pytest.raises(ApiError) as err:
        api.pk("demo", "XY")
    expected = http.get("/api/pk", params={"model": "demo", "pairing": "XY"}).json()["error"]["message"]
    assert err.value.status == 422 and err.value.message == expected
    with pytest.raises(ApiError) as err:
        api.model_info("no-such-model")
    assert err.value.status == 404 and "demo" in err.value.message


def test_local_base_url_from_wsgi_environ() -> None:
    assert local_base_url({"SERVER_NAME": "127.0.0.1", "SERVER_PORT": "8050"}) == "http://127.0.0.1:8050"
    assert local_base_url({"SERVER_NAME": "0.0.0.0", "SERVER_PORT": "80"}) == "http://127.0.0.1:80"
    assert local_base_url({"SERVER_NAME": "::1", "SERVER_PORT": "9", "wsgi.url_scheme": "https"}) == "https://[::1]:9"


def test_dash_is_mounted_after_the_api(http: TestClient) -> None:
    page = http.get("/")
    assert page.status_code == 200 and "<title>headgraph</title>" in page.text
    layout = json.dumps(http.get("/_dash-layout").json())
    for cid in ("graph", "heatmap", "scatter", "kl-grid", "progress", "overlay-upload", "upload-error",
                "copy-link", "head-panel", "pair-panel"):
        assert f'"id": "{cid}"' in layout, cid
    assert http.get("/api/does-not-exist").json()["error"]["status"] == 404
    assert http.get("/assets/style.css").status_code == 200
    # One real callback round trip through Dash: a metric click writes the whole state into the URL.
    dash_app = http.app.state.dash_app
    dash_app.server.config[CONFIG_KEY] = FrontendContext(lambda: ApiClient("http://testserver", http=http))
    deps = http.get("/_dash-dependencies").json()
    writers = [d for d in deps if "url.search" in d["output"]]
    assert len(writers) == 1, "exactly one callback writes the URL"
    assert not any(isinstance(i["id"], dict) or str(i["id"]).startswith("{") for i in writers[0]["inputs"])
    inputs = [{"id": i["id"], "property": i["property"],
               "value": "z" if i["id"] == "metric-radio" else None} for i in writers[0]["inputs"]]
    state = [{"id": i["id"], "property": i["property"],
              "value": "?model=demo&view=heatmap" if i["id"] == "url" else None} for i in writers[0]["state"]]
    body = {"output": writers[0]["output"], "outputs": {"id": "url", "property": "search"},
            "inputs": inputs, "changedPropIds": ["metric-radio.value"], "state": state}
    r = http.post("/_dash-update-component", json=body)
    assert r.status_code == 200, r.text[:500]
    search = r.json()["response"]["url"]["search"]
    assert parse_query(search, VOCAB) == default_state(VOCAB, view="heatmap", metric="z")


def test_dense_heatmaps_have_no_gaps_and_grow_with_their_rows():
    """Issue 17: 144-270 rows in ~420 px with white gaps washed the colour out."""
    from headgraph.frontend.figures.heatmaps import cell_gap, grid_height, score_heatmap

    for n_layers, n_heads in ((2, 8), (12, 12), (30, 9)):
        rows = n_layers * n_heads
        labels = [f"L{layer}H{h}" for layer in range(n_layers) for h in range(n_heads)]
        grid = {"model": "m", "pairing": "OK", "order": "forward", "kind": "pk",
                "source_role": "O", "target_role": "K", "source_labels": labels,
                "target_labels": labels, "layer_indices": list(range(n_layers)),
                "grid": [[[[1.0] * n_heads for _ in range(n_layers)] for _ in range(n_heads)]
                         for _ in range(n_layers)],
                "valid": [[[[True] * n_heads for _ in range(n_layers)] for _ in range(n_heads)]
                          for _ in range(n_layers)]}
        fig = score_heatmap(grid, metric="raw")
        trace = fig.data[0]
        assert trace.xgap == trace.ygap == cell_gap(rows)
        assert (trace.xgap == 0) == (rows > 64)
        assert fig.layout.height == grid_height(rows) >= 560
        usable = fig.layout.height - 160  # margins, title and axis
        assert rows <= 64 or usable / rows >= 2.9  # at least ~3 px per row when dense


def test_a_dense_token_grid_shows_one_token_per_cell_and_keeps_the_list_on_hover(api: ApiClient) -> None:
    """Past DENSE_TOKEN_CELLS heads (SmolLM2: 270) a cell shows only its top token (each extra
    line is SVG text Plotly lays out per cell); the hover keeps the whole list. The demo's real
    layer-1 rows, repeated over 20 layers (160 heads), make the dense grid."""
    from headgraph.frontend.figures import token_grid_figure
    from headgraph.frontend.figures.tokens import DENSE_TOKEN_CELLS

    tokens = api.get("/api/tokens", model="demo", role="V", k=5)
    small = token_grid_figure(tokens, [0, 1], 8).data[0]
    dense_rows = [{**h, "layer": layer} for layer in range(20) for h in tokens["heads"] if h["layer"] == 1]
    assert len(dense_rows) > DENSE_TOKEN_CELLS
    dense = token_grid_figure({**tokens, "heads": dense_rows}, list(range(20)), 8)
    for row in dense_rows:
        cell, hover = dense.data[0].text[row["layer"]][row["head"]], dense.data[0].customdata[row["layer"]][row["head"]]
        assert "<br>" not in cell and row["tokens"][0]["display"] in cell
        assert all(t["display"] in hover for t in row["tokens"])  # the whole list on hover
        assert small.text[1][row["head"]].count("<br>") == 2  # 3 tokens a cell on a small grid
    assert dense.layout.height < token_grid_figure({**tokens, "heads": dense_rows}, list(range(20)), 8,
                                                   shown=3).layout.height
