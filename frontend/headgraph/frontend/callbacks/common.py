"""Small helpers the per-view callbacks share (no state of their own)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from dash import html

from headgraph.frontend.api_client import ApiClient, ApiError
from headgraph.frontend.state import PATTERN_OVERLAY

T = TypeVar("T")

ApiProvider = Callable[[], ApiClient]
WAITING = "waiting for the model's results (see the progress bar above)…"
UNAVAILABLE = "not available offline"


def model_options(models: list[dict[str, Any]] | None, current: str | None) -> list[dict[str, Any]]:
    """Model dropdown options; models that cannot be loaded offline are disabled with the API's
    message. The current value is always an option (Dash 4 clears a value missing from options)."""
    opts = []
    for m in models or []:
        off = m.get("status") == UNAVAILABLE
        label = m["id"] + (f" — {m['status']}" if m.get("status") != "available" else "")
        opts.append({"label": label, "value": m["id"], "disabled": off, "title": m.get("message", "")})
    if current and current not in {o["value"] for o in opts}:
        opts.append({"label": current, "value": current})
    return opts


def overlay_options(sets: list[dict[str, Any]] | None, current: str | None = None) -> list[dict[str, Any]]:
    """Label-set dropdown options (name, head count, model hint); keeps ``current`` selectable."""
    out = []
    for s in sets or []:
        hint = f" · {s['model']}" if s.get("model") else ""
        label = (f"{s['name']} (per model)" if s.get("per_model")
                 else f"{s['name']} ({s.get('n_heads', '?')} heads{hint})")
        out.append({"label": label, "value": s["name"], "title": s.get("description", "")})
    if current and current not in {o["value"] for o in out}:
        out.append({"label": current, "value": current})
    return out


def overlay_classes(client: ApiClient, overlay: str | None, model: str | None = None) -> dict[str, str]:
    """head -> class map of a label set for ``model`` ({} when no overlay or it cannot be read;
    per-model sets such as ``patterns`` are read for ``model``)."""
    if not overlay:
        return {}
    try:
        return dict(client.get(f"/api/labels/{overlay}", model=model).get("classes", {}))
    except ApiError:
        return {}


def with_overlay(call: Callable[[str | None], T], overlay: str | None) -> tuple[T, str | None]:
    """(``call(overlay)``, None); for the per-model ``patterns`` overlay on a model the API
    cannot run (404: no attention patterns), (``call(None)``, a note saying why no classes)."""
    try:
        return call(overlay or None), None
    except ApiError as err:
        if overlay != PATTERN_OVERLAY or err.status != 404:
            raise
        result = call(None)  # the model itself is fine: only its pattern classes are missing
        return result, f"no class overlay: {err.message}"


def stat(label: str, value: Any, key: str, fmt: str = "{}") -> html.Span:
    """A summary chip ``label value`` exposing the raw value as data-value for tests."""
    shown = fmt.format(value) if value is not None else "–"
    return html.Span([html.Span(label, className="stat-label"), html.Span(shown, className="stat-value")],
                     className="stat", id=f"stat-{key}", **{"data-value": "" if value is None else str(value)})


def error_note(message: str) -> html.Div:
    return html.Div(message, className="error-note")
