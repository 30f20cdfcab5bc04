"""PK vs CS scatter view (paper Fig. 5): quadrants, cutoffs and Spearman correlations."""

from __future__ import annotations

from typing import Any

from dash import Dash, Input, Output

from headgraph.frontend.api_client import ApiError
from headgraph.frontend.callbacks.common import WAITING, ApiProvider, error_note, stat
from headgraph.frontend.figures import empty_figure, scatter_figure

CS_PAIRINGS = ("OQ", "OK", "OV")


def register(app: Dash, api: ApiProvider) -> None:
    @app.callback(
        Output("scatter", "figure"), Output("scatter-summary", "children"),
        Output("scatter-summary", "data-points"),
        Input("params-scatter", "data"),
    )
    def render_scatter(params: dict[str, Any] | None) -> tuple:
        if not params or not params.get("ready"):
            return empty_figure(WAITING), [], None
        pairing = params["pairing"]
        if pairing not in CS_PAIRINGS:
            msg = f"CS exists for OQ, OK and OV only; pick one of them (now {pairing})"
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
