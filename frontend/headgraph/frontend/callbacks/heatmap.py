"""Heatmap view: the full pair grid of one pairing and one head's outgoing/incoming grid."""

from __future__ import annotations

from typing import Any

from dash import Output

from headgraph.frontend.api.answers import LabelSetSummary, ScoreGrid
from headgraph.frontend.api.client import ApiClient, ApiError
from headgraph.frontend.callbacks.common import (
    WAITING,
    api,
    class_order,
    error_note,
    overlay_classes,
    stat,
    state_of,
    vocab,
)
from headgraph.frontend.callbacks.router import view_callback
from headgraph.frontend.figures import empty_figure, head_grid_figure, score_heatmap
from headgraph.frontend.figures.heatmaps import block_grid, grid_labels, layer_overview
from headgraph.frontend.state.readiness import view_params, waiting_for


def metric_grid(client: ApiClient, model: str, pairing: str, metric: str) -> ScoreGrid:
    """The API grid for a metric switch value: GET /api/pk's raw / normalized / z PK and its
    cka / procrustes grids (the PK paper's baselines on PK's pairs), or GET /api/cs (CS exists
    for OQ / OK / OV only).

    On a grouped-query model an OK / OV PK, CKA or Procrustes grid has KV groups on its target
    axis ("L6KV1"), its CS grid query heads (labels made to match, see figures.heatmaps.grid_labels).
    """
    if metric == "cs":
        if pairing not in vocab().cs_pairings:
            raise ApiError(422, f"Composition Score exists for OQ, OK and OV only, not {pairing}")
        return grid_labels(client.cs(model, pairing[1]))  # query heads on both axes
    return client.pk(model, pairing, metric)


def hover_grids(client: ApiClient, model: str, pairing: str, metric: str) -> dict[str, ScoreGrid]:
    """Other metrics shown in the hover: raw PK and CS next to the coloured one."""
    out: dict[str, ScoreGrid] = {}
    if metric != "raw":
        out["PK"] = client.pk(model, pairing, "raw")
    if metric != "cs" and pairing in vocab().cs_pairings:
        out["CS"] = client.cs(model, pairing[1])
    return out


@view_callback("heatmap", Output("heatmap", "figure"), Output("heatmap-summary", "children"),
               Output("heatmap-summary", "data-cells"))
def render_heatmap(search: str | None, ready: dict | None, label_sets: list | None) -> tuple:
    """The full pair grid of the URL's pairing and metric (when the heatmap tab shows), its
    layer overview, or one layer block of it."""
    state = state_of(search, label_sets)
    return heatmap_view(view_params(state, "heatmap", ready), label_sets,
                        waiting=waiting_for(state, ready, "heatmap"))


def heatmap_view(params: dict[str, Any] | None, label_sets: list[LabelSetSummary] | None = None,
                 waiting: str = WAITING) -> tuple:
    """(figure, summary chips, cell count) for heatmap params (None: a waiting note);
    ``label_sets``: the API's label-set list (the overlay's class order; read when None)."""
    if not params or not params.get("ready"):
        return empty_figure(waiting), [], None
    client = api()
    model, pairing, metric = params["model"], params["pairing"], params["metric"]
    try:
        grid = metric_grid(client, model, pairing, metric)
        if params.get("grain") == "layers":
            fig = layer_overview(grid, metric=metric)
            n = len(grid["layer_indices"])
            return fig, [stat("blocks", n * n, "cells"), stat("min", grid.get("min"), "min", "{:.4g}"),
                         stat("max", grid.get("max"), "max", "{:.4g}")], str(n * n)
        extra = hover_grids(client, model, pairing, metric)
        if params.get("zoom"):
            grid = block_grid(grid, tuple(params["zoom"]))
    except (ApiError, KeyError) as err:
        message = err.message if isinstance(err, ApiError) else str(err.args[0])
        return empty_figure(message), [error_note(message)], None
    classes = overlay_classes(client, params.get("overlay"), model)
    order = class_order(client, params.get("overlay"), label_sets) if classes else ()
    fig = score_heatmap(grid, metric=metric, hover_grids=extra, classes=classes, class_order=order)
    rows, cols = len(grid["source_labels"]), len(grid["target_labels"])
    n_valid = sum(v for a in grid["valid"] for b in a for c in b for v in c)
    chips = [stat("cells", rows * cols, "cells"), stat("valid", n_valid, "valid"),
             stat("min", grid.get("min"), "min", "{:.4g}"), stat("max", grid.get("max"), "max", "{:.4g}")]
    if params.get("zoom"):
        s, t = params["zoom"]
        chips.insert(0, stat("block", f"{s} → {t} (back: cells = layer overview)", "zoom"))
    return fig, chips, str(rows * cols)


@view_callback("head-grid", Output("head-grid", "figure"), Output("head-grid-summary", "children"),
               Output("head-grid-box", "style"))
def render_head_grid(search: str | None, ready: dict | None, label_sets: list | None) -> tuple:
    """One head's outgoing / incoming scores (the selected head, else the pair's end)."""
    state = state_of(search, label_sets)
    return head_grid_view(view_params(state, "head-grid", ready), waiting_for(state, ready, "head-grid"))


def head_grid_view(params: dict[str, Any] | None, waiting: str = WAITING) -> tuple:
    """(figure, summary chips, box style) for head-grid params (None: hidden)."""
    if not params or not params.get("ready"):
        return empty_figure(waiting, 300), [], {"display": "none"}
    head = params.get("head")
    if not head:
        hint = "click a cell above, or a node in the head graph, to see one head's scores"
        return empty_figure(hint, 200), [], {"display": "block"}
    client = api()
    try:
        grid = metric_grid(client, params["model"], params["pairing"], params["metric"])
        fig = head_grid_figure(grid, head, params["direction"], metric=params["metric"])
    except (ApiError, KeyError) as err:
        msg = err.message if isinstance(err, ApiError) else f"{head}: {err.args[0]}"
        return empty_figure(msg, 200), [error_note(msg)], {"display": "block"}
    chips = [stat("head", head, "grid-head"), stat("direction", params["direction"], "grid-direction")]
    return fig, chips, {"display": "block"}
