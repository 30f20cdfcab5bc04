"""The task view on the demo through the real in-process API: its URL state (task, method,
steps), its controls and readiness (it reads no result of the model's job), the task metric,
the table and the faithfulness curve carrying GET /api/circuit's numbers, the clean metric
checked again against the demo's own forward in float64, an unknown task's message, and a JSONL
upload stored, selected, or rejected naming its bad row."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
import pytest
import torch
from dash import no_update

from frontend_support import READY, find
from headgraph.server.http.routers.vocabulary import served_vocabulary as vocabulary
from headgraph.frontend.api.client import ApiClient
from headgraph.frontend.api.names import Vocabulary
from headgraph.frontend.callbacks.circuit_reads import pair_attribution
from headgraph.frontend.callbacks.graph import all_head_nodes, graph_view
from headgraph.frontend.callbacks.task import poll_view, task_name, task_view, upload_task
from headgraph.frontend.figures.common import fmt_value
from headgraph.frontend.figures.positions import grid_positions
from headgraph.frontend.figures.task import faithfulness_figure, table_rows, task_words
from headgraph.frontend.layout.controls import control_groups, task_options
from headgraph.frontend.state.readiness import view_params
from headgraph.frontend.state.transitions import next_state
from headgraph.frontend.state.url import parse_query, to_query

VOCAB = Vocabulary.from_json(vocabulary())
SEARCH = "?model=demo&view=task&task=induction&k=12"


def test_the_url_holds_the_task_method_and_steps() -> None:
    state = parse_query(SEARCH, VOCAB)
    assert (state.view, state.task, state.method, state.steps, state.k) == ("task", "induction", "eap-ig", 5, 12)
    assert parse_query(to_query(state), VOCAB) == state  # a copied link reopens the same circuit
    other = state.with_(task="mine.v2", method="eap", steps=9)
    assert parse_query(to_query(other), VOCAB) == other
    q = to_query(other.with_(view="graph"))  # a non-default task survives a trip through another tab
    assert "task=mine.v2" in q and parse_query(q, VOCAB).with_(view="task") == other
    # Forgiving parsing: a bad name, method or step count falls back to the default / bound.
    bad = parse_query("?view=task&task=../etc&method=ig&steps=999", VOCAB)
    assert (bad.task, bad.method, bad.steps) == ("induction", "eap-ig", 64)
    # Job-free: it renders with no ready record (computed on request), only on its own tab.
    params = view_params(state, "task", None)
    assert params == {"model": "demo", "task": "induction", "method": "eap-ig", "steps": 5, "k": 12, "pairs": 32,
                      "ready": None}
    # A bundled task cut to its first n prompt pairs (a quicker circuit of a large model): in the link.
    few = parse_query(SEARCH + "&pairs=4", VOCAB)
    assert few.pairs == 4 and "pairs=4" in to_query(few) and parse_query(to_query(few), VOCAB) == few
    assert "pairs=" not in to_query(state) and parse_query(SEARCH + "&pairs=99", VOCAB).pairs == 32
    assert view_params(state, "task", READY)["ready"] == "t1"
    assert view_params(state.with_(view="graph"), "task", READY) is None
    # The controls write the URL's fields; bad values leave the state as it is.
    assert next_state(state, "task-select", "ioi", VOCAB).task == "ioi"
    assert next_state(state, "task-select", "no/such", VOCAB).task == "induction"
    assert next_state(state, "method-radio", "eap", VOCAB).method == "eap"
    assert next_state(state, "method-radio", "gradients", VOCAB).method == "eap-ig"
    assert next_state(state, "steps-input", 12, VOCAB).steps == 12
    assert next_state(state, "steps-input", 0, VOCAB).steps == 1
    # A task is chosen only by a link naming one or by the task view (which names its task, the
    # default one too, in its links): then the graph and the pair panel read its circuit.
    plain = parse_query("?model=demo&view=graph", VOCAB)
    assert plain.task == "" and "task=" not in to_query(plain)
    assert view_params(plain, "graph", READY)["task"] == ""
    assert parse_query("?view=task", VOCAB).task == "induction"
    assert "task=induction" in to_query(plain.with_(view="task"))  # the task tab's link
    back = parse_query(to_query(parse_query("?view=task", VOCAB).with_(view="graph")), VOCAB)
    assert back.task == "induction" and view_params(back, "graph", READY)["task"] == "induction"
    assert view_params(plain.with_(pair=("L0H0", "L1H3")), "pair-panel", READY)["task"] == ""


def test_the_controls_of_the_task_tab() -> None:
    state = parse_query(SEARCH, VOCAB)
    groups = {g.id: g for g in control_groups(state, VOCAB, [])}
    shown = {gid for gid, g in groups.items() if g.style != {"display": "none"}}
    assert shown == {"ctl-task"}
    assert find(groups["ctl-task"], "task-select").value == "induction"
    assert find(groups["ctl-task"], "method-radio").value == "eap-ig"
    assert find(groups["ctl-task"], "steps-input").value == 5
    eap = {g.id: g for g in control_groups(state.with_(method="eap"), VOCAB, [])}
    assert find(eap["ctl-task"], "steps-box").style == {"display": "none"}  # EAP has no steps
    # Options: the API's tasks (uploaded ones marked), the current one always selectable.
    opts = task_options([{"name": "ioi", "bundled": True}, {"name": "mine", "bundled": False}], "gone")
    assert [(o["value"], o["label"]) for o in opts] == [("ioi", "ioi"), ("mine", "mine (uploaded)"),
                                                        ("gone", "gone")]
    # Until GET /api/tasks answers: core's bundled names, each selectable into the URL.
    from headgraph.core.names import BUNDLED_TASKS

    assert [o["value"] for o in task_options(None)] == list(BUNDLED_TASKS)
    assert all(next_state(state, "task-select", n, VOCAB).task == n for n in BUNDLED_TASKS)


@pytest.mark.slow
def test_the_metric_table_and_curve_carry_the_apis_numbers(in_app: None, api: ApiClient) -> None:
    from headgraph.core.circuits.bundled import bundled_task
    from headgraph.core.models.demo import load_demo_model

    assert {"ioi", "induction", "successor"} <= {t["name"] for t in api.tasks()}
    params = view_params(parse_query(SEARCH, VOCAB), "task", None)
    fig, chips, body, graph = task_view(params)
    data = api.circuit("demo", "induction", "eap-ig", 5, 12)  # what the view read (cached now)
    assert len(data["edges"]) == 12
    m = data["metrics"]
    # The task metric first: the demo does induction.
    assert getattr(find(chips, "stat-task-clean"), "data-value") == str(m["clean"])
    assert getattr(find(chips, "stat-task-corrupt"), "data-value") == str(m["corrupt"])
    assert getattr(find(chips, "stat-task-clean-acc"), "data-value") == str(m["clean_accuracy"])
    assert getattr(find(chips, "stat-task-able"), "data-value") == "yes" and m["able"]
    a = m["ability"]  # the two sign tests' p-values beside it and in the words
    assert getattr(find(chips, "stat-task-able-p"), "data-value") == f"{a['answer']['p']:.2g} · {a['follows']['p']:.2g}"
    assert find(body, "task-words-0").children.startswith("demo does 'induction'")
    assert f"distractor p = {a['answer']['p']:.2g} ({a['answer']['wins']}/{a['answer']['n']})" in task_words(data)[0]
    # Independent of the server: the demo's own forward on core's induction prompts, in float64.
    demo = load_demo_model()
    task = bundled_task("induction", demo)
    with torch.no_grad():
        demo64 = demo.double()
        for ids, field in ((task.clean, "clean"), (task.corrupt, "corrupt")):
            logits = demo64(torch.tensor(ids))[:, -1, :]
            rows = torch.arange(len(ids))
            diff = logits[rows, torch.tensor(task.answer)] - logits[rows, torch.tensor(task.distractor)]
            assert m[field] == pytest.approx(float(diff.mean()), rel=1e-4, abs=1e-4)
            if field == "clean":
                assert m["clean_accuracy"] == pytest.approx(float((diff > 0).double().mean()))
    # The table: a row per edge, the API's order and values.
    table = find(body, "task-table")
    for e, row in zip(data["edges"], table_rows(data)):
        for key in ("rank", "writer", "reader", "path", "score", "in_circuit"):
            cell = find(table, f"task-{e['rank']}-{key}")
            assert getattr(cell, "data-value") == repr(e[key]) and cell.children == row[key]
    assert find(table, "task-edge-13") is None
    # The strongest K-path edges run from L0H0 into layer 1 (the demo's induction circuit).
    k_edges = [e for e in api.circuit("demo", "induction", "eap-ig", 5, 200)["edges"] if e["path"] == "K"]
    assert k_edges[0]["writer"] == "L0H0" and k_edges[0]["reader"].startswith("L1")
    # The curve: sizes and recovered, the stated share, the smallest circuit reaching it.
    f = data["faithfulness"]
    curve, marker = fig.data
    assert list(curve.x) == f["sizes"] and list(curve.y) == f["recovered"]
    size = f["circuit_size"]
    assert size is not None and list(marker.x) == [size]
    assert f["recovered"][f["sizes"].index(size)] >= f["share"] >= 0.8
    assert all(r < f["share"] for n, r in zip(f["sizes"], f["recovered"]) if n < size)
    assert fig.layout.shapes[0].y0 == f["share"]
    assert fig.to_dict() == faithfulness_figure(data).to_dict()
    assert getattr(find(chips, "stat-task-circuit-size"), "data-value") == str(size)
    spearman = data["patching"]["spearman"]
    assert getattr(find(chips, "stat-task-spearman"), "data-value") == str(spearman)
    mib = data["mib"]  # MIB's areas over its grid of edge fractions, by numpy's trapezoid
    at = dict(zip(f["sizes"], f["metrics"]))
    fm = np.array([(at[n] - at[0]) / (f["clean"] - at[0]) for n in mib["sizes"]])
    assert mib["cpr"] == pytest.approx(float(np.trapezoid(fm, mib["fractions"])), abs=1e-9)
    assert getattr(find(chips, "stat-task-cpr"), "data-value") == str(mib["cpr"])
    assert getattr(find(chips, "stat-task-cmd"), "data-value") == str(mib["cmd"])
    assert [find(body, f"task-words-{i}").children for i in range(3)] == task_words(data)
    assert f"{data['patching']['n_edges']} edges: Spearman ρ = {spearman:.3f}" in task_words(data)[2]
    check_circuit_on_the_head_graph(api, data, graph)


def check_circuit_on_the_head_graph(api: ApiClient, data: dict, graph: Any) -> None:
    """The cached circuit drawn by the task view on the head graph's layout, marked on the graph
    view, and its edges' attribution in the pair panel (all read, none computed)."""
    circuit = data["circuit"]
    want = {(e["writer"], e["reader"].rsplit(".", 1)[0], "O" + e["path"]) for e in circuit
            if e["writer_kind"] == "head" and e["path"] in ("Q", "K", "V")}
    heads = ({e["writer"] for e in circuit if e["writer_kind"] == "head"}
             | {e["reader"].rsplit(".", 1)[0] for e in circuit if e["path"] in ("Q", "K", "V")})
    info = api.model_info("demo")["info"]
    layout = grid_positions({"nodes": all_head_nodes(info)}, info["layer_indices"])  # the graph view's grid
    drawn = {tuple(cd[1:4]): (x, y) for tr in graph.data for x, y, cd in zip(tr.x or [], tr.y or [], tr.customdata or [])
             if isinstance(cd, (list, tuple)) and cd[0] == "edge"}
    assert set(drawn) == want and want
    nodes = {cd[1]: (x, y) for tr in graph.data for x, y, cd in zip(tr.x or [], tr.y or [], tr.customdata or [])
             if isinstance(cd, (list, tuple)) and cd[0] == "node" and tr.name != "no edge"}
    assert all(nodes[h] == layout[h] for h in nodes) and set(nodes) == {h for k in want for h in k[:2]}
    ring = next(tr for tr in graph.data if tr.meta == "circuit-heads")
    assert {cd[1] for cd in ring.customdata} == heads
    # An edge's hover: its attribution and rank among all edges.
    by_key = {(e["writer"], e["reader"].rsplit(".", 1)[0], "O" + e["path"]): e for e in circuit}
    texts = {tuple(cd[1:4]): t for tr in graph.data if tr.text is not None and tr.customdata is not None
             for cd, t in zip(tr.customdata, tr.text) if cd[0] == "edge"}
    for key, text in texts.items():
        assert f"attribution {by_key[key]['score']:+.3g} (rank {by_key[key]['rank']} of {data['n_edges']})" in text
    # The graph view with the task chosen: its edges in the circuit underlaid, its heads ringed,
    # the legend "in induction circuit", node hovers with attribution; a chip says how many.
    search = "?model=demo&view=graph&k=8&task=induction&method=eap-ig&steps=5"
    gfig, gchips, *_ = graph_view(view_params(parse_query(search, VOCAB), "graph", READY))
    shown = {tuple(cd[1:4]) for tr in gfig.data for cd in (tr.customdata or [])
             if isinstance(cd, (list, tuple)) and cd[0] == "edge"}
    marked = shown & want
    under = [tr for tr in gfig.data if tr.meta == "circuit"]
    assert marked and len(under) == 1 and under[0].name == f"in induction circuit ({len(marked)} edges)"
    assert len([x for x in under[0].x if x is None]) == len(marked) and gfig.data[0].meta == "circuit"
    chip = find(gchips, "graph-circuit")
    assert getattr(chip, "data-edges") == str(len(marked))
    assert set(getattr(chip, "data-heads").split(",")) == heads
    hover = {cd[1]: cd[9] for tr in gfig.data for cd in (tr.customdata or [])
             if isinstance(cd, (list, tuple)) and cd[0] == "node" and len(cd) > 9}
    assert all("attribution, induction (EAP-IG)" in hover[h] for h in heads if h in hover)
    plain = graph_view(view_params(parse_query(search.replace("&task=induction", ""), VOCAB), "graph", READY))[0]
    assert not [tr for tr in plain.data if tr.meta in ("circuit", "circuit-heads")]  # no task chosen
    # The pair panel of the strongest K edge: its attribution and rank among all edges.
    top_k = next(e for e in circuit if e["path"] == "K" and e["writer_kind"] == "head")
    target = top_k["reader"].rsplit(".", 1)[0]
    state = parse_query(search + f"&pair={top_k['writer']},{target}&pairing=OK", VOCAB)
    line = pair_attribution(view_params(state, "pair-panel", READY), top_k["writer"], target)
    assert line is not None and getattr(line, "data-rank") == str(top_k["rank"])
    assert getattr(line, "data-score") == repr(top_k["score"]) and getattr(line, "data-in-circuit") == "yes"
    assert getattr(line, "data-n-edges") == str(data["n_edges"])
    # The progress poll: a cached circuit hides the bar and stops polling.
    assert poll_view(api.circuit_progress("demo", "induction", "eap-ig", 5))[-1] is True


def test_an_unknown_task_says_so(in_app: None) -> None:
    params = view_params(parse_query("?model=demo&view=task&task=no-such-task", VOCAB), "task", None)
    fig, chips, body, _ = task_view(params)
    assert "no-such-task" in str(chips) and body == []
    assert "no-such-task" in fig.layout.annotations[0].text


def encoded(rows: list[dict[str, str]]) -> str:
    """A dcc.Upload data URL of JSONL rows."""
    body = "".join(json.dumps(r) + "\n" for r in rows).encode()
    return "data:application/x-ndjson;base64," + base64.b64encode(body).decode()


ROW = {"clean": "t01 t02 t03 t01", "corrupt": "t05 t06 t07 t01", "answer": "t02", "distractor": "t09"}
ROW2 = {"clean": "t04 t08 t03 t04", "corrupt": "t05 t06 t07 t04", "answer": "t08", "distractor": "t09"}


def test_an_uploaded_task_is_stored_and_selected_and_a_bad_row_named(in_app: None, api: ApiClient) -> None:
    assert task_name("my tasks/ioi v2.jsonl") == "ioi-v2" and task_name("???.jsonl") == ""
    msg, cls, value, options, cleared = upload_task(encoded([ROW, ROW2]), "two rows.jsonl", "?model=demo&view=task")
    assert (value, cls, cleared) == ("two-rows", "upload-ok", None) and "2 prompt pairs" in msg
    listed = {t["name"]: t for t in api.tasks()}
    assert listed["two-rows"]["n_rows"] == 2 and not listed["two-rows"]["bundled"]
    assert {"label": "two-rows (uploaded)", "value": "two-rows", "title": ""} in options
    # The dropdown's new value is what the URL writer puts in the link.
    state = parse_query("?model=demo&view=task", VOCAB)
    assert next_state(state, "task-select", value, VOCAB).task == "two-rows"
    # A row the demo's tokens cannot take: the API's message names its line; nothing stored.
    msg, cls, value, _options, _ = upload_task(encoded([ROW, {**ROW, "corrupt": "t05 t06 t01"}]), "bad.jsonl",
                                               "?model=demo&view=task")
    assert cls == "upload-error shown" and value is no_update
    assert "line 2: clean and corrupt are 4 and 3 tokens" in str(msg)
    assert "bad" not in {t["name"] for t in api.tasks()}


@pytest.mark.slow
def test_the_able_chip_and_words_say_which_state(in_app: None, api: ApiClient) -> None:
    """Does not: the demo's subtraction (a circuit of 4 pairs, able decided on all 32); too few
    pairs to tell: an uploaded task of two rows. Each with the API's p-values, as an error note."""
    msg, *_ = upload_task(encoded([ROW, ROW2]), "few rows.jsonl", "?model=demo&view=task")
    assert "2 prompt pairs" in msg
    for search, state, first in (
            ("task=subtraction&pairs=4", "no", "demo does not do 'subtraction' (sign tests over 16 units of 32"),
            ("task=few-rows", "too few pairs", "Too few prompt pairs to tell whether demo does 'few-rows' "
                                               "(sign tests over 2 units of 2 prompt pairs")):
        params = view_params(parse_query(f"?model=demo&view=task&method=eap&{search}", VOCAB), "task", None)
        assert params is not None
        _fig, chips, body, _graph = task_view(params)
        data = api.circuit("demo", params["task"], "eap", 1, 12, pairs=params["pairs"])
        a = data["metrics"]["ability"]
        assert data["metrics"]["able"] is {"no": False, "too few pairs": None}[state]
        assert getattr(find(chips, "stat-task-able"), "data-value") == state
        assert getattr(find(chips, "stat-task-able-p"), "data-value") == \
            f"{a['answer']['p']:.2g} · {a['follows']['p']:.2g}"
        words = find(body, "task-words-0")
        assert words.children.startswith(first) and "error-note" in words.className
        assert f"clean above corrupt p = {a['follows']['p']:.2g} ({a['follows']['wins']}/{a['follows']['n']})" \
            in words.children


@pytest.mark.slow
def test_head_edges_carry_their_pk_and_cs_once_the_job_is_done(in_app: None, api: ApiClient,
                                                                computed: list[str]) -> None:
    state = parse_query(SEARCH, VOCAB).with_(k=60)  # the top 60 hold head -> head (Q / K / V) edges
    _fig, _chips, body, graph = task_view(view_params(state, "task", READY))  # READY: the demo's job is done
    data = api.circuit("demo", "induction", "eap-ig", 5, 60)
    table = find(body, "task-table")
    assert find(table, "task-1-pk") is not None and find(table, "task-1-cs") is not None
    head_edges = 0
    for e in data["edges"]:
        pk_cell, cs_cell = find(table, f"task-{e['rank']}-pk"), find(table, f"task-{e['rank']}-cs")
        if e["writer_kind"] != "head" or e["path"] not in ("Q", "K", "V"):
            assert getattr(pk_cell, "data-value") == "" and pk_cell.children == "–"
            continue
        head_edges += 1  # the pair endpoint, read on its own, gives the same PK and CS
        pair = api.pair("demo", "O" + e["path"], e["writer"], e["reader"].rsplit(".", 1)[0])
        assert float(getattr(pk_cell, "data-value")) == pytest.approx(pair["pk"])
        assert float(getattr(cs_cell, "data-value")) == pytest.approx(pair["cs"])
    assert head_edges >= 5
    # The circuit graph's edges carry the same PK and CS in their hovers.
    texts = {tuple(cd[1:4]): t for tr in graph.data if tr.text is not None and tr.customdata is not None
             for cd, t in zip(tr.customdata, tr.text) if cd[0] == "edge"}
    (s, t, p), text = sorted(texts.items())[0]
    pair = api.pair("demo", p, s, t)
    assert f"PK {fmt_value(pair['pk'])}" in text and f"CS {fmt_value(pair['cs'])}" in text
    # Before the job is done (no ready record) the table has no PK / CS columns.
    _fig, _chips, body, _graph = task_view(view_params(state, "task", None))
    assert find(find(body, "task-table"), "task-1-pk") is None
