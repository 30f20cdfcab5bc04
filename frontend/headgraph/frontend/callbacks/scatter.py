"""PK vs CS scatter view (paper Fig. 5): quadrants, cutoffs and Spearman correlations."""

from __future__ import annotations

from typing import Any

from dash import Output

from headgraph.frontend.api.client import ApiError
from headgraph.frontend.callbacks.common import WAITING, api, error_note, stat, state_of, vocab
from headgraph.frontend.callbacks.router import view_callback
from headgraph.frontend.figures import empty_figure, scatter_figure
from headgraph.frontend.state.readiness import waiting_for, view_params


@view_callback("scatter", Output("scatter", "figure"), Output("scatter-summary", "children"),
               Output("scatter-summary", "data-points"), labels=False)
def render_scatter(search: str | None, ready: dict | None) -> tuple:
    """PK against CS for every pair of the URL's pairing (O -> Q/K/V only)."""
    state = state_of(search)
    return scatter_view(view_params(state, "scatter", ready), waiting_for(state, ready, "scatter"))


def scatter_view(params: dict[str, Any] | None, waiting: str = WAITING) -> tuple:
    """(figure, summary, point count) for scatter params (None: waiting)."""
    if not params:
        return empty_figure(waiting), [], None
    pairing = params["pairing"]
    allowed = vocab().cs_pairings
    if pairing not in allowed:
        msg = f"CS exists for {', '.join(allowed)} only; pick one of them (now {pairing})"
        return empty_figure(msg), [error_note(msg)], None
    try:
        data = api().scatter(params["model"], pairing, params["top_percent"])
    except ApiError as err:
        return empty_figure(err.message), [error_note(err.message)], None
    cmp_ = data.get("comparison", {})
    counts = cmp_.get("counts", {})
    n = len(data["points"]["pk"])
    chips = [stat("pairs", n, "points"),
             stat("ρ all", cmp_.get("rho_all"), "rho-all", "{:.3f}"),
             stat("ρ top", cmp_.get("rho_top"), "rho-top", "{:.3f}"),
             stat("both", counts.get("both"), "both"), stat("PK only", counts.get("pk_only"), "pk-only"),
             stat("CS only", counts.get("cs_only"), "cs-only")]
    return scatter_figure(data), chips, str(n)
