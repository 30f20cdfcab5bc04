"""Public notebook API (re-exported as ``headgraph.load_heads`` etc.)."""

from __future__ import annotations

from headgraph.core.composition import composition_score
from headgraph.core.loading import load_heads
from headgraph.core.pk import projection_kernel

__all__ = ["load_heads", "projection_kernel", "composition_score"]
