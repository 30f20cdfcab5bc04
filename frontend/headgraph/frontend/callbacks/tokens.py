"""Token view: top tokens per head-role in a layer x head grid (Fig. 6) and pattern scores (Fig. 7)."""

from __future__ import annotations

from typing import Any

from dash import Output

from headgraph.frontend.api.client import ApiError
from headgraph.frontend.callbacks.common import WAITING, api, error_note, stat, state_of
from headgraph.frontend.callbacks.router import view_callback
from headgraph.frontend.figures import empty_figure, patterns_figure, token_grid_figure
from headgraph.frontend.state.readiness import waiting_for, view_params

TOKENS_SHOWN = 5


@view_callback("tokens", Output("token-grid", "figure"), Output("patterns", "figure"),
               Output("tokens-summary", "children"), Output("tokens-summary", "data-heads"))
def render_tokens(search: str | None, ready: dict | None, label_sets: list | None) -> tuple:
    """Top tokens of the URL's role per head, and the attention-pattern scores."""
    state = state_of(search, label_sets)
    return tokens_view(view_params(state, "tokens", ready), waiting_for(state, ready, "tokens"))


def tokens_view(params: dict[str, Any] | None, waiting: str = WAITING) -> tuple:
    """(token grid, patterns figure, summary, head count) for tokens params (None: waiting)."""
    if not params:
        return empty_figure(waiting), empty_figure(waiting, 260), [], None
    client = api()
    model, role = params["model"], params["role"]
    notes: list[Any] = []
    try:
        info = client.model_info(model)["info"]
    except ApiError as err:
        return empty_figure(err.message), empty_figure(err.message, 260), [error_note(err.message)], None
    n_heads = info["n_kv_heads"] if role in ("K", "V") else info["n_heads"]
    try:
        tokens = client.tokens(model, role, k=TOKENS_SHOWN)
        tok_fig = token_grid_figure(tokens, info["layer_indices"], n_heads)
        n_rows = len(tokens["heads"])
        if tokens.get("n_above_baseline") is not None:
            notes.append(stat("lists above random", tokens["n_above_baseline"], "token-above-baseline",
                              "{} of " + str(n_rows)))
    except ApiError as err:
        tok_fig, n_rows = empty_figure(err.message), None
        notes.append(error_note(err.message))
    try:
        pat_fig = patterns_figure(client.patterns(model))
    except ApiError as err:
        pat_fig = empty_figure(err.message, 260)
        notes.append(error_note(err.message))
    chips = [stat("role", role, "token-role"), stat("heads", n_rows, "token-heads"), *notes]
    return tok_fig, pat_fig, chips, None if n_rows is None else str(n_rows)
