"""Which (source layer, target layer) pairs a layer order keeps, as masks and rectangles.

Orders: "forward" (strictly earlier -> later), "same-layer", "all". Positions index the stacked
layers of a HeadWeights, which follow the model's layer order.
"""

from __future__ import annotations

import torch

from headgraph.core.names import check_order

Rect = tuple[int, int, int, int]  # source start, stop, target start, stop (layer positions)


def layer_mask(layer_indices: tuple[int, ...], order: str, device: torch.device) -> torch.Tensor:
    """[L, L] bool: which (source layer, target layer) positions ``order`` keeps.

    forward: strictly earlier -> later block; same-layer: equal blocks; all: every pair.
    """
    check_order(order)
    idx = torch.tensor(layer_indices, device=device)
    if order == "forward":
        return idx[:, None] < idx[None, :]
    if order == "same-layer":
        return idx[:, None] == idx[None, :]
    return torch.ones(len(idx), len(idx), dtype=torch.bool, device=device)


def _forward_blocks(lo: int, hi: int) -> list[Rect]:
    """Rectangles covering exactly the position pairs i < j in [lo, hi): earlier half x later
    half, then both halves recursively."""
    if hi - lo < 2:
        return []
    mid = (lo + hi) // 2
    return [(lo, mid, mid, hi)] + _forward_blocks(lo, mid) + _forward_blocks(mid, hi)


def layer_blocks(n_layers: int, order: str) -> list[Rect]:
    """Few, large rectangles that together cover exactly the pairs ``order`` keeps."""
    check_order(order)
    if order == "forward":
        return _forward_blocks(0, n_layers)
    if order == "same-layer":
        return [(i, i + 1, i, i + 1) for i in range(n_layers)]
    return [(0, n_layers, 0, n_layers)] if n_layers else []


def group_rects(order: str, g0: int, g1: int, s_lo: int, s_hi: int) -> list[Rect]:
    """Rectangles covering exactly the kept pairs with a target layer in [g0, g1) and a source
    layer in [s_lo, s_hi). The first one spans every target of the group when the group has
    such a common source range (forward: the layers before g0; all: every source)."""
    check_order(order)
    rects: list[Rect] = []
    if order == "all":
        rects.append((s_lo, s_hi, g0, g1))
    elif order == "forward":
        rects.append((s_lo, min(g0, s_hi), g0, g1))
        rects += [(max(g0, s_lo), min(t, s_hi), t, t + 1) for t in range(g0 + 1, g1)]
    else:
        rects += [(t, t + 1, t, t + 1) for t in range(g0, g1) if s_lo <= t < s_hi]
    return [r for r in rects if r[0] < r[1] and r[2] < r[3]]


def group_cover(order: str, g0: int, g1: int, s_lo: int, s_hi: int) -> Rect | None:
    """One rectangle holding every kept pair with a target layer in [g0, g1) and a source layer
    in [s_lo, s_hi), and with it (forward, same-layer) some pairs the order drops, which the
    caller must discard; None when no pair is kept. One large product instead of the few small
    ones of :func:`group_rects`."""
    rects = group_rects(order, g0, g1, s_lo, s_hi)
    if not rects:
        return None
    return (min(r[0] for r in rects), max(r[1] for r in rects),
            min(r[2] for r in rects), max(r[3] for r in rects))


def rect_area(rects: list[Rect]) -> int:
    """Layer pairs the rectangles cover (counted with overlaps)."""
    return sum((sb - sa) * (tb - ta) for sa, sb, ta, tb in rects)


__all__ = ["Rect", "check_order", "group_cover", "group_rects", "layer_blocks", "layer_mask",
           "rect_area"]
