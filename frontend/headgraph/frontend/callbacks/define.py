"""``@callback``: define a Dash callback at module level, wire it into every app made later.

Like ``dash.callback`` (same arguments), the decorated function stays a plain module-level
function, so tests call it directly. Unlike ``dash.callback``, whose global list is consumed by
the first Dash app that starts serving, every app ``create_dash`` builds in one process gets
all of them (``register_all``): tests and servers may hold several apps at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dash import Dash

CALLBACKS: list[tuple[tuple[Any, ...], dict[str, Any], Callable[..., Any]]] = []


def callback(*args: Any, **kwargs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Record a callback (``dash.callback``'s arguments); returns the function unchanged."""
    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        CALLBACKS.append((args, kwargs, func))
        return func
    return decorate


def register_all(app: Dash) -> None:
    """Register every recorded callback on ``app``."""
    for args, kwargs, func in CALLBACKS:
        app.callback(*args, **kwargs)(func)
