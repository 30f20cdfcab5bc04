"""Where the head graph's invisible edge click handles go, so that every click finds its target.

Plotly hovers, among the markers under the pointer, the one with the smallest radius (its
distance inside a marker is ``1 - 3 / radius``), whichever is nearer. So a handle that covers a
node's centre, or another handle's, steals its clicks. ``place_handles`` puts each handle on its
edge where it covers no node and no handle placed before it (in pixels, from a lower bound of the
plot's pixels per data unit); on an edge with no such room it takes the spot with the most
clearance and shrinks to fit it, down to plotly's smallest hover radius.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

HANDLE_PX = 7.0      # handle radius where the edge has room
MIN_HANDLE_PX = 3.0  # plotly's smallest hover radius
CELL_PX = 20.0       # spatial-hash cell: covers any node radius (<= 12 px) plus a handle's
# Fractions along an edge to try after its preferred one, nearest first.
_SWEEP = [0.08 + 0.03 * i for i in range(29)]


@dataclass(frozen=True)
class Handles:
    """Handle centres in data units (x, y: [n]) and marker diameters in px (size: [n])."""

    x: list[float]
    y: list[float]
    size: list[float]


class _Grid:
    """Markers (centre px, radius px) hashed by CELL_PX cells, for clearance queries."""

    def __init__(self) -> None:
        self.cells: dict[tuple[int, int], list[tuple[float, float, float]]] = {}

    def add(self, x: float, y: float, r: float) -> None:
        self.cells.setdefault((math.floor(x / CELL_PX), math.floor(y / CELL_PX)), []).append((x, y, r))

    def clearance(self, x: float, y: float) -> float:
        """Pixels from (x, y) to the nearest marker's edge, up to about CELL_PX (else inf)."""
        cx, cy = math.floor(x / CELL_PX), math.floor(y / CELL_PX)
        best = math.inf
        for i in (cx - 1, cx, cx + 1):
            for j in (cy - 1, cy, cy + 1):
                for mx, my, r in self.cells.get((i, j), ()):
                    best = min(best, math.hypot(mx - x, my - y) - r)
        return best


def place_handles(segments: Sequence[tuple[tuple[float, float], tuple[float, float]]],
                  fractions: Sequence[float], nodes: Sequence[tuple[float, float]],
                  node_radius: Sequence[float], scale: tuple[float, float]) -> Handles:
    """One handle per segment ((x0, y0), (x1, y1)) in data units, preferably at ``fractions``.

    nodes / node_radius: node centres (data units) and marker radii (px, at most 12); scale:
    pixels per data unit along x and y. Handles are placed in order; each avoids the nodes and
    the handles placed before it.
    """
    sx, sy = scale
    grid = _Grid()
    for (x, y), r in zip(nodes, node_radius):
        grid.add(x * sx, y * sy, float(r))
    out = Handles([], [], [])
    # A dense graph (where room is rare anyway) tries fewer spots per edge: bounded time.
    tries = 29 if len(segments) <= 500 else 9 if len(segments) <= 2000 else 3
    for ((x0, y0), (x1, y1)), frac in zip(segments, fractions):
        ts = [float(frac)] + sorted(_SWEEP, key=lambda t: abs(t - frac))[:tries]
        best_t, best_c = ts[0], -math.inf
        for t in ts:
            c = grid.clearance((x0 + t * (x1 - x0)) * sx, (y0 + t * (y1 - y0)) * sy)
            if c > best_c:
                best_t, best_c = t, c
            if c >= HANDLE_PX + 0.5:
                break
        radius = min(HANDLE_PX, max(MIN_HANDLE_PX, best_c - 0.5))
        hx, hy = x0 + best_t * (x1 - x0), y0 + best_t * (y1 - y0)
        grid.add(hx * sx, hy * sy, radius)
        out.x.append(hx)
        out.y.append(hy)
        out.size.append(2 * radius)
    return out
