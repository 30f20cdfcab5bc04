"""The dashboard's whole view state, its URL query form, and what each view renders from.

The URL query is the single source of truth: one callback writes it (callbacks/navigation),
every control and view is built from it. Everything here is pure: the API's names come in as
a :class:`~headgraph.frontend.api.names.Vocabulary` (GET /api/vocabulary), so a test can build
one from core's ``vocabulary()``. Parsing is forgiving (an unknown or malformed value falls
back to its default) so a hand-edited or stale link still opens a sensible view.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, replace
from typing import Any
from urllib.parse import parse_qs, urlencode

from headgraph.frontend.api.answers import LabelSetSummary
from headgraph.frontend.api.names import Vocabulary
from headgraph.frontend.state.subgraph import parse_subgraph

# Frontend-only lists (what the dashboard shows; the API's names come from the vocabulary).
VIEWS: tuple[str, ...] = ("graph", "heatmap", "scatter", "reference", "tokens", "validation", "recovery",
                          "compare", "timeline", "task", "subgraph")
LAYOUTS: tuple[str, ...] = ("grid", "force")
RULES: tuple[str, ...] = ("topk", "threshold")
DIRECTIONS: tuple[str, ...] = ("out", "in")
# Heatmap grain: every head pair, or the layer-aggregated overview (one cell per layer pair,
# its mean; a click drills down to that block's heads, ``zoom``).
GRAINS: tuple[str, ...] = ("heads", "layers")
# Graph edges by their path-ablation verdict (GET /api/ablation, read from the cache only):
# "off", "colour" (styled by verdict, with a legend), "verified" (only verified edges shown).
VERIFICATION_MODES: tuple[str, ...] = ("off", "colour", "verified")
_LAYER_RE = re.compile(r"^L\d+$")
_LAYERS_RE = re.compile(r"^\s*(\d{1,4})\s*(?:[-–:]\s*(\d{1,4})\s*)?$")
# The graph's edge scales (the API's ``threshold_on``): top-k ranks by one of RANK_ON, threshold
# mode keeps the pairs at or above a threshold on one of THRESHOLD_ON ("fdr": BH q level, edges
# are the pairs significant at q). Normalized PK (in [0, 1]) compares across pairings, so it is
# the threshold default; raw PK stays the top-k default (the paper's rule).
RANK_ON: tuple[str, ...] = ("pk", "normalized", "z")
THRESHOLD_ON: tuple[str, ...] = ("normalized", "z", "pk", "fdr")
DEFAULT_RANK_ON = "pk"
DEFAULT_THRESHOLD_ON = "normalized"
FDR_DEFAULT_Q = 0.05  # the API's default q for threshold_on=fdr
FDR_Q_RANGE = (0.001, 0.2)
# The API rounds thresholds to this many significant digits, 0 below THRESHOLD_FLOOR
# (GET /api/vocabulary ``threshold_digits``); the page rounds the same way, so what it shows
# is what the graph applied.
THRESHOLD_DIGITS = 3
THRESHOLD_FLOOR = 1e-6
DEFAULT_MODEL = "demo"
# A model id's norm-aware variant (the API's ``MODEL@norm``: the norm gains around attention
# folded into the heads); the plain id is raw. The dashboard's subspaces toggle switches it.
NORM_SUFFIX = "@norm"
SUBSPACES: tuple[str, ...] = ("raw", "norm")
DEFAULT_SERIES = "demo-series"  # the timeline's series (GET /api/series)
DEFAULT_PAIRING = "OK"
DEFAULT_ROLE = "O"
# The API's per-model label set: each model's heads classed by its own attention patterns.
PATTERN_OVERLAY = "patterns"
# The task view (GET /api/circuit): a task of GET /api/tasks, the attribution method and
# EAP-IG's integration steps (the API's defaults; its bounds are the vocabulary's ``limits``;
# eap always runs one step).
DEFAULT_TASK = "induction"
CIRCUIT_METHODS: tuple[str, ...] = ("eap", "eap-ig")
DEFAULT_METHOD = "eap-ig"
DEFAULT_STEPS = 5
DEFAULT_PAIRS = 32  # a bundled task's prompt pairs, all of them (the API's default); fewer: a quicker circuit
_TASK_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")


def parse_task(value: str | None) -> str:
    """A task name as the API spells one (letters, digits, ``_.-``, at most 64), else ""."""
    text = (value or "").strip()
    return text if _TASK_RE.match(text) else ""


def split_subspaces(model: str) -> tuple[str, str]:
    """(model id, subspaces) of a model id: ``demo@norm`` -> ("demo", "norm"), ``demo`` ->
    ("demo", "raw")."""
    if model.endswith(NORM_SUFFIX) and len(model) > len(NORM_SUFFIX):
        return model[: -len(NORM_SUFFIX)], "norm"
    return model, "raw"


def with_subspaces(model: str, subspaces: str) -> str:
    """``model`` (either mode) as the id of mode ``subspaces`` ("raw" | "norm")."""
    base, _ = split_subspaces(model)
    return base + NORM_SUFFIX if subspaces == "norm" else base


def default_overlay(model: str, label_sets: list[LabelSetSummary] | None = None) -> str:
    """The class overlay a link that names none opens ``model`` with.

    A built-in set made for the model (GET /api/labels ``model`` hint equal to the model id,
    either subspaces mode; the one labelling most heads, ties by name), else the per-model
    ``patterns`` set, which the API computes for every model it can run. Without the
    label-set list: ``patterns``.
    """
    model, _ = split_subspaces(model)
    own = [s for s in label_sets or [] if s.get("builtin") and not s.get("per_model")
           and s.get("model") and s.get("model") == model and s.get("n_heads")]
    if own:
        return sorted(own, key=lambda s: (-(s["n_heads"] or 0), str(s["name"])))[0]["name"]  # all > 0
    return PATTERN_OVERLAY


@dataclass(frozen=True, kw_only=True)
class ViewState:
    """Everything a view needs besides the data: what a copied link must reproduce.

    ``pairings`` and ``k`` default from the vocabulary (see :func:`default_state`).
    """

    pairings: tuple[str, ...]  # graph edges shown
    k: int
    model: str = DEFAULT_MODEL
    view: str = "graph"
    pairing: str = DEFAULT_PAIRING  # heatmap / scatter / reference / pair panel
    rule: str = "topk"  # "topk" (k per pairing) | "threshold"
    rank_on: str = DEFAULT_RANK_ON  # top-k ranking scale (RANK_ON)
    threshold_on: str = DEFAULT_THRESHOLD_ON  # threshold scale (THRESHOLD_ON)
    threshold: float | None = None  # on threshold_on's scale (fdr: the q level); None: the default
    metric: str = "raw"
    layout: str = "grid"
    overlay: str = PATTERN_OVERLAY  # label-set name; "" = none (a link without it: default_overlay)
    head: str | None = None  # selected head "L1H4" -> head panel
    pair: tuple[str, str] | None = None  # selected (source, target) -> pair panel
    direction: str = "out"  # head grid: outgoing or incoming scores of `head`
    top_percent: float = 5.0
    role: str = DEFAULT_ROLE  # token view role
    grain: str = "heads"  # heatmap: "heads" (every pair) | "layers" (layer-block overview)
    zoom: tuple[str, str] | None = None  # heatmap drill-down: (source layer, target layer), "L3"
    verification: str = "off"  # graph edges by ablation verdict (VERIFICATION_MODES)
    layers: tuple[int, int] | None = None  # graph: only heads of blocks lo..hi (both ends in it)
    find: str = ""  # graph: a head name ("L17H3", "L17KV1"), a layer ("L17") or a class ("induction")
    a: str = ""  # compare: model A ("" = ``model``)
    b: str = ""  # compare: model B ("" = none picked yet)
    series: str = DEFAULT_SERIES  # timeline: a named series or a comma list of model ids
    checkpoint: str = ""  # timeline: the shown checkpoint's position in the series ("" = the last)
    # A task of GET /api/tasks; "" = none chosen: the task view shows DEFAULT_TASK (and names
    # it in its links), the graph and pair panel mark no circuit.
    task: str = ""
    method: str = DEFAULT_METHOD  # task view: "eap" | "eap-ig" (CIRCUIT_METHODS)
    steps: int = DEFAULT_STEPS  # task view: EAP-IG's integration steps (1..limits.circuit_steps_max)
    pairs: int = DEFAULT_PAIRS  # task view: a bundled task's first n prompt pairs (limits.circuit_pairs_min..max)
    pins: tuple[str, ...] = ()  # subgraph: pinned heads (and KV groups), in pin order
    groups: tuple[tuple[str, tuple[str, ...]], ...] = ()  # subgraph: (name, its pinned heads)
    labels: tuple[tuple[str, str], ...] = ()  # subgraph: (head or group name, custom label)

    def with_(self, **changes: Any) -> ViewState:
        """Copy with some fields changed (frozen dataclass helper)."""
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["pairings"] = list(self.pairings)
        d["pair"] = list(self.pair) if self.pair else None
        d["layers"] = list(self.layers) if self.layers else None
        d["pins"] = list(self.pins)
        d["groups"] = [[name, list(heads)] for name, heads in self.groups]
        d["labels"] = [list(kv) for kv in self.labels]
        return d


def default_state(vocab: Vocabulary, **changes: Any) -> ViewState:
    """The state of a link with no query (all graph pairings, the API's default k), changed."""
    return ViewState(pairings=vocab.graph_pairings, k=vocab.default_k).with_(**changes)


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


def quantize_threshold(value: float) -> float:
    """``value`` rounded as the API rounds a graph threshold (THRESHOLD_DIGITS significant
    digits, 0 below THRESHOLD_FLOOR): the threshold a graph applies for ``value``."""
    value = float(value)
    if not math.isfinite(value) or abs(value) < THRESHOLD_FLOOR:
        return 0.0 if math.isfinite(value) else value
    return float(f"{value:.{THRESHOLD_DIGITS}g}")


def format_threshold(value: float | None) -> str:
    """A threshold as the page prints it: rounded as the API applies it, printed as the API's
    ``rule`` prints it (``:g``, so at most THRESHOLD_DIGITS significant digits)."""
    return "–" if value is None else f"{quantize_threshold(value):g}"


def clean_threshold(value: float | None, on: str) -> float | None:
    """A threshold for scale ``on`` as the graph applies it: rounded; an FDR q kept in
    FDR_Q_RANGE and defaulting to FDR_DEFAULT_Q (the API's default), so the state names it."""
    if on == "fdr":
        q = FDR_DEFAULT_Q if value is None else min(max(float(value), FDR_Q_RANGE[0]), FDR_Q_RANGE[1])
        return quantize_threshold(q)
    return None if value is None else quantize_threshold(value)


def parse_layers(value: str | None) -> tuple[int, int] | None:
    """A layer range ``"10-20"`` (blocks, both ends included; ``"17"``: one block; ends in
    either order) as (lo, hi); None when blank or malformed."""
    m = _LAYERS_RE.match(value or "")
    if not m:
        return None
    lo, hi = int(m.group(1)), int(m.group(2) if m.group(2) is not None else m.group(1))
    return (min(lo, hi), max(lo, hi))


def format_layers(layers: tuple[int, int] | None) -> str:
    """The URL / input form of a layer range: "10-20", "17" for one block, "" for none."""
    if not layers:
        return ""
    return str(layers[0]) if layers[0] == layers[1] else f"{layers[0]}-{layers[1]}"


FIND_MAX = 64  # the longest class name a search takes (the API's class names: 64 characters)


def parse_find(value: str | None, vocab: Vocabulary) -> str:
    """A graph search term: a head name (``vocab.is_head``: "L17H3", "L17KV1") or a layer
    ("L17"), upper-cased; else a class name ("induction", "previous token") as typed, blanks
    trimmed and collapsed; "" for a blank, an over-long term or control characters."""
    text = " ".join((value or "").split())
    if not text or len(text) > FIND_MAX or any(ord(c) < 32 or ord(c) == 127 for c in text):
        return ""
    upper = text.upper()
    if vocab.is_head(upper) or _LAYER_RE.match(upper):
        return upper
    return text if any(c.isalpha() for c in text) else ""


def format_subgraph(state: ViewState) -> list[tuple[str, str]]:
    """The URL items of a state's pins, groups and labels (none when it has no pins)."""
    if not state.pins:
        return []
    items = [("pins", ",".join(state.pins))]
    if state.groups:
        items.append(("groups", ";".join(f"{name}:{','.join(heads)}" for name, heads in state.groups)))
    if state.labels:
        items.append(("labels", ";".join(f"{key}:{text}" for key, text in state.labels)))
    return items


def _legacy_on(metric: str | None) -> str:
    """The scale a link from before ``rank_on``/``threshold_on`` used: its ``metric`` (CS: PK)."""
    return {"raw": "pk", "normalized": "normalized", "z": "z"}.get(metric or "", "pk")


def parse_query(search: str | None, vocab: Vocabulary,
                label_sets: list[LabelSetSummary] | None = None) -> ViewState:
    """ViewState from a URL query string such as ``?model=demo&view=heatmap&pairing=OV``.

    A query without ``overlay`` gets the model's ``default_overlay`` (from ``label_sets``, the
    API's label-set list, when known); ``overlay=`` (blank) means no overlay. A link without
    ``rank_on`` / ``threshold_on`` (written before they existed) ranks and, when it names a
    threshold, thresholds on its ``metric`` as it did then; otherwise the scales' defaults.
    """
    q = {key: vals[-1] for key, vals in parse_qs((search or "").lstrip("?"), keep_blank_values=True).items()}
    d, limits = default_state(vocab), vocab.limits
    view = _choice(q.get("view"), VIEWS, d.view)
    pairings = tuple(p for p in vocab.graph_pairings if p in (q.get("pairings") or "").upper().split(","))
    head = q.get("head") if vocab.is_head(q.get("head")) else None
    pair = None
    parts = (q.get("pair") or "").split(",")
    if len(parts) == 2 and all(vocab.is_head(p) for p in parts):
        pair = (parts[0], parts[1])
    k = _number(q.get("k"), d.k, 1, vocab.k_max)
    model = q.get("model") or d.model
    rank_on = _choice(q.get("rank_on"), RANK_ON, _legacy_on(q.get("metric")) if "metric" in q else d.rank_on)
    legacy = _legacy_on(q.get("metric")) if "metric" in q and "threshold" in q else d.threshold_on
    on = _choice(q.get("threshold_on"), THRESHOLD_ON, legacy)
    pins, groups, labels = parse_subgraph(q.get("pins"), q.get("groups"), q.get("labels"), vocab)
    return ViewState(
        model=model,
        view=view,
        pairing=_choice((q.get("pairing") or "").upper(), vocab.pairings, d.pairing),
        pairings=pairings if "pairings" in q else d.pairings,
        k=int(k if k is not None else d.k),
        rule=_choice(q.get("rule"), RULES, d.rule),
        rank_on=rank_on,
        threshold_on=on,
        threshold=clean_threshold(_number(q.get("threshold"), None, -limits.threshold_magnitude_max,
                                          limits.threshold_magnitude_max), on),
        metric=_choice(q.get("metric"), vocab.metrics, d.metric),
        layout=_choice(q.get("layout"), LAYOUTS, d.layout),
        overlay=q["overlay"] if "overlay" in q else default_overlay(model, label_sets),
        head=head,
        pair=pair,
        direction=_choice(q.get("direction"), DIRECTIONS, d.direction),
        top_percent=float(_number(q.get("top_percent"), d.top_percent, 0.1, 100.0) or d.top_percent),
        role=_choice((q.get("role") or "").upper(), vocab.roles, d.role),
        grain=_choice(q.get("grain"), GRAINS, d.grain),
        zoom=_zoom(q.get("zoom")),
        verification=_choice(q.get("verification"), VERIFICATION_MODES, d.verification),
        layers=parse_layers(q.get("layers")),
        find=parse_find(q.get("find"), vocab),
        a=_model_id(q.get("a")),
        b=_model_id(q.get("b")),
        series=_model_id(q.get("series"), 4096) or d.series,
        checkpoint=q.get("checkpoint", "") if (q.get("checkpoint") or "").isdigit() else "",
        task=parse_task(q.get("task")) or (DEFAULT_TASK if view == "task" else d.task),
        method=_choice(q.get("method"), CIRCUIT_METHODS, d.method),
        steps=int(_number(q.get("steps"), d.steps, 1, limits.circuit_steps_max) or d.steps),
        pairs=int(_number(q.get("pairs"), d.pairs, limits.circuit_pairs_min, limits.circuit_pairs_max) or d.pairs),
        pins=pins,
        groups=groups,
        labels=labels,
    )


def _model_id(value: str | None, limit: int = 512) -> str:
    """A model id (or series) from the URL: blank-trimmed, no control characters, bounded."""
    text = (value or "").strip()
    return text if len(text) <= limit and not any(ord(c) < 32 or ord(c) == 127 for c in text) else ""


def _zoom(value: str | None) -> tuple[str, str] | None:
    parts = (value or "").upper().split(",")
    return (parts[0], parts[1]) if len(parts) == 2 and all(_LAYER_RE.match(p) for p in parts) else None


def to_query(state: ViewState) -> str:
    """URL query (with leading ``?``) holding every field, so a link is self-contained."""
    items: list[tuple[str, str]] = [
        ("model", state.model),
        ("view", state.view),
        ("pairing", state.pairing),
        ("pairings", ",".join(state.pairings)),
        ("k", str(state.k)),
        ("rule", state.rule),
        ("rank_on", state.rank_on),
        ("threshold_on", state.threshold_on),
    ]
    if state.threshold is not None:
        items.append(("threshold", repr(quantize_threshold(state.threshold))))  # as the API applies it
    items += [
        ("metric", state.metric),
        ("layout", state.layout),
        ("overlay", state.overlay),
        ("direction", state.direction),
        ("top_percent", f"{state.top_percent:g}"),
        ("role", state.role),
        ("grain", state.grain),
        ("verification", state.verification),
    ]
    if state.layers:
        items.append(("layers", format_layers(state.layers)))
    if state.find:
        items.append(("find", state.find))
    if state.zoom:
        items.append(("zoom", ",".join(state.zoom)))
    if state.view == "compare" or state.a or state.b:
        items += [("a", state.a), ("b", state.b)]
    if state.view == "timeline" or state.series != DEFAULT_SERIES or state.checkpoint:
        items += [("series", state.series), ("checkpoint", state.checkpoint)]
    task = state.task or (DEFAULT_TASK if state.view == "task" else "")
    if task or (state.method, state.steps) != (DEFAULT_METHOD, DEFAULT_STEPS):
        items += [("task", task), ("method", state.method), ("steps", str(state.steps))]
    if state.pairs != DEFAULT_PAIRS:
        items.append(("pairs", str(state.pairs)))
    items += format_subgraph(state)
    if state.head:
        items.append(("head", state.head))
    if state.pair:
        items.append(("pair", ",".join(state.pair)))
    return "?" + urlencode(items, safe=",/")


def graph_on(params: dict[str, Any] | ViewState) -> str:
    """The API's ``threshold_on`` for a graph: the threshold scale in threshold mode, else the
    top-k ranking scale (GET /api/graph ranks top-k by ``threshold_on``)."""
    d = params.to_dict() if isinstance(params, ViewState) else params
    return d["threshold_on"] if d["rule"] == "threshold" else d["rank_on"]
