"""Node positions for the head graph, computed from the API's node-link JSON.

Two layouts: "grid" (x = head index, y = layer position, so deeper layers sit higher, as in the
paper's figures; a grouped-query model's KV-group nodes on their layer's row, between the query
heads they serve) and "force" (networkx spring layout, seeded so a link reproduces the picture).
"""

from __future__ import annotations

import math
from typing import Any

import networkx as nx

Positions = dict[str, tuple[float, float]]


# Grid layout of a grouped-query model: a KV-group node (kind "kv_group", e.g. L6KV1 serving
# L6H3-L6H5) sits on its own layer's row (an edge into it from the layer below reads as going
# up a layer, not along one), between the columns of the query heads it serves: at their mean
# column, moved half a column right when that mean is a query head's column (an odd group), so
# it never covers a query-head node. KV_ROW_OFFSET (rows below its layer's) is 0.
KV_ROW_OFFSET = 0.0
KV_COLUMN_SHIFT = 0.5


def is_kv_node(node: dict[str, Any]) -> bool:
    """True for a KV-group node of a grouped-query model (the API's kind "kv_group")."""
    return node.get("kind") == "kv_group" or "KV" in str(node.get("head_name") or node.get("id", ""))


def member_columns(node: dict[str, Any]) -> list[int]:
    """Query-head columns a KV-group node serves, from its ``heads`` ("L6H3,L6H4,L6H5")."""
    cols = []
    for name in str(node.get("heads") or "").split(","):
        _, sep, idx = name.strip().rpartition("H")
        if sep and idx.isdigit() and "KV" not in name:
            cols.append(int(idx))
    return cols


def kv_column(cols: list[int], default: float) -> float:
    """The grid column of a KV group serving query-head columns ``cols``: their mean, plus
    KV_COLUMN_SHIFT when the mean is itself a head's column; ``default`` without members."""
    if not cols:
        return default
    mean = sum(cols) / len(cols)
    return mean + KV_COLUMN_SHIFT if float(mean).is_integer() else mean


def grid_row(y: float) -> int:
    """The layer row a grid y belongs to (the nearest row)."""
    return math.floor(y + 0.5 + 1e-9)


def grid_positions(node_link: dict[str, Any], layer_indices: list[int] | None = None) -> Positions:
    """(x, y) = (head index, layer position); roles of one head spread a little along x.

    A KV-group node: y = its layer's row, x = between the query heads it serves
    (:func:`kv_column`).
    """
    layers = sorted({int(n.get("layer", 0)) for n in node_link.get("nodes", [])} | set(layer_indices or []))
    row = {layer: i for i, layer in enumerate(layers)}
    role_dx = {"Q": -0.27, "K": -0.09, "V": 0.09, "O": 0.27}
    pos: Positions = {}
    for n in node_link.get("nodes", []):
        y = float(row.get(int(n.get("layer", 0)), 0))
        x = float(n.get("head", 0))
        if is_kv_node(n):
            x = kv_column(member_columns(n), x)
            y -= KV_ROW_OFFSET
        pos[n["id"]] = (x + role_dx.get(str(n.get("role", "")), 0.0), y)
    return pos


def force_positions(node_link: dict[str, Any], *, seed: int = 0) -> Positions:
    """Spring layout of the (undirected view of the) graph, weight = edge score, seeded."""
    g = nx.Graph()
    g.add_nodes_from(n["id"] for n in node_link.get("nodes", []))
    for e in node_link.get("edges", node_link.get("links", [])):
        w = float(e.get("score") or 0.0)
        if g.has_edge(e["source"], e["target"]):
            g[e["source"]][e["target"]]["weight"] += w
        else:
            g.add_edge(e["source"], e["target"], weight=w)
    if g.number_of_nodes() == 0:
        return {}
    raw = nx.spring_layout(g, seed=seed, weight="weight")
    return {n: (float(x), float(y)) for n, (x, y) in raw.items()}


def positions(node_link: dict[str, Any], layout: str, layer_indices: list[int] | None = None) -> Positions:
    """Positions for a layout name ("grid" | "force")."""
    if layout == "force":
        return force_positions(node_link)
    return grid_positions(node_link, layer_indices)
