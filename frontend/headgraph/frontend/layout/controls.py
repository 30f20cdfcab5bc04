"""The control widgets, built from the URL's state (the Pages-router idea: URL in, widgets out).

``render_controls`` (callbacks/navigation.py) calls these on every URL change; user changes
to the widgets go to the single URL writer. Every widget id exists in every rendering (hidden
when the view does not use it), because Dash refuses a callback whose inputs are only partly
on the page. ``placeholder_*`` give the same ids before the first rendering.
"""

from __future__ import annotations

from typing import Any

from dash import dcc, html
from dash.development.base_component import Component

from headgraph.frontend.api.answers import LabelSetSummary, ModelSummary, TaskSummary
from headgraph.frontend.api.names import Vocabulary
from headgraph.frontend.figures import PAIRING_COLORS
from headgraph.frontend.layout.compare_controls import comparison_groups
from headgraph.frontend.state.url import (
    CIRCUIT_METHODS,
    DEFAULT_MODEL,
    DEFAULT_TASK,
    FDR_Q_RANGE,
    RANK_ON,
    SUBSPACES,
    THRESHOLD_ON,
    VERIFICATION_MODES,
    VIEWS,
    ViewState,
    format_layers,
    format_threshold,
    split_subspaces,
    to_query,
)

VIEW_LABELS: dict[str, str] = {"graph": "Head graph", "heatmap": "Heatmaps", "scatter": "PK vs CS",
                               "reference": "Random reference", "tokens": "Tokens & patterns",
                               "validation": "Validation", "recovery": "Recovery", "compare": "Compare",
                               "timeline": "Timeline", "task": "Task", "subgraph": "Subgraph"}
# Which control groups each view shows.
VIEW_CONTROLS: dict[str, tuple[str, ...]] = {
    # the rule group holds the graph's scales; "filter": layer range and head search
    "graph": ("pairings", "rule", "layout", "overlay", "verification", "filter"),
    "heatmap": ("pairing", "metric", "grain", "direction", "overlay"),
    "scatter": ("pairing", "top_percent"),
    "reference": ("pairing",),
    "tokens": ("role",),
    "validation": ("pairing",),
    "recovery": ("pairing", "overlay", "recovery"),  # the label set is the class overlay; top-k
    "compare": ("pairing", "compare"),  # model A / B and top-k
    "timeline": ("pairing", "series"),  # the series and top-k (the step slider is in the view)
    "task": ("task",),  # the task, the attribution method and EAP-IG's steps
    "subgraph": ("pairings", "metric", "overlay"),  # pinned heads' edges on the metric (raw/normalized PK, z, CS)
}
CONTROL_GROUPS = ("pairing", "pairings", "rule", "metric", "grain", "layout", "direction", "top_percent",
                  "role", "overlay", "verification", "filter", "recovery", "compare", "series", "task")
METRIC_LABELS = {"raw": "raw", "normalized": "normalized", "z": "z", "cs": "CS", "cka": "CKA",
                 "procrustes": "Procrustes"}
# The metric switch's values the subgraph cannot rank by (GET /api/subgraph's rank_on): shown
# there but disabled (a link holding one ranks the subgraph by raw PK, which it says).
HEATMAP_ONLY_METRICS = {"cka": "CKA: heatmaps only (the subgraph ranks by raw PK, z or CS)",
                        "procrustes": "Procrustes: heatmaps only (the subgraph ranks by raw PK, z or CS)"}
# The graph's scales (the API's threshold_on): no CS, which GET /api/graph cannot rank by.
RANK_LABELS = {"pk": "raw PK", "normalized": "normalized", "z": "z"}
THRESHOLD_LABELS = {"normalized": "normalized", "z": "z", "pk": "raw PK", "fdr": "FDR q"}
VERIFICATION_LABELS = {"off": "off", "colour": "colour", "verified": "verified only"}
SUBSPACES_LABELS = {"raw": "raw", "norm": "norm-aware"}
UNAVAILABLE = "not available offline"
NOT_OFFERED = "not offered"  # a local model the server refuses (a link out of its root)
HIDE = {"display": "none"}
BUNDLED_TASKS: tuple[str, ...] = ("ioi", "induction", "successor", "ioi-mib", "addition",
                                  "subtraction", "mcqa")  # until GET /api/tasks answers
METHOD_LABELS = {"eap": "EAP", "eap-ig": "EAP-IG"}


def task_options(tasks: list[TaskSummary] | None, current: str | None = None) -> list[dict[str, Any]]:
    """Task dropdown options: GET /api/tasks's tasks (the bundled ones until it answers);
    keeps ``current`` selectable."""
    out = [{"label": t["name"] + ("" if t.get("bundled") else " (uploaded)"), "value": t["name"],
            "title": t.get("description", "")} for t in tasks or []]
    if not out:
        out = [{"label": n, "value": n} for n in BUNDLED_TASKS]
    if current and current not in {o["value"] for o in out}:
        out.append({"label": current, "value": current})
    return out


def model_options(models: list[ModelSummary] | None, current: str | None) -> list[dict[str, Any]]:
    """Model dropdown options; models that cannot be loaded offline, or that the server refuses
    (not offered), are disabled with the API's message as their title. The current value is always an option (Dash 4 clears a value missing from options)."""
    opts = []
    for m in models or []:
        off = m.get("status") in (UNAVAILABLE, NOT_OFFERED)
        label = m["id"] + (f" — {m['status']}" if m.get("status") != "available" else "")
        opts.append({"label": label, "value": m["id"], "disabled": off, "title": m.get("message", "")})
    if current and current not in {o["value"] for o in opts}:
        opts.append({"label": current, "value": current})
    return opts


def overlay_options(sets: list[LabelSetSummary] | None, current: str | None = None) -> list[dict[str, Any]]:
    """Label-set dropdown options (name, head count, model hint); keeps ``current`` selectable."""
    out = []
    for s in sets or []:
        hint = f" · {s['model']}" if s.get("model") else ""
        label = (f"{s['name']} (per model)" if s.get("per_model")
                 else f"{s['name']} ({s.get('n_heads', '?')} heads{hint})")
        out.append({"label": label, "value": s["name"], "title": s.get("description", "")})
    if current and current not in {o["value"] for o in out}:
        out.append({"label": current, "value": current})
    return out


def model_dropdown(state: ViewState | None, models: list[ModelSummary] | None) -> dcc.Dropdown:
    """The model picker; its value is the model without its subspaces mode (the toggle's)."""
    model, _ = split_subspaces(state.model if state else DEFAULT_MODEL)
    return dcc.Dropdown(id="model-select", options=model_options(models, model), value=model,
                        clearable=False, searchable=True, className="model-select", placeholder="model")


def subspaces_toggle(state: ViewState | None) -> html.Span:
    """Raw or norm-aware subspaces of the model: switches the URL's model id (``MODEL@norm``)."""
    _, mode = split_subspaces(state.model if state else DEFAULT_MODEL)
    return html.Span([html.Span("subspaces", className="ctl-label"),
                      dcc.RadioItems(id="subspaces-radio", value=mode, inline=True,
                                     options=_opts(SUBSPACES, SUBSPACES_LABELS))],
                     className="subspaces-toggle",
                     title="raw weights, or norm-aware: the gains of the norms around attention "
                           "folded into the heads (the model id's @norm variant)")


def model_picker(state: ViewState | None, models: list[ModelSummary] | None) -> list[Any]:
    """The model bar's picker: the model dropdown and the subspaces toggle."""
    return [model_dropdown(state, models), subspaces_toggle(state)]


def tab_links(state: ViewState | None) -> list[Any]:
    """The view tabs: links to the current state with another view (id "tab-<view>")."""
    current = state.view if state else None
    return [dcc.Link(label, id=f"tab-{v}", href=to_query(state.with_(view=v)) if state else f"?view={v}",
                     className="tab tab-selected" if v == current else "tab")
            for v, label in VIEW_LABELS.items() if v in VIEWS]


def _group(name: str, label: str, shown: bool, *children: Component) -> html.Div:
    return html.Div([html.Label(label, className="ctl-label"), *children], id=f"ctl-{name}",
                    className="ctl-group", style={"display": "flex"} if shown else HIDE)


def _opts(values: tuple[str, ...], labels: dict[str, str] | None = None) -> list[dict[str, str]]:
    return [{"label": (labels or {}).get(v, v), "value": v} for v in values]


def metric_options(vocab: Vocabulary | None, view: str | None) -> list[dict[str, Any]]:
    """The metric switch: the vocabulary's metrics (PK raw / normalized / z, CKA, Procrustes,
    CS); in the subgraph view the heatmap-only ones are disabled, titled why."""
    opts: list[dict[str, Any]] = list(_opts(vocab.metrics if vocab else (), METRIC_LABELS))
    if view == "subgraph":
        opts = [{**o, "disabled": True, "title": HEATMAP_ONLY_METRICS[o["value"]]}
                if o["value"] in HEATMAP_ONLY_METRICS else o for o in opts]
    return opts


def slider_props(state: ViewState | None, slider: dict[str, Any] | None) -> dict[str, Any]:
    """The threshold slider's min, max, step, marks and value for ``state``.

    ``slider``: the range the graph view computed for this state's graph ({"min", "max",
    "step", "marks", "value"}; ``value`` the threshold it applied), else a placeholder range
    around the URL's threshold. The value is the applied one (the URL's, else the default the
    graph used); None on the FDR scale, whose q has its own input.
    """
    on_slider = bool(state) and state.rule == "threshold" and state.threshold_on != "fdr"
    value = state.threshold if state and on_slider else None
    if slider:
        if on_slider and value is None:
            value = slider.get("value")
        return {"min": slider["min"], "max": slider["max"], "step": slider.get("step"),
                "marks": slider.get("marks"), "value": value}
    lo, hi = min(0.0, value or 0.0), max(1.0, value or 0.0)
    return {"min": lo, "max": hi, "step": None, "marks": None, "value": value}


def control_groups(state: ViewState | None, vocab: Vocabulary | None,
                   label_sets: list[LabelSetSummary] | None = None,
                   slider: dict[str, Any] | None = None) -> list[html.Div]:
    """Every control group, values from ``state`` (None: empty placeholders with the same ids).

    ``slider``: the threshold slider's range for this state's graph ({"min", "max", "step",
    "marks", "value"}, written by the graph view; see :func:`slider_props`).
    """
    shown = set(VIEW_CONTROLS.get(state.view, ())) if state else set()
    pairings = vocab.pairings if vocab else ()
    graph_pairings = vocab.graph_pairings if vocab else ()
    rng = slider_props(state, slider)
    topk = bool(state) and state.rule == "topk"
    fdr = bool(state) and not topk and state.threshold_on == "fdr"
    inline = {"display": "inline-block"}
    # The API's bounds (the vocabulary's limits); the page's first render, before the vocabulary
    # arrives, has no state and bounds nothing.
    recovery_k_max = vocab.limits.recovery_k_max if vocab else None
    steps_max = vocab.limits.circuit_steps_max if vocab else None
    recovery_k = min(state.k, recovery_k_max) if state and recovery_k_max else (state.k if state else None)
    return [
        _group("pairing", "pairing", "pairing" in shown, dcc.Dropdown(
            id="pairing-select", options=_opts(pairings), value=state.pairing if state else None,
            clearable=False, className="small-dd")),
        _group("pairings", "edges", "pairings" in shown, dcc.Checklist(
            id="pairings-check", value=list(state.pairings) if state else [], inline=True,
            className="pairing-check",
            options=[{"label": html.Span(p, style={"color": PAIRING_COLORS.get(p, "#777"), "fontWeight": 600}),
                      "value": p} for p in graph_pairings])),
        _group("rule", "rule", "rule" in shown,
               dcc.RadioItems(id="rule-radio", value=state.rule if state else None, inline=True,
                              options=[{"label": "top-k", "value": "topk"},
                                       {"label": "threshold", "value": "threshold"}]),
               dcc.Input(id="k-input", type="number", min=1, max=vocab.k_max if vocab else None, step=1,
                         value=state.k if state else None, debounce=True, className="num-input",
                         style=inline if topk else HIDE),
               html.Span([html.Span("by", className="ctl-label"),
                          dcc.RadioItems(id="rank-on-radio", value=state.rank_on if state else None,
                                         inline=True, options=_opts(RANK_ON, RANK_LABELS))],
                         id="rank-on-box", title="rank top-k edges by", style=inline if topk else HIDE),
               html.Span([html.Span("on", className="ctl-label"),
                          dcc.RadioItems(id="threshold-on-radio", value=state.threshold_on if state else None,
                                         inline=True, options=_opts(THRESHOLD_ON, THRESHOLD_LABELS))],
                         id="threshold-on-box", title="threshold edges on",
                         style=inline if state and not topk else HIDE),
               html.Div(dcc.Slider(id="threshold-slider", min=rng["min"], max=rng["max"],
                                   value=rng["value"], step=rng.get("step"), marks=rng.get("marks"),
                                   tooltip={"placement": "bottom", "always_visible": True},
                                   updatemode="mouseup"),
                        className="slider-box", id="threshold-box",
                        style={"display": "block"} if state and not topk and not fdr else HIDE),
               html.Span([html.Span("q", className="ctl-label"),
                          dcc.Input(id="fdr-q-input", type="number", min=FDR_Q_RANGE[0], max=FDR_Q_RANGE[1],
                                    step=0.001, value=state.threshold if fdr and state else None, debounce=True,
                                    className="num-input")],
                         id="fdr-box", title=f"Benjamini-Hochberg q level ({format_threshold(FDR_Q_RANGE[0])}"
                                             f"..{format_threshold(FDR_Q_RANGE[1])})",
                         style=inline if fdr else HIDE)),
        _group("metric", "metric", "metric" in shown, dcc.RadioItems(
            id="metric-radio", value=state.metric if state else None, inline=True,
            options=metric_options(vocab, state.view if state else None))),
        _group("grain", "cells", "grain" in shown, dcc.RadioItems(
            id="grain-radio", value=state.grain if state else None, inline=True,
            options=[{"label": "head pairs", "value": "heads"},
                     {"label": "layer overview", "value": "layers"}])),
        _group("layout", "layout", "layout" in shown, dcc.RadioItems(
            id="layout-radio", value=state.layout if state else None, inline=True,
            options=[{"label": "layer × head", "value": "grid"}, {"label": "force", "value": "force"}])),
        _group("direction", "head grid", "direction" in shown, dcc.RadioItems(
            id="direction-radio", value=state.direction if state else None, inline=True,
            options=[{"label": "outgoing", "value": "out"}, {"label": "incoming", "value": "in"}])),
        _group("top_percent", "top %", "top_percent" in shown, dcc.Input(
            id="top-percent-input", type="number", min=0.1, max=100, step=0.1,
            value=state.top_percent if state else None, debounce=True, className="num-input")),
        _group("role", "role", "role" in shown, dcc.RadioItems(
            id="role-radio", value=state.role if state else None, inline=True,
            options=_opts(vocab.roles if vocab else ()))),
        _group("overlay", "reference" if state and state.view == "recovery" else "classes", "overlay" in shown,
               dcc.Dropdown(id="overlay-select", options=overlay_options(label_sets, state.overlay if state else None),
                            value=(state.overlay or None) if state else None, placeholder="no overlay",
                            className="overlay-dd")),
        _group("verification", "verification", "verification" in shown, dcc.RadioItems(
            id="verification-radio", value=state.verification if state else None, inline=True,
            options=_opts(VERIFICATION_MODES, VERIFICATION_LABELS))),
        _group("filter", "layers", "filter" in shown,
               html.Span(dcc.Input(id="layers-input", type="text", value=format_layers(state.layers) if state else "",
                                   placeholder="all (e.g. 10-20)", debounce=True, className="text-input"),
                         title="only heads of these blocks (both ends of an edge in the range)"),
               html.Span("find", className="ctl-label"),
               html.Span(dcc.Input(id="find-input", type="text", value=state.find if state else "",
                                   placeholder="L17H3 · L17 · induction", debounce=True, className="text-input"),
                         title="highlight a head, a layer's heads (L17) or a class's heads (a class of "
                               "the overlay, e.g. induction); a head name opens its panel")),
        _group("recovery", "top-k", "recovery" in shown, dcc.Input(
            id="recovery-k-input", type="number", min=1, max=recovery_k_max, step=1,
            value=recovery_k, debounce=True, className="num-input")),
        *comparison_groups(state, vocab, _group),
        _group("task", "task", "task" in shown,
               dcc.Dropdown(id="task-select", options=task_options(None, (state.task or DEFAULT_TASK) if state else None),
                            value=(state.task or DEFAULT_TASK) if state else None, clearable=False, className="task-dd"),
               html.Span("method", className="ctl-label"),
               dcc.RadioItems(id="method-radio", value=state.method if state else None, inline=True,
                              options=_opts(CIRCUIT_METHODS, METHOD_LABELS)),
               html.Span([html.Span("steps", className="ctl-label"),
                          dcc.Input(id="steps-input", type="number", min=1, max=steps_max, step=1,
                                    value=state.steps if state else None, debounce=True, className="num-input")],
                         id="steps-box", title="EAP-IG's integration steps (EAP: one)",
                         style={"display": "inline-flex"} if state and state.method == "eap-ig" else HIDE)),
    ]
