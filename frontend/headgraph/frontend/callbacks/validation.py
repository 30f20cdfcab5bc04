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

import re
import time
from typing import Any

from dash import Input, Output, State, html, no_update

from headgraph.frontend.api.answers import ValidationOut
from headgraph.frontend.api.client import ApiError
from headgraph.frontend.callbacks.common import api, data_attrs, error_note, stat, state_of
from headgraph.frontend.callbacks.define import callback
from headgraph.frontend.callbacks.router import view_callback
from headgraph.frontend.figures import empty_figure
from headgraph.frontend.figures.graph_filters import ABLATION_PAIRINGS
from headgraph.frontend.figures.validation import (
    PROMPT_LABELS,
    interval_text,
    paired_rows,
    power_text,
    validation_figure,
    validation_scatter_figure,
    validation_words,
    verdict_text,
)
from headgraph.frontend.state.readiness import view_params

SHOW = {"display": "flex"}
HIDE = {"display": "none"}
NOT_COMPUTED = ("not computed: no one has validated this pairing's metrics against path ablation yet. "
                "“run validation” measures the sampled pairs (computes: under a minute on the demo, minutes "
                "on a real model; in a lab it needs your token).")
# The browser counts the seconds while the run button's request is open.
ELAPSED_JS = """
function(n, started) {
  if (!started) return window.dash_clientside.no_update;
  return "running for " + Math.round((Date.now() - started) / 1000) + " s";
}
"""



def paired_row_id(prompts: str, metric: str) -> str:
    """A paired row's element id, CSS-safe: 'text (held-out)', 'CS' -> 'paired-text-held-out-CS'."""
    return "paired-" + re.sub(r"[^A-Za-z0-9]+", "-", f"{prompts} {metric}").strip("-")

def cached_state(params: dict[str, Any]) -> bool | None:
    """Whether the params' validation is cached (part of the view's rendered key, so a view
    drawn before a run is not served again after it); None when the API cannot say."""
    if params.get("pairing") not in ABLATION_PAIRINGS:
        return None
    try:
        return bool(api().validation(params["model"], params["pairing"], cached=True).get("computed"))
    except ApiError:
        return None


def chips(data: ValidationOut) -> list[Any]:
    """Summary chips: computed or not, the sample size (of the requested), its power for
    ρ = 0.3, k, seed and the pairs measured."""
    computed = bool(data.get("computed"))
    power = data.get("power") or {}
    out = [html.Span("computed" if computed else "not computed", id="validation-state",
                     className="badge verdict verdict-" + ("verified" if computed else "not-measured"),
                     **data_attrs({"data-computed": "true" if computed else "false"}))]
    if computed:
        out += [stat("random pairs", data.get("n_sample"), "val-n"),
                stat("asked for", power.get("requested"), "val-requested"),
                stat(f"power (ρ = {power.get('rho', 0.3):g})", power.get("power"), "val-power", "{:.2f}"),
                stat("top-k", data.get("k"), "val-k"), stat("seed", data.get("seed"), "val-seed"),
                stat("pairs measured", len(data.get("edges") or []), "val-edges")]
    elif power:
        out += [stat("random pairs asked for", power.get("requested"), "val-requested"),
                stat(f"power (ρ = {power.get('rho', 0.3):g})", power.get("power"), "val-power", "{:.2f}")]
    return out


def paired_table(data: ValidationOut) -> html.Table:
    """The decision rule's table (id "validation-paired"): per prompt set, PK minus each other
    metric's Spearman on the same random pairs with its paired bootstrap 95% interval and
    verdict; a row's data-verdict / data-difference carry the API's values."""
    head = html.Tr([html.Th(h) for h in ("prompts", "comparison", "difference [95%]", "pairs", "verdict")])
    rows = []
    for r in paired_rows(data):
        name = f"{r['metric_a']} − {r['metric_b']}" + (" (baseline)" if r["baseline"] else "")
        rows.append(html.Tr([
            html.Td(PROMPT_LABELS.get(r["prompts"], r["prompts"])), html.Td(name),
            html.Td(interval_text({"value": r["difference"], "low": r["low"], "high": r["high"]})),
            html.Td(str(r["n"])),
            html.Td(verdict_text(r), className="paired-verdict paired-" + (r["verdict"] or "none"))],
            id=paired_row_id(r["prompts"], r["metric_b"]), className="paired-row",
            **data_attrs({"data-verdict": r["verdict"] or "", "data-difference": "" if r["difference"] is None
                          else repr(r["difference"])})))
    return html.Table([html.Thead(head), html.Tbody(rows)], id="validation-paired", className="paired-table")


def precision_row_id(metric: str) -> str:
    """A precision row's element id, CSS-safe: 'data-PK out' -> 'precision-data-PK-out'."""
    return "precision-" + re.sub(r"[^A-Za-z0-9]+", "-", metric).strip("-")


def _p_text(p: Any) -> str:
    return "—" if p is None else (f"{p:.1e}" if p < 1e-3 else f"{p:.3f}")


def precision_table(data: ValidationOut) -> html.Table | None:
    """Calibrated precision (id "validation-precision"): per metric, the share of its top-k
    pairs verified against the random-pair null, the null's own share above the same
    thresholds, and the one-sided Fisher exact test of the difference; a row's data-verified /
    data-p carry the API's values. None when the answer has no precision rows."""
    rows_in = data.get("precision") or []
    if not rows_in:
        return None
    head = html.Tr([html.Th(h) for h in ("metric", "top-k verified", "held-out null verified", "achieved FWER",
                                          "odds ratio", "p (Fisher, one-sided)", "matched null p")])
    rows = []
    for r in rows_in:
        odds = r.get("odds_ratio")
        if r.get("verified") is None:  # unresolved: too few null pairs for the quantile, no verdict
            cells = ["unresolved (null too small)", f"— / {r.get('n_null', 0)}", "—", "—", "—", "—"]
        else:
            matched = r.get("matched") or {}
            cells = [f"{r['verified']} / {r['k']} ({r['precision']:.0%})",
                     f"{r['null_verified']} / {r['n_null']} ({r['null_share']:.0%})",
                     "—" if r.get("achieved_fwer") is None else f"{r['achieved_fwer']:.2g}",
                     "—" if odds is None else ("∞" if odds == float("inf") else f"{odds:.3g}"),
                     _p_text(r.get("p_value")), _p_text(matched.get("p_value"))]
        rows.append(html.Tr([html.Td(r["metric"]), *[html.Td(c) for c in cells]],
                            id=precision_row_id(r["metric"]), className="precision-row",
                            **data_attrs({"data-verified": "" if r.get("verified") is None else str(r["verified"]),
                                          "data-k": str(r["k"]),
                                          "data-p": "" if r.get("p_value") is None else repr(r["p_value"])})))
    return html.Table([html.Thead(head), html.Tbody(rows)], id="validation-precision", className="paired-table")


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
        planned = html.P(f"The sample to run: {power_text(data)}; a model with fewer valid forward pairs draws all of "
                         "them (the answer then states their power).",
                         id="validation-power", className="validation-note")
        return (empty_figure(f"{pairing}: not computed", 220), empty_figure(""), chips(data), [note, planned],
                SHOW, HIDE)
    lines = validation_words(data)
    words = [html.P(lines[0], className="validation-line"),
             html.P(lines[1], id="validation-power", className="validation-line"),
             *[html.P(line, className="validation-line") for line in lines[2:]],
             html.P("Decision rule: PK minus each metric's Spearman with the effect on the same random pairs, "
                    "with a paired bootstrap 95% interval; a metric is better only when that interval "
                    "excludes 0.", className="validation-note"),
             paired_table(data)]
    precision = precision_table(data)
    if precision is not None:
        words += [html.P("Calibrated precision: the random pairs outside a metric's top-k are split in seeded "
                         "halves; one half sets the thresholds (Bonferroni over the k pairs and prompt sets), the "
                         "top-k and the other half are judged by them (one-sided Fisher exact test). The held-out "
                         "share above the thresholds times k is the achieved family-wise error (expected ≤ 0.05); "
                         "the matched null compares with held-out pairs of the same source-variance tertile and "
                         "layer gap.", className="validation-note"), precision]
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
