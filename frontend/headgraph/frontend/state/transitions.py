"""The URL writer's next-state function: current state + the one thing that changed.

Pure: ``next_state(state, source, value, vocab, label_sets)`` gives the state after the user
changed one control, clicked a figure, or uploaded a label set. The single URL writer
(callbacks/navigation.py) returns ``to_query`` of it, or no update when it equals ``state``.
"""

from __future__ import annotations

import re
from typing import Any

from headgraph.frontend.api.answers import LabelSetSummary
from headgraph.frontend.api.names import Vocabulary
from headgraph.frontend.state.readiness import focus_head
from headgraph.frontend.state.subgraph import clean_name, clean_subgraph
from headgraph.frontend.state.url import (
    CIRCUIT_METHODS,
    DEFAULT_SERIES,
    DEFAULT_TASK,
    DIRECTIONS,
    GRAINS,
    LAYOUTS,
    RANK_ON,
    RULES,
    SUBSPACES,
    THRESHOLD_ON,
    VERIFICATION_MODES,
    VIEWS,
    ViewState,
    clean_threshold,
    default_overlay,
    parse_find,
    parse_layers,
    parse_task,
    split_subspaces,
    with_subspaces,
)

_LAYER_RE = re.compile(r"^L\d+$")

# Control component id -> the ViewState field it edits.
CONTROL_FIELDS: dict[str, str] = {
    "model-select": "model",
    "subspaces-radio": "subspaces",
    "pairing-select": "pairing",
    "pairings-check": "pairings",
    "k-input": "k",
    "rule-radio": "rule",
    "rank-on-radio": "rank_on",
    "threshold-on-radio": "threshold_on",
    "threshold-slider": "threshold",
    "fdr-q-input": "threshold",
    "metric-radio": "metric",
    "layout-radio": "layout",
    "overlay-select": "overlay",
    "direction-radio": "direction",
    "top-percent-input": "top_percent",
    "role-radio": "role",
    "grain-radio": "grain",
    "verification-radio": "verification",
    "layers-input": "layers",
    "find-input": "find",
    "compare-a-input": "a",
    "compare-b-input": "b",
    "compare-k-input": "k",
    "recovery-k-input": "k",
    "series-input": "series",
    "timeline-k-input": "k",
    "step-slider": "checkpoint",
    "task-select": "task",
    "method-radio": "method",
    "steps-input": "steps",
}
# Figures whose clicks select something (their clickData goes to the URL writer).
CLICK_SOURCES: tuple[str, ...] = ("graph", "heatmap", "head-grid", "scatter", "kl-grid", "subgraph-fig")
UPLOAD_SOURCE = "uploaded-store"
# The subgraph's edits (pin, group, label, import), one record each: written by its buttons,
# its JSON import and a modifier-click on a graph node (assets/pin-click.js).
SUBGRAPH_SOURCE = "sub-action"


def _allowed(field: str, vocab: Vocabulary) -> tuple[str, ...] | None:
    return {"view": VIEWS, "pairing": vocab.pairings, "rule": RULES, "metric": vocab.metrics,
            "rank_on": RANK_ON, "threshold_on": THRESHOLD_ON,
            "layout": LAYOUTS, "direction": DIRECTIONS, "role": vocab.roles, "grain": GRAINS,
            "verification": VERIFICATION_MODES, "method": CIRCUIT_METHODS}.get(field)


def set_field(state: ViewState, field: str, value: Any, vocab: Vocabulary) -> ViewState:
    """``state`` with one field set from a control value; invalid values leave it unchanged."""
    allowed = _allowed(field, vocab)
    if allowed is not None:
        return state.with_(**{field: value}) if value in allowed else state
    if field == "model":  # another model keeps the subspaces mode
        mode = split_subspaces(state.model)[1]
        return state.with_(model=with_subspaces(str(value), mode)) if value else state
    if field == "subspaces":  # the same model in the other mode (its id's @norm suffix)
        return state.with_(model=with_subspaces(state.model, value)) if value in SUBSPACES else state
    if field == "pairings":
        return state.with_(pairings=tuple(p for p in vocab.graph_pairings if p in (value or [])))
    if field == "overlay":
        return state.with_(overlay=str(value or ""))
    if field == "layers":  # blank clears the range; a malformed one leaves it as it is
        text = str(value or "").strip()
        layers = parse_layers(text)
        return state.with_(layers=layers) if layers or not text else state
    if field in ("a", "b", "series"):  # model ids / a series: as typed (blank: the default)
        text = str(value or "").strip()
        if field == "series":  # another series starts at its last checkpoint; the same keeps its own
            series = text or DEFAULT_SERIES
            return state if series == state.series else state.with_(series=series, checkpoint="")
        return state.with_(**{field: text})
    if field == "checkpoint":  # the timeline's shown checkpoint (its position in the series)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 10**6
        return state.with_(checkpoint=str(int(value))) if ok else state
    if field == "task":  # a task name as the API spells one; anything else leaves it as it is
        task = parse_task(str(value or ""))
        if not task or (not state.task and task == DEFAULT_TASK and state.view != "task"):
            return state  # the task box showing its default while no task is chosen: no choice
        return state.with_(task=task)
    if field == "find":
        text = str(value or "").strip()
        found = parse_find(text, vocab)
        return state.with_(find=found) if found or not text else state
    try:
        number = float(value)
    except (TypeError, ValueError):
        return state
    if number != number:  # NaN
        return state
    if field == "k":
        return state.with_(k=int(min(max(number, 1), vocab.k_max)))
    if field == "threshold":  # rounded as the API applies it (an FDR q kept in its range)
        return state.with_(threshold=clean_threshold(number, state.threshold_on))
    if field == "top_percent":
        return state.with_(top_percent=min(max(number, 0.1), 100.0))
    if field == "steps":
        return state.with_(steps=int(min(max(number, 1), vocab.limits.circuit_steps_max)))
    return state


def apply_control(state: ViewState, field: str, value: Any, vocab: Vocabulary,
                  label_sets: list[LabelSetSummary] | None = None) -> ViewState:
    """The state after the user changed one control (with that control's side rules).

    A model change clears the selection; an overlay that was the old model's default
    (``default_overlay`` over ``label_sets``) becomes the new model's default, while one the
    user picked stays. A threshold or its scale selects threshold mode (a new scale drops the
    old scale's threshold: its default applies, for FDR q = FDR_DEFAULT_Q); k or the ranking
    scale selects top-k. A graph search for an exact head name opens that head's panel.
    """
    new = set_field(state, field, value, vocab)
    if new == state:
        return state
    if field == "model":
        if state.overlay == default_overlay(state.model, label_sets):
            new = new.with_(overlay=default_overlay(new.model, label_sets))
        return new.with_(head=None, pair=None)
    if field in ("k", "rank_on"):
        return new.with_(rule="topk")
    if field == "threshold":
        return new.with_(rule="threshold")
    if field == "grain":  # the grain control leaves a drill-down (back to the whole grid)
        return new.with_(zoom=None)
    if field == "threshold_on":
        return new.with_(rule="threshold", threshold=clean_threshold(None, new.threshold_on))
    if field == "find" and vocab.is_head(new.find):
        return new.with_(head=new.find, pair=None)
    return new


def _point(click: Any) -> dict[str, Any]:
    try:
        point = click["points"][0]
    except (TypeError, KeyError, IndexError):
        return {}
    return point if isinstance(point, dict) else {}


def _custom(click: Any) -> list[Any] | None:
    data = _point(click).get("customdata")
    return data if isinstance(data, list) else [data] if data is not None else None


def apply_click(state: ViewState, source: str, click: Any, vocab: Vocabulary) -> ViewState:
    """The state after a click on a figure: a node, an edge, a cell or a point."""
    is_head = vocab.is_head
    if source == "heatmap":  # categorical axes: y = source head, x = target head
        s, t = str(_point(click).get("y", "")), str(_point(click).get("x", ""))
        if state.grain == "layers" and _LAYER_RE.match(s) and _LAYER_RE.match(t):  # overview cell
            return state.with_(grain="heads", zoom=(s, t))
        return state.with_(pair=(s, t)) if is_head(s) and is_head(t) else state
    if source == "head-grid":  # categorical axes: y = "L1", x = "H3" (or "KV1")
        other = str(_point(click).get("y", "")) + str(_point(click).get("x", ""))
        focus = focus_head(state)
        if focus and is_head(other):
            return state.with_(pair=(focus, other) if state.direction == "out" else (other, focus))
        return state
    if source == "kl-grid":  # categorical axes: y = source role, x = target role
        pairing = str(_point(click).get("y", "")) + str(_point(click).get("x", ""))
        return state.with_(pairing=pairing) if pairing in vocab.pairings else state
    data = _custom(click)
    if not data:
        return state
    if source == "subgraph-fig":  # a head node opens its panel, a head -> head edge its pair (groups: nothing)
        if data[0] == "node" and len(data) >= 2 and is_head(str(data[1])):
            return state.with_(head=str(data[1]), pair=None)
        if data[0] == "edge" and len(data) >= 4 and str(data[3]) in vocab.pairings \
                and is_head(str(data[1])) and is_head(str(data[2])):
            return state.with_(pair=(str(data[1]), str(data[2])), pairing=str(data[3]), head=None)
        return state
    if source == "graph":
        if data[0] == "node" and len(data) >= 2 and is_head(str(data[1])):
            return state.with_(head=str(data[1]), pair=None)
        if data[0] == "layers" and len(data) >= 3:  # a cell of the layer-aggregated graph
            layers = parse_layers(f"{data[1]}-{data[2]}")
            return state.with_(layers=layers) if layers else state
        if data[0] == "edge" and len(data) >= 4 and str(data[3]) in vocab.pairings \
                and is_head(str(data[1])) and is_head(str(data[2])):
            return state.with_(pair=(str(data[1]), str(data[2])), pairing=str(data[3]), head=None)
        return state
    if source == "scatter" and len(data) >= 2:
        s, t = str(data[0]), str(data[1])
        return state.with_(pair=(s, t)) if is_head(s) and is_head(t) else state
    return state


def toggle_pin(state: ViewState, head: str) -> ViewState:
    """``head`` pinned if it was not, else unpinned (and out of its group and labels)."""
    if head in state.pins:
        return unpin(state, [head])
    return state.with_(pins=(*state.pins, head))


def unpin(state: ViewState, heads: list[str]) -> ViewState:
    """``state`` without these pins; a group left without members goes, labels of gone names too."""
    pins = tuple(p for p in state.pins if p not in heads)
    groups = tuple((n, tuple(h for h in m if h not in heads)) for n, m in state.groups)
    keys = set(pins) | {n for n, m in groups if m}
    return state.with_(pins=pins, groups=tuple(g for g in groups if g[1]),
                       labels=tuple(kv for kv in state.labels if kv[0] in keys))


def apply_subgraph_action(state: ViewState, action: Any, vocab: Vocabulary) -> ViewState:
    """The state after one subgraph edit ``action`` (a dict with ``op``):

    * ``pin`` {head, on}: pin (on true) or unpin (on false) a head, a toggle without ``on``;
      ``unpin`` {heads}: remove pins (a group name removes its members);
    * ``pin-many`` {heads}: add heads to the pins (a server query's heads; at most PINS_MAX in all);
    * ``group`` {name, heads}: the pinned ``heads`` become group ``name`` (leaving other groups;
      an existing name is replaced); ``ungroup`` {names}: the groups go, their heads stay pinned;
    * ``label`` {key, text}: a head's or group's custom label (blank text removes it);
    * ``import`` {model, pairings, metric, pins, groups, labels}: the subgraph view of an
      exported subgraph (core fields checked like a link's).
    Anything malformed leaves the state as it is.
    """
    if not isinstance(action, dict):
        return state
    op = action.get("op")
    if op == "pin" and vocab.is_head(str(action.get("head"))):
        head, on = str(action["head"]), action.get("on")
        if isinstance(on, bool) and on == (head in state.pins):  # what the click meant is done
            return state
        return toggle_pin(state, head)
    if op == "pin-many":  # heads a server query found, added to the pins (up to PINS_MAX)
        heads = [*state.pins, *(str(h) for h in action.get("heads") or [])]
        pins, groups, labels = clean_subgraph(heads, state.groups, state.labels, vocab)
        return state.with_(view="subgraph", pins=pins, groups=groups, labels=labels)
    if op == "unpin":
        names = [str(h) for h in action.get("heads") or []]
        members = [h for n, m in state.groups if n in names for h in m]
        return unpin(state, names + members)
    if op == "group":
        name = clean_name(action.get("name"))
        heads = [str(h) for h in action.get("heads") or [] if str(h) in state.pins]
        if not name or vocab.is_head(name) or not heads:
            return state
        rest = [(n, tuple(h for h in m if h not in heads)) for n, m in state.groups if n != name]
        groups = [(n, m) for n, m in rest if m] + [(name, tuple(heads))]
        pins, groups_, labels = clean_subgraph(state.pins, groups, state.labels, vocab)
        return state.with_(pins=pins, groups=groups_, labels=labels)
    if op == "ungroup":
        names = {str(n) for n in action.get("names") or []}
        groups = tuple(g for g in state.groups if g[0] not in names)
        return state.with_(groups=groups, labels=tuple(kv for kv in state.labels if kv[0] not in names))
    if op == "label":
        key, text = str(action.get("key") or ""), clean_name(action.get("text"))
        labels = [kv for kv in state.labels if kv[0] != key] + ([(key, text)] if text else [])
        return state.with_(labels=clean_subgraph(state.pins, state.groups, labels, vocab)[2])
    if op == "import":
        pins, groups, labels = clean_subgraph(action.get("pins"), action.get("groups"), action.get("labels"), vocab)
        if not pins:
            return state
        new = state.with_(view="subgraph", pins=pins, groups=groups, labels=labels, head=None, pair=None)
        pairings = tuple(p for p in vocab.graph_pairings if p in (action.get("pairings") or []))
        metric = action.get("metric")
        model = action.get("model")
        return new.with_(pairings=pairings or new.pairings,
                         metric=metric if metric in vocab.metrics else new.metric,
                         model=str(model) if isinstance(model, str) and model.strip() else new.model)
    return state


def next_state(state: ViewState, source: str | None, value: Any, vocab: Vocabulary,
               label_sets: list[LabelSetSummary] | None = None) -> ViewState:
    """The state after ``source`` (a control id, a figure id, or the upload store) got ``value``.

    Anything else (no trigger, a component just rendered) leaves the state as it is.
    """
    if source in CONTROL_FIELDS:
        return apply_control(state, CONTROL_FIELDS[source], value, vocab, label_sets)
    if source in CLICK_SOURCES:
        return apply_click(state, source, value, vocab)
    if source == UPLOAD_SOURCE:
        name = (value or {}).get("name") if isinstance(value, dict) else None
        return state.with_(overlay=str(name)) if name else state
    if source == SUBGRAPH_SOURCE:
        return apply_subgraph_action(state, value, vocab)
    return state
