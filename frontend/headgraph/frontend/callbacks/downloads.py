"""PNG / SVG / CSV buttons under every figure (dcc.Download).

Images are rendered server-side with kaleido from the figure currently shown; CSV comes from
the API (its download endpoint for score grids, the view's JSON otherwise).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from dash import Input, Output, State, ctx, dcc, no_update

from headgraph.frontend.api.client import ApiClient, ApiError
from headgraph.frontend.callbacks.common import api, state_of, vocab
from headgraph.frontend.callbacks.define import callback
from headgraph.frontend.callbacks.graph import load_graph, shown_graph
from headgraph.frontend.callbacks.heatmap import metric_grid
from headgraph.frontend.figures import export as exports
from headgraph.frontend.figures.recovery import recovery_csv
from headgraph.frontend.layout.page import DOWNLOADABLE, FILTERED
from headgraph.frontend.state.readiness import view_params

CsvMaker = Callable[[ApiClient, dict[str, Any]], tuple[str, str]]
# Which view's parameters describe each figure's data.
PARAMS_OF = {"graph": "graph", "heatmap": "heatmap", "head-grid": "head-grid", "scatter": "scatter",
             "kl-grid": "reference", "ref-hist": "reference", "null-fig": "reference",
             "token-grid": "tokens", "patterns": "tokens", "cosines": "pair-panel",
             "validation": "validation", "validation-scatter": "validation", "recovery": "recovery"}


def _stem(*parts: Any) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", "_".join(str(p) for p in parts if p not in (None, ""))).strip("-")


def _heatmap_csv(client: ApiClient, p: dict[str, Any]) -> tuple[str, str]:
    if p["metric"] == "cs":
        body, _ = client.download(what="cs", format="csv", model=p["model"], mode=p["pairing"][1])
    else:
        body, _ = client.download(what="pk", format="csv", model=p["model"], pairing=p["pairing"],
                                  metric=p["metric"])
    return body.decode(), _stem(p["model"], p["pairing"], p["metric"])


CSV_MAKERS: dict[str, CsvMaker] = {
    "graph": lambda c, p: (exports.graph_csv(shown_graph(c, p)), _stem(p["model"], "graph", *p["pairings"])),
    "heatmap": _heatmap_csv,
    "head-grid": lambda c, p: (exports.head_grid_csv(metric_grid(c, p["model"], p["pairing"], p["metric"]),
                                                     p["head"], p["direction"]),
                               _stem(p["model"], p["head"], p["direction"], p["pairing"])),
    "scatter": lambda c, p: (exports.scatter_csv(c.scatter(p["model"], p["pairing"], p["top_percent"])),
                             _stem(p["model"], "scatter", p["pairing"])),
    "kl-grid": lambda c, p: (exports.kl_csv(c.reference(p["model"])["kl"]), _stem(p["model"], "kl")),
    "ref-hist": lambda c, p: (exports.histogram_csv(c.reference(p["model"])["kl"], p["pairing"]),
                              _stem(p["model"], "reference", p["pairing"])),
    "null-fig": lambda c, p: (exports.nulls_csv(c.reference(p["model"])), _stem(p["model"], "nulls")),
    "token-grid": lambda c, p: (exports.tokens_csv(c.tokens(p["model"], p["role"], k=10)),
                                _stem(p["model"], "tokens", p["role"])),
    "patterns": lambda c, p: (exports.patterns_csv(c.patterns(p["model"])), _stem(p["model"], "patterns")),
    "cosines": lambda c, p: (exports.cosines_csv(c.pair(p["model"], p["pairing"], *p["pair"])),
                             _stem(p["model"], p["pairing"], *p["pair"])),
    "validation": lambda c, p: (exports.validation_csv(c.validation(p["model"], p["pairing"], cached=True)),
                                _stem(p["model"], "validation", p["pairing"])),
    "validation-scatter": lambda c, p: (exports.validation_edges_csv(c.validation(p["model"], p["pairing"],
                                                                                  cached=True)),
                                        _stem(p["model"], "validation-pairs", p["pairing"])),
    "recovery": lambda c, p: (recovery_csv(c.recovery(p["model"], p["pairing"], p["overlay"],
                                                      min(p["k"], vocab().limits.recovery_k_max))),
                              _stem(p["model"], "recovery", p["pairing"], p["overlay"])),
}

# "CSV (all)": the whole API answer behind a filtered view (layout.page.FILTERED).
FULL_CSV_MAKERS: dict[str, CsvMaker] = {
    "graph": lambda c, p: (exports.graph_csv(load_graph(c, p)[0]), _stem(p["model"], "graph", *p["pairings"], "all")),
}


def download(fig_id: str, fmt: str, figure: dict | None, search: str | None, ready: dict | None,
             label_sets: list | None) -> tuple:
    """(dcc.Download data, message) for the ``fmt`` button under figure ``fig_id``."""
    if fmt not in ("png", "svg", "csv", "csvall") or (fmt == "csvall" and fig_id not in FULL_CSV_MAKERS):
        return no_update, no_update
    state = state_of(search, label_sets)
    try:
        if fmt in ("csv", "csvall"):
            params = view_params(state, PARAMS_OF[fig_id], ready)
            if not params:
                return no_update, "no data yet"
            text, stem = (CSV_MAKERS if fmt == "csv" else FULL_CSV_MAKERS)[fig_id](api(), params)
            return dcc.send_string(text, f"{stem or fig_id}.csv"), ""
        if not figure:
            return no_update, "no figure yet"
        try:
            image = exports.figure_image(figure, fmt)
        except Exception as err:
            return no_update, f"{fmt.upper()} export failed: {type(err).__name__}: {err}"
        return dcc.send_bytes(image, f"{_stem(state.model, fig_id)}.{fmt}"), ""
    except ApiError as err:
        return no_update, err.message
    except (ValueError, KeyError) as err:
        return no_update, f"export failed: {err}"


def _define(fig_id: str) -> Callable[..., tuple]:
    formats = ("png", "svg", "csv", *(("csvall",) if fig_id in FILTERED else ()))

    @callback(Output(f"dl-{fig_id}", "data"), Output(f"dl-{fig_id}-msg", "children"),
              *(Input(f"dl-{fig_id}-{fmt}", "n_clicks") for fmt in formats),
              State(fig_id, "figure"), State("url", "search"), State("ready-store", "data"),
              State("labels-store", "data"),
              prevent_initial_call=True)
    def download_button(*args: Any) -> tuple:
        figure, search, ready, label_sets = args[len(formats):]
        fmt = str(ctx.triggered_id or "").rsplit("-", 1)[-1]
        return download(fig_id, fmt, figure, search, ready, label_sets)

    download_button.__name__ = f"download_{fig_id.replace('-', '_')}"
    return download_button


# One callback per downloadable figure, defined when this module is imported.
DOWNLOAD_CALLBACKS = {fig_id: _define(fig_id) for fig_id in DOWNLOADABLE}
