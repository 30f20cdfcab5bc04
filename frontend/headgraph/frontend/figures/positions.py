"""Node positions for the head graph, computed from the API's node-link JSON.

Two layouts: "grid" (x = head index, y = layer position, so deeper layers sit higher, as in the
paper's figures; a grouped-query model's KV-group nodes on a sub-row under the query heads
they serve) and "force" (networkx spring layout, seeded so a link reproduces the picture).
"""

from __future__ import annotations

import math
from typing import Any

import networkx as nx

Positions = dict[str, tuple[float, float]]


# Grid layout of a grouped-query model: a KV-group node (kind "kv_group", e.g. L6KV1 serving
# L6H3-L6H5) sits at the mean column of the query heads it serves, on its own sub-row half way
# between its layer's row and the one below, so it never covers a query-head node (the figure
# gives every row enough pixels for that, figures.graph.grid_height).
KV_ROW_OFFSET = 0.5


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


def grid_row(y: float) -> int:
    """The layer row a grid y belongs to (a KV sub-row, half a row down, counts as its layer's)."""
    return math.floor(y + 0.5 + 1e-9)


def grid_positions(node_link: dict[str, Any], layer_indices: list[int] | None = None) -> Positions:
    """(x, y) = (head index, layer position); roles of one head spread a little along x.

    A KV-group node: x = mean column of the query heads it serves, y = its layer's row minus
    ``KV_ROW_OFFSET`` (a sub-row between its layer and the one below).
    """
    layers = sorted({int(n.get("layer", 0)) for n in node_link.get("nodes", [])} | set(layer_indices or []))
    row = {layer: i for i, layer in enumerate(layers)}
    role_dx = {"Q": -0.27, "K": -0.09, "V": 0.09, "O": 0.27}
    pos: Positions = {}
    for n in node_link.get("nodes", []):
        y = float(row.get(int(n.get("layer", 0)), 0))
        x = float(n.get("head", 0))
        if is_kv_node(n):
            cols = member_columns(n)
            x = sum(cols) / len(cols) if cols else x
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
