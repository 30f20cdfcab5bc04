"""How ``headgraph`` commands print rows: aligned text tables, their cells, and CSV text.

Every command's table is built here so all of them look alike: columns two spaces apart,
each as wide as its widest cell, a missing value printed as ``-``.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence
from typing import Any


def cell(value: Any, fmt: str = "{}") -> str:
    """``fmt.format(value)``, or ``-`` for a missing value (None)."""
    return "-" if value is None else fmt.format(value)


def interval(est: dict[str, Any] | None) -> str:
    """An estimate ``{value, low, high}`` as ``0.412 [0.301, 0.530]``: the value alone when a
    bound is missing, ``-`` when the value is."""
    if est is None or est["value"] is None:
        return "-"
    if est["low"] is None or est["high"] is None:
        return f"{est['value']:.3f}"
    return f"{est['value']:.3f} [{est['low']:.3f}, {est['high']:.3f}]"


def text_table(heads: Sequence[str], rows: Sequence[Sequence[str]], align: str = "",
               strip: bool = False) -> list[str]:
    """The header line and one line per row (cells already text), columns two spaces apart and
    as wide as their widest cell. ``align``: one ``l`` / ``r`` per column (left when empty);
    ``strip`` drops the trailing spaces of each line."""
    if align and len(align) != len(heads):
        raise ValueError(f"align {align!r} names {len(align)} columns, the table has {len(heads)}")
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(heads)]
    right = [a == "r" for a in align] if align else [False] * len(heads)

    def line(values: Sequence[str]) -> str:
        text = "  ".join(v.rjust(w) if r else v.ljust(w) for v, w, r in zip(values, widths, right))
        return text.rstrip() if strip else text

    return [line(heads), *(line(r) for r in rows)]


def csv_text(heads: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A header line and one line per row as CSV (``\\n`` line ends; None as an empty field)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(heads)
    w.writerows(rows)
    return buf.getvalue()
