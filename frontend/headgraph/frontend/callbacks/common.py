"""Small helpers the per-view callbacks share (no state of their own).

``api()`` and ``vocab()`` read the current Dash app's context (context.py); ``state_of`` is
``parse_query`` with that vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from dash import html

from headgraph.frontend.api.answers import LabelSetSummary
from headgraph.frontend.api.client import ApiClient, ApiError
from headgraph.frontend.api.context import api, vocab
from headgraph.frontend.callbacks.router import mark_error
from headgraph.frontend.figures.palette import label_set_order
from headgraph.frontend.layout.controls import UNAVAILABLE
from headgraph.frontend.state.url import PATTERN_OVERLAY, ViewState, parse_query

T = TypeVar("T")

__all__ = ["UNAVAILABLE", "WAITING", "api", "class_order", "data_attrs", "error_note", "overlay_classes", "stat",
           "state_of", "vocab", "with_overlay"]
WAITING = "waiting for the model's results (see the progress bar above)…"


def data_attrs(attrs: Mapping[str, object]) -> dict[str, Any]:
    """``data-*`` attributes as keyword arguments of a Dash component (``**data_attrs({...})``):
    Dash takes them through ``**kwargs``, which its typed signatures do not show."""
    return dict(attrs)


def state_of(search: str | None, label_sets: list[LabelSetSummary] | None = None) -> ViewState:
    """The URL's view state, read with the API's vocabulary."""
    return parse_query(search, vocab(), label_sets)


def overlay_classes(client: ApiClient, overlay: str | None, model: str | None = None) -> dict[str, str]:
    """head -> class map of a label set for ``model`` ({} when no overlay or it cannot be read;
    per-model sets such as ``patterns`` are read for ``model``)."""
    if not overlay:
        return {}
    try:
        return dict(client.label_set(overlay, model).get("classes", {}))
    except ApiError:
        return {}


def class_order(client: ApiClient, overlay: str | None,
                label_sets: list[LabelSetSummary] | None = None) -> tuple[str, ...]:
    """The class order of the overlay (its colours, figures.palette), from the label-set list
    (``label_sets``, else GET /api/labels); () without an overlay or when it is not listed."""
    if not overlay:
        return ()
    if label_sets is None:
        try:
            label_sets = client.labels()
        except ApiError:
            return ()
    return label_set_order(label_sets, overlay)


def with_overlay(call: Callable[[str | None], T], overlay: str | None) -> tuple[T, str | None]:
    """(``call(overlay)``, None); for the per-model ``patterns`` overlay on a model the API
    cannot run (422: no attention patterns; a 404 from older servers), (``call(None)``, a note
    saying why no classes). Any other failure of the call itself is raised by ``call(None)``."""
    try:
        return call(overlay or None), None
    except ApiError as err:
        if overlay != PATTERN_OVERLAY or err.status not in (404, 422):
            raise
        result = call(None)  # the model itself is fine: only its pattern classes are missing
        return result, f"no class overlay: {err.message}"


def stat(label: str, value: Any, key: str, fmt: str = "{}") -> html.Span:
    """A summary chip ``label value`` exposing the raw value as data-value for tests."""
    shown = fmt.format(value) if value is not None else "–"
    return html.Span([html.Span(label, className="stat-label"), html.Span(shown, className="stat-value")],
                     className="stat", id=f"stat-{key}", **data_attrs({"data-value": "" if value is None else str(value)}))


def error_note(message: str) -> html.Div:
    """An error shown in a view (the router then retries that view's render next time)."""
    mark_error()
    return html.Div(message, className="error-note")
