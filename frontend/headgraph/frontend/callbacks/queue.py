"""The page's place in the server's queue of cold computations (GET /api/queue).

A view whose results are not cached waits for one of this browser's slots (the server runs at
most a few of one client's cold computations at once and queues the rest in order); the model
bar says what computes for this page and what waits, next first, so a spinner is never silent.
"""

from __future__ import annotations

from typing import Any

from dash import Input, Output, no_update

from headgraph.frontend.api.answers import Queue
from headgraph.frontend.api.client import ApiError
from headgraph.frontend.callbacks.common import api
from headgraph.frontend.callbacks.define import callback

SHOWN = {"display": "block"}
HIDDEN = {"display": "none"}
NAMED = 3  # queued computations named (the rest counted)


def queue_note(queue: Queue) -> tuple[str, dict[str, str]]:
    """(text, style) of the model bar's queue line for a GET /api/queue answer: hidden while
    nothing of this page waits for a slot."""
    running, queued = list(queue.get("running") or []), list(queue.get("queued") or [])
    if not queued:
        return "", HIDDEN
    named = "; ".join(f"{i}. {w}" for i, w in enumerate(queued[:NAMED], 1))
    more = f"; and {len(queued) - NAMED} more" if len(queued) > NAMED else ""
    slots = queue.get("per_client")
    text = (f"{len(queued)} of this page's computations wait for a slot ({len(running)} running, "
            f"{slots} at a time): {named}{more}")
    return text, SHOWN


@callback(Output("queue-note", "children"), Output("queue-note", "style"),
          Input("queue-poll", "n_intervals"))
def show_queue(_ticks: int | None) -> tuple[Any, Any]:
    """Every few seconds: this browser's queue, read from the API (nothing is computed)."""
    try:
        return queue_note(api().queue())
    except ApiError:
        return no_update, no_update
