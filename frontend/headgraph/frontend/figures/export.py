"""File exports: figures as PNG/SVG (server-side kaleido) and view data as CSV (from API JSON).

Kaleido 1.x drives a Chromium; we point it at the system one through BROWSER_PATH (default
/usr/bin/chromium when present) and never download one.
"""

from __future__ import annotations

import csv
import io
import os
import shutil
from collections.abc import Iterable, Sequence
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio

from headgraph.frontend.api.answers import (
    GraphOut,
    PairOut,
    PatternsOut,
    ReferenceOut,
    ScatterOut,
    ScoreGrid,
    TokensOut,
    ValidationOut,
)
from headgraph.frontend.api.names import head_label
from headgraph.frontend.figures import flatten_grid, head_slice, null_summary
from headgraph.frontend.figures.heatmaps import grid_labels

SYSTEM_CHROMIUM = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")


def browser_path() -> str | None:
    """The Chromium kaleido should use: $BROWSER_PATH, else a system install."""
    if os.environ.get("BROWSER_PATH"):
        return os.environ["BROWSER_PATH"]
    for path in SYSTEM_CHROMIUM:
        if os.path.exists(path):
            return path
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    return found


def figure_image(figure: dict[str, Any] | go.Figure, fmt: str, *, width: int = 1200) -> bytes:
    """PNG or SVG bytes of a figure (its own height; PNG at 2x scale)."""
    if fmt not in ("png", "svg"):
        raise ValueError(f"image format must be png or svg, not {fmt!r}")
    path = browser_path()
    if path is None:
        raise RuntimeError("no Chromium found for figure export: install chromium or set BROWSER_PATH")
    os.environ.setdefault("BROWSER_PATH", path)
    fig = figure if isinstance(figure, go.Figure) else go.Figure(figure)
    layout: Any = fig.layout  # plotly's layout objects carry no usable types
    height = layout.height or 520
    return pio.to_image(fig, format=fmt, width=width, height=int(height), scale=2 if fmt == "png" else 1)


def csv_text(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(header)
    for row in rows:
        w.writerow(["" if v is None else v for v in row])
    return out.getvalue()


def graph_csv(data: GraphOut) -> str:
    """One row per edge of a /api/graph answer."""
    edges = data["graph"].get("edges", data["graph"].get("links", []))
    cols = ("source", "target", "pairing", "score", "normalized", "cs", "opacity", "rank")
    return csv_text(cols, ([e.get(c) for c in cols] for e in edges))


def grid_csv(grid: ScoreGrid) -> str:
    """Valid cells of a /api/pk or /api/cs grid: source, target, value."""
    z, ok = flatten_grid(grid["grid"]), flatten_grid(grid["valid"])
    src, tgt = grid["source_labels"], grid["target_labels"]
    return csv_text(("source", "target", grid["metric"]),
                    ((src[i], tgt[j], z[i][j]) for i in range(len(src)) for j in range(len(tgt)) if ok[i][j]))


def head_grid_csv(grid: ScoreGrid, head: str, direction: str) -> str:
    """One head's row of the grid; the other heads named as the grid names them (L6KV1 on a
    grouped-query model's K / V axis)."""
    grid = grid_labels(grid)
    rows, layers, n = head_slice(grid, head, direction)
    other = "target" if direction == "out" else "source"
    names = grid["target_labels"] if direction == "out" else grid["source_labels"]
    return csv_text(("head", other, grid["metric"]),
                    ((head, names[i * n + h], rows[i][h]) for i in range(len(layers)) for h in range(n)
                     if rows[i][h] is not None))


def scatter_csv(data: ScatterOut) -> str:
    p = data["points"]
    quad = p.get("quadrant") or [None] * len(p["pk"])
    return csv_text(("source", "target", "pk", "cs", "quadrant"),
                    zip(p["source"], p["target"], p["pk"], p["cs"], quad))


def kl_csv(kl: dict[str, Any]) -> str:
    roles = kl["roles"]
    return csv_text(("pairing", "kl_random_vs_model"),
                    ((s + t, kl["kl"][i][j]) for i, s in enumerate(roles) for j, t in enumerate(roles)))


def histogram_csv(kl: dict[str, Any], pairing: str) -> str:
    h = kl["histograms"][pairing]
    e = h["bin_edges"]
    return csv_text(("bin_start", "bin_end", "model_density", "random_density"),
                    zip(e[:-1], e[1:], h["model_density"], h["random_density"]))


def nulls_csv(reference: ReferenceOut) -> str:
    haar = reference.get("haar_moments") or {}
    rows = []
    for p in reference.get("nulls", {}):
        s = null_summary(reference["nulls"], p) or {}
        q = s.get("quantiles") or {}
        rows.append((p, s.get("mean"), s.get("std"), q.get("0.95"), haar.get("mean"), haar.get("std")))
    return csv_text(("pairing", "anisotropic_mean", "anisotropic_std", "anisotropic_q95",
                     "haar_mean", "haar_std"), rows)


def tokens_csv(tokens: TokensOut) -> str:
    return csv_text(("head", "role", "rank", "token_id", "token", "score"),
                    ((h["name"], tokens["role"], r + 1, t.get("id"), t.get("text"), t.get("score"))
                     for h in tokens["heads"] for r, t in enumerate(h["tokens"])))


def patterns_csv(patterns: PatternsOut) -> str:
    kinds = patterns["kinds"]
    layers = patterns["layer_indices"]
    first = patterns["scores"][kinds[0]]
    return csv_text(("head", *kinds),
                    ((head_label(layer, h), *(patterns["scores"][k][i][h] for k in kinds))
                     for i, layer in enumerate(layers) for h in range(len(first[i]))))


def cosines_csv(pair: PairOut) -> str:
    return csv_text(("index", "cosine", "angle_rad"),
                    ((i + 1, c, a) for i, (c, a) in enumerate(zip(pair["cosines"], pair["angles"]))))


def validation_csv(data: ValidationOut) -> str:
    """A /api/validation answer's summary: one row per prompt set, metric and statistic."""
    return csv_text(("prompts", "metric", "statistic", "value", "low", "high", "n"),
                    ((prompts, row["metric"], key, iv.get("value"), iv.get("low"), iv.get("high"), iv.get("n"))
                     for prompts, rows in (data.get("summary") or {}).items() for row in rows
                     for key in ("random_rho", "top_mean_effect", "top_rho") if (iv := row.get(key) or {})))


def validation_edges_csv(data: ValidationOut) -> str:
    """Every pair a /api/validation answer measured: its metric values and effects."""
    metrics = list(data.get("metrics") or [])
    cols = ("source", "target", "in_sample", "top_of", "effect_text", "effect_random", *metrics)
    return csv_text(cols, ([";".join(e.get(c) or []) if c == "top_of" else e.get(c) for c in cols]
                           for e in data.get("edges") or []))
