"""The evidence layer in the dashboard, without a browser: what the views show of the API's
baselines and flags (issue 15 item 5) on the demo model computed through the real API.

- tokens: lists no better than random subspaces of their rank are greyed and say so, with a
  count chip;
- graph: each node's hover says what its head does, edges from attention sinks are dotted, the
  summary describes the hubs (ties as ties) and counts sink edges, or says "not measured";
- head panel: what the head does and whether it is a sink;
- reference: the random-initialization null beside the Haar and anisotropic ones.
Every shown value is checked against the API's own JSON.
"""

from __future__ import annotations

from frontend_support import READY, find
from headgraph.frontend.api.client import ApiClient
from headgraph.frontend.callbacks.graph import evidence_chips, graph_view
from headgraph.frontend.callbacks.panels import render_head_panel
from headgraph.frontend.callbacks.reference import reference_view
from headgraph.frontend.callbacks.tokens import TOKENS_SHOWN, tokens_view
from headgraph.frontend.state.url import parse_query
from headgraph.frontend.state.readiness import view_params
from headgraph.frontend.api.names import Vocabulary
from headgraph.server.http.routers.vocabulary import served_vocabulary as vocabulary

VOCAB = Vocabulary.from_json(vocabulary())


def params(search: str, view: str) -> dict:
    p = view_params(parse_query(search, VOCAB), view, READY)
    assert p is not None
    return p


def test_token_lists_at_random_level_are_greyed_and_counted(in_app: None, api: ApiClient,
                                                             computed: list[str]) -> None:
    tok_fig, _pat, chips, _n = tokens_view(params("?model=demo&view=tokens&role=O", "tokens"))
    served = api.tokens("demo", "O", k=TOKENS_SHOWN)
    chip = find(chips, "stat-token-above-baseline")
    assert getattr(chip, "data-value") == str(served["n_above_baseline"])
    heat = tok_fig.data[0]
    by_cell = {(h["layer"], h["head"]): h for h in served["heads"]}
    layers = sorted({h["layer"] for h in served["heads"]})
    greyed = {(layers[r], c) for r, row in enumerate(heat.text) for c, t in enumerate(row) if "<i>" in t}
    assert greyed == {k for k, h in by_cell.items() if h["above_baseline"] is False}
    assert 0 < len(greyed) < len(by_cell)  # the demo has both kinds
    for (layer, head), h in by_cell.items():
        hover = heat.customdata[layers.index(layer)][head]
        assert ("at random level" in hover) is (h["above_baseline"] is False), hover


def test_graph_says_what_heads_do_and_marks_sink_edges(in_app: None, api: ApiClient,
                                                       computed: list[str]) -> None:
    search = "?model=demo&view=graph&pairings=OQ,OK,OV&k=20&rule=topk&rank_on=pk&overlay="
    fig, chips, *_ = graph_view(params(search, "graph"))
    served = api.graph("demo", ["OQ", "OK", "OV"], k=20, threshold=None, threshold_on="pk", labels=None)
    assert served["flags"]["measured"] is True  # the job computed the pattern scores
    nodes = {n["id"]: n for n in served["graph"]["nodes"]}
    hovers = {cd[1]: cd[8] for tr in fig.data for cd in (tr.customdata or [])
              if cd is not None and cd[0] == "node" and len(cd) > 8}
    assert set(hovers) == set(nodes)
    for name, n in nodes.items():
        assert f"what it does: {n['description']}" in hovers[name]
        assert ("attention sink" in hovers[name]) is bool(n["sink"])
    dotted = sum(len([x for x in tr.x if x is not None]) // 2 for tr in fig.data
                 if tr.mode == "lines" and tr.line.dash == "dot")
    assert dotted == sum(bool(e["source_sink"]) for e in served["graph"]["edges"])
    sink = find(chips, "stat-sink-edges")
    assert getattr(sink, "data-value") == str(sum(served["flags"]["sink_edges"].values()))
    what = find(chips, "graph-hub-what")
    rows = {r["name"]: r for r in served["hubs"]["rows"]}
    for hub in served["hubs"]["hubs"]:
        assert f"{hub}: {rows[hub]['description']}" in what.children
    assert getattr(what, "data-tie") == ",".join(served["hubs"]["top_tie"])
    # A graph without flags (pattern scores not computed yet) says so instead.
    unmeasured = evidence_chips({"flags": {"measured": False}, "hubs": served["hubs"]})
    assert "not measured" in unmeasured[0].children


def test_head_panel_says_what_the_head_does(in_app: None, api: ApiClient, computed: list[str]) -> None:
    body = render_head_panel("?model=demo&head=L0H0", READY, None)
    served = api.get("/api/head", model="demo", head="L0H0")["flags"]
    what = find(body, "head-what")
    assert getattr(what, "data-description") == served["description"] == "previous-token"
    assert getattr(what, "data-sink") == str(bool(served["sink"])).lower()


def test_reference_shows_the_random_init_null(in_app: None, api: ApiClient, computed: list[str]) -> None:
    _kl, _hist, null_fig, chips, _ = reference_view(params("?model=demo&view=reference&pairing=OK", "reference"))
    nulls = api.reference("demo")["nulls"]
    assert float(getattr(find(chips, "stat-init-mean"), "data-value")) == nulls["OK"]["summary_random_init"]["mean"]
    assert getattr(find(chips, "stat-above-init"), "data-value") == str(nulls["OK"]["above_random_init_q95"])
    init = next(t for t in null_fig.data if t.name.startswith("random-init"))
    names = list(null_fig.layout.xaxis.ticktext)
    assert list(init.y) == [nulls[p]["summary_random_init"]["mean"] for p in names]
