"""Only the visible view's callbacks run: a browser-side router in front of every view.

Every view (a figure block or a side panel) renders from three per-view stores,
``in-<view>-search``, ``in-<view>-ready`` and ``in-<view>-labels``, instead of the URL, the
ready record and the label sets themselves. The clientside ``ROUTER_JS`` copies those three
into a view's stores only when that view is shown (its tab is open; a panel has a head or a
pair selected) and what it renders from changed (its URL fields, the ready record, the label
sets). A hidden view costs no request; a view whose inputs did not change is not redrawn.

``view_callback`` registers a view's server callback on those stores and adds one more
guard: the view's parameters as last rendered (``in-<view>-rendered``). While a job runs,
the ready record changes with every cached stage, but a view already drawn from its own
results keeps the same parameters (state.ready_token) and is left as it is, not redrawn.
A render that hit an API error (``common.error_note``) is not recorded, so it is retried.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from typing import Any, TypeVar

import flask
from dash import Dash, Input, Output, State, no_update

from headgraph.frontend.api.context import rendered_views, vocab
from headgraph.frontend.callbacks.define import callback
from headgraph.frontend.state.readiness import ROUTED_VIEWS, TAB_OF, VIEW_PARAMS, view_params
from headgraph.frontend.state.url import DEFAULT_MODEL, VIEWS, ViewState, parse_query

ROUTED = ROUTED_VIEWS  # graph, heatmap, head-grid, ..., head-panel, pair-panel
# The URL fields each view renders from (the head grid also follows the selected head / pair).
URL_FIELDS: dict[str, tuple[str, ...]] = {v: VIEW_PARAMS[v] + (("head", "pair") if v == "head-grid" else ())
                                          for v in ROUTED}
ERROR_FLAG = "headgraph_view_error"
ViewFn = TypeVar("ViewFn", bound=Callable[..., Any])  # a view's render function, kept as it is
DEFAULT_VIEW = next(f.default for f in dataclasses.fields(ViewState) if f.name == "view")

ROUTER_JS = """
function(search, labels, ready, readyInitial) {
  const cfg = __CONFIG__;
  const nu = window.dash_clientside.no_update;
  const q = new URLSearchParams(search || "");
  const view = cfg.views.includes(q.get("view")) ? q.get("view") : cfg.default_view;
  const model = q.get("model") || cfg.default_model;
  // The model bar's record; until its first answer, the one the page's layout came with.
  if (!ready && readyInitial && readyInitial.model === model) ready = readyInitial;
  const last = (window.__headgraphRouted = window.__headgraphRouted || {});
  const out = [];
  for (const v of cfg.routed) {
    const shown = v === "head-panel" ? !!q.get("head")
        : v === "pair-panel" ? !!q.get("pair") : cfg.tab_of[v] === view;
    const key = JSON.stringify([cfg.fields[v].map((f) => q.has(f) ? q.get(f) : cfg.defaults[f]), ready || null,
                                cfg.labels[v] ? (labels || null) : null]);
    if (!shown || last[v] === key) { out.push(nu, nu, nu); continue; }
    last[v] = key;
    out.push(search || "", ready || null, labels || null);
  }
  return out;
}
"""
# The same router when the model bar's ready record or the label sets change (its arguments
# in another order): Dash holds a callback back while a producer of one of its Inputs may still
# run, so the first routing reads those two as States and does not wait for the model bar.
ROUTER_ON_READY_JS = """
function(ready, search, labels, readyInitial) {
  return (__ROUTER__)(search, labels, ready, readyInitial);
}
"""
ROUTER_ON_LABELS_JS = """
function(labels, search, ready, readyInitial) {
  return (__ROUTER__)(search, labels, ready, readyInitial);
}
"""


def router_config() -> dict[str, Any]:
    return {"views": list(VIEWS), "default_view": DEFAULT_VIEW, "default_model": DEFAULT_MODEL, "routed": list(ROUTED),
            "tab_of": TAB_OF, "fields": {v: list(f) for v, f in URL_FIELDS.items()},
            "labels": {v: True for v in ROUTED},
            # A field absent from the URL reads its static default (a link and its normalized
            # form then give the same key); fields without one read null.
            "defaults": {f.name: f.default for f in dataclasses.fields(ViewState)
                         if isinstance(f.default, str) and f.name != "overlay"}}


def register_clientside(app: Dash) -> None:
    """The router, run in the browser on every URL change, and again when the model bar's
    ready record or the label sets change. On a page load it routes at once with the ready record
    the layout brought (``ready-initial``), so a warm view's callback starts while the model
    bar's first answer and plotly.js are still loading."""
    router = ROUTER_JS.replace("__CONFIG__", json.dumps(router_config())).strip()
    outputs = [Output(f"in-{v}-{part}", "data") for v in ROUTED for part in ("search", "ready", "labels")]
    again = [Output(o.component_id, o.component_property, allow_duplicate=True) for o in outputs]
    app.clientside_callback(router, *outputs, Input("url", "search"), State("labels-store", "data"),
                            State("ready-store", "data"), State("ready-initial", "data"))
    app.clientside_callback(ROUTER_ON_READY_JS.replace("__ROUTER__", router), *again,
                            Input("ready-store", "data"), State("url", "search"), State("labels-store", "data"),
                            State("ready-initial", "data"), prevent_initial_call=True)
    app.clientside_callback(ROUTER_ON_LABELS_JS.replace("__ROUTER__", router), *again,
                            Input("labels-store", "data"), State("url", "search"), State("ready-store", "data"),
                            State("ready-initial", "data"), prevent_initial_call=True)


def render_key(view: str, search: str | None, ready: dict | None, label_sets: list | None,
               variant: Callable[[dict[str, Any]], Any] | None = None) -> str:
    """What ``view`` draws from: its parameters (None while waiting), the label sets' digest and,
    with ``variant``, what else its drawing reads (``variant(params)``: server state such as
    which ablations are cached)."""
    params = view_params(parse_query(search, vocab(), label_sets), view, ready)
    digest = hashlib.blake2b(json.dumps(label_sets, sort_keys=True, default=str).encode(), digest_size=8)
    extra = [variant(params)] if variant is not None and params is not None else []
    return json.dumps([params, digest.hexdigest(), *extra], sort_keys=True, default=str)


def mark_error() -> None:
    """Called by ``common.error_note``: this render showed an error, so do not record it."""
    if flask.has_request_context():
        setattr(flask.g, ERROR_FLAG, True)


def view_callback(view: str, *outputs: Output, labels: bool = True, triggers: tuple[Input, ...] = (),
                  variant: Callable[[dict[str, Any]], Any] | None = None,
                  settle: tuple[Callable[..., tuple], tuple[State, ...]] | None = None
                  ) -> Callable[[ViewFn], ViewFn]:
    """Register ``func(search, ready[, label_sets]) -> tuple of outputs`` (or its one output) as
    ``view``'s callback, fed by the router's stores and skipped when its parameters are those last rendered.
    ``triggers``: more inputs that make it look again (their values are not passed);
    ``variant``: see render_key; ``settle``: ``(fn, states)``, ``fn(outputs, *state values)``
    gives the outputs sent, computed or replayed, against the page as it was when the render
    was asked for (a control it would redraw unchanged is left alone). Returns ``func``
    unchanged (tests call it directly)."""
    def decorate(func: ViewFn) -> ViewFn:
        inputs = [Input(f"in-{view}-search", "data"), Input(f"in-{view}-ready", "data")]
        if labels:
            inputs.append(Input(f"in-{view}-labels", "data"))
        n_given = len(inputs)
        inputs += list(triggers)
        finish, states = settle if settle is not None else (None, ())
        n_states = len(states)

        def routed(*args: Any) -> tuple:
            seen: tuple[Any, ...] = ()
            if n_states:
                args, seen = args[:-n_states], args[-n_states:]
            *given, rendered = args
            given = given[:n_given]
            result = _render(given, rendered)
            if finish is None or result[-1] is no_update:
                return result
            return (*finish(result[:-1], *seen), result[-1])

        def _render(given: list[Any], rendered: Any) -> tuple:
            key = render_key(view, given[0], given[1], given[2] if labels else None, variant)
            if key == rendered:
                return tuple([no_update] * (len(outputs) + 1))
            views = rendered_views()
            known = views.get(key) if json.loads(key)[0] is not None else None
            if known is not None:
                return (*known, key)
            result = func(*given)
            result = result if isinstance(result, tuple) else (result,)
            failed = flask.has_request_context() and getattr(flask.g, ERROR_FLAG, False)
            if not failed and json.loads(key)[0] is not None:
                views.put(key, result)
            return (*result, None if failed else key)

        routed.__name__ = f"routed_{func.__name__}"
        callback(*outputs, Output(f"in-{view}-rendered", "data"), *inputs,
                 State(f"in-{view}-rendered", "data"), *states, prevent_initial_call=True)(routed)
        return func
    return decorate
