"""Dash callbacks, one module per view; ``register_callbacks`` wires them all to an app."""

from __future__ import annotations

from dash import Dash

from headgraph.frontend.callbacks import (downloads, graph, heatmap, labels, model, navigation,
                                          panels, reference, scatter, tokens)
from headgraph.frontend.callbacks.common import ApiProvider


def register_callbacks(app: Dash, api: ApiProvider) -> None:
    """Register every callback of the dashboard; ``api()`` gives the ApiClient for a request."""
    navigation.register(app)
    model.register(app, api)
    graph.register(app, api)
    heatmap.register(app, api)
    scatter.register(app, api)
    reference.register(app, api)
    tokens.register(app, api)
    panels.register(app, api)
    labels.register(app, api)
    downloads.register(app, api)
