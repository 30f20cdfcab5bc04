"""Frontend pieces without a browser: URL state, figure builders, CSV/PNG exports, Dash wiring.

Figures and exports are fed the real API's JSON (the app runs in-process on the demo model)
and checked against independent numpy / networkx / csv computations on that same JSON.
"""

from __future__ import annotations

import contextvars
import csv
import io
import json
import time
from typing import Any
from collections.abc import Iterator

import dash

import networkx as nx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from dash._callback_context import context_value
from dash._utils import AttributeDict

from headgraph.core.vocabulary import vocabulary
from headgraph.frontend import exports
from headgraph.frontend.api_client import ApiClient, ApiError
from headgraph.frontend.app import create_dash, local_base_url
from headgraph.frontend.callbacks.heatmap import render_heatmap
from headgraph.frontend.callbacks.model import is_complete, model_status
from headgraph.frontend.callbacks.navigation import WRITER_INPUTS, next_query, render_controls, show_views, write_url
from headgraph.frontend.callbacks.panels import render_head_panel, render_pair_panel
from headgraph.frontend.callbacks.scatter import render_scatter
from headgraph.frontend.context import CONFIG_KEY, FrontendContext
from headgraph.frontend.figures import (graph_figure, head_grid_figure, kl_grid_figure, reference_figure,
                                        scatter_figure, score_heatmap, top_cutoffs)
from headgraph.frontend.graph_layout import force_positions, grid_positions
from headgraph.frontend.state import ViewState, default_state, parse_query, to_query, view_params
from headgraph.frontend.transitions import apply_click, apply_control, next_state
from headgraph.frontend.vocab import Vocabulary, VocabularyCache
from headgraph.server.app import create_app
from headgraph.server.settings import Settings

VOCAB = Vocabulary.from_json(vocabulary())
READY = {"model": "demo", "token": "t1"}


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    app = create_app(Settings(cache_dir=tmp_path_factory.mktemp("frontend-units")))
    with TestClient(app) as client:
        yield client


@pytest.fixture(scope="module")
def api(http: TestClient) -> ApiClient:
    return ApiClient("http://testserver", http=http)


@pytest.fixture(scope="module")
def computed(api: ApiClient) -> list[str]:
    """Compute the demo model through the API; its cache entries."""
    job = api.compute("demo")["job"]
    while api.job(job["id"])["state"] in ("queued", "running"):
        time.sleep(0.2)
    assert api.job(job["id"])["state"] == "done"
    return next(m for m in api.models() if m["id"] == "demo")["cached"]


@pytest.fixture()
def in_app(api: ApiClient) -> Iterator[None]:
    """An app context of a real dashboard app whose callbacks reach the in-process API."""
    dash_app = create_dash(api_url="http://testserver")
    dash_app.server.config[CONFIG_KEY] = FrontendContext(lambda: api)
    with dash_app.server.app_context():
        yield


def triggered(prop_ids: list[str], fn: Any, *args: Any) -> Any:
    """Call a callback as Dash does, with ``prop_ids`` as its triggered inputs."""
    def run() -> Any:
        context_value.set(AttributeDict(triggered_inputs=[{"prop_id": p, "value": None} for p in prop_ids]))
        return fn(*args)
    return contextvars.copy_context().run(run)


# -- vocabulary and URL state -----------------------------------------------------------------

def test_vocabulary_comes_from_the_api_once(http: TestClient) -> None:
    served = http.get("/api/vocabulary").json()
    assert Vocabulary.from_json(served) == VOCAB
    assert VOCAB.cs_pairings == ("OQ", "OK", "OV") and VOCAB.metrics[-1] == "cs"
    calls = []
    cache = VocabularyCache()
    fetch = lambda: calls.append(1) or served  # noqa: E731
    assert cache.get(fetch) is cache.get(fetch) and calls == [1]


@pytest.mark.parametrize("state", [
    default_state(VOCAB),
    default_state(VOCAB, model="local:gpt2 tiny", view="heatmap", pairing="VK", pairings=("OV",), k=7,
                  rule="threshold", threshold=2.5, metric="z", layout="force", overlay="ioi_gpt2_small",
                  head="L3H11", pair=("L0H1", "L5H0"), direction="in", top_percent=2.5, role="K"),
    default_state(VOCAB, pairings=(), metric="cs", view="tokens"),
    default_state(VOCAB, head="L6KV1", pair=("L2KV0", "L3H4")),
])
def test_state_round_trips_through_the_url(state: ViewState) -> None:
    assert parse_query(to_query(state), VOCAB) == state


def test_bad_query_values_fall_back_to_defaults() -> None:
    s = parse_query("?view=nope&pairing=ZZ&k=-5&metric=banana&head=L1X2&pair=L0H1&top_percent=1e9"
                    "&threshold=abc&role=q&pairings=OK,XX", VOCAB)
    d = default_state(VOCAB)
    assert (s.view, s.pairing, s.metric, s.head, s.pair) == (d.view, d.pairing, d.metric, None, None)
    assert s.k == 1 and s.top_percent == 100.0 and s.threshold is None and s.role == "Q"
    assert s.pairings == ("OK",)
    assert parse_query("?k=99999", VOCAB).k == VOCAB.k_max
    assert parse_query("", VOCAB) == d and d.k == VOCAB.default_k and d.pairings == VOCAB.graph_pairings
    assert parse_query("?head=L6KV1", VOCAB).head == "L6KV1"


def test_view_params_only_for_the_shown_ready_view() -> None:
    s = parse_query("?model=demo&view=heatmap&pairing=OV&metric=normalized&pair=L0H1,L1H2", VOCAB)
    assert view_params(s, "heatmap", READY) == {"model": "demo", "pairing": "OV", "metric": "normalized",
                                                "overlay": "patterns", "ready": "t1"}
    assert view_params(s, "head-grid", READY)["head"] == "L0H1"  # the pair's source (outgoing)
    assert view_params(s, "graph", READY) is None  # another tab
    assert view_params(s, "heatmap", None) is None  # not ready
    assert view_params(s, "heatmap", {"model": "gpt2", "token": "x"}) is None  # ready for another model
    assert view_params(s, "pair-panel", READY)["pair"] == ["L0H1", "L1H2"]
    assert view_params(s, "head-panel", READY) is None  # no head selected


def test_control_and_click_rules() -> None:
    s = default_state(VOCAB, head="L1H2", pair=("L0H0", "L1H1"), threshold=3.0, rule="threshold")
    assert apply_control(s, "model", "gpt2", VOCAB) == s.with_(model="gpt2", head=None, pair=None)
    assert apply_control(s, "metric", "z", VOCAB) == s.with_(metric="z", threshold=None)
    assert apply_control(s, "k", "12", VOCAB) == s.with_(k=12, rule="topk")
    assert apply_control(s, "k", "abc", VOCAB) == s
    assert apply_control(s, "threshold", 4, VOCAB) == s.with_(threshold=4.0, rule="threshold")
    node = {"points": [{"customdata": ["node", "L1H4", 3]}]}
    assert apply_click(s, "graph", node, VOCAB) == s.with_(head="L1H4", pair=None)
    edge = {"points": [{"customdata": ["edge", "L0H2", "L1H4", "OV"]}]}
    assert apply_click(s, "graph", edge, VOCAB) == s.with_(pair=("L0H2", "L1H4"), pairing="OV", head=None)
    cell = {"points": [{"x": "L1H5", "y": "L0H3", "z": 1.0}]}
    assert apply_click(s, "heatmap", cell, VOCAB).pair == ("L0H3", "L1H5")
    grid_cell = {"points": [{"x": "H6", "y": "L1"}]}
    assert apply_click(s.with_(direction="in"), "head-grid", grid_cell, VOCAB).pair == ("L1H6", "L1H2")
    assert apply_click(s, "kl-grid", {"points": [{"x": "V", "y": "O"}]}, VOCAB).pairing == "OV"
    assert next_state(s, "uploaded-store", {"name": "mine", "t": 1.0}, VOCAB).overlay == "mine"
    assert next_state(s, None, "anything", VOCAB) == s


def test_url_writer_next_query() -> None:
    fresh = "?model=demo&view=heatmap"  # a shared link: partial query, nothing selected
    new = next_query(fresh, [("metric-radio", "z")], VOCAB)
    assert parse_query(new, VOCAB) == default_state(VOCAB, view="heatmap", metric="z")
    # Values equal to the URL's (e.g. controls just rebuilt from it): no new URL, no history entry.
    assert next_query(fresh, [("metric-radio", "raw"), ("pairing-select", "OK"), ("model-select", "demo")],
                      VOCAB) is None
    assert next_query(fresh, [], VOCAB) is None
    # A Dash 4 dropdown that lost its value never drops the model from the URL.
    assert next_query(fresh, [("model-select", None)], VOCAB) is None
    click = {"points": [{"x": "L1H5", "y": "L0H3"}]}
    assert parse_query(next_query(fresh, [("heatmap", click)], VOCAB), VOCAB).pair == ("L0H3", "L1H5")


# -- module-level callbacks called directly ----------------------------------------------------

def test_url_writer_callback(in_app: None) -> None:
    values = [None] * len(WRITER_INPUTS)
    values[[c for c, _ in WRITER_INPUTS].index("metric-radio")] = "normalized"
    search = triggered(["metric-radio.value"], write_url, *values, "?model=demo&view=heatmap", None)
    assert parse_query(search, VOCAB) == default_state(VOCAB, view="heatmap", metric="normalized")
    # Rendered, not changed (no triggered input): no update.
    assert triggered([], write_url, *values, "?model=demo", None) is dash.no_update


def test_model_status_is_the_ready_writer(in_app: None, computed: list[str]) -> None:
    out = triggered(["url.search"], model_status, "?model=demo&view=graph", 0, 0, None, None, None)
    ready, models = out[0], out[10]
    assert ready["model"] == "demo" and ready["token"]
    assert any(m["id"] == "demo" for m in models)
    again = triggered(["url.search"], model_status, "?model=demo&view=heatmap", 0, 0, None, ready, models)
    assert all(v is dash.no_update for v in again)  # same model: nothing to do


def test_view_callbacks_render_the_api_data(in_app: None, api: ApiClient, computed: list[str]) -> None:
    search = "?model=demo&view=heatmap&pairing=OV&metric=normalized&pair=L0H0,L1H3"
    fig, _chips, cells = render_heatmap(search, READY, None)
    grid = api.pk("demo", "OV", "normalized")
    z = [[v if ok else None for v, ok in zip(r, o)] for r, o in
         zip([[v for tl in sh for v in tl] for sl in grid["grid"] for sh in sl],
             [[v for tl in sh for v in tl] for sl in grid["valid"] for sh in sl])]
    assert [list(r) for r in fig.data[0].z] == z and cells == "256"
    assert render_heatmap(search.replace("heatmap", "graph", 1), READY, None)[0].data == ()  # other tab
    body, _ = render_pair_panel(search, READY, None)
    title = next(c for c in body if getattr(c, "id", None) == "pair-panel-title")
    assert float(getattr(title, "data-pk")) == api.pair("demo", "OV", "L0H0", "L1H3")["pk"]
    close = next(c for c in body if getattr(c, "id", None) == "pair-close")
    assert parse_query(close.href, VOCAB).pair is None and parse_query(close.href, VOCAB).metric == "normalized"
    head = render_head_panel("?model=demo&head=L1H4", READY, None)
    assert head[1].id == "head-panel-title"
    _, _, n = render_scatter("?model=demo&view=scatter&pairing=OK&top_percent=10", READY)
    assert n == str(len(api.scatter("demo", "OK", 10)["points"]["pk"]))


def test_controls_are_built_from_the_url(in_app: None) -> None:
    search = "?model=demo&view=heatmap&pairing=OV&metric=z"
    _, tabs, groups, rendered = render_controls(search, None, None, None)
    assert rendered == "(loading)" and render_controls(search, [], [], None)[3] == search
    by_id = {g.id: g for g in groups}
    assert by_id["ctl-pairing"].children[1].value == "OV"
    assert by_id["ctl-metric"].children[1].value == "z"
    assert by_id["ctl-layout"].style == {"display": "none"}  # a graph-only control
    heat = next(t for t in tabs if t.id == "tab-heatmap")
    assert "tab-selected" in heat.className
    graph_tab = next(t for t in tabs if t.id == "tab-graph")
    assert parse_query(graph_tab.href, VOCAB) == parse_query("?view=graph&pairing=OV&metric=z", VOCAB)
    styles = show_views("?view=scatter&head=L0H1")
    assert styles[2] == {"display": "block"} and styles[0] == {"display": "none"}


def test_cache_completeness_reads_the_api_names(computed: list[str]) -> None:
    assert is_complete(computed, VOCAB.graph_pairings)
    assert not is_complete([c for c in computed if not c.startswith("null")], VOCAB.graph_pairings)
    assert not is_complete(None, VOCAB.graph_pairings)


# -- figures from the real API JSON -----------------------------------------------------------

def _grid(data: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    g = np.array(data["grid"], dtype=float)
    v = np.array(data["valid"], dtype=bool)
    return g.reshape(g.shape[0] * g.shape[1], -1), v.reshape(v.shape[0] * v.shape[1], -1)


def test_score_heatmap_is_the_api_grid(api: ApiClient) -> None:
    data = api.pk("demo", "OK", "normalized")
    fig = score_heatmap(data, metric="normalized", hover_grids={"CS": api.cs("demo", "K")})
    z = np.array([[np.nan if v is None else v for v in row] for row in fig.data[0].z])
    grid, valid = _grid(data)
    assert z.shape == (16, 16)
    np.testing.assert_allclose(z[valid], grid[valid], rtol=0)
    assert np.isnan(z[~valid]).all()
    assert list(fig.data[0].x) == data["target_labels"] and list(fig.data[0].y) == data["source_labels"]
    assert list(fig.layout.xaxis.ticktext) == ["L0", "L1"]
    cs_grid, _ = _grid(api.cs("demo", "K"))
    i, j = np.argwhere(valid)[0]
    assert float(fig.data[0].customdata[i][j][4]) == pytest.approx(cs_grid[i, j], rel=1e-3)


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
