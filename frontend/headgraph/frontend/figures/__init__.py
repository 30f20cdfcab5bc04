"""Plotly figure builders: pure functions from the API's JSON to ``go.Figure``.

No HTTP and no Dash here, so every figure can be rebuilt for export and tested from JSON alone.
Head names are "L{block}H{head}" as the API writes them. One module per view:
``common`` (colours, layout), ``heatmaps``, ``graph``, ``scatter``, ``reference`` (KL and nulls),
``tokens`` (patterns and top tokens), ``cosines``, ``validation``; this package re-exports their public names.

Imports ``state`` and ``api`` only (enforced by import-linter).
"""

from headgraph.frontend.figures.common import (
                                               CLASS_PALETTE,
                                               FONT,
                                               METRIC_TITLES,
                                               NO_CLASS_COLOR,
                                               OTHER_PAIRING_COLOR,
                                               PAIRING_COLORS,
                                               TEMPLATE,
                                               base_layout,
                                               class_colors,
                                               empty_figure,
                                               fmt_value,
                                               pairing_color,
)
from headgraph.frontend.figures.cosines import cosines_figure
from headgraph.frontend.figures.graph import graph_figure
from headgraph.frontend.figures.heatmaps import flatten_grid, head_grid_figure, head_slice, score_heatmap
from headgraph.frontend.figures.reference import kl_grid_figure, null_figure, null_summary, reference_figure
from headgraph.frontend.figures.scatter import QUADRANTS, scatter_figure, top_cutoffs
from headgraph.frontend.figures.tokens import patterns_figure, token_grid_figure
from headgraph.frontend.figures.validation import (
                                               validation_figure,
                                               validation_scatter_figure,
                                               validation_words,
)

__all__ = [
    "CLASS_PALETTE", "FONT", "METRIC_TITLES", "NO_CLASS_COLOR", "OTHER_PAIRING_COLOR", "PAIRING_COLORS",
    "QUADRANTS", "TEMPLATE", "base_layout", "class_colors", "cosines_figure", "empty_figure",
    "flatten_grid", "fmt_value", "graph_figure", "head_grid_figure", "head_slice", "kl_grid_figure",
    "null_figure", "null_summary", "pairing_color", "patterns_figure", "reference_figure",
    "scatter_figure", "score_heatmap", "token_grid_figure", "top_cutoffs", "validation_figure",
    "validation_scatter_figure", "validation_words",
]
