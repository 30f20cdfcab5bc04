"""How the findings page prints numbers and tables (shared by its sections)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def fmt(value: Any, digits: int = 3) -> str:
    """A number as the page prints it: 3 significant digits, integers as such, None as 'n/a'."""
    if value is None:
        return "n/a"
    if isinstance(value, int):  # bool included
        return str(value)
    return f"{float(value):.{digits}g}"


def fmt_ci(stat: dict[str, Any] | None) -> str:
    """A bootstrap statistic ``{value, low, high}`` as 'v [low, high]'."""
    if not stat or stat.get("value") is None:
        return "n/a"
    return f"{fmt(stat['value'], 2)} [{fmt(stat['low'], 2)}, {fmt(stat['high'], 2)}]"


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A markdown table (cells already formatted; '|' escaped)."""
    def cell(v: Any) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)
