"""The task view on the demo through the real in-process API: its URL state (task, method,
steps), its controls and readiness (it reads no result of the model's job), the task metric,
the table and the faithfulness curve carrying GET /api/circuit's numbers, the clean metric
checked again against the demo's own forward in float64, an unknown task's message, and a JSONL
upload stored, selected, or rejected naming its bad row."""

from __future__ import annotations

import base64
import json

import pytest
import torch
from dash import no_update

from frontend_support import READY, find
from headgraph.core.names import vocabulary
from headgraph.frontend.api.client import ApiClient
from headgraph.frontend.api.names import Vocabulary
from headgraph.frontend.callbacks.task import task_name, task_view, upload_task
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
    assert params == {"model": "demo", "task": "induction", "method": "eap-ig", "steps": 5, "k": 12, "ready": None}
    assert view_params(state, "task", READY)["ready"] == "t1"
    assert view_params(state.with_(view="graph"), "task", READY) is None
    # The controls write the URL's fields; bad values leave the state as it is.
    assert next_state(state, "task-select", "ioi", VOCAB).task == "ioi"
    assert next_state(state, "task-select", "no/such", VOCAB).task == "induction"
    assert next_state(state, "method-radio", "eap", VOCAB).method == "eap"
    assert next_state(state, "method-radio", "gradients", VOCAB).method == "eap-ig"
    assert next_state(state, "steps-input", 12, VOCAB).steps == 12
    assert next_state(state, "steps-input", 0, VOCAB).steps == 1


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


@pytest.mark.slow
def test_the_metric_table_and_curve_carry_the_apis_numbers(in_app: None, api: ApiClient) -> None:
    from headgraph.core.circuits.tasks import bundled_task
    from headgraph.core.models.demo import load_demo_model

    assert {"ioi", "induction", "successor"} <= {t["name"] for t in api.tasks()}
    params = view_params(parse_query(SEARCH, VOCAB), "task", None)
    fig, chips, body = task_view(params)
    data = api.circuit("demo", "induction", "eap-ig", 5, 12)  # what the view read (cached now)
    assert len(data["edges"]) == 12
    m = data["metrics"]
    # The task metric first: the demo does induction.
    assert getattr(find(chips, "stat-task-clean"), "data-value") == str(m["clean"])
    assert getattr(find(chips, "stat-task-corrupt"), "data-value") == str(m["corrupt"])
    assert getattr(find(chips, "stat-task-clean-acc"), "data-value") == str(m["clean_accuracy"])
    assert getattr(find(chips, "stat-task-able"), "data-value") == "yes" and m["able"]
    assert find(body, "task-words-0").children.startswith("demo does 'induction'")
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
    assert [find(body, f"task-words-{i}").children for i in range(3)] == task_words(data)
    assert f"{data['patching']['n_edges']} edges: Spearman ρ = {spearman:.3f}" in task_words(data)[2]


def test_an_unknown_task_says_so(in_app: None) -> None:
    params = view_params(parse_query("?model=demo&view=task&task=no-such-task", VOCAB), "task", None)
    fig, chips, body = task_view(params)
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
def test_head_edges_carry_their_pk_and_cs_once_the_job_is_done(in_app: None, api: ApiClient,
                                                                computed: list[str]) -> None:
    state = parse_query(SEARCH, VOCAB).with_(k=60)  # the top 60 hold head -> head (Q / K / V) edges
    _fig, _chips, body = task_view(view_params(state, "task", READY))  # READY: the demo's job is done
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
    # Before the job is done (no ready record) the table has no PK / CS columns.
    _fig, _chips, body = task_view(view_params(state, "task", None))
    assert find(find(body, "task-table"), "task-1-pk") is None
