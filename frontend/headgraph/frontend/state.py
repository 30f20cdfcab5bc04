"""The dashboard's whole view state and its URL query form (shareable links, back/forward).

The URL query is the single source of truth: controls write it, every view reads it.
Parsing is forgiving (an unknown or malformed value falls back to its default) so a hand-edited
or stale link still opens a sensible view.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, replace
from typing import Any
from urllib.parse import parse_qs, urlencode

ROLE_LETTERS: tuple[str, ...] = ("Q", "K", "V", "O")
# Source role first, then target role; the paper's three O->x pairings lead the list.
PAIRINGS: tuple[str, ...] = ("OQ", "OK", "OV") + tuple(
    s + t for s in ROLE_LETTERS for t in ROLE_LETTERS if not (s == "O" and t in "QKV")
)
GRAPH_PAIRINGS: tuple[str, ...] = ("OQ", "OK", "OV")
VIEWS: tuple[str, ...] = ("graph", "heatmap", "scatter", "reference", "tokens")
METRICS: tuple[str, ...] = ("raw", "normalized", "z", "cs")
LAYOUTS: tuple[str, ...] = ("grid", "force")
RULES: tuple[str, ...] = ("topk", "threshold")
DIRECTIONS: tuple[str, ...] = ("out", "in")
HEAD_RE = re.compile(r"^L(\d+)H(\d+)$")
K_MAX = 1000
# The API's per-model label set: each model's heads classed by its own attention patterns.
PATTERN_OVERLAY = "patterns"


def default_overlay(model: str, label_sets: list[dict[str, Any]] | None = None) -> str:
    """The class overlay a link that names none opens ``model`` with.

    A built-in set made for the model (GET /api/labels ``model`` hint equal to the model id;
    the one labelling most heads, ties by name), else the per-model ``patterns`` set, which
    the API computes for every model it can run. Without the label-set list: ``patterns``.
    """
    own = [s for s in label_sets or [] if s.get("builtin") and not s.get("per_model")
           and s.get("model") and s.get("model") == model and s.get("n_heads")]
    if own:
        return sorted(own, key=lambda s: (-int(s["n_heads"]), str(s["name"])))[0]["name"]
    return PATTERN_OVERLAY


@dataclass(frozen=True)
class ViewState:
    """Everything a view needs besides the data: what a copied link must reproduce."""

    model: str = "demo"
    view: str = "graph"
    pairing: str = "OK"  # heatmap / scatter / reference / pair panel
    pairings: tuple[str, ...] = GRAPH_PAIRINGS  # graph edges shown
    k: int = 20
    rule: str = "topk"  # "topk" (k per pairing) | "threshold"
    threshold: float | None = None
    metric: str = "raw"
    layout: str = "grid"
    overlay: str = PATTERN_OVERLAY  # label-set name; "" = none (a link without it: default_overlay)
    head: str | None = None  # selected head "L1H4" -> head panel
    pair: tuple[str, str] | None = None  # selected (source, target) -> pair panel
    direction: str = "out"  # head grid: outgoing or incoming scores of `head`
    top_percent: float = 5.0
    role: str = "O"  # token view role

    def with_(self, **changes: Any) -> ViewState:
        """Copy with some fields changed (frozen dataclass helper)."""
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["pairings"] = list(self.pairings)
        d["pair"] = list(self.pair) if self.pair else None
        return d


def _choice(value: str | None, allowed: tuple[str, ...], default: str) -> str:
    return value if value in allowed else default


def _number(value: str | None, default: float | None, lo: float, hi: float) -> float | None:
    try:
        x = float(value) if value not in (None, "") else default
    except ValueError:
        return default
    if x is None or x != x:  # NaN
        return default
    return min(max(x, lo), hi)


def parse_query(search: str | None, label_sets: list[dict[str, Any]] | None = None) -> ViewState:
    """ViewState from a URL query string such as ``?model=demo&view=heatmap&pairing=OV``.

    A query without ``overlay`` gets the model's ``default_overlay`` (from ``label_sets``, the
    API's label-set list, when known); ``overlay=`` (blank) means no overlay.
    """
    q = {key: vals[-1] for key, vals in parse_qs((search or "").lstrip("?"), keep_blank_values=True).items()}
    d = ViewState()
    pairings = tuple(p for p in (q.get("pairings") or "").split(",") if p in PAIRINGS)
    head = q.get("head") if HEAD_RE.match(q.get("head") or "") else None
    pair = None
    parts = (q.get("pair") or "").split(",")
    if len(parts) == 2 and all(HEAD_RE.match(p) for p in parts):
        pair = (parts[0], parts[1])
    k = _number(q.get("k"), d.k, 1, K_MAX)
    model = q.get("model") or d.model
    return ViewState(
        model=model,
        view=_choice(q.get("view"), VIEWS, d.view),
        pairing=_choice((q.get("pairing") or "").upper(), PAIRINGS, d.pairing),
        pairings=pairings if "pairings" in q else d.pairings,
        k=int(k if k is not None else d.k),
        rule=_choice(q.get("rule"), RULES, d.rule),
        threshold=_number(q.get("threshold"), None, -1e6, 1e6),
        metric=_choice(q.get("metric"), METRICS, d.metric),
        layout=_choice(q.get("layout"), LAYOUTS, d.layout),
        overlay=q["overlay"] if "overlay" in q else default_overlay(model, label_sets),
        head=head,
        pair=pair,
        direction=_choice(q.get("direction"), DIRECTIONS, d.direction),
        top_percent=float(_number(q.get("top_percent"), d.top_percent, 0.1, 100.0) or d.top_percent),
        role=_choice((q.get("role") or "").upper(), ROLE_LETTERS, d.role),
    )


def to_query(state: ViewState) -> str:
    """URL query (with leading ``?``) holding every field, so a link is self-contained."""
    items: list[tuple[str, str]] = [
        ("model", state.model),
        ("view", state.view),
        ("pairing", state.pairing),
        ("pairings", ",".join(state.pairings)),
        ("k", str(state.k)),
        ("rule", state.rule),
    ]
    if state.threshold is not None:
        items.append(("threshold", repr(float(state.threshold))))  # exact: thresholds compare with >=
    items += [
        ("metric", state.metric),
        ("layout", state.layout),
        ("overlay", state.overlay),
        ("direction", state.direction),
        ("top_percent", f"{state.top_percent:g}"),
        ("role", state.role),
    ]
    if state.head:
        items.append(("head", state.head))
    if state.pair:
        items.append(("pair", ",".join(state.pair)))
    return "?" + urlencode(items, safe=",/")


def threshold_on(metric: str) -> str:
    """The API's ``threshold_on`` for a metric switch value (CS edges are thresholded on PK)."""
    return {"raw": "pk", "normalized": "normalized", "z": "z"}.get(metric, "pk")
