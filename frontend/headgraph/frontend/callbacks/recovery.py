"""The recovery view: how well does each weight metric's ranking of head pairs recover a label
set's circuit? (the PK paper's Tables 1 and 2, for the URL's model).

Renders GET /api/recovery for the URL's pairing (O -> Q / K / V), its class overlay as the
reference label set (a link without one opens the model's default: a built-in set made for it,
else its own ``patterns`` set) and top-k (at most the API's 200): the table (per metric the
endpoint share, precision@k and ROC-AUC with their bootstrap 95% intervals, and the paired
differences to PK), a figure of ROC-AUC per metric with interval bars, and the answer in words.
It waits for the model's PK and CS (the job's stages); a cold table computes CKA and Procrustes
(a minute or more on a real model; in a lab it needs the token: the refusal is shown). A label
set that names no head of the model, or no edge of the pairing, says so instead of a table.
"""

from __future__ import annotations

from typing import Any

from dash import Output, html

from headgraph.frontend.api.answers import RecoveryOut
from headgraph.frontend.api.client import ApiError
from headgraph.frontend.api.names import O_PAIRINGS
from headgraph.frontend.callbacks.common import api, error_note, stat, state_of, vocab
from headgraph.frontend.callbacks.router import view_callback
from headgraph.frontend.figures import empty_figure
from headgraph.frontend.figures.recovery import (
    DIFFS,
    STATS,
    names_no_edge,
    recovery_figure,
    recovery_words,
    table_rows,
)
from headgraph.frontend.state.readiness import view_params

NO_LABELS = ("pick a label set (the “reference” control) as the reference: its heads' edges are the "
             "circuit each metric's ranking should recover")


def no_edge_note(message: str) -> html.P:
    """The clear message of a label set with nothing to recover on this model / pairing."""
    return html.P(message, id="recovery-no-edge", className="validation-note")


def recovery_table(data: RecoveryOut) -> html.Table:
    """The table (id "recovery-table"): a row per metric (id "recovery-row-<metric>"), a cell
    per statistic whose data-value / data-low / data-high carry the API's numbers."""
    k = data.get("k")
    titles = [t.replace("@k", f"@{k}") for _, t in (*STATS, *DIFFS)]
    head = html.Tr([html.Th("metric"), *[html.Th(t) for t in titles]])
    body = []
    for r in table_rows(data):
        cells = [html.Td(r["label"], className="recovery-metric")]
        for key, _ in (*STATS, *DIFFS):
            est = r["values"].get(key) or {}
            data_attrs: dict[str, Any] = {f"data-{end}": "" if est.get(end) is None else repr(est[end])
                                          for end in ("value", "low", "high")}
            cells.append(html.Td(r[key], id=f"recovery-{r['metric']}-{key}", **data_attrs))
        body.append(html.Tr(cells, id=f"recovery-row-{r['metric']}",
                            className="recovery-row" + (" recovery-baseline" if r["baseline"] else "")))
    return html.Table([html.Thead(head), html.Tbody(body)], id="recovery-table", className="paired-table")


def summary(data: RecoveryOut) -> list[Any]:
    """Summary chips: the reference set, its heads, the valid and reference pairs, k."""
    return [stat("label set", data.get("labels"), "rec-labels"),
            stat("reference heads", len(data.get("reference_heads") or []), "rec-heads"),
            stat("valid pairs", data.get("n_valid"), "rec-valid"),
            stat("reference pairs", data.get("n_reference"), "rec-reference"),
            stat("base rate", data.get("base_rate"), "rec-base", "{:.2f}"),
            stat("top-k", data.get("k"), "rec-k")]


@view_callback("recovery", Output("recovery", "figure"), Output("recovery-summary", "children"),
               Output("recovery-body", "children"))
def render_recovery(search: str | None, ready: dict | None, label_sets: list | None) -> tuple:
    """The URL's recovery table, or why there is none."""
    return recovery_view(view_params(state_of(search, label_sets), "recovery", ready))


def recovery_view(params: dict[str, Any] | None) -> tuple:
    """(figure, summary chips, body: words and table, or a message) for the recovery params
    (None: the view is not shown or its model's results are not ready)."""
    if not params:
        return empty_figure(""), [], []
    pairing, labels = params["pairing"], params["overlay"]
    if pairing not in O_PAIRINGS:
        msg = (f"recovery tables rank the paper's O -> Q / K / V pairings ({', '.join(O_PAIRINGS)}); "
               f"pick one of them (now {pairing})")
        return empty_figure(msg, 220), [error_note(msg)], []
    if not labels:
        return empty_figure("no reference label set", 220), [], [no_edge_note(NO_LABELS)]
    k_max = vocab().limits.recovery_k_max
    k = min(int(params["k"]), k_max)
    try:
        data = api().recovery(params["model"], pairing, labels, k)
    except ApiError as err:
        if err.status == 422 and "names no head" in err.message:
            msg = f"nothing to recover: {err.message}; pick a label set that names heads of this model"
            return empty_figure("the label set names no head of this model", 220), [], [no_edge_note(msg)]
        return empty_figure(err.message, 220), [error_note(err.message)], []
    capped = ([html.P(f"top-k capped at the API's {k_max} (asked for {params['k']})", className="validation-note")]
              if params["k"] > k_max else [])
    if names_no_edge(data):
        msg = (f"nothing to recover: no valid {pairing} pair joins two heads of '{data.get('labels')}' on "
               f"{data.get('model')} (the set names {len(data.get('reference_heads') or [])} of its heads), so "
               "the label set names no edge of the model; pick another set or pairing")
        return empty_figure("the label set names no edge of this model", 220), summary(data), [no_edge_note(msg)]
    words = [html.P(line, className="validation-line", id=f"recovery-words-{i}")
             for i, line in enumerate(recovery_words(data))]
    return recovery_figure(data), summary(data), [*capped, *words, recovery_table(data),
                                                  html.P(data.get("method", ""), className="validation-note")]
