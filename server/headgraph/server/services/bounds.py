"""Bounds on what one API answer ships for a model with many heads.

A per-pair grid of a 7B-class model (1,024 query heads: a million cells) is ~19 MB of JSON and
a scatter of every valid pair ~30 MB; a browser view needs neither. Above MAX_GRID_CELLS cells
a grid answers its **layer overview** (one cell per layer pair: the largest finite value over
its head pairs, valid where any head pair is), above MAX_SCATTER_POINTS a scatter answers every
point of the top quadrants that fits and a seeded uniform sample of the rest; each answer says
what it left out and how to ask for all of it (``download=true``). Under the caps (SmolLM2's
270 x 270 grid, say) answers are unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# ~25 bytes of JSON per cell (value and valid flag): about 3.3 MB at the cap, under 5 MB.
MAX_GRID_CELLS = 131072
# ~70 bytes of JSON per point (two names, two floats, a quadrant): about 1.4 MB at the cap.
MAX_SCATTER_POINTS = 20000
DOWNLOAD_HINT = "ask again with download=true for the full answer"


def grid_too_big(shape: tuple[int, ...] | list[int]) -> bool:
    """Whether a [Ls, Hs, Lt, Ht] grid exceeds MAX_GRID_CELLS."""
    return int(np.prod(shape)) > MAX_GRID_CELLS


def layer_overview(grid: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[Ls, Hs, Lt, Ht] grid and valid mask -> [Ls, 1, Lt, 1] (largest finite valid value of each
    layer pair, NaN where none; valid where any head pair is)."""
    g = np.where(valid & np.isfinite(grid), grid.astype(np.float64), -np.inf)
    best = g.max(axis=(1, 3), keepdims=True)
    any_valid = np.isfinite(best)
    return np.where(any_valid, best, np.nan), any_valid


def overview_note(shape: tuple[int, ...] | list[int]) -> dict[str, Any]:
    """What a layer overview left out, and how to get it."""
    full = int(np.prod(shape))
    return {"aggregate": "max over the layer pair's head pairs", "full_shape": list(shape),
            "cells": int(shape[0] * shape[2]), "cells_left_out": full - int(shape[0] * shape[2]),
            "how": DOWNLOAD_HINT}


def bounded_points(points: dict[str, list[Any]], cap: int = MAX_SCATTER_POINTS,
                   seed: int = 0) -> tuple[dict[str, list[Any]], dict[str, Any] | None]:
    """Parallel point lists cut to ``cap`` points: all points of quadrants 1-3 (top in PK or CS)
    when they fit, else a seeded sample of them; the remaining room a seeded uniform sample of
    quadrant 0. Returns the points (original order kept) and what was left out (None when all
    fit)."""
    n = len(points.get("quadrant", []))
    if n <= cap:
        return points, None
    quadrant = np.asarray(points["quadrant"])
    rng = np.random.default_rng(seed)
    top = np.flatnonzero(quadrant > 0)
    rest = np.flatnonzero(quadrant == 0)
    if top.size >= cap:
        keep = rng.choice(top, size=cap, replace=False)
    else:
        keep = np.concatenate([top, rng.choice(rest, size=cap - top.size, replace=False)])
    keep.sort()
    out = {k: [v[i] for i in keep.tolist()] for k, v in points.items()}
    note = {"points_total": n, "points_shown": int(keep.size), "points_left_out": n - int(keep.size),
            "top_quadrant_points_shown": int(min(top.size, cap)),
            "sampled": "every top-quadrant point that fits, then a uniform sample (seed 0) of the rest",
            "how": DOWNLOAD_HINT}
    return out, note


__all__ = ["DOWNLOAD_HINT", "MAX_GRID_CELLS", "MAX_SCATTER_POINTS", "bounded_points",
           "grid_too_big", "layer_overview", "overview_note"]
