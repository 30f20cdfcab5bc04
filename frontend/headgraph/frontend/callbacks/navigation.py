"""The URL: the one module that writes it, and the callbacks that build the page from it.

* ``write_url`` is the only writer of ``url.search``. Its inputs are the controls' values,
  the figures' clicks and the upload store; it returns the query of ``next_state(current URL,
  the one thing that changed)``, or no update when nothing changed. Panel buttons and view
  tabs are plain ``dcc.Link``s, so no pattern-matching input ever feeds it.
* ``render_controls`` builds the model dropdown, the view tabs and every control from the URL
  (the Pages-router idea): URL in, widgets out; never the other way round.
* ``show_page`` sets what is visible (views, panels, the graph's verify box) and fills the
  copy-link box: one callback, since every callback a page load runs costs the browser a round
  of store updates across the whole component tree.
"""

from __future__ import annotations

from typing import Any

from dash import Input, Output, State, ctx, no_update

from headgraph.frontend.api.answers import LabelSetSummary, ModelSummary
from headgraph.frontend.api.names import Vocabulary
from headgraph.frontend.callbacks.common import state_of, vocab
from headgraph.frontend.callbacks.define import callback
from headgraph.frontend.layout.controls import VIEW_CONTROLS, control_groups, model_picker, tab_links
from headgraph.frontend.state.transitions import (
    CLICK_SOURCES,
    CONTROL_FIELDS,
    SUBGRAPH_SOURCE,
    UPLOAD_SOURCE,
    next_state,
)
from headgraph.frontend.state.url import (
    VIEWS,
    ViewState,
    default_state,
    parse_query,
    quantize_threshold,
    to_query,
)

# (component id, property) of every input of the URL writer, in order.
WRITER_INPUTS: tuple[tuple[str, str], ...] = (
    *((cid, "value") for cid in CONTROL_FIELDS),
    *((fig, "clickData") for fig in CLICK_SOURCES),
    (UPLOAD_SOURCE, "data"),
    (SUBGRAPH_SOURCE, "data"),
)
SHOW = {"display": "block"}
HIDE = {"display": "none"}


def next_query(search: str | None, changes: list[tuple[str, Any]], vocab: Vocabulary,
               label_sets: list[LabelSetSummary] | None = None,
               slider_range: dict[str, Any] | None = None) -> str | None:
    """The new URL query after ``changes`` ((source id, new value), in order), or None if the
    state stays the same (values equal to the URL's, a component just rendered).

    ``slider_range``: the graph view's slider record; the slider reporting the default
    threshold the graph applied for a URL without one (the slider showing it, just rendered)
    is no change, so that URL stays as it is (and Back still leaves it).
    """
    state = parse_query(search, vocab, label_sets)
    applied = (slider_for(state, slider_range) or {}).get("value") if state.threshold is None else None
    new = state
    for source, value in changes:
        if source == "threshold-slider" and applied is not None and _same_threshold(value, applied):
            continue
        new = next_state(new, source, value, vocab, label_sets)
    return None if new == state else to_query(new)


def _same_threshold(value: Any, applied: float) -> bool:
    try:
        return quantize_threshold(float(value)) == applied
    except (TypeError, ValueError):
        return False


@callback(Output("url", "search"),
          [Input(cid, prop) for cid, prop in WRITER_INPUTS],
          State("url", "search"), State("labels-store", "data"), State("slider-range", "data"),
          prevent_initial_call=True)
def write_url(*args: Any) -> Any:
    """The single URL writer: current URL + what the user just changed -> new URL."""
    n = len(WRITER_INPUTS)
    values = dict(zip((cid for cid, _ in WRITER_INPUTS), args[:n]))
    search, label_sets = args[n], args[n + 1]
    slider_range = args[n + 2] if len(args) > n + 2 else None
    changed = [pid.rpartition(".")[0] for pid in ctx.triggered_prop_ids]
    changes = [(cid, values[cid]) for cid in changed if cid in values]
    if not changes:
        return no_update
    query = next_query(search, changes, vocab(), label_sets, slider_range)
    return no_update if query is None else query


def slider_for(state: ViewState, slider_range: dict[str, Any] | None) -> dict[str, Any] | None:
    """The graph view's threshold-slider range when it was computed for this state's graph
    (same model, pairings, threshold scale and URL threshold: its ``value`` is then the
    threshold that graph applied)."""
    if not slider_range:
        return None
    if slider_range.get("key") != [state.model, list(state.pairings), state.threshold_on, state.threshold]:
        return None
    return slider_range


@callback(Output("model-select-box", "children"), Output("view-tabs", "children"),
          Output("controls-dynamic", "children"), Output("controls-dynamic", "data-rendered"),
          Input("url", "search"), Input("models-store", "data"), Input("labels-store", "data"),
          Input("slider-range", "data"))
def render_controls(search: str | None, models: list[ModelSummary] | None,
                    label_sets: list[LabelSetSummary] | None,
                    slider_range: dict[str, Any] | None) -> tuple[Any, Any, Any, str]:
    """URL -> the model dropdown, the view tabs (links) and every control, valued from the URL.

    ``data-rendered`` names the query the controls show once the model and label-set lists
    are in too (tests wait for it before typing into a control).
    """
    state = state_of(search, label_sets)
    rendered = (search or "") if models is not None and label_sets is not None else "(loading)"
    return (model_picker(state, models), tab_links(state),
            control_groups(state, vocab(), label_sets, slider_for(state, slider_range)), rendered)


def visibility(state: ViewState) -> list[Any]:
    """Styles of the view containers, the panels, the side column and the upload box."""
    return ([SHOW if v == state.view else HIDE for v in VIEWS]
            + [SHOW if state.head else HIDE, SHOW if state.pair else HIDE,
               "side open" if (state.head or state.pair) else "side",
               {"display": "flex"} if "overlay" in VIEW_CONTROLS[state.view] else HIDE])


def share_link(search: str | None, href: str | None) -> str:
    """The full link of the current view (copied by the copy-link button)."""
    base = (href or "").split("?")[0].split("#")[0]
    return base + (search or to_query(default_state(vocab())))


def verify_box_style(state: ViewState) -> dict[str, str]:
    """The graph's "verify the top edges" box shows while the verification control is on."""
    return {"display": "flex"} if state.view == "graph" and state.verification != "off" else HIDE


@callback([Output(f"view-{v}", "style") for v in VIEWS]
          + [Output("head-panel", "style"), Output("pair-panel", "style"), Output("side", "className"),
             Output("ctl-upload", "style"), Output("verify-top-box", "style"), Output("share-url", "value")],
          Input("url", "search"), State("url", "href"))
def show_page(search: str | None, href: str | None) -> list[Any]:
    """What the URL shows (visibility(), then the verify box) and its full link."""
    state = state_of(search)
    return [*visibility(state), verify_box_style(state), share_link(search, href)]
