"""Verifying edges by path ablation from the page: the pair panel's verdict and its "verify by
ablation" button, and the graph's "verify the top edges" button.

Reading never computes: the pair panel's verdict and the graph's colours come from
GET /api/ablation?cached=true (an edge no cached ablation measured is "not measured"). Only
the two buttons measure (GET /api/ablation without ``cached``: cold work, so in lab mode it
needs the user's own token, forwarded by the dashboard; a refusal shows the API's message).
After a measurement the ``ablation-token`` store changes, which redraws the pair's verdict
and the graph (its rendered-view key includes the model's cached ablations, callbacks/graph).
"""

from __future__ import annotations

import time
from typing import Any

from dash import Input, Output, State, html, no_update

from headgraph.frontend.api.answers import AblationEdge
from headgraph.frontend.api.client import ApiError
from headgraph.frontend.callbacks.common import api, data_attrs, state_of, vocab
from headgraph.frontend.callbacks.define import callback
from headgraph.frontend.callbacks.graph import load_graph
from headgraph.frontend.figures.common import fmt_value
from headgraph.frontend.figures.graph_filters import ABLATION_PAIRINGS, NOT_MEASURED, verify_k
from headgraph.frontend.state.readiness import view_params
from headgraph.frontend.state.url import ViewState

SHOW = {"display": "inline-block"}
HIDE = {"display": "none"}
MEASURES = {"tvd": "share of the target's attention mass moved (TVD)",
            "relative_output": "relative change of the target's output"}


def ablation_section(row: AblationEdge | None, rule: str | None) -> list[Any]:
    """The pair panel's path-ablation block for its GET /api/ablation edge row (None or a
    "not measured" row: says so)."""
    verdict = (row or {}).get("verdict") or NOT_MEASURED
    badge = html.Span(verdict, className="badge verdict verdict-" + verdict.replace(" ", "-"),
                      id="pair-verdict", title=rule or "", **data_attrs({"data-verdict": verdict}))
    out: list[Any] = [html.H4(["path ablation ", badge])]
    if verdict == NOT_MEASURED or row is None:
        out.append(html.P("not measured: the source head's output mean-ablated on the target's "
                          "input only, on text and on repeated random tokens", className="hint"))
        return out
    halves = row.get("halves") or {}
    rows = []
    for name, key in (("text", "effect_text"), ("random tokens", "effect_random")):
        split = halves.get("text" if name == "text" else "random") or []
        rows.append(html.Tr([html.Th(name), html.Td(fmt_value(row.get(key)), id=f"pair-effect-{key[7:]}",
                                                     **data_attrs({"data-value": repr(row.get(key))})),
                             html.Td("halves " + " / ".join(fmt_value(v) for v in split), className="hint")]))
    out.append(html.Table(html.Tbody(rows), className="kv", id="pair-ablation-table"))
    out.append(html.P(MEASURES.get(str(row.get("measure")), str(row.get("measure"))), className="hint"))
    note = row.get("verdict_note")
    if note:  # "above the random-pair null (q=...; text > ...; ...)": what "verified" means here
        words = (f"verified means {note}" if verdict == "verified" else note if verdict == "null too small"
                 else f"{verdict}: not {note}")
        out.append(html.P(words, className="hint", id="pair-verdict-rule",
                          **data_attrs({"data-quantile": repr(row.get("null_quantile"))})))
    elif verdict == "null not computed":
        out.append(html.P("measured; its random-pair null is not computed yet (verify to compute it)",
                          className="hint", id="pair-verdict-rule"))
    return out


def pair_edge(state: ViewState) -> str | None:
    """The ``edge`` parameter of the selected pair when ablation can measure it, else None."""
    if not state.pair or state.pairing not in ABLATION_PAIRINGS:
        return None
    return ",".join(state.pair)


@callback(Output("pair-ablation", "children"), Output("verify-edge-btn", "style"),
          Output("verify-edge-msg", "children", allow_duplicate=True),
          Input("in-pair-panel-search", "data"), Input("in-pair-panel-ready", "data"),
          Input("ablation-token", "data"), prevent_initial_call=True)
def render_pair_ablation(search: str | None, ready: dict | None, _token: Any) -> tuple:
    """The selected pair's verdict and effects, read from the cache only; the verify button
    shows while the edge is not measured."""
    state = state_of(search)
    edge = pair_edge(state)
    if edge is None or view_params(state, "pair-panel", ready) is None:
        return [], HIDE, ""
    try:
        answer = api().ablation(state.model, state.pairing, edge=edge, cached=True)
    except ApiError as err:  # no forward edge (a later source), a model that cannot run, ...
        return [html.P(f"path ablation: {err.message}", className="hint", id="pair-ablation-note")], HIDE, ""
    row = next(iter(answer.get("edges") or []), None)
    rule = (answer.get("verdict_rule") or {}).get("rule")
    measured = row is not None and row.get("verdict") not in (NOT_MEASURED, "null not computed")
    return ablation_section(row, rule), HIDE if measured else SHOW, ""


@callback(Output("ablation-token", "data", allow_duplicate=True),
          Output("verify-edge-msg", "children", allow_duplicate=True),
          Input("verify-edge-btn", "n_clicks"), State("url", "search"), prevent_initial_call=True,
          running=[(Output("verify-edge-btn", "disabled"), True, False),
                   (Output("verify-edge-progress", "style"), {"display": "flex"}, HIDE)])
def verify_edge(n_clicks: int | None, search: str | None) -> tuple:
    """Measure the selected pair's edge (the user's own credential; their 401 / 403 shown)."""
    state = state_of(search)
    edge = pair_edge(state)
    if not n_clicks or edge is None:
        return no_update, no_update
    try:
        api().ablation(state.model, state.pairing, edge=edge)
    except ApiError as err:
        return no_update, html.Span(err.message, className="error-note", id="verify-edge-error")
    return {"model": state.model, "at": time.time()}, ""


def graph_edge_counts(state: ViewState) -> dict[str, int]:
    """Edges per pairing of the state's graph in threshold mode (a warm API read; {} in top-k
    mode, where k says it, or when the graph cannot be read)."""
    if state.rule == "topk":
        return {}
    try:
        data, *_ = load_graph(api(), state.to_dict())
    except ApiError:
        return {}
    return dict(data.get("edge_counts") or {})


def queue_outputs(again: bool = False) -> list[Output]:
    """The verification queue and its progress bar (``again``: the second callback to write them)."""
    return [Output(cid, prop, allow_duplicate=again) for cid, prop in (
        ("verify-top-queue", "data"), ("verify-top-progress", "style"), ("verify-top-bar", "style"),
        ("verify-top-label", "children"), ("verify-top-progress", "data-state"),
        ("verify-top-progress", "data-fraction"), ("verify-top-btn", "disabled"),
        ("verify-top-progress", "className"))]


def queue_progress(queue: dict[str, Any], failed: bool = False) -> tuple:
    """(style, bar style, label, state, fraction, button disabled, class) of the verification
    queue ``{"per": [[pairing, k], ...], "done": n, ...}``: one step per pairing; while a
    pairing is measured (minutes on a real model, no finer count) a stripe sweeps the bar."""
    per, done = queue["per"], int(queue["done"])
    frac = done / len(per)
    finished = failed or done >= len(per)
    if failed:
        label, state = f"stopped after {done} of {len(per)} pairings", "failed"
    elif finished:
        label, state = f"measured {len(per)} of {len(per)} pairings", "done"
    else:
        pairing, k = per[done]
        label, state = f"measuring the top {k} {pairing} edges ({done + 1} of {len(per)})…", "running"
    return ({"display": "flex"}, {"width": f"{frac * 100:.1f}%"}, label, state, f"{frac:.3f}", not finished,
            "progress" if finished else "progress indeterminate")


@callback(*queue_outputs(), Output("verify-top-msg", "children"),
          Output("verify-top-tick", "max_intervals"), Input("verify-top-btn", "n_clicks"),
          State("url", "search"), State("verify-top-tick", "n_intervals"), prevent_initial_call=True)
def verify_top(n_clicks: int | None, search: str | None, ticks: int | None) -> tuple:
    """Queue the top edges by PK of every shown pairing (as many as the graph shows, at most
    50 each: the edges the graph's verdicts read) and arm the tick; ``verify_top_step``
    measures them one pairing per tick, so the progress bar moves between pairings."""
    if not n_clicks:
        return (no_update,) * 10
    state = state_of(search)
    per = verify_k(state.pairings, state.rule, state.k, graph_edge_counts(state), vocab().limits.ablation_top_max)
    if not per:
        return (no_update,) * 8 + ("no edges to verify", no_update)
    queue = {"model": state.model, "per": [[p, k] for p, k in per.items()], "done": 0, "verdicts": []}
    return queue, *queue_progress(queue), "", int(ticks or 0) + 1


@callback(Output("ablation-token", "data", allow_duplicate=True), *queue_outputs(again=True),
          Output("verify-top-msg", "children", allow_duplicate=True),
          Output("verify-top-tick", "max_intervals", allow_duplicate=True),
          Input("verify-top-tick", "n_intervals"), State("verify-top-queue", "data"),
          prevent_initial_call=True)
def verify_top_step(ticks: int | None, queue: dict[str, Any] | None) -> tuple:
    """Measure the queue's next pairing (the user's own credential; a refusal shows the API's
    message and stops the queue) and re-arm the tick for the one after (a store written by
    the callback it triggers would not trigger it again); the last step redraws the verdicts
    and says what was found."""
    if not queue or int(queue["done"]) >= len(queue["per"]):
        return (no_update,) * 11
    model, (pairing, k) = queue["model"], queue["per"][int(queue["done"])]
    measured = {"model": model, "at": time.time()}
    try:
        answer = api().ablation(model, pairing, top=int(k))
    except ApiError as err:
        verdicts = queue["verdicts"]
        done = f" ({len(verdicts)} edges measured first)" if verdicts else ""
        return (measured if verdicts else no_update, no_update, *queue_progress(queue, failed=True),
                html.Span(err.message + done, className="error-note", id="verify-top-error"), no_update)
    queue = {**queue, "done": int(queue["done"]) + 1,
             "verdicts": queue["verdicts"] + [e["verdict"] for e in answer.get("edges", [])]}
    if queue["done"] < len(queue["per"]):
        return no_update, queue, *queue_progress(queue), no_update, int(ticks or 0) + 1
    verdicts = queue["verdicts"]
    text = (f"measured the top {', '.join(f'{k} {p}' for p, k in queue['per'])} edges by PK: "
            f"{verdicts.count('verified')} verified, {verdicts.count('no effect')} no effect"
            + (f", {verdicts.count('null too small')} without a verdict (the random-pair null is too small)"
               if "null too small" in verdicts else ""))
    return measured, queue, *queue_progress(queue), html.Span(text, id="verify-top-done"), no_update
