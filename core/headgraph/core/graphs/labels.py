"""Head-class overlays: named sets of ``head -> class`` labels (IOI circuit, identity heads, ...).

Heads are named ``"L{layer}H{head}"`` with the ORIGINAL block number as layer (the same names
the head graph uses); ``"9.6"`` is accepted as input for ``"L9H6"``. Built-in sets live as JSON
files in ``core/data/labels/``; users upload their own as JSON or CSV (``parse_label_set``), and
``label_set_from_scores`` turns attention-pattern scores into a discovered set for any model.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import networkx as nx
import torch

from headgraph.core.errors import InvalidInput
from headgraph.core.names import HeadRef, head_label
from headgraph.core.types import ModelInfo

# Lenient spellings of a query head accepted in uploaded label files: "l9h6", "9.6", "L3.H0".
_LENIENT_HEAD_RE = re.compile(r"^\s*L?\s*(\d+)\s*(?:\.|H|\.H)\s*(\d+)\s*$", re.IGNORECASE)
MAX_CLASS_CHARS = 200
# What a class may not hold, as the inside of a regex character class: C0 and C1 controls, DEL,
# and the bidirectional formatting controls (ALM, LRM, RLM, embeddings, overrides, isolates),
# which reorder the text around them on screen so that one class could read as another.
CLASS_FORBIDDEN = r"\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_CLASS_FORBIDDEN = re.compile(f"[{CLASS_FORBIDDEN}]")
# Classes label_set_from_scores knows, keyed by a normalised score name.
PATTERN_CLASSES: dict[str, str] = {
    "previous_token": "Previous Token",
    "prev_token": "Previous Token",
    "induction": "Induction",
    "identity": "Identity",
    "self": "Identity",
    "duplicate_token": "Duplicate Token",
    "duplicate": "Duplicate Token",
    "first_token": "First Token",
    "bos": "First Token",
}


class LabelSetError(InvalidInput):
    """A label set that cannot be used; ``line`` is the CSV line (1-based, header = 1) or the
    JSON entry index (0-based) at fault, ``where`` says which of the two in words."""

    def __init__(self, message: str, *, line: int | None, where: str) -> None:
        super().__init__(f"{where}: {message}")
        self.line = line
        self.where = where


class UnknownHead(LabelSetError):
    """A well-formed head the given model does not have (a 404 to an API client)."""


def parse_head_ref(text: str) -> HeadRef:
    """A head name in canonical form (``HeadRef.parse``: "L9H6", "L6KV1") or, for a query head,
    a lenient one ("l9h6", "9.6", " L3.H0 "); InvalidInput otherwise."""
    raw = str(text).strip()
    if HeadRef.is_label(raw):
        return HeadRef.parse(raw)
    m = _LENIENT_HEAD_RE.match(raw)
    if not m:
        raise InvalidInput(f"{raw[:40]!r} is not a head name (expected like 'L9H6' or '9.6')")
    return HeadRef(int(m.group(1)), int(m.group(2)))


def parse_head(text: str) -> tuple[int, int]:
    """Query head ``"L9H6"`` / ``"l9h6"`` / ``"9.6"`` -> ``(9, 6)``; InvalidInput on anything
    else (a grouped KV head such as "L6KV1" too: label sets name query heads)."""
    ref = parse_head_ref(text)
    if ref.kv:
        raise InvalidInput(f"{ref.label} is a grouped key/value head; label query heads (L9H6)")
    return ref.layer, ref.head


@dataclass(frozen=True)
class LabelSet:
    """A named overlay of head classes.

    classes: ``{"L9H6": "Name Mover", ...}`` (canonical head names, original block numbers);
    model: a hint of the model the set was made for (e.g. "gpt2"), or None.
    """

    name: str
    description: str
    classes: dict[str, str] = field(default_factory=dict)
    model: str | None = None

    def class_of(self, head: str) -> str | None:
        """Class of a head name (any accepted spelling), or None when unlabelled."""
        try:
            return self.classes.get(head_label(*parse_head(head)))
        except InvalidInput:
            return None

    @property
    def class_names(self) -> list[str]:
        """Distinct class names in first-seen order."""
        return list(dict.fromkeys(self.classes.values()))

    def to_dict(self) -> dict[str, Any]:
        """JSON form (the same shape ``parse_label_set(..., "json")`` reads)."""
        return {"name": self.name, "description": self.description, "model": self.model,
                "classes": dict(self.classes)}


def builtin_label_sets() -> dict[str, LabelSet]:
    """The label sets shipped in ``core/data/labels/*.json``, keyed by set name."""
    folder = resources.files("headgraph.core").joinpath("data", "labels")
    out: dict[str, LabelSet] = {}
    for entry in sorted(folder.iterdir(), key=lambda p: p.name):
        if entry.name.endswith(".json"):
            stem = entry.name[: -len(".json")]
            ls = parse_label_set(entry.read_text(encoding="utf-8"), "json", name=None)
            out[ls.name if ls.name else stem] = ls
    return out


def _clip(text: object, limit: int = 60) -> str:
    """``repr`` of (the start of) a caller's text, for messages."""
    r = repr(str(text))
    return r if len(r) <= limit else r[: limit - 4] + "...'"


def _type_name(value: Any) -> str:
    if isinstance(value, _Pairs):
        return "an object"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number"}.get(type(value), "a value")


def _check_head(raw: Any, info: ModelInfo | None, line: int, where: str) -> str:
    if not isinstance(raw, str):
        raise LabelSetError(f"a head name must be a string like 'L9H6', got {_type_name(raw)}",
                            line=line, where=where)
    try:
        layer, head = parse_head(raw)
    except InvalidInput as err:
        raise LabelSetError(str(err), line=line, where=where) from None
    if info is not None:
        if layer not in info.layer_indices:
            raise UnknownHead(
                f"unknown head {_clip(raw)} for {info.name}: layer {layer} is not one of its attention "
                f"layers {list(info.layer_indices)}", line=line, where=where)
        if head >= info.n_heads:
            raise UnknownHead(
                f"unknown head {_clip(raw)} for {info.name}: head {head} out of range "
                f"(0..{info.n_heads - 1})", line=line, where=where)
    return head_label(layer, head)


def _add(classes: dict[str, str], seen: dict[str, int], raw_head: Any, raw_cls: Any,
         info: ModelInfo | None, line: int, where: str) -> None:
    label = _check_head(raw_head, info, line, where)
    if raw_cls is not None and not isinstance(raw_cls, str):
        raise LabelSetError(f"class of {label} must be a string, got {_type_name(raw_cls)}",
                            line=line, where=where)
    cls = "" if raw_cls is None else raw_cls.strip()
    if not cls:
        raise LabelSetError(f"head {label} has an empty class", line=line, where=where)
    if len(cls) > MAX_CLASS_CHARS:
        raise LabelSetError(f"class of {label} is longer than {MAX_CLASS_CHARS} characters",
                            line=line, where=where)
    if _CLASS_FORBIDDEN.search(cls):
        raise LabelSetError(f"class of {label} contains control characters (NUL, line breaks, "
                            "bidirectional overrides, ...)", line=line, where=where)
    if label in seen:
        raise LabelSetError(f"duplicate head {label} (first given at {seen[label]})",
                            line=line, where=where)
    seen[label] = line
    classes[label] = cls


def _parse_json(text: str, info: ModelInfo | None) -> tuple[dict[str, str], dict[str, Any]]:
    def pairs_hook(pairs: list[tuple[str, Any]]) -> Any:
        return _Pairs(pairs)

    try:
        data = json.loads(text, object_pairs_hook=pairs_hook)
    except json.JSONDecodeError as err:
        raise LabelSetError(f"bad JSON: {err.msg} (column {err.colno})", line=err.lineno,
                            where=f"line {err.lineno}") from None
    except RecursionError:
        raise LabelSetError("JSON nested too deeply", line=0, where="entry 0") from None
    except ValueError as err:  # e.g. an integer over the digit limit
        raise LabelSetError(f"bad JSON: {str(err)[:120]}", line=0, where="entry 0") from None
    meta: dict[str, Any] = {}
    if isinstance(data, _Pairs):
        meta = {k: v for k, v in data.pairs if k != "classes"}
        for key in ("name", "description", "model"):
            if meta.get(key) is not None and not isinstance(meta[key], str):
                raise LabelSetError(f'"{key}" must be a string, got {_type_name(meta[key])}',
                                    line=0, where="entry 0")
        body = data.get("classes")
        if body is None:
            raise LabelSetError('JSON object has no "classes" field', line=0, where="entry 0")
    else:
        body = data
    classes: dict[str, str] = {}
    seen: dict[str, int] = {}
    if isinstance(body, _Pairs):
        for i, (head, cls) in enumerate(body.pairs):
            if isinstance(cls, (_Pairs, list)):
                raise LabelSetError(f"class of {head!r} must be a string", line=i, where=f"entry {i}")
            _add(classes, seen, head, cls, info, i, f"entry {i}")
    elif isinstance(body, list):
        for i, item in enumerate(body):
            if not isinstance(item, _Pairs) or item.get("head") is None or "class" not in item:
                raise LabelSetError('each entry must be an object {"head": ..., "class": ...}',
                                    line=i, where=f"entry {i}")
            _add(classes, seen, item.get("head"), item.get("class"), info, i, f"entry {i}")
    else:
        raise LabelSetError('expected {"classes": {...}} or a list of {"head", "class"} objects',
                            line=0, where="entry 0")
    return classes, {k: (v if not isinstance(v, _Pairs) else dict(v.pairs)) for k, v in meta.items()}


class _Pairs:
    """A JSON object kept as its ordered (key, value) pairs, so duplicate keys stay visible."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        self.pairs = pairs

    def get(self, key: str) -> Any:
        return next((v for k, v in self.pairs if k == key), None)

    def keys(self) -> list[str]:
        return [k for k, _ in self.pairs]

    def __contains__(self, key: object) -> bool:
        return any(k == key for k, _ in self.pairs)


def _csv_rows(text: str) -> list[tuple[int, list[str]]]:
    """(first line, cells) of each CSV record; any line ending (``\\n``, ``\\r\\n``, a bare
    ``\\r``) ends a line. LabelSetError naming the line for what the csv module refuses (an
    over-long field, a stray quote in strict dialects)."""
    reader = csv.reader(io.StringIO(text, newline=""))
    rows: list[tuple[int, list[str]]] = []
    start = 1
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return rows
        except csv.Error as err:
            raise LabelSetError(f"unreadable CSV ({err})", line=start, where=f"line {start}") from None
        rows.append((start, row))
        start = reader.line_num + 1


def _parse_csv(text: str, info: ModelInfo | None) -> dict[str, str]:
    numbered = [(i, r) for i, r in _csv_rows(text) if r and any(c.strip() for c in r)
                and not r[0].lstrip().startswith("#")]
    if not numbered:
        raise LabelSetError("empty file (expected a header 'head,class')", line=1, where="line 1")
    hline, header = numbered[0]
    if [c.strip().lower() for c in header] != ["head", "class"]:
        raise LabelSetError(f"header must be 'head,class', got {_clip(','.join(header))}",
                            line=hline, where=f"line {hline}")
    classes: dict[str, str] = {}
    seen: dict[str, int] = {}
    for lineno, row in numbered[1:]:
        if len(row) != 2:
            raise LabelSetError(f"expected 2 columns (head,class), got {len(row)}",
                                line=lineno, where=f"line {lineno}")
        _add(classes, seen, row[0].strip(), row[1], info, lineno, f"line {lineno}")
    if not classes:
        raise LabelSetError("no head labels after the header", line=hline, where=f"line {hline}")
    return classes


def parse_label_set(text: str, fmt: str, *, name: str | None, info: ModelInfo | None = None,
                    description: str = "") -> LabelSet:
    """Parse an uploaded label set.

    fmt "json": ``{"name":..., "description":..., "model":..., "classes": {"L9H6": "Name Mover"}}``,
    ``"classes"`` may also be a list of ``{"head": "L9H6", "class": "..."}``, or the list alone.
    fmt "csv": header ``head,class`` then one head per line (blank and ``#`` lines skipped).
    Heads may be written "L9H6" or "9.6". ``name`` overrides the JSON "name" field. With ``info``
    every head must exist in that model (layer among its original block numbers, head < n_heads).
    Raises LabelSetError naming the CSV line / JSON entry at fault for a bad format, an unknown or
    duplicate head, an empty class, or an empty set.
    """
    fmt = fmt.lower().lstrip(".")
    meta: dict[str, Any] = {}
    if fmt == "json":
        classes, meta = _parse_json(text, info)
        if not classes:
            raise LabelSetError("the set has no head labels", line=0, where="entry 0")
    elif fmt == "csv":
        classes = _parse_csv(text, info)
    else:
        raise InvalidInput(f"unknown label-set format {fmt!r}; expected 'json' or 'csv'")
    set_name = name or str(meta.get("name") or "uploaded")
    desc = description or str(meta.get("description") or set_name)
    model = meta.get("model")
    return LabelSet(name=set_name, description=desc, classes=classes,
                    model=None if model is None else str(model))


def label_set_from_scores(
    grids: Mapping[str, torch.Tensor],
    layer_indices: Iterable[int],
    thresholds: float | Mapping[str, float],
    *,
    name: str = "discovered",
    description: str = "Head classes discovered from attention-pattern scores",
) -> LabelSet:
    """Label heads by pattern scores: each head gets the class whose score is highest among
    the classes whose score exceeds its threshold; heads with none stay unlabelled.

    grids: ``{score name: [L, H] tensor}`` keyed by class ("Previous Token") or score name
    ("previous_token", "induction", "identity", "duplicate_token", "first_token"; unknown keys
    are used as class names as given). thresholds: one float for all, or per grid key.
    layer_indices: original block number of each grid row. Ties go to the earlier grid key.
    """
    if not grids:
        raise InvalidInput("no score grids given")
    keys = list(grids)
    layers = [int(x) for x in layer_indices]
    stacked = torch.stack([grids[k].detach().to(torch.float64) for k in keys])  # [C, L, H]
    if stacked.ndim != 3 or stacked.shape[1] != len(layers):
        raise InvalidInput(f"grids must all be [L, H] with L = {len(layers)} layers; got "
                         f"{tuple(stacked.shape[1:])}")
    if isinstance(thresholds, Mapping):
        missing = [k for k in keys if k not in thresholds]
        if missing:
            raise InvalidInput(f"no threshold for {missing}")
        thr = torch.tensor([float(thresholds[k]) for k in keys], dtype=torch.float64,
                           device=stacked.device)
    else:
        thr = torch.full((len(keys),), float(thresholds), dtype=torch.float64, device=stacked.device)
    passed = torch.nan_to_num(stacked, nan=-torch.inf) > thr[:, None, None]
    masked = torch.where(passed, stacked, torch.full_like(stacked, -torch.inf))
    best = masked.argmax(dim=0)  # first max on ties -> earlier key
    any_pass = passed.any(dim=0)
    class_names = [PATTERN_CLASSES.get(re.sub(r"[\s\-]+", "_", k.strip().lower()), k) for k in keys]
    classes: dict[str, str] = {}
    for li, hi in any_pass.nonzero().tolist():
        classes[head_label(layers[li], hi)] = class_names[int(best[li, hi])]
    return LabelSet(name=name, description=description, classes=classes, model=None)


def _node_heads(graph: Any, node: Any) -> tuple[str, list[str]]:
    """(head identity, query heads it stands for) of a graph node."""
    data = graph.nodes[node]
    ident = str(data.get("head_name") or str(node).split(" ")[0])
    members = data.get("heads")
    return ident, (str(members).split(",") if members else [ident])


def _nx(graph: Any) -> nx.Graph:
    """The NetworkX graph of a HeadGraph (or the graph itself)."""
    return graph if isinstance(graph, nx.Graph) else graph.graph


def class_counts(graph: Any, labels: LabelSet) -> dict[str, int]:
    """``{"in_class": n, "out_of_class": m}`` over the distinct heads that are graph nodes.

    At role granularity "L4H7 O" and "L4H7 Q" count once as head L4H7; a grouped-query KV node
    is in class when any query head it serves is. (Paper Fig. 1, PK top-20 on GPT-2 small with
    the IOI classes: In-class 24 / Out-of-class 28.) Accepts a HeadGraph or a NetworkX graph.
    """
    g = _nx(graph)
    status: dict[str, bool] = {}
    for node in g.nodes:
        ident, members = _node_heads(g, node)
        status[ident] = status.get(ident, False) or any(m in labels.classes for m in members)
    n_in = sum(status.values())
    return {"in_class": n_in, "out_of_class": len(status) - n_in}


def class_recovery(graph: Any, labels: LabelSet) -> dict[str, float]:
    """Per pairing, the fraction of its edges whose source AND target heads are both in class.

    A figure of merit for how much of a pairing's selected edges stay inside a known circuit
    (e.g. IOI): 1.0 means every edge joins two labelled heads; a pairing with no edges gets 0.0.
    """
    g = _nx(graph)
    in_class = {n: any(m in labels.classes for m in _node_heads(g, n)[1]) for n in g.nodes}
    totals: dict[str, list[int]] = {}
    for u, v, data in g.edges(data=True):
        pairing = str(data.get("pairing", ""))
        t = totals.setdefault(pairing, [0, 0])
        t[0] += 1
        t[1] += int(in_class[u] and in_class[v])
    return {p: (hit / n if n else 0.0) for p, (n, hit) in totals.items()}
