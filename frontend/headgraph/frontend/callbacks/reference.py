"""Random-reference view: 4x4 KL grid, PK histogram vs Haar density (Fig. 8), anisotropic null."""

from __future__ import annotations

import json
from typing import Any

from dash import Output

from headgraph.frontend.api.client import ApiError
from headgraph.frontend.callbacks.common import WAITING, api, error_note, stat, state_of
from headgraph.frontend.callbacks.router import view_callback
from headgraph.frontend.figures import (
    empty_figure,
    kl_grid_figure,
    null_figure,
    null_summary,
    reference_figure,
)
from headgraph.frontend.state.readiness import view_params, waiting_for


@view_callback("reference", Output("kl-grid", "figure"), Output("ref-hist", "figure"),
               Output("null-fig", "figure"), Output("reference-summary", "children"),
               Output("reference-summary", "data-kl"), labels=False)
def render_reference(search: str | None, ready: dict | None) -> tuple:
    """KL grid, PK histogram against the Haar density, and the anisotropic null."""
    state = state_of(search)
    return reference_view(view_params(state, "reference", ready), waiting_for(state, ready, "reference"))


def reference_view(params: dict[str, Any] | None, waiting: str = WAITING) -> tuple:
    """The three reference figures, summary and KL values for reference params (None: waiting)."""
    if not params:
        return empty_figure(waiting), empty_figure(waiting), empty_figure(waiting, 300), [], None
    pairing = params["pairing"]
    try:
        data = api().reference(params["model"])
    except ApiError as err:
        fig = empty_figure(err.message)
        return fig, fig, fig, [error_note(err.message)], None
    kl = data["kl"]
    nulls = data.get("nulls", {})
    haar = data.get("haar_moments") or {}
    roles = kl["roles"]
    i, j = roles.index(pairing[0]), roles.index(pairing[1])
    hist = kl["histograms"].get(pairing, {})
    null = null_summary(nulls, pairing)
    chips = [stat(f"KL {pairing}", kl["kl"][i][j], "kl-selected", "{:.4g}"),
             stat("model mean", hist.get("model_mean"), "model-mean", "{:.4g}"),
             stat("random mean", hist.get("random_mean"), "random-mean", "{:.4g}"),
             stat("anisotropic null mean", None if null is None else null["mean"], "null-mean", "{:.4g}")]
    found = nulls.get(pairing)
    entry: dict[str, Any] = found if isinstance(found, dict) else {}
    init = entry.get("summary_random_init") or {}
    if init.get("mean") is not None:
        chips.append(stat("random-init mean", init["mean"], "init-mean", "{:.4g}"))
        if entry.get("above_random_init_q95") is not None:
            chips.append(stat("pairs above random-init 95%", entry["above_random_init_q95"], "above-init",
                              "{} of " + str(entry.get("valid_pairs", "?"))))
    return (kl_grid_figure(kl, pairing), reference_figure(kl, pairing, null), null_figure(nulls, haar),
            chips, json.dumps(kl["kl"]))
