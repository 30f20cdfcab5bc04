"""The registered path-ablation computation and the view that joins it with PK and CS.

``ablation`` (core.ablation.path_ablation) measures a set of O -> Q/K/V edges of one model on
its runnable model (the pattern source: the demo, a TransformerBridge, a GGUF booted on first
use); its key is the pairing and the exact edge set (layer positions), so the top-k of a
pairing and an explicit edge are cached like every other result. ``ablation_view`` resolves a
request (top-k by PK, or one named edge) into that edge set and adds each edge's PK and CS
(a KV-group target: the CS mean over its query heads, core.ranking.kv_level_cs), and its
``verdict`` (``edge_verdict``: one rule for the API, the CLI and the dashboard). With
``cached=True`` it only reads: each edge's effects come from any cached ablation of its pairing
that measured it (an edge's effects do not depend on the other edges measured with it), and an
edge none measured is "not measured".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from headgraph.core.errors import UnsupportedModel
from headgraph.server.errors import Invalid

if TYPE_CHECKING:  # the CLI's parser reads the constants below without importing torch
    from headgraph.server.compute.registry import Computation, Inputs
    from headgraph.server.models.offered import ModelRef

ABLATION_PAIRINGS = ("OQ", "OK", "OV")
ABLATION_TOP_MAX = 50  # edges per request: each costs a few forward passes
DEFAULT_ABLATION_TOP = 10
ABLATION_PROMPTS = "default-20+rr20x20-seed0"  # the prompt sets (part of the cache key)

# The verdict of a measured edge. TVD of attention rows (Q / K paths) is the share of the
# target's attention mass the ablation moves; the V measure is the relative change of its
# output. Chosen on the measured numbers: the demo's induction edges (L0H0 -> layer 1, OK)
# move 0.21-0.35 and SmolLM2's induction edge L16H0 -> L17KV1 0.41 (random tokens), while the
# edges from SmolLM2's attention-sink heads L18H6-8 -> L19KV2 move 0.000-0.065; both split
# halves must pass, so one lucky half of the prompts does not verify an edge.
VERIFIED = "verified"
NO_EFFECT = "no effect"
NOT_MEASURED = "not measured"
VERDICTS = (VERIFIED, NO_EFFECT, NOT_MEASURED)
VERIFY_MIN_EFFECT = 0.1
VERDICT_RULE = (f"verified when, on at least one prompt set (text or random tokens), the effect "
                f"is >= {VERIFY_MIN_EFFECT:g} in both split halves (even and odd prompts): "
                f"{VERIFY_MIN_EFFECT:.0%} of the target's attention mass moved (TVD, Q / K paths) "
                f"or a {VERIFY_MIN_EFFECT:.0%} relative change of its output (V path); else "
                "'no effect'; 'not measured' when no ablation of the edge is cached")


def edge_verdict(halves: dict[str, Any] | None) -> str:
    """"verified" | "no effect" for a measured edge's split halves ({prompt set: [even, odd]}),
    "not measured" without any (VERDICT_RULE)."""
    if not halves:
        return NOT_MEASURED
    for values in halves.values():
        if values and all(v is not None and v == v and v >= VERIFY_MIN_EFFECT for v in values):
            return VERIFIED
    return NO_EFFECT


def check_ablation_pairing(value: Any) -> str:
    if value not in ABLATION_PAIRINGS:
        raise Invalid(f"ablation measures O->Q/K/V edges; unknown pairing {value!r}; allowed: "
                      f"{list(ABLATION_PAIRINGS)}", allowed=list(ABLATION_PAIRINGS))
    return value


def check_edges(value: Any) -> tuple[tuple[int, int, int, int], ...]:
    """A non-empty tuple of at most ABLATION_TOP_MAX (source layer, source head, target
    layer, target head) position tuples, each with the source in an earlier layer."""
    try:
        edges = tuple(tuple(int(x) for x in e) for e in value)
    except (TypeError, ValueError):
        raise Invalid(f"edges must be (source layer, source head, target layer, target head) "
                      f"positions, got {value!r:.80}") from None
    if not edges or len(edges) > ABLATION_TOP_MAX:
        raise Invalid(f"ablation takes 1..{ABLATION_TOP_MAX} edges, got {len(edges)}")
    for e in edges:
        if len(e) != 4 or min(e) < 0:
            raise Invalid(f"an edge is 4 non-negative positions, got {e!r}")
        if e[0] >= e[2]:
            raise Invalid("an ablated edge's source must be in an earlier layer than its target")
    return edges  # type: ignore[return-value]


def ablation(src: Inputs, *, pairing: str, edges: tuple[tuple[int, int, int, int], ...]
             ) -> dict[str, Any]:
    """Path-ablation effects of ``edges`` on the text and random-token prompt sets, with
    split-half reliability (core.ablation.path_ablation), JSON data."""
    from headgraph.core.activations.ablation import Edge, path_ablation, path_of_pairing
    from headgraph.server.computations.convert import jsonable

    source = src.patterns
    if source is None:
        raise UnsupportedModel(f"{src.info.name} cannot be run here (weights read without a "
                               "runnable model), so its edges cannot be verified by ablation")
    path = path_of_pairing(pairing)
    result = path_ablation(source, [Edge(*e, path) for e in edges])
    return {"pairing": pairing, **jsonable(result.to_dict())}


def _edges_key(p: dict[str, Any]) -> dict[str, Any]:
    return {"pairing": p["pairing"],
            "edges": ";".join(".".join(map(str, e)) for e in p["edges"]),
            "prompts": ABLATION_PROMPTS}


def ablation_computations() -> list[Computation]:
    from headgraph.server.compute.registry import Computation

    return [Computation("ablation", ablation,
                        {"pairing": check_ablation_pairing, "edges": check_edges},
                        key=_edges_key)]


# -- the request-level view -----------------------------------------------------------------

def _pk_cs(scores: Any, ref: ModelRef, pairing: str, edges: list[tuple[int, int, int, int]]
           ) -> list[tuple[float | None, float | None]]:
    from headgraph.core.scores.ranking import kv_level_cs

    ps = scores.pk(ref, pairing, "forward")
    cs = scores.cs_for(ref, pairing, "forward")
    out: list[tuple[float | None, float | None]] = []
    for sl, sh, tl, th in edges:
        pk = float(ps.scores[sl, sh, tl, th]) if bool(ps.valid[sl, sh, tl, th]) else None
        value = None
        if cs is not None:
            row = replace(cs, scores=cs.scores[sl: sl + 1, sh: sh + 1],
                          valid=cs.valid[sl: sl + 1, sh: sh + 1])
            kv = kv_level_cs(row, ps.scores.shape[3])
            if bool(kv.valid[0, 0, tl, th]):
                value = float(kv.scores[0, 0, tl, th])
        out.append((pk, value))
    return out


EDGE_PATTERN = (r"^\s*[Ll]\d{1,4}[Hh]\d{1,4}\s*,\s*[Ll]\d{1,4}([Hh]|[Kk][Vv])\d{1,4}\s*$")


def parse_edge(text: str) -> tuple[str, str]:
    """``"L0H0,L1H3"`` -> ("L0H0", "L1H3") (source, target; heads checked by parse_node)."""
    parts = [p.strip() for p in str(text).split(",")]
    if len(parts) != 2 or not all(parts):
        raise Invalid(f"an edge is 'source,target' like 'L0H0,L1H3', got {str(text)[:40]!r}")
    return parts[0], parts[1]


Edge4 = tuple[int, int, int, int]


def _resolve_edges(views: Any, catalog: Any, ref: ModelRef, pairing: str, top: int | None,
                   edge: tuple[str, str] | None) -> tuple[list[Edge4], list[tuple[str, str]], str]:
    """The request's edge set (layer positions), their (source, target) names, and its
    selection text."""
    from headgraph.core.names import head_label
    from headgraph.server.computations.convert import parse_node, role_is_grouped
    from headgraph.server.errors import NotFound

    info = catalog.model_info(ref)
    if edge is not None:
        source, target = edge
        sl, sh = parse_node(source, "O", info)
        tl, th = parse_node(target, pairing[1], info)
        if sl >= tl:
            raise NotFound(f"no forward edge {source} -> {target}: an ablated edge's source "
                           "must be in an earlier layer than its target")
        edges, selection = [(sl, sh, tl, th)], "edge"
    else:
        k = DEFAULT_ABLATION_TOP if top is None else top
        if isinstance(k, bool) or not 1 <= k <= ABLATION_TOP_MAX:
            raise Invalid(f"top must be in 1..{ABLATION_TOP_MAX}, got {k!r}")
        records = views.top(ref, pairing, k, "pk", "forward")
        edges = [parse_node(r["source"], "O", info) + parse_node(r["target"], pairing[1], info)
                 for r in records]
        selection = f"top {k} by PK"
    kv = role_is_grouped(info, pairing[1])
    names = [(head_label(info.layer_indices[sl], sh), head_label(info.layer_indices[tl], th, kv=kv))
             for sl, sh, tl, th in edges]
    return edges, names, selection


def _parse_edge_key(text: str) -> tuple[Edge4, ...] | None:
    try:
        edges = tuple(tuple(int(x) for x in e.split(".")) for e in text.split(";") if e)
    except ValueError:
        return None
    return edges if edges and all(len(e) == 4 for e in edges) else None  # type: ignore[return-value]


def cached_measurements(cache: Any, ref: ModelRef, pairing: str, edges: list[Edge4]
                        ) -> tuple[dict[Edge4, dict[str, Any]], dict[str, Any] | None,
                                   dict[str, Any] | None]:
    """({edge: its row in a cached ablation result}, the result of exactly ``edges`` if
    cached, the first result read): the edges of ``pairing`` that any cached ablation
    measured (the exact set, a top-k, one edge, a validation chunk). Reads only."""
    from urllib.parse import parse_qsl

    from headgraph.server.cache.cold_miss import ColdMiss

    exact = tuple(edges)
    try:
        if cache.has(ref, "ablation", pairing=pairing, edges=exact):
            result = cache.get(ref, "ablation", pairing=pairing, edges=exact)
            return dict(zip(exact, result["edges"], strict=True)), result, result
    except ColdMiss:  # evicted in between
        pass
    wanted: set[Edge4] = set(exact)
    found: dict[Edge4, dict[str, Any]] = {}
    first = None
    for name in cache.cached_names(ref) or []:
        base, _, query = name.partition("?")
        q = dict(parse_qsl(query))
        if base != "ablation" or q.get("pairing") != pairing or q.get("prompts") != ABLATION_PROMPTS:
            continue
        theirs = _parse_edge_key(q.get("edges", ""))
        if theirs is None or not (wanted & set(theirs)) - found.keys():
            continue
        try:
            result = cache.get(ref, "ablation", pairing=pairing, edges=theirs)
        except (ColdMiss, Invalid):
            continue
        first = first or result
        for e, row in zip(theirs, result["edges"], strict=True):
            if e in wanted:
                found.setdefault(e, row)
        if len(found) == len(wanted):
            break
    return found, None, first


def ablation_view(scores: Any, views: Any, catalog: Any, ref: ModelRef, pairing: str,
                  top: int | None, edge: tuple[str, str] | None = None, cached: bool = False
                  ) -> dict[str, Any]:
    """The API answer: per edge {source, target, pairing, effect_text, effect_random, pk, cs,
    verdict, ...}, reliability per prompt set and n_prompts. Edges: the ``top`` highest-PK
    forward pairs of ``pairing``, or the one ``edge`` (source, target) when given; a named head
    the model lacks, or a source not in an earlier layer than its target (no such forward
    edge), is NotFound.

    ``cached``: only what is cached (cache_only.CACHE_ONLY), nothing computed or loaded: an
    edge no cached ablation measured has verdict "not measured" and null effects; reliability
    only when exactly this edge set is cached; no edges while the model or its PK is not."""
    from headgraph.server.cache.cold_miss import CACHE_ONLY, ColdMiss

    check_ablation_pairing(pairing)
    if not cached:
        edges, names, selection = _resolve_edges(views, catalog, ref, pairing, top, edge)
        if not edges:
            raise Invalid(f"{ref.id} has no valid forward {pairing} pairs to ablate")
        result = scores.cache.get(ref, "ablation", pairing=pairing, edges=tuple(edges))
        rows = dict(zip(edges, result["edges"], strict=True))
        return _answer(_pk_cs(scores, ref, pairing, edges), ref, pairing, selection, edges,
                       names, rows, result, result, cached_only=False)
    token = CACHE_ONLY.set(True)
    try:
        try:
            edges, names, selection = _resolve_edges(views, catalog, ref, pairing, top, edge)
        except ColdMiss:  # the model or its PK not known yet: nothing can be measured
            selection = "edge" if edge is not None else f"top {top or DEFAULT_ABLATION_TOP} by PK"
            return _answer([], ref, pairing, selection, [], [], {}, None, None, cached_only=True)
        rows, exact, first = cached_measurements(scores.cache, ref, pairing, edges)
        try:
            pk_cs = _pk_cs(scores, ref, pairing, edges)
        except ColdMiss:
            pk_cs = [(None, None) for _ in edges]
        return _answer(pk_cs, ref, pairing, selection, edges, names, rows, exact, first,
                       cached_only=True)
    finally:
        CACHE_ONLY.reset(token)


def _answer(pk_cs: Sequence[tuple[float | None, float | None]], ref: ModelRef, pairing: str,
            selection: str, edges: list[Edge4], names: list[tuple[str, str]],
            rows: dict[Edge4, dict[str, Any]], exact: dict[str, Any] | None,
            first: dict[str, Any] | None, *, cached_only: bool) -> dict[str, Any]:
    out = []
    for position, (source, target), (pk, cs) in zip(edges, names, pk_cs, strict=True):
        e = rows.get(position)
        if e is None:
            out.append({"source": source, "target": target, "pairing": pairing, "path": pairing[1],
                        "measure": "relative_output" if pairing == "OV" else "tvd",
                        "effect_text": None, "effect_random": None, "halves": {},
                        "pk": pk, "cs": cs, "verdict": NOT_MEASURED})
        else:
            out.append({"source": e["source"], "target": e["target"], "pairing": pairing,
                        "path": e["path"], "measure": e["measure"],
                        "effect_text": e["effect_text"], "effect_random": e["effect_random"],
                        "halves": e["halves"], "pk": pk, "cs": cs,
                        "verdict": edge_verdict(e["halves"])})
    meta = first or {}
    return {"model": ref.id, "pairing": pairing, "selection": selection, "edges": out,
            "reliability": (exact or {}).get("reliability", {}),
            "n_prompts": meta.get("n_prompts", {}), "induction_length": meta.get("induction_length"),
            "method": meta.get("method"), "cached_only": cached_only,
            "verdict_rule": {"min_effect": VERIFY_MIN_EFFECT, "rule": VERDICT_RULE}}
