"""The compare and timeline views, read over HTTP like every view.

compare: GET /api/compare of A (the ``a`` field, else the model) and B for the URL's pairing
and k: chips (|B - A|, edges gained / lost / kept), A | B | B - A heatmaps, the edge-change
graph and tables of edges and hubs. timeline: GET /api/timeline of the URL's series, pairing
and k (at most 50): a slider over the checkpoints (``checkpoint`` in the URL: its position), one PK line per edge
and the shown checkpoint's grid (GET /api/pk of its model); the trajectories download as CSV
(``format=csv``). Both compute PK on first use (cold work: in a lab it needs the token).
"""

from __future__ import annotations

from typing import Any

from dash import Input, Output, State, dcc, html, no_update

from headgraph.frontend.api.answers import CompareOut, EdgeChangeOut
from headgraph.frontend.api.client import ApiError
from headgraph.frontend.callbacks.common import api, error_note, stat, state_of, vocab
from headgraph.frontend.callbacks.define import callback
from headgraph.frontend.callbacks.router import view_callback
from headgraph.frontend.figures import empty_figure
from headgraph.frontend.figures.compare import (
    checkpoint_heatmap,
    compare_graph,
    compare_heatmaps,
    timeline_figure,
)
from headgraph.frontend.layout.compare import step_slider
from headgraph.frontend.state.readiness import view_params

PICK_B = "pick model B (a model with the same layers and heads as A, e.g. a checkpoint: demo@step-417)"


def model_suggestions() -> list[Any]:
    """Datalist options: the API's models and every series checkpoint."""
    ids: list[str] = []
    try:
        ids += [m["id"] for m in api().models()]
        for checkpoints in api().series().get("series", {}).values():
            ids += [c["model"] for c in checkpoints]
    except ApiError:
        pass
    return [html.Option(value=i) for i in dict.fromkeys(ids)]


def _edge_rows(rows: list[EdgeChangeOut], status: str) -> list[Any]:
    return [html.Tr([html.Td(f"{r['source']} → {r['target']}"), html.Td(status), html.Td(f"{r['a']:.3f}"),
                     html.Td(f"{r['b']:.3f}"), html.Td(f"{r['delta']:+.3f}"), html.Td(str(r["rank_a"] or "–")),
                     html.Td(str(r["rank_b"] or "–"))], className=f"edge-{status}") for r in rows]


def compare_tables(data: CompareOut) -> list[Any]:
    """Edges gained / lost / changed and the hubs that moved, as HTML tables."""
    head = html.Tr([html.Th(h) for h in ("edge", "status", "A", "B", "B − A", "rank A", "rank B")])
    edges = html.Table([html.Thead(head), html.Tbody(
        _edge_rows(data["gained"], "gained") + _edge_rows(data["lost"], "lost")
        + _edge_rows(data["changed"], "kept"))], id="compare-edges", className="data-table")
    hubs = html.Table([html.Thead(html.Tr([html.Th(h) for h in ("hub", "status", "rank A", "rank B",
                                                                 "degree A", "degree B")])),
                       html.Tbody([html.Tr([html.Td(m["name"]), html.Td(m["status"]), html.Td(str(m["rank_a"] or "–")),
                                            html.Td(str(m["rank_b"] or "–")), html.Td(str(m["degree_a"])),
                                            html.Td(str(m["degree_b"]))]) for m in data["hub_moves"]])],
                      id="compare-hubs", className="data-table")
    return [html.H4("edges of either top-k"), edges, html.H4("hubs"), hubs]


@view_callback("compare", Output("compare-heatmaps", "figure"), Output("compare-graph", "figure"),
               Output("compare-summary", "children"), Output("compare-tables", "children"),
               Output("compare-model-list", "children"), labels=False)
def render_compare(search: str | None, ready: dict | None) -> tuple:
    """A vs B of the URL's pairing."""
    return compare_view(view_params(state_of(search), "compare", ready))


def compare_view(params: dict[str, Any] | None) -> tuple:
    """(heatmaps, graph, chips, tables, suggestions) for the compare params (None: not shown)."""
    if not params:
        blank = empty_figure("")
        return blank, blank, [], [], no_update
    suggestions = model_suggestions()
    a = params["a"] or params["model"]
    if not params["b"]:
        return (empty_figure(PICK_B, 300), empty_figure("", 200),
                [html.Span(PICK_B, id="compare-pick-b", className="validation-note")], [], suggestions)
    try:
        data = api().compare(a, params["b"], params["pairing"], params["k"])
    except ApiError as err:
        return empty_figure(err.message, 300), empty_figure("", 200), [error_note(err.message)], [], suggestions
    s = data["summary"]
    chips = [stat("A", data["a"], "cmp-a"), stat("B", data["b"], "cmp-b"),
             stat("max |B − A|", s["max_abs_diff"], "cmp-max", "{:.3f}"),
             stat("gained", s["n_gained"], "cmp-gained"), stat("lost", s["n_lost"], "cmp-lost"),
             stat("kept", s["n_kept"], "cmp-kept"),
             stat("hubs", ", ".join(m["name"] for m in data["hub_moves"]) or "–", "cmp-hubs")]
    return compare_heatmaps(data), compare_graph(data), chips, compare_tables(data), suggestions


def _series_suggestions() -> list[Any]:
    try:
        names = list(api().series().get("series", {}))
    except ApiError:
        names = []
    return [html.Option(value=n) for n in names]


def keep_slider(outputs: tuple, value: Any, marks: Any) -> tuple:
    """The timeline's outputs with the checkpoint slider left as the page has it when it already
    shows these steps at this position: a render asked for before the user moved the slider, and
    answered after, must not move it back (its new slider would write its position to the URL)."""
    slider = outputs[3]
    if slider is no_update or not isinstance(slider, dcc.Slider):
        return outputs
    new_marks = {str(k): v for k, v in (getattr(slider, "marks", None) or {}).items()}
    old_marks = {str(k): v for k, v in (marks or {}).items()}
    if new_marks and new_marks == old_marks and getattr(slider, "value", None) == value:
        return (*outputs[:3], no_update, *outputs[4:])
    return outputs


@view_callback("timeline", Output("timeline", "figure"), Output("timeline-grid", "figure"),
               Output("timeline-summary", "children"), Output("step-slider-box", "children"),
               Output("series-list", "children"),
               labels=False, settle=(keep_slider, (State("step-slider", "value"), State("step-slider", "marks"))))
def render_timeline(search: str | None, ready: dict | None) -> tuple:
    """The URL's series: trajectories and the shown checkpoint's grid."""
    return timeline_view(view_params(state_of(search), "timeline", ready))


def timeline_view(params: dict[str, Any] | None) -> tuple:
    """(trajectories, grid, chips, checkpoint slider, series suggestions)."""
    if not params:
        blank = empty_figure("")
        return blank, blank, [], no_update, no_update
    suggestions = _series_suggestions()
    try:
        data = api().timeline(params["series"], params["pairing"],
                              min(int(params["k"]), vocab().limits.timeline_edges_max))
    except ApiError as err:
        return (empty_figure(err.message, 300), empty_figure("", 200), [error_note(err.message)],
                no_update, suggestions)
    steps, models = data["steps"], data["models"]
    shown = int(params["checkpoint"]) if params["checkpoint"] else len(steps) - 1
    shown = min(shown, len(steps) - 1)
    step, model = steps[shown], models[shown]
    try:
        top = [v for e in data["edges"] for v in e["pk"] if v is not None]  # one scale for every step
        grid = checkpoint_heatmap(api().pk(model, params["pairing"]), step, model, max(top) if top else None)
    except ApiError as err:
        grid = empty_figure(err.message, 300)
    growth = [(e["source"], e["target"], e["change"]) for e in data["edges"] if e["change"] is not None]
    top = max(growth, key=lambda g: g[2]) if growth else None
    chips = [stat("series", data["series"], "tl-series"), stat("checkpoints", len(steps), "tl-n"),
             stat("step", step, "tl-step"), stat("model", model, "tl-model"),
             stat("edges", len(data["edges"]), "tl-edges")]
    if top:
        chips.append(stat("grew most", f"{top[0]} → {top[1]} ({top[2]:+.2f})", "tl-grew"))
    return timeline_figure(data, step), grid, chips, step_slider(steps, shown), suggestions


@callback(Output("timeline-download", "data"), Input("timeline-csv-btn", "n_clicks"), State("url", "search"),
          prevent_initial_call=True)
def download_timeline(n_clicks: int | None, search: str | None) -> Any:
    """The trajectories as CSV (GET /api/timeline?format=csv)."""
    if not n_clicks:
        return no_update
    state = state_of(search)
    try:
        resp = api().request("GET", "/api/timeline", params={
            "series": state.series, "pairing": state.pairing,
            "k": min(state.k, vocab().limits.timeline_edges_max), "format": "csv"})
    except ApiError:
        return no_update
    name = "".join(c if c.isalnum() or c in "-_" else "_" for c in state.series)[:60]
    return dcc.send_string(resp.text, f"timeline-{name}-{state.pairing}.csv")
