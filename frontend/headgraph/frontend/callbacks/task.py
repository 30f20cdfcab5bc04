"""The task view: which head-to-head edges carry a behaviour (GET /api/circuit).

Renders the URL's task (GET /api/tasks: the bundled ones, ioi to mcqa, and the uploaded
ones), method (eap | eap-ig) and steps: the task metric first (clean and corrupt logit
difference and accuracy; whether the model does the task: yes, no or too few pairs to tell,
with the p-values of its two sign tests), the circuit's
top k edges as a table (source, target, reader, attribution, in the circuit; once the model's
job is done, a head -> head edge's PK and CS of the pairing O -> its Q / K / V input, from GET
/api/pk and /api/cs), the faithfulness curve (share of the gap recovered vs circuit size, the
stated share and the smallest circuit reaching it) and the EAP vs patching Spearman. It reads
no result of the model's job: a cold circuit is computed on request (a minute or more on a real
model; in a lab it needs the token: the refusal is shown), while a progress bar polls GET
/api/circuit/progress every second (stage and fraction of the run). The circuit is also drawn
on the head graph's layered layout (figures.graph with figures.circuit's marks).
A JSONL file dropped on the view's upload box is stored through POST /api/tasks under its file's
name (rows checked in the model's tokens; a bad row's message names its line) and selected.
"""

from __future__ import annotations

import re
from pathlib import PurePath
from typing import Any

import plotly.graph_objects as go
from dash import Input, Output, State, ctx, html, no_update

from headgraph.frontend.api.answers import CircuitOut, CircuitProgressOut, ScoreGrid
from headgraph.frontend.api.client import ApiError
from headgraph.frontend.callbacks.common import api, error_note, stat, state_of
from headgraph.frontend.callbacks.define import callback
from headgraph.frontend.callbacks.graph import all_head_nodes
from headgraph.frontend.callbacks.labels import decode_upload
from headgraph.frontend.callbacks.model import ESTIMATING, seconds_left
from headgraph.frontend.callbacks.router import view_callback
from headgraph.frontend.figures import empty_figure, graph_figure
from headgraph.frontend.figures.circuit import circuit_marks, circuit_node_link
from headgraph.frontend.figures.graph_filters import edge_counts
from headgraph.frontend.figures.graph_layers import EDGE_DRAW_LIMIT
from headgraph.frontend.figures.positions import grid_positions
from headgraph.frontend.figures.task import (
    ABLE_WORDS,
    TASK_EDGES_SHOWN_MAX,
    WeightGrids,
    edge_columns,
    faithfulness_figure,
    grid_value,
    number_text,
    table_rows,
    task_words,
    with_scores,
)
from headgraph.frontend.layout.controls import task_options
from headgraph.frontend.state.readiness import view_params
from headgraph.frontend.state.url import parse_task

HIDE = {"display": "none"}


def circuit_table(data: CircuitOut) -> html.Table:
    """The table (id "task-table"): a row per edge (id "task-edge-<rank>"), a cell per column
    (id "task-<rank>-<key>") whose data-value carries the API's value."""
    columns = edge_columns(data)
    head = html.Tr([html.Th(title) for _, title in columns])
    body = []
    for r in table_rows(data):
        rank = r["values"]["rank"]
        cells = []
        for key, _ in columns:
            value = r["values"].get(key)
            data_attrs: dict[str, Any] = {"data-value": "" if value is None else repr(value)}
            cells.append(html.Td(r[key], id=f"task-{rank}-{key}", **data_attrs))
        body.append(html.Tr(cells, id=f"task-edge-{rank}",
                            className="task-row" + (" task-in-circuit" if r["values"].get("in_circuit") else "")))
    return html.Table([html.Thead(head), html.Tbody(body)], id="task-table", className="paired-table")


def summary(data: CircuitOut) -> list[Any]:
    """Summary chips: the task metric first (clean, corrupt, accuracies, gap, able: yes, no or too
    few pairs, and its two sign tests' p-values), then the circuit (its size, the stated share,
    the edges scored), the EAP vs patching Spearman and MIB's CPR (area under the faithfulness
    curve over 0.1 %..100 % of edges, higher is better) and CMD (area under |1 - faithfulness|,
    lower is better)."""
    m = data.get("metrics") or {}
    a = m.get("ability") or {}
    able_p = " · ".join((number_text((a.get("answer") or {}).get("p"), "{:.2g}"),
                         number_text((a.get("follows") or {}).get("p"), "{:.2g}")))
    p = data.get("patching") or {}
    mib = data.get("mib") or {}
    return [stat("task", (data.get("task") or {}).get("name"), "task-name"),
            stat("clean metric", m.get("clean"), "task-clean", "{:.3f}"),
            stat("corrupt metric", m.get("corrupt"), "task-corrupt", "{:.3f}"),
            stat("clean accuracy", m.get("clean_accuracy"), "task-clean-acc", "{:.0%}"),
            stat("corrupt accuracy", m.get("corrupt_accuracy"), "task-corrupt-acc", "{:.0%}"),
            stat("able", ABLE_WORDS[m.get("able")], "task-able"),
            stat("able p (answer, follows)", able_p, "task-able-p"),
            stat("circuit size", data.get("circuit_size"), "task-circuit-size"),
            stat("share", data.get("share"), "task-share", "{:g}"),
            stat("edges scored", data.get("n_edges"), "task-n-edges"),
            stat("Spearman vs patching", p.get("spearman") if p.get("n_edges") else None, "task-spearman",
                 "{:.3f}"),
            stat("MIB CPR ↑", mib.get("cpr"), "task-cpr", "{:.3f}"),
            stat("MIB CMD ↓", mib.get("cmd"), "task-cmd", "{:.3f}")]


@view_callback("task", Output("task-curve", "figure"), Output("task-summary", "children"),
               Output("task-body", "children"), Output("task-graph", "figure"),
               Output("task-poll", "disabled", allow_duplicate=True),
               Output("task-progress", "style", allow_duplicate=True))
def render_task(search: str | None, ready: dict | None, label_sets: list | None) -> tuple:
    """The URL's task circuit, or why there is none; then the progress poll stops."""
    return (*task_view(view_params(state_of(search, label_sets), "task", ready)), True, HIDE)


def task_view(params: dict[str, Any] | None) -> tuple:
    """(curve figure, summary chips, body: words and table, or a message, circuit graph
    figure) for the task params (None: the view is not shown)."""
    if not params:
        return empty_figure(""), [], [], empty_figure("")
    steps = int(params["steps"]) if params["method"] == "eap-ig" else 1
    try:
        data = api().circuit(params["model"], params["task"], params["method"], steps,
                             min(int(params["k"]), TASK_EDGES_SHOWN_MAX), pairs=params.get("pairs"))
    except ApiError as err:
        return empty_figure(err.message, 220), [error_note(err.message)], [], empty_figure("")
    grids = (weight_grids(params["model"], data)
             if params.get("ready") and not str(params["ready"]).endswith(":partial") else {})
    data = with_scores(data, grids)
    words = [html.P(line, className="validation-line", id=f"task-words-{i}")
             for i, line in enumerate(task_words(data))]
    if not (data.get("metrics") or {}).get("able"):  # does not, or too few pairs to tell
        words[0] = html.P(words[0].children, className="validation-line error-note", id="task-words-0")
    return faithfulness_figure(data), summary(data), [*words, circuit_table(data)], circuit_graph(data, grids)


def circuit_graph(data: CircuitOut, grids: WeightGrids) -> go.Figure:
    """The circuit's head -> head edges on the head graph's layered layout (figures.graph:
    the same layer x head grid, KV diamonds, pairing colours; opacity = |attribution|), its
    heads ringed; an edge's hover gives its attribution and, once the model's job is done, PK
    and CS (``grids``, weight_grids); a head's its strongest edges' attribution."""
    try:
        info = api().model_info(data["model"])["info"]
    except ApiError as err:
        return empty_figure(err.message, 220)
    layer_indices = list(info["layer_indices"])
    backdrop = all_head_nodes(info)
    node_link = circuit_node_link(data, backdrop, EDGE_DRAW_LIMIT)
    for e in node_link["edges"]:
        pk, cs = grids.get(e["pairing"][1], (None, None))
        e["score"] = grid_value(pk, e["source"], e["target"]) if pk is not None else None
        e["cs"] = grid_value(cs, e["source"], e["target"]) if cs is not None else None
    marks = circuit_marks(data)
    pairings = sorted({e["pairing"] for e in node_link["edges"]})
    fig = graph_figure({"graph": node_link, "pairings": pairings, "layer_indices": layer_indices,
                        "edge_counts": edge_counts(node_link["edges"], pairings)},
                       grid_positions(node_link, layer_indices), layout="grid",
                       all_heads=[n["id"] for n in backdrop], head_pos=grid_positions({"nodes": backdrop}, layer_indices),
                       backdrop=backdrop, circuit=marks)
    size, drawn = data.get("circuit_size"), len(node_link["edges"])
    task = (data.get("task") or {}).get("name")
    fig.update_layout(title_text=f"{data.get('model')} · {task}: the circuit's head → head edges ({drawn} drawn of "
                                 f"{size if size is not None else 'no'} circuit edges; the rest read from or "
                                 "write to embeddings, MLPs or logits)", title_font_size=13)
    return fig


def poll_view(progress: CircuitProgressOut | None) -> tuple:
    """(bar style, fill style, label, data-state, data-fraction, poll disabled) of a GET
    /api/circuit/progress answer: a running circuit shows its stage and fraction and keeps the
    poll going; a cached one hides the bar and stops it; an idle one (not started yet, or its
    model loading) hides the bar and leaves the poll as it is (the view's answer stops it)."""
    state = (progress or {}).get("state")
    if state == "running":
        assert progress is not None
        frac = float(progress.get("fraction") or 0.0)
        elapsed = float(progress.get("elapsed_s") or 0.0)
        label = (f"{progress.get('stage')} · {frac * 100:.0f}% · {progress.get('message') or ''} · "
                 f"{elapsed:.0f} s · {circuit_time_left(frac, elapsed)}")
        return ({"display": "flex"}, {"width": f"{frac * 100:.1f}%"}, label, "running", f"{frac:.4f}", False)
    if state == "cached":
        return HIDE, {"width": "100%"}, "", "cached", "1", True
    return HIDE, no_update, "", state or "", "", no_update


def circuit_time_left(fraction: float, elapsed_s: float) -> str:
    """A running circuit's time left at the speed it has shown: the elapsed time scaled by
    the share still to do (the fraction the run reports, its stages weighted by their usual
    cost), once 5% of the run is done; "estimating time left…" before."""
    if fraction < 0.05 or elapsed_s <= 0:
        return ESTIMATING
    return seconds_left(elapsed_s * (1.0 - fraction) / fraction)


@callback(Output("task-progress", "style"), Output("task-progress-bar", "style"),
          Output("task-progress-label", "children"), Output("task-progress", "data-state"),
          Output("task-progress", "data-fraction"), Output("task-poll", "disabled"),
          Input("url", "search"), Input("task-poll", "n_intervals"))
def poll_task(search: str | None, _n: int | None) -> tuple:
    """While the task view shows a circuit not cached yet, poll its progress every second."""
    state = state_of(search)
    if state.view != "task":
        return HIDE, no_update, "", "", "", True
    params = view_params(state, "task", None)
    assert params is not None
    steps = int(params["steps"]) if params["method"] == "eap-ig" else 1
    try:
        progress = api().circuit_progress(params["model"], params["task"], params["method"], steps,
                                          params.get("pairs"))
    except ApiError:
        return HIDE, no_update, "", "", "", True
    out = poll_view(progress)
    if ctx.triggered_id != "task-poll" and out[-1] is no_update:
        out = (*out[:-1], False)  # a new task shown: poll until its answer (or the run) says more
    return out


def weight_grids(model: str, data: CircuitOut) -> WeightGrids:
    """Per reader input Q / K / V among the listed head -> head edges, the model's PK grid of
    the pairing O -> it and its CS grid (None where the API has none): GET /api/pk and
    /api/cs, read once the model's job is done (cached then); a grid the API refuses is left out."""
    out: WeightGrids = {}
    paths = {e.get("path") for e in data.get("edges") or [] if e.get("writer_kind") == "head"}
    for path in sorted(p for p in paths if p in ("Q", "K", "V")):
        try:
            pk = api().pk(model, "O" + path)
        except ApiError:
            continue
        try:
            cs: ScoreGrid | None = api().cs(model, path)
        except ApiError:
            cs = None
        out[path] = (pk, cs)
    return out


@callback(Output("task-select", "options"), Input("task-select", "value"), State("url", "search"))
def task_choices(value: str | None, search: str | None) -> Any:
    """The task dropdown's options from GET /api/tasks, each time the controls are drawn on the
    task view (elsewhere the dropdown is hidden and keeps its placeholder options)."""
    if state_of(search).view != "task":
        return no_update
    try:
        return task_options(api().tasks(), value)
    except ApiError:
        return task_options(None, value)


def task_name(filename: str | None) -> str:
    """An uploaded file's task name: its stem with characters a task name cannot hold as "-"
    (``my tasks/ioi v2.jsonl`` -> ``ioi-v2``), at most 64; "" when nothing usable is left."""
    stem = re.sub(r"[^A-Za-z0-9_.\-]+", "-", PurePath(filename or "").stem).strip("-._")[:64]
    return parse_task(stem)


@callback(Output("task-upload-msg", "children"), Output("task-upload-msg", "className"),
          Output("task-select", "value"), Output("task-select", "options", allow_duplicate=True),
          Output("task-upload", "contents"),
          Input("task-upload", "contents"), State("task-upload", "filename"), State("url", "search"),
          prevent_initial_call=True)
def upload_task(contents: str | None, filename: str | None, search: str | None) -> tuple:
    """POST an uploaded JSONL task (named by its file, each row checked in the model's tokens;
    a task of that name is replaced) and select it: the task dropdown's new value goes to the
    URL writer. A rejected upload shows the API's message naming the bad row."""
    if not contents:
        return no_update, no_update, no_update, no_update, no_update
    name = task_name(filename)
    if not name:
        msg = f"{filename or 'upload'}: name the file like a task (letters, digits, _ . -)"
        return [html.B("upload rejected: "), msg], "upload-error shown", no_update, no_update, None
    try:
        saved = api().upload_task(decode_upload(contents), name, model=state_of(search).model)
        options = task_options(api().tasks(), name)
    except ApiError as err:
        return ([html.B("upload rejected: "), f"{filename or 'upload'}: {err.message}"], "upload-error shown",
                no_update, no_update, None)
    note = f"uploaded task {saved['name']}: {saved.get('n_rows')} prompt pairs"
    return note, "upload-ok", saved["name"], options, None
