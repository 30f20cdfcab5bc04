"""The validation view: do PK, CS and data-weighted PK predict the path-ablation effect?

Opening the view never computes: it reads GET /api/validation?cached=true for the URL's model
and pairing (the API's default sample: n, k, seed), which answers ``computed: false`` until
someone computed that validation. Then the view says "not computed" and offers the **run
validation** button, the one thing here that computes: a plain GET /api/validation with the
user's own token (as the verify buttons do, callbacks/verify.py; a refusal shows the API's
message). The request lasts as long as the computation (minutes on a real model); while it
runs the button is disabled and a note counts the seconds in the browser. When it answers,
``validation-token`` changes and the view reads the cache again (its rendered-view key
includes whether the validation is cached, ``cached_state``).
"""

from __future__ import annotations

import time
from typing import Any

from dash import Input, Output, State, html, no_update

from headgraph.frontend.api.client import ApiError
from headgraph.frontend.callbacks.common import api, error_note, stat, state_of
from headgraph.frontend.callbacks.define import callback
from headgraph.frontend.callbacks.router import view_callback
from headgraph.frontend.figures import empty_figure
from headgraph.frontend.figures.graph_filters import ABLATION_PAIRINGS
from headgraph.frontend.figures.validation import (
    validation_figure,
    validation_scatter_figure,
    validation_words,
)
from headgraph.frontend.state.readiness import view_params

SHOW = {"display": "flex"}
HIDE = {"display": "none"}
NOT_COMPUTED = ("not computed: no one has validated this pairing's metrics against path ablation yet. "
                "“run validation” measures the sampled pairs (computes: seconds on the demo, minutes on a "
                "real model; in a lab it needs your token).")
# The browser counts the seconds while the run button's request is open.
ELAPSED_JS = """
function(n, started) {
  if (!started) return window.dash_clientside.no_update;
  return "running for " + Math.round((Date.now() - started) / 1000) + " s";
}
"""


def cached_state(params: dict[str, Any]) -> bool | None:
    """Whether the params' validation is cached (part of the view's rendered key, so a view
    drawn before a run is not served again after it); None when the API cannot say."""
    if params.get("pairing") not in ABLATION_PAIRINGS:
        return None
    try:
        return bool(api().validation(params["model"], params["pairing"], cached=True).get("computed"))
    except ApiError:
        return None


def chips(data: dict[str, Any]) -> list[Any]:
    """Summary chips: computed or not, the sample size, k, seed and the pairs measured."""
    computed = bool(data.get("computed"))
    out = [html.Span("computed" if computed else "not computed", id="validation-state",
                     className="badge verdict verdict-" + ("verified" if computed else "not-measured"),
                     **{"data-computed": "true" if computed else "false"})]
    if computed:
        out += [stat("random pairs", data.get("n_sample"), "val-n"), stat("top-k", data.get("k"), "val-k"),
                stat("seed", data.get("seed"), "val-seed"),
                stat("pairs measured", len(data.get("edges") or []), "val-edges")]
    return out


@view_callback("validation", Output("validation", "figure"), Output("validation-scatter", "figure"),
               Output("validation-summary", "children"), Output("validation-words", "children"),
               Output("validation-run-box", "style"), Output("validation-scatter-box", "style"),
               labels=False, triggers=(Input("validation-token", "data"),), variant=cached_state)
def render_validation(search: str | None, ready: dict | None) -> tuple:
    """The URL's pairing validated: forest plot, scatter and words, or "not computed"."""
    return validation_view(view_params(state_of(search), "validation", ready))


def validation_view(params: dict[str, Any] | None) -> tuple:
    """(forest figure, scatter figure, chips, words, run-box style, scatter-box style) for the
    validation params (None: the view is not shown)."""
    if not params:
        blank = empty_figure("")
        return blank, blank, [], [], HIDE, HIDE
    pairing = params["pairing"]
    if pairing not in ABLATION_PAIRINGS:
        msg = (f"validation compares the metrics with path-ablation effects, which exist for "
               f"{', '.join(ABLATION_PAIRINGS)}; pick one of them (now {pairing})")
        return empty_figure(msg), empty_figure(""), [error_note(msg)], [], HIDE, HIDE
    try:
        data = api().validation(params["model"], pairing, cached=True)
    except ApiError as err:
        return empty_figure(err.message), empty_figure(""), [error_note(err.message)], [], HIDE, HIDE
    if not data.get("computed"):
        note = html.P(NOT_COMPUTED, id="validation-not-computed", className="validation-note")
        return (empty_figure(f"{pairing}: not computed", 220), empty_figure(""), chips(data), [note],
                SHOW, HIDE)
    words = [html.P(line, className="validation-line") for line in validation_words(data)]
    return (validation_figure(data), validation_scatter_figure(data), chips(data), words, HIDE,
            {"display": "block"})


@callback(Output("validation-token", "data"), Output("validation-run-msg", "children"),
          Input("validation-run-btn", "n_clicks"), State("url", "search"), prevent_initial_call=True,
          running=[(Output("validation-run-btn", "disabled"), True, False),
                   (Output("validation-running", "style"), {"display": "inline"}, HIDE),
                   (Output("validation-tick", "disabled"), False, True)])
def run_validation(n_clicks: int | None, search: str | None) -> tuple:
    """Compute the URL's validation with the user's own credential (their 401 / 403 shown)."""
    state = state_of(search)
    if not n_clicks or state.pairing not in ABLATION_PAIRINGS:
        return no_update, no_update
    started = time.monotonic()
    try:
        api().validation(state.model, state.pairing)
    except ApiError as err:
        return no_update, html.Span(err.message, className="error-note", id="validation-run-error")
    took = time.monotonic() - started
    return ({"model": state.model, "pairing": state.pairing, "at": time.time()},
            html.Span(f"computed in {took:.0f} s", id="validation-run-done"))


def register_clientside(app: Any) -> None:
    """The running note's seconds: the click's time, then one tick a second while it runs."""
    app.clientside_callback("function(n) { return n ? Date.now() : window.dash_clientside.no_update; }",
                            Output("validation-started", "data"), Input("validation-run-btn", "n_clicks"),
                            prevent_initial_call=True)
    app.clientside_callback(ELAPSED_JS, Output("validation-elapsed", "children"),
                            Input("validation-tick", "n_intervals"), State("validation-started", "data"),
                            prevent_initial_call=True)
