"""Dash callbacks, one module per view, defined at module level (``define.callback``).

Importing this package defines them all; ``register_callbacks`` wires them to an app. The
state flow has no cycles: ``navigation`` alone writes the URL (``write_url``) and builds the
controls from it (``render_controls``); ``model`` alone writes the model-ready record; every
view renders from ``view_params(parse_query(url), view, ready)``.

Imports ``layout``, ``figures``, ``state`` and ``api``, never ``report`` or ``app`` (enforced by
import-linter).
"""

from __future__ import annotations

from dash import Dash

from headgraph.frontend.callbacks import (  # noqa: F401
    auth,
    compare,
    downloads,
    graph,
    heatmap,
    labels,
    model,
    navigation,
    panels,
    queue,
    recovery,
    reference,
    router,
    scatter,
    subgraph,
    task,
    tokens,
    validation,
    verify,
)
from headgraph.frontend.callbacks.define import register_all


def register_callbacks(app: Dash) -> None:
    """Register every callback of the dashboard on ``app``."""
    register_all(app)
    auth.register_clientside(app)
    panels.register_clientside(app)
    router.register_clientside(app)
    validation.register_clientside(app)
