"""Frontend pieces without a browser: URL state, figure builders, CSV/PNG exports, Dash wiring.

Figures and exports are fed the real API's JSON (the app runs in-process on the demo model)
and checked against independent numpy / networkx / csv computations on that same JSON.
"""

from __future__ import annotations

import contextvars
import time
from typing import Any
from collections.abc import Iterator

import dash

import pytest
from fastapi.testclient import TestClient

from dash._callback_context import context_value
from dash._utils import AttributeDict

from headgraph.core.vocabulary import vocabulary
from frontend_support import api, http  # noqa: F401  (fixtures found by name)
from headgraph.frontend.api_client import ApiClient
from headgraph.frontend.app import create_dash
from headgraph.frontend.callbacks.heatmap import render_heatmap
from headgraph.frontend.callbacks.model import is_complete, model_status
from headgraph.frontend.callbacks.navigation import WRITER_INPUTS, next_query, render_controls, show_views, write_url
from headgraph.frontend.callbacks.panels import render_head_panel, render_pair_panel
from headgraph.frontend.callbacks.scatter import render_scatter
from headgraph.frontend.context import CONFIG_KEY, FrontendContext
from headgraph.frontend.state import ViewState, default_state, parse_query, to_query, view_params
from headgraph.frontend.transitions import apply_click, apply_control, next_state
from headgraph.frontend.vocab import Vocabulary, VocabularyCache

VOCAB = Vocabulary.from_json(vocabulary())
READY = {"model": "demo", "token": "t1"}


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
