"""Edge verification and the graph at real sizes in the dashboard, without a browser.

URL state of the verification control, the layer range and the head search; the pure filters
(graph_filters); the graph figure and the pair panel's verdict on the demo computed through the
real in-process API, compared with the API's GET /api/ablation answers. Rendering reads
verdicts from the cache only: a render before any verification leaves no ablation cached.
"""

from __future__ import annotations

import pytest

from frontend_support import READY, find, lab_dashboard
from headgraph.server.http.routers.vocabulary import served_vocabulary as vocabulary
from headgraph.frontend.api.client import ApiClient
from headgraph.frontend.callbacks.graph import ablation_digest, graph_view
from headgraph.frontend.callbacks.navigation import render_controls
from headgraph.frontend.callbacks.verify import render_pair_ablation
from headgraph.frontend.figures.verdicts import VERDICT_STYLES, verdict_line
from headgraph.frontend.figures.graph_filters import (filter_layers, find_matches, keep_verified, verdict_counts,
                                              verdict_map, verify_k)
from headgraph.frontend.state.url import default_state, parse_query, to_query
from headgraph.frontend.state.readiness import view_params
from headgraph.frontend.state.transitions import next_state
from headgraph.frontend.api.names import Vocabulary

VOCAB = Vocabulary.from_json(vocabulary())


# -- URL state ----------------------------------------------------------------------------------

def test_verification_layers_and_find_round_trip_through_the_url() -> None:
    state = default_state(VOCAB, verification="colour", layers=(10, 20), find="L17KV1", head="L17KV1")
    query = to_query(state)
    assert "verification=colour" in query and "layers=10-20" in query and "find=L17KV1" in query
    assert parse_query(query, VOCAB) == state
    loose = parse_query("?layers=20 - 10&find=l17&verification=verified", VOCAB)
    assert (loose.layers, loose.find, loose.verification) == ((10, 20), "L17", "verified")
    assert parse_query("?layers=7", VOCAB).layers == (7, 7)
    bad = parse_query("?layers=a-b&find=12&verification=maybe", VOCAB)  # no letter: no head, layer or class
    assert (bad.layers, bad.find, bad.verification) == (None, "", "off")
    assert "layers=" not in to_query(default_state(VOCAB)) and "find=" not in to_query(default_state(VOCAB))


def test_typing_a_head_name_opens_its_panel_and_a_layer_only_highlights() -> None:
    state = default_state(VOCAB, pair=("L0H0", "L1H3"))
    exact = next_state(state, "find-input", "l1h3", VOCAB)
    assert (exact.find, exact.head, exact.pair) == ("L1H3", "L1H3", None)
    layer = next_state(state, "find-input", "L1", VOCAB)
    assert (layer.find, layer.head, layer.pair) == ("L1", None, ("L0H0", "L1H3"))
    assert next_state(layer, "find-input", "%%", VOCAB) == layer  # no head, layer or class: unchanged
    assert next_state(layer, "find-input", "", VOCAB).find == ""
    ranged = next_state(state, "layers-input", "3-1", VOCAB)
    assert ranged.layers == (1, 3) and next_state(ranged, "layers-input", "x", VOCAB) == ranged
    assert next_state(ranged, "layers-input", " ", VOCAB).layers is None
    assert next_state(state, "verification-radio", "colour", VOCAB).verification == "colour"
    assert next_state(state, "verification-radio", "bogus", VOCAB) == state


def test_the_controls_show_the_url_values(in_app: None) -> None:
    search = "?model=demo&view=graph&verification=verified&layers=0-1&find=L1"
    _, _, groups, _ = render_controls(search, [], [], None)
    assert find(groups, "verification-radio").value == "verified"
    assert find(groups, "layers-input").value == "0-1" and find(groups, "find-input").value == "L1"
    assert find(groups, "ctl-filter").style == {"display": "flex"}
    _, _, groups, _ = render_controls("?view=heatmap", [], [], None)
    assert find(groups, "ctl-verification").style == {"display": "none"}


# -- pure filters -------------------------------------------------------------------------------

NODE_LINK = {"nodes": [{"id": "L3H0", "layer": 3}, {"id": "L5H1", "layer": 5}, {"id": "L5KV0", "layer": 5,
                                                                                 "kind": "kv_group"},
                       {"id": "L9H2", "layer": 9}],
             "edges": [{"source": "L3H0", "target": "L5KV0", "pairing": "OK"},
                       {"source": "L5H1", "target": "L9H2", "pairing": "OQ"},
                       {"source": "L3H0", "target": "L5H1", "pairing": "OQ"}]}


def test_layer_range_keeps_edges_with_both_ends_inside() -> None:
    inside = filter_layers(NODE_LINK, (3, 5))
    assert [n["id"] for n in inside["nodes"]] == ["L3H0", "L5H1", "L5KV0"]
    assert [(e["source"], e["target"]) for e in inside["edges"]] == [("L3H0", "L5KV0"), ("L3H0", "L5H1")]
    assert filter_layers(NODE_LINK, None) is NODE_LINK
    assert find_matches(["L3H0", "L5H1", "L5KV0", "L15H1"], "L5") == ["L5H1", "L5KV0"]
    assert find_matches(["L3H0", "L5KV0"], "l5kv0") == ["L5KV0"] and find_matches(["L3H0"], "L5H1") == []


def test_verdicts_cover_the_top_edges_and_filter() -> None:
    top_max = VOCAB.limits.ablation_top_max
    assert top_max == 50  # the API's bound on one ablation request
    assert verify_k(("OQ", "OK", "OV"), "topk", 70, {}, top_max) == {"OQ": 50, "OK": 50, "OV": 50}
    assert verify_k(("OK", "OV"), "threshold", 20, {"OK": 12, "OV": 0}, top_max) == {"OK": 12}
    verdicts = verdict_map([{"pairing": "OQ", "edges": [
        {"source": "L5H1", "target": "L9H2", "pairing": "OQ", "verdict": "verified"},
        {"source": "L3H0", "target": "L5H1", "pairing": "OQ", "verdict": "no effect"}]}])
    assert verdict_counts(NODE_LINK["edges"], verdicts) == {"verified": 1, "no effect": 1, "not measured": 1,
                                                             "null not computed": 0, "null too small": 0}
    only = keep_verified(NODE_LINK, verdicts)
    assert [e["target"] for e in only["edges"]] == ["L9H2"] and {n["id"] for n in only["nodes"]} == {"L5H1", "L9H2"}


# -- on the demo, through the API ---------------------------------------------------------------

def graph_params(search: str) -> dict:
    p = view_params(parse_query(search, VOCAB), "graph", READY)
    assert p is not None
    return p


def edge_verdicts(fig) -> dict[tuple[str, str, str], str]:
    return {(cd[1], cd[2], cd[3]): cd[4] for tr in fig.data for cd in (tr.customdata or [])
            if isinstance(cd, (list, tuple)) and cd and cd[0] == "edge"}


def test_graph_colours_edges_by_the_cached_verdicts(in_app: None, api: ApiClient, computed: list[str]) -> None:
    k = 10
    search = f"?model=demo&view=graph&pairings=OK&k={k}&rule=topk&rank_on=pk&overlay=&verification=colour"
    params = graph_params(search)

    def ablations() -> list[str]:
        return [c for c in api.model_info("demo")["cached"] if c.startswith("ablation?")]

    before, digest = ablations(), ablation_digest(params)
    fig, chips, *_ = graph_view(params)
    # Reading never computes: every edge "not measured", no ablation cached by the render.
    assert set(edge_verdicts(fig).values()) == {"not measured"}
    assert getattr(find(chips, "stat-not-measured"), "data-value") == str(k)
    assert ablations() == before and ablation_digest(params) == digest

    measured = api.ablation("demo", "OK", top=2)  # the top 2, and the random-pair null with them
    assert ablation_digest(params) != digest  # so the rendered view is not served again
    fig, chips, *_ = graph_view(params)
    served = api.ablation("demo", "OK", top=k, cached=True)
    expected = {(e["source"], e["target"], "OK"): e["verdict"] for e in served["edges"]}
    assert edge_verdicts(fig) == expected
    # The null measured every one of the demo's 64 forward OK pairs, so every shown edge is judged
    # for the graph's ten edges together (q = 1 - 0.05 / 20); 54 null pairs halved cannot resolve
    # that quantile, so the verdict is refused: "null too small", drawn faint like "not measured".
    assert "not measured" not in expected.values() and {e["verdict"] for e in measured["edges"]} <= {
        "verified", "no effect", "null too small"}
    assert served["verdict_rule"]["quantile"] == pytest.approx(1 - 0.05 / 20)
    assert set(expected.values()) == {"null too small"}
    lines = {tr.meta: tr.line for tr in fig.data if tr.mode == "lines" and tr.meta}
    assert lines["null too small"].width == VERDICT_STYLES["not measured"][0]
    legend = {tr.name for tr in fig.data if tr.showlegend and str(tr.name).startswith("null too small")}
    assert legend == {f"null too small ({k})"}
    assert getattr(find(chips, "stat-null-too-small"), "data-value") == str(k)
    # A verified edge is drawn solid and bold (the style, independent of the demo's null).
    bold, faint = verdict_line("OK", 0.3, "verified", False), verdict_line("OK", 0.3, "no effect", False)
    assert bold["width"] > faint["width"] and bold["dash"] == "solid" and faint["dash"] == "dash"
    # "verified only" hides the rest: nothing is verified here.
    fig, chips, *_ = graph_view(graph_params(search.replace("colour", "verified")))
    assert set(edge_verdicts(fig).values()) <= {"verified"}
    assert getattr(find(chips, "stat-shown-edges"), "data-value") == "0"


def test_pair_panel_reads_the_verdict_and_offers_the_button(in_app: None, api: ApiClient,
                                                           computed: list[str]) -> None:
    search = "?model=demo&pairing=OV&pair=L0H5,L1H2"
    body, button, _ = render_pair_ablation(search, READY, None)
    assert getattr(find(body, "pair-verdict"), "data-verdict") == "not measured"
    assert button == {"display": "inline-block"}
    one = api.ablation("demo", "OV", edge="L0H5,L1H2")["edges"][0]
    body, button, _ = render_pair_ablation(search, READY, {"at": 1})
    assert getattr(find(body, "pair-verdict"), "data-verdict") == one["verdict"]
    # The verdict says what it means: above the random-pair null at a stated quantile (one edge, two sets).
    rule = find(body, "pair-verdict-rule")
    assert "random-pair null is too small to resolve q=0.975" in rule.children and one["verdict_note"] in rule.children
    assert float(getattr(rule, "data-quantile")) == pytest.approx(1 - 0.05 / 2)
    assert float(getattr(find(body, "pair-effect-text"), "data-value")) == pytest.approx(one["effect_text"])
    assert float(getattr(find(body, "pair-effect-random"), "data-value")) == pytest.approx(one["effect_random"])
    assert button == {"display": "none"}
    # A pairing ablation cannot measure, or no pair: no section, no button.
    assert render_pair_ablation("?model=demo&pairing=QK&pair=L0H5,L1H2", READY, None)[:2] == ([], {"display": "none"})


def test_layer_range_and_search_on_the_demo(in_app: None, api: ApiClient, computed: list[str]) -> None:
    search = "?model=demo&view=graph&pairings=OQ,OK,OV&k=5&rule=topk&rank_on=pk&overlay=&layers=1&find=L1H3"
    fig, chips, *_ = graph_view(graph_params(search))
    names = {cd[1] for tr in fig.data for cd in (tr.customdata or []) if cd and cd[0] == "node"}
    assert names == {f"L1H{h}" for h in range(8)}  # layer 1 only; every demo edge leaves layer 0
    assert not edge_verdicts(fig) and not [cd for tr in fig.data for cd in (tr.customdata or []) if cd[0] == "edge"]
    found = next(tr for tr in fig.data if str(tr.name).startswith("found"))
    assert [cd[1] for cd in found.customdata] == ["L1H3"]
    assert getattr(find(chips, "stat-found"), "data-value") == "L1H3"
    assert getattr(find(chips, "stat-shown-edges"), "data-value") == "0"
    served = api.graph("demo", ["OQ", "OK", "OV"], k=5)
    assert getattr(find(chips, "stat-edges"), "data-value") == str(sum(served["edge_counts"].values()))


def test_verifying_without_the_lab_token_shows_the_apis_refusal(tmp_path) -> None:
    from dash import no_update

    from headgraph.frontend.callbacks.verify import verify_edge, verify_top, verify_top_step

    with lab_dashboard(tmp_path, "verify-lab-token-0123456789") as http:
        refused = http.get("/api/ablation", params={"model": "demo", "pairing": "OK", "edge": "L0H0,L1H3"})
        assert refused.status_code == 401
        token, note = verify_edge(1, "?model=demo&pairing=OK&pair=L0H0,L1H3")
        assert token is no_update and note.children == refused.json()["error"]["message"]
        # The graph's button queues one step a pairing; the first step meets the refusal,
        # stops the queue (progress "failed", button enabled again) and shows the message.
        queue, *bar, note, arm = verify_top(1, "?model=demo&view=graph&pairings=OQ,OK&k=3&verification=colour", 4)
        assert queue["per"] == [["OQ", 3], ["OK", 3]] and queue["done"] == 0 and note == ""
        assert bar[3:] == ["running", "0.000", True, "progress indeterminate"] and "top 3 OQ edges (1 of 2)" in bar[2]
        assert arm == 5  # the tick fires once more, for the first step
        token, queue2, *bar, note, arm = verify_top_step(5, queue)
        assert token is no_update and queue2 is no_update and arm is no_update  # stopped
        assert bar[3:] == ["failed", "0.000", False, "progress"]
        assert note.children == refused.json()["error"]["message"]


def test_verifying_the_top_edges_steps_one_pairing_at_a_time(api: ApiClient, computed: list[str],
                                                               in_app: None) -> None:
    """The graph's button: a queue of the shown pairings, measured one per tick of a one-shot
    interval each step re-arms, the progress bar moving between them; the message counts the
    API's own verdicts. (OK and OV: the pairings whose random-pair nulls the tests above cached.)"""
    from dash import no_update

    from headgraph.frontend.callbacks.verify import verify_top, verify_top_step

    queue, *bar, note, arm = verify_top(1, "?model=demo&view=graph&pairings=OK,OV&k=2&verification=colour", None)
    assert queue["per"] == [["OK", 2], ["OV", 2]] and bar[3:] == ["running", "0.000", True, "progress indeterminate"]
    assert arm == 1
    token, queue, *bar, note, arm = verify_top_step(1, queue)
    assert token is no_update and note is no_update and queue["done"] == 1
    assert arm == 2  # re-armed for the next pairing
    assert bar[3:] == ["running", "0.500", True, "progress indeterminate"] and bar[1] == {"width": "50.0%"}
    assert "top 2 OV edges (2 of 2)" in bar[2]
    token, queue, *bar, note, arm = verify_top_step(2, queue)
    assert token["model"] == "demo" and bar[3:] == ["done", "1.000", False, "progress"] and arm is no_update
    served = [e["verdict"] for p in ("OK", "OV")
              for e in api.get("/api/ablation", model="demo", pairing=p, top=2, cached="true")["edges"]]
    assert "not measured" not in served and queue["verdicts"] == served
    assert f"{served.count('verified')} verified, {served.count('no effect')} no effect" in note.children
    assert verify_top_step(3, queue) == (no_update,) * 11  # a finished queue does nothing more


def test_the_verification_queue_shows_a_moving_bar_while_a_pairing_is_measured():
    """While a pairing is measured (no finer count: minutes on a real model) a stripe sweeps
    the bar (class "indeterminate") beside the share of pairings done; done, it stops."""
    from headgraph.frontend.callbacks.verify import queue_progress

    queue = {"per": [["OQ", 20], ["OK", 20], ["OV", 20]], "done": 0}
    style, bar, label, state, frac, busy, cls = queue_progress(queue)
    assert style == {"display": "flex"} and frac == "0.000"
    assert state == "running" and busy and "indeterminate" in cls.split()
    assert label == "measuring the top 20 OQ edges (1 of 3)…" and bar == {"width": "0.0%"}
    *_, state, frac, busy, cls = queue_progress({**queue, "done": 3})
    assert state == "done" and not busy and cls == "progress" and frac == "1.000"
    *_, state, _, busy, cls = queue_progress({**queue, "done": 1}, failed=True)
    assert state == "failed" and not busy and cls == "progress"
