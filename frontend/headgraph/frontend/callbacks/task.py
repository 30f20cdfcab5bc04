"""The task view: which head-to-head edges carry a behaviour (GET /api/circuit).

Renders the URL's task (GET /api/tasks: the bundled ioi, induction, successor and uploaded
ones), method (eap | eap-ig) and steps: the task metric first (clean and corrupt logit
difference and accuracy; a model that cannot do the task is said to be unable), the circuit's
top k edges as a table (source, target, reader, attribution, in the circuit; once the model's
job is done, a head -> head edge's PK and CS of the pairing O -> its Q / K / V input, from GET
/api/pk and /api/cs), the faithfulness curve (share of the gap recovered vs circuit size, the
stated share and the smallest circuit reaching it) and the EAP vs patching Spearman. It reads
no result of the model's job: a cold circuit is computed on request (a minute or more on a real
model, under the view's loading spinner; in a lab it needs the token: the refusal is shown).
A JSONL file dropped on the view's upload box is stored through POST /api/tasks under its file's
name (rows checked in the model's tokens; a bad row's message names its line) and selected.
"""

from __future__ import annotations

import re
from pathlib import PurePath
from typing import Any

from dash import Input, Output, State, html, no_update

from headgraph.frontend.api.client import ApiError
from headgraph.frontend.callbacks.common import api, error_note, stat, state_of
from headgraph.frontend.callbacks.define import callback
from headgraph.frontend.callbacks.labels import decode_upload
from headgraph.frontend.callbacks.router import view_callback
from headgraph.frontend.figures import empty_figure
from headgraph.frontend.figures.task import (
    TOP_MAX,
    edge_columns,
    faithfulness_figure,
    table_rows,
    task_words,
    with_scores,
)
from headgraph.frontend.layout.controls import task_options
from headgraph.frontend.state.readiness import view_params
from headgraph.frontend.state.url import parse_task


def circuit_table(data: dict[str, Any]) -> html.Table:
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


def summary(data: dict[str, Any]) -> list[Any]:
    """Summary chips: the task metric first (clean, corrupt, accuracies, gap, able), then the
    circuit (its size, the stated share, the edges scored) and the EAP vs patching Spearman."""
    m = data.get("metrics") or {}
    p = data.get("patching") or {}
    return [stat("task", (data.get("task") or {}).get("name"), "task-name"),
            stat("clean metric", m.get("clean"), "task-clean", "{:.3f}"),
            stat("corrupt metric", m.get("corrupt"), "task-corrupt", "{:.3f}"),
            stat("clean accuracy", m.get("clean_accuracy"), "task-clean-acc", "{:.0%}"),
            stat("corrupt accuracy", m.get("corrupt_accuracy"), "task-corrupt-acc", "{:.0%}"),
            stat("able", "yes" if m.get("able") else "no", "task-able"),
            stat("circuit size", data.get("circuit_size"), "task-circuit-size"),
            stat("share", data.get("share"), "task-share", "{:g}"),
            stat("edges scored", data.get("n_edges"), "task-n-edges"),
            stat("Spearman vs patching", p.get("spearman") if p.get("n_edges") else None, "task-spearman",
                 "{:.3f}")]


@view_callback("task", Output("task-curve", "figure"), Output("task-summary", "children"),
               Output("task-body", "children"))
def render_task(search: str | None, ready: dict | None, label_sets: list | None) -> tuple:
    """The URL's task circuit, or why there is none."""
    return task_view(view_params(state_of(search, label_sets), "task", ready))


def task_view(params: dict[str, Any] | None) -> tuple:
    """(figure, summary chips, body: words and table, or a message) for the task params
    (None: the view is not shown)."""
    if not params:
        return empty_figure(""), [], []
    steps = int(params["steps"]) if params["method"] == "eap-ig" else 1
    try:
        data = api().circuit(params["model"], params["task"], params["method"], steps,
                             min(int(params["k"]), TOP_MAX))
    except ApiError as err:
        return empty_figure(err.message, 220), [error_note(err.message)], []
    if params.get("ready") and not str(params["ready"]).endswith(":partial"):
        data = with_scores(data, weight_grids(params["model"], data))
    words = [html.P(line, className="validation-line", id=f"task-words-{i}")
             for i, line in enumerate(task_words(data))]
    able = (data.get("metrics") or {}).get("able")
    if not able:
        words[0] = html.P(words[0].children, className="validation-line error-note", id="task-words-0")
    return faithfulness_figure(data), summary(data), [*words, circuit_table(data)]


def weight_grids(model: str, data: dict[str, Any]) -> dict[str, tuple[dict[str, Any], dict[str, Any] | None]]:
    """Per reader input Q / K / V among the listed head -> head edges, the model's PK grid of
    the pairing O -> it and its CS grid (None where the API has none): GET /api/pk and
    /api/cs, read once the model's job is done (cached then); a grid the API refuses is left out."""
    out: dict[str, tuple[dict[str, Any], dict[str, Any] | None]] = {}
    paths = {e.get("path") for e in data.get("edges") or [] if e.get("writer_kind") == "head"}
    for path in sorted(p for p in paths if p in ("Q", "K", "V")):
        try:
            pk = api().pk(model, "O" + path)
        except ApiError:
            continue
        try:
            cs: dict[str, Any] | None = api().cs(model, path)
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
