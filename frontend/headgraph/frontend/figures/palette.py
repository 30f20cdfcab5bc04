"""One colour per head class, the same in every view (graph, heatmap class strip) and in the
findings report.

A class's colour is fixed by its position in its label set's class list (GET /api/labels
``classes``: the set's own order, e.g. the per-model ``patterns`` set lists Previous Token,
Induction, Duplicate Token), never by which classes a figure happens to show, so "Induction"
keeps its colour at k = 20, k = 100, in an FDR graph and in the heatmap strip.

The colours are Okabe-Ito and Paul Tol colours that stay apart under protan, deutan and tritan
vision and away from the pairing colours of the edges (OQ red, OK green, OV blue) and the greys
of unlabelled and edgeless heads (tests/frontend/test_palette.py measures both in CIELAB).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

# Okabe-Ito orange and sky blue, Tol wine, sand, indigo, vibrant magenta; then Tol rose and
# bright purple (the first six are the most distinct; more classes than eight reuse them).
CLASS_PALETTE: tuple[str, ...] = ("#E69F00", "#56B4E9", "#882255", "#DDCC77", "#332288", "#EE3377",
                                  "#CC6677", "#AA3377")
NO_CLASS_COLOR = "#8c9bb0"  # a head with no class in the overlay
NO_CLASS = "no class"
JOINED = " / "  # a KV group's class joins its query heads' classes ("Induction / Previous Token")
LEGEND_SYMBOL = "circle"  # a class's legend glyph: never the KV group's diamond, never the hub's star


def label_set_order(label_sets: Sequence[Mapping[str, Any]] | None, name: str | None) -> tuple[str, ...]:
    """The class order of label set ``name``: its ``classes`` in the GET /api/labels list
    (() when it is not listed)."""
    for s in label_sets or ():
        if s.get("name") == name:
            return tuple(str(c) for c in s.get("classes") or ())
    return ()


def class_palette(order: Sequence[str], classes: Iterable[str] = ()) -> dict[str, str]:
    """class -> colour: the i-th class of ``order`` (its label set's order) gets
    CLASS_PALETTE[i mod len]. A class of ``classes`` not in ``order``: a joined KV-group class
    takes its first known part's colour; any other (outside the label set, which only a
    figure's data can add) follows ``order``, sorted. ``NO_CLASS`` and "" are grey."""
    order = list(dict.fromkeys(c for c in order if c and c != NO_CLASS))
    out = {c: CLASS_PALETTE[i % len(CLASS_PALETTE)] for i, c in enumerate(order)}
    extra = sorted({c for c in classes if c and c != NO_CLASS and c not in out})
    for c in [c for c in extra if _first_known(c, out) is None]:
        out[c] = CLASS_PALETTE[len(out) % len(CLASS_PALETTE)]
    for c in extra:
        if c not in out:
            out[c] = out[_first_known(c, out) or ""]
    out[NO_CLASS] = NO_CLASS_COLOR
    out[""] = NO_CLASS_COLOR
    return out


def _first_known(cls: str, known: Mapping[str, str]) -> str | None:
    parts = [p.strip() for p in cls.split(JOINED.strip())] if JOINED.strip() in cls else []
    return next((p for p in parts if p in known), None)


def class_key(text: str) -> str:
    """A class name as a search compares it: case-folded, runs of blanks, '-' and '_' as one
    blank ("previous-token" == "Previous Token")."""
    return re.sub(r"[\s\-_]+", " ", str(text)).strip().casefold()


def class_parts(cls: str | None) -> list[str]:
    """The classes a (possibly joined) class names: "A / B" -> ["A", "B"]."""
    return [p.strip() for p in str(cls or "").split(JOINED.strip()) if p.strip()]
