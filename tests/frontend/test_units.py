"""Frontend pieces without a browser: URL state, figure builders, CSV/PNG exports, Dash wiring.

Figures and exports are fed the real API's JSON (the app runs in-process on the demo model)
and checked against independent numpy / networkx / csv computations on that same JSON.
"""

from __future__ import annotations

import contextvars
from typing import Any

import dash
import numpy as np

import pytest
from fastapi.testclient import TestClient

from dash._callback_context import context_value
from dash._utils import AttributeDict

from headgraph.server.http.routers.vocabulary import served_vocabulary as vocabulary
from frontend_support import READY, find
from headgraph.frontend.api.client import ApiClient
from headgraph.frontend.callbacks.heatmap import render_heatmap
from headgraph.frontend.callbacks.model import is_complete, model_status
from headgraph.frontend.callbacks.navigation import WRITER_INPUTS, next_query, render_controls, show_page, write_url
from headgraph.frontend.callbacks.panels import render_head_panel, render_pair_panel
from headgraph.frontend.callbacks.scatter import render_scatter
from headgraph.frontend.callbacks.graph import render_graph, slider_range, summary
from headgraph.frontend.layout.controls import model_picker
from headgraph.frontend.state.url import (THRESHOLD_DIGITS, ViewState, default_overlay, default_state,
                                      format_threshold, parse_query, quantize_threshold, to_query)
from headgraph.frontend.state.readiness import view_params
from headgraph.frontend.state.transitions import apply_click, apply_control, next_state
from headgraph.frontend.api.names import Vocabulary, VocabularyCache

VOCAB = Vocabulary.from_json(vocabulary())


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
    default_state(VOCAB, rule="threshold", threshold_on="fdr", threshold=0.01, rank_on="z"),
    default_state(VOCAB, rule="threshold", threshold_on="z", threshold=-1.25, rank_on="normalized"),
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
                                                "overlay": "patterns", "grain": "heads", "zoom": None,
                                                "ready": "t1"}
    assert view_params(s, "head-grid", READY)["head"] == "L0H1"  # the pair's source (outgoing)
    assert view_params(s, "graph", READY) is None  # another tab
    assert view_params(s, "heatmap", None) is None  # not ready
    assert view_params(s, "heatmap", {"model": "gpt2", "token": "x"}) is None  # ready for another model
    assert view_params(s, "pair-panel", READY)["pair"] == ["L0H1", "L1H2"]
    assert view_params(s, "head-panel", READY) is None  # no head selected


def test_control_and_click_rules() -> None:
    s = default_state(VOCAB, head="L1H2", pair=("L0H0", "L1H1"), threshold=3.0, rule="threshold")
    assert apply_control(s, "model", "gpt2", VOCAB) == s.with_(model="gpt2", head=None, pair=None)
    # The heatmap metric is not the graph's scale: the graph's threshold stays.
    assert apply_control(s, "metric", "z", VOCAB) == s.with_(metric="z")
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


def test_cka_and_procrustes_are_heatmap_metrics_in_the_link() -> None:
    from headgraph.frontend.layout.controls import control_groups

    assert {"cka", "procrustes"} <= set(VOCAB.metrics) and {"cka", "procrustes"} <= set(VOCAB.rank_metrics)
    fresh = "?model=demo&view=heatmap&pairing=OV"
    for metric in ("cka", "procrustes"):
        search = next_query(fresh, [("metric-radio", metric)], VOCAB)
        assert f"metric={metric}" in search
        state = parse_query(search, VOCAB)
        assert state == parse_query(fresh, VOCAB).with_(metric=metric)
        assert parse_query(to_query(state), VOCAB) == state
        radio = {g.id: g for g in control_groups(state, VOCAB, [])}["ctl-metric"].children[1]
        assert radio.value == metric
        assert {o["value"]: o.get("disabled", False) for o in radio.options}[metric] is False
        # The subgraph cannot rank by them: offered there, disabled, saying why.
        sub = {g.id: g for g in control_groups(state.with_(view="subgraph"), VOCAB, [])}["ctl-metric"]
        option = next(o for o in sub.children[1].options if o["value"] == metric)
        assert option["disabled"] and "heatmaps only" in option["title"]
    assert parse_query("?view=heatmap&metric=cosine", VOCAB).metric == default_state(VOCAB).metric


def test_subspaces_toggle_round_trips_through_the_url() -> None:
    raw = "?model=demo&view=heatmap&head=L1H2"
    norm = next_query(raw, [("subspaces-radio", "norm")], VOCAB)
    assert "model=demo%40norm" in norm  # the link keeps the mode
    state = parse_query(norm, VOCAB)
    assert state == parse_query(raw, VOCAB).with_(model="demo@norm")  # same view, same head
    assert parse_query(to_query(state), VOCAB) == state
    dropdown, toggle = model_picker(state, [{"id": "demo", "status": "available"}])
    assert dropdown.value == "demo" and find(toggle, "subspaces-radio").value == "norm"
    # The controls rebuilt from the URL report their values: no change, the mode stays.
    assert next_query(norm, [("model-select", "demo"), ("subspaces-radio", "norm")], VOCAB) is None
    assert parse_query(next_query(norm, [("model-select", "gpt2")], VOCAB), VOCAB).model == "gpt2@norm"
    assert parse_query(next_query(norm, [("subspaces-radio", "raw")], VOCAB), VOCAB).model == "demo"
    assert next_query(norm, [("subspaces-radio", "folded")], VOCAB) is None
    sets = [{"name": "demo-heads", "builtin": True, "model": "demo", "n_heads": 4}]
    assert default_overlay("demo@norm", sets) == default_overlay("demo", sets) == "demo-heads"


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
    want = np.array(grid["grid"], dtype=float).reshape(16, 16)
    valid = np.array(grid["valid"], dtype=bool).reshape(16, 16)
    shown = np.asarray(fig.data[0].z)
    assert shown.dtype == np.float32 and cells == "256"  # binary float32 on the wire
    np.testing.assert_allclose(shown[valid], want[valid], rtol=1e-6)
    assert np.isnan(shown[~valid]).all()
    assert '"bdata"' in fig.to_json()  # typed array, not a list of numbers
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


def test_cka_heatmap_and_pair_panel_show_the_api_values(in_app: None, api: ApiClient, computed: list[str]) -> None:
    search = "?model=demo&view=heatmap&pairing=OK&metric=cka&pair=L0H0,L1H3"
    fig, _chips, _cells = render_heatmap(search, READY, None)
    grid = api.pk("demo", "OK", "cka")
    assert grid["kind"] == "cka" and grid["metric"] == "cka"
    want = np.array(grid["grid"], dtype=float).reshape(16, 16)
    valid = np.array(grid["valid"], dtype=bool).reshape(16, 16)
    shown = np.asarray(fig.data[0].z)
    np.testing.assert_allclose(shown[valid], want[valid], rtol=1e-6)
    assert "CKA" in fig.layout.title.text and "PK: %{customdata[0]" in fig.data[0].hovertemplate
    # The pair panel reads the grid now cached; a kind not cached says so.
    pair = api.pair("demo", "OK", "L0H0", "L1H3")
    cell = grid["source_labels"].index("L0H0"), grid["target_labels"].index("L1H3")
    assert "cka" in pair["similarity_cached"] and pair["cka"] == want[cell]
    body, _ = render_pair_panel(search, READY, None)
    cka = find(body, "pair-cka")
    assert float(getattr(cka.children, "data-value")) == pair["cka"]
    procrustes = find(body, "pair-procrustes").children
    if "procrustes" in pair["similarity_cached"]:
        assert float(getattr(procrustes, "data-value")) == pair["procrustes"]
    else:
        assert procrustes.children == "not computed"


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
    styles = show_page("?view=scatter&head=L0H1", "http://host:1/?old")
    assert styles[2] == {"display": "block"} and styles[0] == {"display": "none"}
    assert styles[-2] == {"display": "none"} and styles[-1] == "http://host:1/?view=scatter&head=L0H1"
    graph = show_page("?view=graph&verification=colour", "http://host:1/")
    assert graph[-2] == {"display": "flex"}


def test_cache_completeness_reads_the_api_names(computed: list[str]) -> None:
    assert is_complete(computed, VOCAB.graph_pairings)
    assert not is_complete([c for c in computed if not c.startswith("null")], VOCAB.graph_pairings)
    assert not is_complete(None, VOCAB.graph_pairings)


# -- graph scales: threshold_on / rank_on / FDR in the URL, the applied threshold shown -----------

def test_graph_scales_parse_and_serialize() -> None:
    assert vocabulary()["threshold_digits"] == THRESHOLD_DIGITS  # the page rounds as the API does
    s = parse_query("?view=graph&rule=threshold", VOCAB)
    assert (s.threshold_on, s.threshold, s.rank_on) == ("normalized", None, "pk")  # the defaults
    assert "threshold_on=normalized" in to_query(s) and "rank_on=pk" in to_query(s)
    assert "threshold=" not in to_query(s)
    # Thresholds are kept as the API applies them (3 significant digits), so the URL prints that.
    s = parse_query("?rule=threshold&threshold_on=z&threshold=0.123456789", VOCAB)
    assert s.threshold == 0.123 and "threshold=0.123&" in to_query(s)
    assert parse_query("?rule=threshold&threshold=4e-7", VOCAB).threshold == 0.0
    # FDR: the threshold is the BH q level, 0.05 by default, kept in 0.001..0.2.
    fdr = parse_query("?view=graph&rule=threshold&threshold_on=fdr", VOCAB)
    assert (fdr.threshold_on, fdr.threshold) == ("fdr", 0.05) and "threshold_on=fdr&threshold=0.05&" in to_query(fdr)
    assert parse_query("?threshold_on=fdr&threshold=0.9", VOCAB).threshold == 0.2
    assert parse_query("?threshold_on=fdr&threshold=0.00001", VOCAB).threshold == 0.001
    # Unknown scales fall back; CS is no graph scale and FDR cannot rank top-k.
    bad = parse_query("?threshold_on=cs&rank_on=fdr", VOCAB)
    assert (bad.threshold_on, bad.rank_on) == ("normalized", "pk")
    # Links from before the scales existed rank / threshold on their metric, as they did.
    assert parse_query("?rule=threshold&threshold=5.5&metric=raw", VOCAB).threshold_on == "pk"
    assert parse_query("?rule=threshold&metric=raw", VOCAB).threshold_on == "normalized"  # no threshold named
    assert parse_query("?view=graph&metric=z", VOCAB).rank_on == "z"
    assert parse_query("?view=graph&metric=cs", VOCAB).rank_on == "pk"
    assert format_threshold(0.30000000000000004) == "0.3" and format_threshold(1234.5) == "1230"
    assert quantize_threshold(-8.1171) == -8.12


def test_graph_scale_controls() -> None:
    s = default_state(VOCAB, rule="threshold", threshold=0.3)
    assert apply_control(s, "threshold_on", "z", VOCAB) == s.with_(threshold_on="z", threshold=None)
    assert apply_control(s, "threshold_on", "fdr", VOCAB) == s.with_(threshold_on="fdr", threshold=0.05)
    assert apply_control(s, "threshold_on", "cs", VOCAB) == s
    assert apply_control(s, "rank_on", "z", VOCAB) == s.with_(rank_on="z", rule="topk")
    assert apply_control(s.with_(rule="topk"), "threshold_on", "pk", VOCAB).rule == "threshold"
    # A slider position is stored as the API applies it.
    assert apply_control(s, "threshold", 0.30000000000000004 + 0.0123, VOCAB).threshold == 0.312
    fresh = "?model=demo&view=graph"
    new = parse_query(next_query(fresh, [("threshold-on-radio", "fdr")], VOCAB), VOCAB)
    assert (new.rule, new.threshold_on, new.threshold) == ("threshold", "fdr", 0.05)
    q = parse_query(next_query(to_query(new), [("fdr-q-input", "0.01")], VOCAB), VOCAB)
    assert q.threshold == 0.01 and q.threshold_on == "fdr"
    assert parse_query(next_query(to_query(q), [("fdr-q-input", 5)], VOCAB), VOCAB).threshold == 0.2
    # A hidden control rendered without a value changes nothing.
    assert next_query(to_query(q), [("threshold-slider", None)], VOCAB) is None
    assert parse_query(next_query(fresh, [("rank-on-radio", "normalized")], VOCAB), VOCAB).rank_on == "normalized"
    # The slider showing the default threshold its graph applied (URL without one) is no change;
    # any other position, or a range for another graph, is.
    thr = "?model=demo&view=graph&rule=threshold"
    rng = {"key": ["demo", list(VOCAB.graph_pairings), "normalized", None], **slider_range(0.0468, 0.39)}
    assert next_query(thr, [("threshold-slider", rng["value"] + 1e-12)], VOCAB, None, rng) is None
    assert parse_query(next_query(thr, [("threshold-slider", 0.2)], VOCAB, None, rng), VOCAB).threshold == 0.2
    stale = {**rng, "key": ["demo", ["OK"], "normalized", None]}
    moved = next_query(thr, [("threshold-slider", rng["value"])], VOCAB, None, stale)
    assert parse_query(moved, VOCAB).threshold == rng["value"]


def test_slider_range_positions_are_applied_thresholds() -> None:
    r = slider_range(2.28413462638855, 6.244492530822754)
    assert (r["min"], r["max"], r["step"], r["value"]) == (2.28, 6.24, 0.01, 5.45)
    assert r["marks"] == {2.28: "2.28", 6.24: "6.24"}
    r = slider_range(0.04682771489024162, 0.3902807831764221)
    assert (r["min"], r["max"], r["step"], r["value"]) == (0.046, 0.39, 0.001, 0.322)
    r = slider_range(-8.117144584655762, 27.545856475830078)
    assert (r["min"], r["max"], r["value"]) == (-8.2, 27.5, 20.4)
    for lo, hi in [(0.0, 0.0), (6.24, 6.2449), (1e-9, 3e-9), (-1000.0, 999.7)]:
        r = slider_range(lo, hi)
        assert r["min"] < r["max"] and r["min"] <= r["value"] <= r["max"]
        assert all(quantize_threshold(v) == v for v in (r["min"], r["max"], r["value"]))
    capped = summary({"edge_counts": {"OK": 2000}, "capped": {"OK": 2400}, "graph": {"nodes": []}}, 0.1, "pk")
    hint = next(c for c in capped if getattr(c, "id", None) == "graph-capped")
    assert "OK: best 2000 of 2400" in hint.children


def test_graph_view_shows_the_applied_threshold(in_app: None, api: ApiClient, computed: list[str]) -> None:
    search = "?model=demo&view=graph&rule=threshold"  # normalized scale, no threshold: the default
    state = parse_query(search, VOCAB)
    fig, chips, slider, edges, _ = render_graph(search, READY, None)
    lo = min(api.pk("demo", p, "normalized")["min"] for p in VOCAB.graph_pairings)
    hi = max(api.pk("demo", p, "normalized")["max"] for p in VOCAB.graph_pairings)
    assert {k: v for k, v in slider.items() if k != "key"} == slider_range(lo, hi)
    applied = slider["value"]
    expected = api.graph("demo", list(VOCAB.graph_pairings), k=None, threshold=applied,
                         threshold_on="normalized", labels="patterns")
    rule = find(chips, "graph-rule").children
    assert rule == expected["rule"] == f"normalized PK >= {format_threshold(applied)}"
    assert getattr(find(chips, "stat-threshold"), "data-value") == format_threshold(applied)
    assert int(edges) == sum(expected["edge_counts"].values())
    assert expected["rule"] in fig.layout.title.text
    # The controls built from the URL show that threshold on the slider, on the normalized scale.
    _, _, groups, _ = render_controls(search, [], [], slider)
    slider_c = find(groups, "threshold-slider")
    assert (slider_c.value, slider_c.min, slider_c.max) == (applied, slider["min"], slider["max"])
    assert find(groups, "threshold-on-radio").value == "normalized"
    assert find(groups, "threshold-box").style == {"display": "block"}
    assert find(groups, "fdr-box").style == {"display": "none"}
    # A range for another scale or threshold is not this graph's: a placeholder around the URL's value.
    other = parse_query(to_query(state.with_(threshold_on="z", threshold=12.5)), VOCAB)
    _, _, groups, _ = render_controls(to_query(other), [], [], slider)
    assert find(groups, "threshold-slider").value == 12.5 and find(groups, "threshold-slider").max == 12.5
    # FDR: q in its own input, edges as the API's for threshold_on=fdr.
    fdr = to_query(state.with_(threshold_on="fdr", threshold=0.01))
    _, chips, _, edges, _ = render_graph(fdr, READY, None)
    served = api.graph("demo", list(VOCAB.graph_pairings), k=None, threshold=0.01, threshold_on="fdr",
                       labels="patterns")
    assert int(edges) == sum(served["edge_counts"].values())
    assert getattr(find(chips, "stat-threshold"), "data-value") == "0.01"
    _, _, groups, _ = render_controls(fdr, [], [], slider)
    assert find(groups, "fdr-q-input").value == 0.01 and find(groups, "threshold-slider").value is None
    assert find(groups, "fdr-box").style == {"display": "inline-block"}
    assert find(groups, "threshold-box").style == {"display": "none"}
    # Top-k: the ranking scale's radio (no CS), the rule the API names.
    _, chips, _, _, _ = render_graph("?model=demo&view=graph&rank_on=z&k=5", READY, None)
    assert find(chips, "graph-rule").children == "top-5 per pairing by z-score"
    _, _, groups, _ = render_controls("?model=demo&view=graph&rank_on=z", [], [], None)
    radio = find(groups, "rank-on-radio")
    assert radio.value == "z" and [o["value"] for o in radio.options] == ["pk", "normalized", "z"]
    assert find(groups, "ctl-metric").style == {"display": "none"}  # the heatmap metric (with CS) is not shown


def test_the_api_client_acts_for_one_browser_user():
    """Each callback's client carries that browser's own token and address, nothing else:
    the dashboard has no token of its own, and the API's per-client limits count browsers."""
    import httpx

    from headgraph.frontend.api.client import ApiClient

    seen: list[httpx.Headers] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers)
        return httpx.Response(200, json={"mode": "token", "authorized": True, "can": []})

    base = ApiClient("http://api", http=httpx.Client(base_url="http://api",
                                                     transport=httpx.MockTransport(answer)))
    base.auth()
    alice = base.as_user("alice-token-0123456789", "10.0.0.7")
    alice.auth()
    base.as_user(None, None).auth()
    assert "authorization" not in seen[0] and "x-forwarded-for" not in seen[0]
    assert seen[1]["authorization"] == "Bearer alice-token-0123456789"
    assert seen[1]["x-forwarded-for"] == "10.0.0.7"
    assert "authorization" not in seen[2]  # the shared client never kept alice's token
    assert base.as_user(None, None) is base


def test_views_fill_as_their_own_results_are_cached():
    """Issue 17: a cold model showed nothing until the whole job ended. With a running job's
    partial record each view renders once what it reads is cached; the panels once PK, CS
    and the class overlay's pattern scores are (the rest they show when cached); a waiting
    view names the stages it waits for."""
    from functools import partial as bind

    from headgraph.frontend.state.url import ViewState
    from headgraph.frontend.state.readiness import needed_stages, view_params, waiting_for

    VS = bind(ViewState, model="demo", pairings=("OQ", "OK", "OV"), k=20)

    plan = ["pk", "pk OQ", "pk OK", "pk OV", "cs Q", "cs K", "cs V", "patterns", "z OQ", "z OK",
            "z OV", "reference", "null OQ", "null OK", "null OV", "tokens O", "tokens V",
            "tokens Q", "tokens K"]

    def partial(n: int) -> dict:
        return {"model": "demo", "token": f"job1:{n}", "partial": True, "computed": plan[:n],
                "plan": plan}

    heat = VS(view="heatmap", pairing="OK", metric="raw", overlay="")
    first = next(n for n in range(len(plan) + 1) if view_params(heat, "heatmap", partial(n)))
    assert plan[first - 1] == "cs V"  # PK and CS (its hover) are all a plain heatmap needs
    assert view_params(heat, "heatmap", partial(first))["ready"] == "job1:partial"
    assert view_params(heat, "heatmap", partial(first + 3)) == view_params(heat, "heatmap",
                                                                            partial(first))
    z = VS(view="heatmap", pairing="OK", metric="z", overlay="")
    assert not view_params(z, "heatmap", partial(plan.index("z OK")))
    assert view_params(z, "heatmap", partial(plan.index("z OK") + 1))
    graph = VS(view="graph")  # default overlay: the model's patterns
    assert needed_stages(graph, "graph") is not None and "patterns" in needed_stages(graph, "graph")
    assert not view_params(graph, "graph", partial(plan.index("patterns")))
    assert view_params(graph, "graph", partial(plan.index("patterns") + 1))
    ref = VS(view="reference")
    assert not view_params(ref, "reference", partial(plan.index("null OV")))
    assert view_params(ref, "reference", partial(plan.index("null OV") + 1))
    pair = VS(view="graph", pairing="OK", pair="L0H0,L1H0")
    assert not view_params(pair, "pair-panel", partial(plan.index("patterns")))
    assert view_params(pair, "pair-panel", partial(plan.index("patterns") + 1))  # before z, nulls, tokens
    assert view_params(VS(view="graph", head="L0H0", overlay=""), "head-panel", partial(plan.index("cs V") + 1))
    assert waiting_for(z, partial(plan.index("z OQ")), "heatmap").startswith("waiting for z OK (")
    assert waiting_for(graph, partial(3), "graph").startswith("waiting for pk OV, cs Q, cs K, cs V and 1 more (")
    assert waiting_for(graph, partial(7), "graph").startswith("waiting for patterns (")
    assert waiting_for(graph, None, "graph").startswith("waiting for the model's results")
    done = {"model": "demo", "token": "job1"}
    assert view_params(pair, "pair-panel", done)["ready"] == "job1"
    assert not view_params(heat, "heatmap", {**partial(len(plan)), "model": "other"})


def test_a_busy_get_waits_its_turn_and_a_post_does_not():
    import httpx

    from headgraph.frontend.api.client import ApiClient, ApiError

    answers = {"GET": [429, 429, 200], "POST": [429, 200]}
    calls: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        calls.append(request.method)
        status = answers[request.method].pop(0)
        body = {"ok": True} if status == 200 else {"error": {"status": 429, "message": "busy"}}
        return httpx.Response(status, json=body)

    client = ApiClient("http://api", http=httpx.Client(base_url="http://api",
                                                       transport=httpx.MockTransport(answer)))
    assert client.get("/api/pk") == {"ok": True} and calls == ["GET"] * 3
    try:
        client.request("POST", "/api/models/compute")
        raise AssertionError("a POST must not be repeated")
    except ApiError as err:
        assert err.status == 429 and calls.count("POST") == 1
    impatient = ApiClient("http://api", busy_wait_s=0, http=httpx.Client(
        base_url="http://api", transport=httpx.MockTransport(lambda r: httpx.Response(429, json={}))))
    try:
        impatient.get("/api/pk")
        raise AssertionError("429 must surface once the wait is over")
    except ApiError as err:
        assert err.status == 429


def test_heatmap_grain_and_zoom_round_trip_and_clicks() -> None:
    s = parse_query("?model=demo&view=heatmap&grain=layers", VOCAB)
    assert s.grain == "layers" and s.zoom is None
    zoomed = apply_click(s, "heatmap", {"points": [{"x": "L1", "y": "L0"}]}, VOCAB)
    assert (zoomed.grain, zoomed.zoom) == ("heads", ("L0", "L1"))
    assert parse_query(to_query(zoomed), VOCAB) == zoomed
    assert parse_query("?zoom=L0,H1", VOCAB).zoom is None and parse_query("?grain=bogus", VOCAB).grain == "heads"
    assert apply_click(zoomed, "heatmap", {"points": [{"x": "L1H2", "y": "L0H3"}]}, VOCAB).pair == ("L0H3", "L1H2")
    back = next_state(zoomed, "grain-radio", "layers", VOCAB)
    assert (back.grain, back.zoom) == ("layers", None)


def test_rendered_views_is_a_bounded_lru() -> None:
    from headgraph.frontend.api.context import RenderedViews

    views = RenderedViews(capacity=2)
    views.put("a", (1,))
    views.put("b", (2,))
    assert views.get("a") == (1,)  # a is now the most recent
    views.put("c", (3,))
    assert views.get("b") is None and views.get("a") == (1,) and views.get("c") == (3,)


def test_a_running_circuits_time_left_is_its_elapsed_time_scaled_by_the_share_to_do():
    from headgraph.frontend.callbacks.task import circuit_time_left, poll_view

    assert circuit_time_left(0.02, 30.0) == "estimating time left…"  # under 5% done: no estimate
    assert circuit_time_left(0.25, 60.0) == "about 3 min left"  # 60 s for a quarter: 180 s more
    assert circuit_time_left(0.5, 20.0) == "about 20 s left"
    running = {"state": "running", "stage": "attribution", "fraction": 0.25, "message": "pass 3 of 12",
               "elapsed_s": 60.0}
    label = poll_view(running)[2]
    assert label == "attribution · 25% · pass 3 of 12 · 60 s · about 3 min left"


def test_a_running_jobs_label_counts_its_time_left_down():
    """The model bar's label: stage, share done and the time left counted down from the job's
    finish_by to now (or "estimating" without one, "finishing" past it); a finished job's
    label is its message."""
    from headgraph.frontend.callbacks.model import progress_view, time_left

    job = {"state": "running", "stage": "z OQ", "fraction": 0.04, "finish_by": 1000.0,
           "message": "computing z OQ; about 3 min left"}
    assert time_left(job, now=1000.0 - 185) == "about 3 min left"
    assert time_left(job, now=1000.0 - 42) == "about 40 s left"
    assert time_left(job, now=1001.0) == "finishing (past the estimate)"
    assert time_left({**job, "finish_by": None}) == "estimating time left…"
    _, bar, label, state = progress_view({**job, "finish_by": None})
    assert label == "z OQ · 4% · estimating time left…" and state == "running"
    assert bar == {"width": "4.0%"}
    done = progress_view({"state": "done", "stage": "done", "fraction": 1.0, "message": "27 computations cached"})
    assert done[2] == "done · 100% · 27 computations cached"
