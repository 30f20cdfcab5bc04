"""What the graph view shows of an API graph: a layer range, a head search, ablation verdicts.

Pure functions over the API's node-link JSON and its GET /api/ablation answers, so a test can
check them without a browser. A layer range keeps the heads of blocks lo..hi and the edges
whose both ends lie in it; a search term is a head name (``L17H3``, ``L17KV1``), a layer
(``L17``) or a class of the overlay (``induction``, any case); an edge's verdict is the API's ("verified" / "no effect" / "not measured"), read
from the cache only, and "not measured" for an edge no cached ablation covers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from headgraph.frontend.api.answers import AblationEdge, AblationOut
from headgraph.frontend.api.names import O_PAIRINGS
from headgraph.frontend.figures.palette import class_key, class_parts

ABLATION_PAIRINGS = O_PAIRINGS  # pairings whose edges path ablation measures
VERIFIED, NO_EFFECT, NOT_MEASURED = "verified", "no effect", "not measured"
NO_NULL = "null not computed"  # measured, its random-pair null not cached yet
UNRESOLVED = "null too small"  # the null cannot resolve the verdict's quantile: no verdict
VERDICTS: tuple[str, ...] = (VERIFIED, NO_EFFECT, NOT_MEASURED, NO_NULL, UNRESOLVED)
_NAME_RE = re.compile(r"^L(\d+)(?:H|KV)\d+$")
EdgeKey = tuple[str, str, str]  # (source, target, pairing)
Verdicts = dict[EdgeKey, AblationEdge]  # an edge's GET /api/ablation row (verdict, effects)


def layer_of(name: str) -> int | None:
    """The block number of a head or KV-group name ("L17H3" / "L17KV1" -> 17)."""
    m = _NAME_RE.match(str(name).upper())
    return int(m.group(1)) if m else None


def in_layers(layer: int | None, layers: tuple[int, int] | list[int] | None) -> bool:
    """True when there is no range, or ``layer`` lies in it (both ends included)."""
    if not layers:
        return True
    return layer is not None and int(layers[0]) <= layer <= int(layers[1])


def filter_layers(node_link: dict[str, Any], layers: tuple[int, int] | list[int] | None) -> dict[str, Any]:
    """``node_link`` with only the nodes of blocks in ``layers`` and the edges whose source and
    target both lie in it (unchanged without a range)."""
    if not layers:
        return node_link
    nodes = [n for n in node_link.get("nodes", [])
             if in_layers(int(n["layer"]) if n.get("layer") is not None else layer_of(n["id"]), layers)]
    keep = {n["id"] for n in nodes}
    edges = [e for e in node_link.get("edges", node_link.get("links", []))
             if e["source"] in keep and e["target"] in keep]
    return {**node_link, "nodes": nodes, "edges": edges}


def head_order(name: str) -> tuple[int, int, int]:
    """Sort key of head names: by block, query heads before KV groups, by index."""
    m = re.match(r"^L(\d+)(H|KV)(\d+)$", str(name).upper())
    return (int(m.group(1)), int(m.group(2) == "KV"), int(m.group(3))) if m else (1 << 30, 0, 0)


def is_head_or_layer(find: str) -> bool:
    """True for a head name ("L17H3", "L17KV1") or a layer ("L17"), any case."""
    term = (find or "").strip().upper()
    return bool(_NAME_RE.match(term) or re.match(r"^L\d+$", term))


def find_matches(names: Iterable[str], find: str, classes: Mapping[str, str] | None = None) -> list[str]:
    """The names a search term matches, sorted (head_order): an exact head name matches itself
    (when shown), a layer ("L17") every head and KV group of that block, anything else the
    heads whose class (``classes``: name -> class) is that class (class_key: any case, "-"
    or "_" as a blank; a KV group's joined class when one of its parts is); "" matches none."""
    term = (find or "").strip().upper()
    if not term:
        return []
    if _NAME_RE.match(term):
        return [n for n in names if n.upper() == term]
    if re.match(r"^L\d+$", term):
        layer = int(term[1:])
        return sorted({n for n in names if layer_of(n) == layer}, key=head_order)
    key = class_key(find)
    return sorted({n for n in names if any(class_key(c) == key for c in class_parts((classes or {}).get(n)))},
                  key=head_order)


def verify_k(pairings: Iterable[str], rule: str, k: int, edge_counts: dict[str, int],
             top_max: int) -> dict[str, int]:
    """How many top edges by PK of each shown pairing verification covers: the graph's k in
    top-k mode, its edge count in threshold mode, capped at ``top_max`` (the vocabulary's
    ``ablation_top_max``); 0-edge pairings and pairings ablation cannot measure left out."""
    out = {}
    for p in pairings:
        if p not in ABLATION_PAIRINGS:
            continue
        n = int(k) if rule == "topk" else int(edge_counts.get(p, 0) or 0)
        if n > 0:
            out[p] = min(n, top_max)
    return out


def verdict_map(answers: Iterable[AblationOut]) -> Verdicts:
    """(source, target, pairing) -> the API's edge row (verdict, effects) over GET
    /api/ablation answers."""
    out: Verdicts = {}
    for answer in answers:
        for e in answer.get("edges", []):
            out[(e["source"], e["target"], e.get("pairing") or answer.get("pairing", ""))] = e
    return out


def edge_key(edge: dict[str, Any]) -> EdgeKey:
    return (edge["source"], edge["target"], str(edge.get("pairing", edge.get("key", ""))))


def verdict_of(edge: dict[str, Any], verdicts: Verdicts) -> str:
    """An API graph edge's verdict: its ablation row's, else "not measured"."""
    row = verdicts.get(edge_key(edge))
    return str(row.get("verdict") or NOT_MEASURED) if row else NOT_MEASURED


def keep_verified(node_link: dict[str, Any], verdicts: Verdicts) -> dict[str, Any]:
    """Only the verified edges and the nodes they touch."""
    edges = [e for e in node_link.get("edges", node_link.get("links", []))
             if verdict_of(e, verdicts) == VERIFIED]
    touched = {e["source"] for e in edges} | {e["target"] for e in edges}
    return {**node_link, "nodes": [n for n in node_link.get("nodes", []) if n["id"] in touched], "edges": edges}


def verdict_counts(edges: Iterable[dict[str, Any]], verdicts: Verdicts) -> dict[str, int]:
    """Edges per verdict, every verdict named (0 when none)."""
    out = dict.fromkeys(VERDICTS, 0)
    for e in edges:
        out[verdict_of(e, verdicts)] += 1
    return out


def null_quantiles(verdicts: Verdicts) -> list[float]:
    """The distinct random-pair null quantiles of the measured rows' verdicts (sorted)."""
    return sorted({float(q) for r in verdicts.values() if (q := r.get("null_quantile")) is not None})


def edge_counts(edges: Iterable[dict[str, Any]], pairings: Iterable[str]) -> dict[str, int]:
    """Edges per pairing (every shown pairing named)."""
    out = dict.fromkeys(pairings, 0)
    for e in edges:
        p = str(e.get("pairing", e.get("key", "")))
        out[p] = out.get(p, 0) + 1
    return out
