"""URL <-> controls, clicks -> URL, and the router that hands each view its parameters.

The URL query is the single source of truth. ``sync_state`` writes it when a control changes
or something is clicked, and sets the controls from it when the URL itself changes (first load,
back/forward, a pasted link). ``route`` turns the URL into one small parameter dict per view and
only updates a view's store when that view's parameters really changed, so views re-fetch only
what they need.
"""

from __future__ import annotations

from typing import Any

from dash import ALL, Dash, Input, Output, State, ctx, no_update
from dash.exceptions import PreventUpdate

from headgraph.frontend.callbacks.common import model_options, overlay_options
from headgraph.frontend.layout import VIEW_CONTROLS
from headgraph.frontend.state import (DIRECTIONS, GRAPH_PAIRINGS, HEAD_RE, K_MAX, LAYOUTS, METRICS,
                                      PAIRINGS, ROLE_LETTERS, RULES, VIEWS, ViewState, default_overlay,
                                      parse_query, to_query)

# (component id, property, ViewState field) for every control mirrored in the URL.
CONTROLS: tuple[tuple[str, str, str], ...] = (
    ("model-select", "value", "model"),
    ("view-tabs", "value", "view"),
    ("pairing-select", "value", "pairing"),
    ("pairings-check", "value", "pairings"),
    ("k-input", "value", "k"),
    ("rule-radio", "value", "rule"),
    ("threshold-slider", "value", "threshold"),
    ("metric-radio", "value", "metric"),
    ("layout-radio", "value", "layout"),
    ("overlay-select", "value", "overlay"),
    ("direction-radio", "value", "direction"),
    ("top-percent-input", "value", "top_percent"),
    ("role-radio", "value", "role"),
)
CLICKS: tuple[tuple[str, str], ...] = (
    ("graph", "clickData"), ("heatmap", "clickData"), ("head-grid", "clickData"),
    ("scatter", "clickData"), ("kl-grid", "clickData"),
    ("head-close", "n_clicks"), ("pair-close", "n_clicks"),
)
VIEW_PARAMS: dict[str, tuple[str, ...]] = {
    "graph": ("model", "pairings", "k", "rule", "threshold", "metric", "layout", "overlay", "head", "pair",
              "pairing"),
    "heatmap": ("model", "pairing", "metric", "overlay"),
    "head-grid": ("model", "pairing", "metric", "direction"),
    "scatter": ("model", "pairing", "top_percent"),
    "reference": ("model", "pairing"),
    "tokens": ("model", "role", "overlay"),
}
VIEW_OF_STORE = {"graph": "graph", "heatmap": "heatmap", "head-grid": "heatmap",
                 "scatter": "scatter", "reference": "reference", "tokens": "tokens"}
PANEL_PARAMS: dict[str, tuple[str, ...]] = {
    "head-panel": ("model", "head", "overlay"),
    "pair-panel": ("model", "pairing", "pair", "overlay"),
}
CONTROL_GROUPS = ("pairing", "pairings", "rule", "metric", "layout", "direction", "top_percent",
                  "role", "overlay")
SHOW = {"display": "block"}
HIDE = {"display": "none"}


def control_values(state: ViewState) -> list[Any]:
    """Control values that display ``state`` (same order as CONTROLS)."""
    out: list[Any] = []
    for _, _, field in CONTROLS:
        value = getattr(state, field)
        if field == "pairings":
            value = list(value)
        elif field == "overlay":
            value = value or None
        out.append(value)
    return out


ALLOWED: dict[str, tuple[str, ...]] = {"view": VIEWS, "pairing": PAIRINGS, "rule": RULES, "metric": METRICS,
                                       "layout": LAYOUTS, "direction": DIRECTIONS, "role": ROLE_LETTERS}


def set_field(state: ViewState, field: str, value: Any) -> ViewState:
    """``state`` with one field set from a control value; invalid values leave it unchanged."""
    if field in ALLOWED:
        return state.with_(**{field: value}) if value in ALLOWED[field] else state
    if field == "model":
        return state.with_(model=str(value)) if value else state
    if field == "pairings":
        return state.with_(pairings=tuple(p for p in GRAPH_PAIRINGS if p in (value or [])))
    if field == "overlay":
        return state.with_(overlay=str(value or ""))
    try:
        number = float(value)
    except (TypeError, ValueError):
        return state
    if number != number:  # NaN
        return state
    if field == "k":
        return state.with_(k=int(min(max(number, 1), K_MAX)))
    if field == "threshold":
        return state.with_(threshold=number)
    if field == "top_percent":
        return state.with_(top_percent=min(max(number, 0.1), 100.0))
    return state


def apply_control(state: ViewState, field: str, value: Any,
                  label_sets: list[dict[str, Any]] | None = None) -> ViewState:
    """The state after the user changed one control (with that control's side rules).

    A model change clears the selection; an overlay that was the old model's default
    (``default_overlay`` over ``label_sets``) becomes the new model's default, while one the
    user picked stays.
    """
    new = set_field(state, field, value)
    if new == state:
        return state
    if field == "model":
        if state.overlay == default_overlay(state.model, label_sets):
            new = new.with_(overlay=default_overlay(new.model, label_sets))
        return new.with_(head=None, pair=None)
    if field == "k":
        return new.with_(rule="topk")
    if field == "threshold":
        return new.with_(rule="threshold")
    if field == "metric":
        return new.with_(threshold=None)
    return new


def from_controls(state: ViewState, values: list[Any], skip: str | None = None) -> ViewState:
    """``state`` with every control-mirrored field taken from the controls (except ``skip``).

    Controls always show the user's latest choices; building the new URL from all of them
    (not only the one that fired) keeps quick successive changes from undoing each other
    while an earlier update is still in flight.
    """
    for (cid, _, field), value in zip(CONTROLS, values):
        if cid != skip:
            state = set_field(state, field, value)
    return state


def _point(click: Any) -> dict[str, Any]:
    try:
        point = click["points"][0]
    except (TypeError, KeyError, IndexError):
        return {}
    return point if isinstance(point, dict) else {}


def _custom(click: Any) -> list[Any] | None:
    data = _point(click).get("customdata")
    return data if isinstance(data, list) else [data] if data is not None else None


def apply_click(state: ViewState, source: str, click: Any) -> ViewState:
    """The state after a click on a figure (node, edge, cell, point) or a panel's close button."""
    if source == "head-close":
        return state.with_(head=None)
    if source == "pair-close":
        return state.with_(pair=None)
    if source == "heatmap":  # categorical axes: y = source head, x = target head
        s, t = str(_point(click).get("y", "")), str(_point(click).get("x", ""))
        return state.with_(pair=(s, t)) if HEAD_RE.match(s) and HEAD_RE.match(t) else state
    if source == "head-grid":  # categorical axes: y = "L1", x = "H3"
        other = str(_point(click).get("y", "")) + str(_point(click).get("x", ""))
        focus = focus_head(state)
        if focus and HEAD_RE.match(other):
            return state.with_(pair=(focus, other) if state.direction == "out" else (other, focus))
        return state
    if source == "kl-grid":  # categorical axes: y = source role, x = target role
        pairing = str(_point(click).get("y", "")) + str(_point(click).get("x", ""))
        return state.with_(pairing=pairing) if pairing in PAIRINGS else state
    data = _custom(click)
    if not data:
        return state
    if source == "graph":
        if data[0] == "node" and HEAD_RE.match(str(data[1])):
            return state.with_(head=str(data[1]), pair=None)
        if data[0] == "edge" and len(data) >= 4:
            return state.with_(pair=(str(data[1]), str(data[2])), pairing=str(data[3]), head=None)
        return state
    if source == "scatter" and len(data) >= 2:
        s, t = str(data[0]), str(data[1])
        return state.with_(pair=(s, t)) if HEAD_RE.match(s) and HEAD_RE.match(t) else state
    return state


def focus_head(state: ViewState) -> str | None:
    """The head the head grid is about: the selected head, else the selected pair's end."""
    if state.head:
        return state.head
    if state.pair:
        return state.pair[0] if state.direction == "out" else state.pair[1]
    return None


def view_params(state: ViewState, store: str, ready: dict[str, Any] | None) -> dict[str, Any]:
    """The parameter dict one view (or panel) renders from; includes the data-ready token."""
    fields = VIEW_PARAMS.get(store) or PANEL_PARAMS[store]
    d = state.to_dict()
    out = {f: d[f] for f in fields}
    if store == "head-grid":
        out["head"] = focus_head(state)
    ok = bool(ready) and ready.get("model") == state.model
    out["ready"] = ready.get("token") if ok else None
    return out


def register(app: Dash) -> None:
    outputs = ([Output("url", "search")] + [Output(cid, prop) for cid, prop, _ in CONTROLS]
               + [Output("model-select", "options"), Output("overlay-select", "options")])
    inputs = ([Input("url", "search")] + [Input(cid, prop) for cid, prop, _ in CONTROLS]
              + [Input(cid, prop) for cid, prop in CLICKS]
              + [Input({"type": "open-pair", "pairing": ALL, "source": ALL, "target": ALL}, "n_clicks"),
                 Input({"type": "open-head", "head": ALL}, "n_clicks"),
                 Input("models-store", "data"), Input("labels-store", "data")])

    @app.callback(outputs, inputs)
    def sync_state(search: str | None, *values: Any) -> list[Any]:
        """URL -> controls on navigation; control/click -> URL otherwise.

        Dropdown options are set here too, always holding the URL's model and overlay: Dash 4
        clears a dropdown value that is missing from its options, which would drop them from
        the URL on first load.
        """
        models, label_sets = values[-2], values[-1]
        state = parse_query(search, label_sets)
        trig = ctx.triggered_id
        n_out = len(CONTROLS)
        options = [model_options(models, state.model), overlay_options(label_sets, state.overlay)]
        if trig is None or trig in ("url", "models-store", "labels-store"):
            return [no_update] + control_values(state) + options
        no_options = [no_update, no_update]
        fields = {cid: (i, field) for i, (cid, _, field) in enumerate(CONTROLS)}
        controls = list(values[:n_out])
        control_trig = trig if isinstance(trig, str) and trig in fields else None
        new = from_controls(state, controls, skip=control_trig)
        if isinstance(trig, dict):
            clicked = ctx.triggered[0].get("value") if ctx.triggered else None
            if not clicked:
                raise PreventUpdate
            if trig.get("type") == "open-pair":
                new = new.with_(pair=(trig["source"], trig["target"]), pairing=trig["pairing"])
            elif trig.get("type") == "open-head":
                new = new.with_(head=trig["head"])
        elif control_trig is not None:
            i, field = fields[control_trig]
            new = apply_control(new, field, values[i], label_sets)
        else:
            click = values[n_out + [c for c, _ in CLICKS].index(trig)]
            if trig in ("head-close", "pair-close") and not click:
                raise PreventUpdate
            new = apply_click(new, trig, click)
        if new == state:
            # Keep the controls honest (e.g. an invalid k typed in) without touching history.
            return [no_update] + control_values(state) + no_options
        return [to_query(new)] + [no_update] * n_out + no_options

    stores = list(VIEW_PARAMS) + list(PANEL_PARAMS)
    views = list(VIEW_CONTROLS)

    @app.callback(
        [Output(f"params-{s}", "data") for s in stores]
        + [Output(f"view-{v}", "style") for v in views]
        + [Output(f"ctl-{g}", "style") for g in CONTROL_GROUPS]
        + [Output("k-input", "style"), Output("threshold-box", "style"),
           Output("head-panel", "style"), Output("pair-panel", "style"), Output("side", "className")],
        Input("url", "search"), Input("ready-store", "data"), Input("labels-store", "data"),
        [State(f"params-{s}", "data") for s in stores],
    )
    def route(search: str | None, ready: dict[str, Any] | None, label_sets: list[dict[str, Any]] | None,
              *current: Any) -> list[Any]:
        """Per-view parameter stores (only the active view and the panels), visibility styles.

        The label-set list is an input because a link without ``overlay`` opens the model's
        default overlay, which depends on it (``default_overlay``).
        """
        state = parse_query(search, label_sets)
        out: list[Any] = []
        for store, old in zip(stores, current):
            if store in VIEW_OF_STORE and VIEW_OF_STORE[store] != state.view:
                out.append(no_update)
                continue
            new = view_params(state, store, ready)
            out.append(no_update if new == old else new)
        out += [SHOW if v == state.view else HIDE for v in views]
        shown = VIEW_CONTROLS[state.view]
        out += [{"display": "flex"} if g in shown else HIDE for g in CONTROL_GROUPS]
        out += [{"display": "inline-block"} if state.rule == "topk" else HIDE,
                SHOW if state.rule == "threshold" else HIDE,
                SHOW if state.head else HIDE, SHOW if state.pair else HIDE,
                "side open" if (state.head or state.pair) else "side"]
        return out

    @app.callback(Output("share-url", "value"), Input("url", "search"), State("url", "href"))
    def share_link(search: str | None, href: str | None) -> str:
        """The full link of the current view (copied by the copy-link button)."""
        base = (href or "").split("?")[0].split("#")[0]
        return base + (search or to_query(ViewState()))
