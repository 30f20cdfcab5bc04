"""Path-ablation verdicts of edges, as the API, the CLI and the dashboard ask for them.

:class:`AblationService` resolves a request (the top-k of a pairing by PK, or one named edge)
into the edge set the registered ``ablation`` computation measures, and joins each measured
edge with its PK and CS (a KV-group target: the CS mean over its query heads,
``core.scores.ranking.kv_level_cs``) and its verdict (``edge_verdict`` against the thresholds
the random-pair null ``ablation_null`` gives for the request's edges: one rule everywhere).
With ``cached=True`` it only reads: each edge's effects come from any cached ablation of its
pairing that measured it (an edge's effects do not depend on the other edges measured with
it), and an edge none measured is "not measured".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any
from urllib.parse import parse_qsl

from headgraph.core.names import head_label
from headgraph.core.scores.ranking import kv_level_cs
from headgraph.server.cache.cold_miss import CACHE_ONLY, ColdMiss
from headgraph.server.computations.ablation import (
    ABLATION_PROMPTS,
    DEFAULT_ABLATION,
    DEFAULT_ABLATION_TOP,
    NOT_MEASURED,
    NULL_SAMPLE,
    NULL_SEED,
    VERDICT_RULE,
    VERIFY_ALPHA,
    check_ablation_kind,
    check_ablation_pairing,
    edge_statistic,
    edge_verdict,
    null_thresholds,
)
from headgraph.server.computations.convert import parse_node, role_is_grouped
from headgraph.server.compute.results import ResultCache
from headgraph.server.errors import Invalid, NotFound
from headgraph.server.limits import ABLATION_TOP_MAX
from headgraph.server.models.catalog import ModelCatalog
from headgraph.server.models.offered import ModelRef
from headgraph.server.services.scores import ScoresService
from headgraph.server.services.views import ViewService


def _pk_cs(scores: ScoresService, ref: ModelRef, pairing: str, edges: list[tuple[int, int, int, int]]
           ) -> list[tuple[float | None, float | None]]:
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


def _resolve_edges(views: ViewService, catalog: ModelCatalog, ref: ModelRef, pairing: str,
                   top: int | None, edge: tuple[str, str] | None
                   ) -> tuple[list[Edge4], list[tuple[str, str]], str]:
    """The request's edge set (layer positions), their (source, target) names, and its
    selection text."""
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


def cached_measurements(cache: ResultCache, ref: ModelRef, pairing: str, edges: list[Edge4],
                        ablation: str = DEFAULT_ABLATION
                        ) -> tuple[dict[Edge4, dict[str, Any]], dict[str, Any] | None,
                                   dict[str, Any] | None]:
    """({edge: its row in a cached ablation result}, the result of exactly ``edges`` if
    cached, the first result read): the edges of ``pairing`` that any cached ablation of this
    kind measured (the exact set, a top-k, one edge, a validation or null chunk). Reads only."""
    exact = tuple(edges)
    try:
        if cache.has(ref, "ablation", pairing=pairing, edges=exact, ablation=ablation):
            result = cache.get(ref, "ablation", pairing=pairing, edges=exact, ablation=ablation)
            return dict(zip(exact, result["edges"], strict=True)), result, result
    except ColdMiss:  # evicted in between
        pass
    wanted: set[Edge4] = set(exact)
    found: dict[Edge4, dict[str, Any]] = {}
    first = None
    for name in cache.cached_names(ref) or []:
        base, _, query = name.partition("?")
        q = dict(parse_qsl(query))
        if base != "ablation" or q.get("pairing") != pairing or q.get("prompts") != ABLATION_PROMPTS \
                or q.get("ablation", DEFAULT_ABLATION) != ablation:
            continue
        theirs = _parse_edge_key(q.get("edges", ""))
        if theirs is None or not (wanted & set(theirs)) - found.keys():
            continue
        try:
            result = cache.get(ref, "ablation", pairing=pairing, edges=theirs, ablation=ablation)
        except (ColdMiss, Invalid):
            continue
        first = first or result
        for e, row in zip(theirs, result["edges"], strict=True):
            if e in wanted:
                found.setdefault(e, row)
        if len(found) == len(wanted):
            break
    return found, None, first


def verdict_rule(thresholds: dict[str, Any], null: dict[str, Any] | None, n_edges: int,
                 ablation: str) -> dict[str, Any]:
    """The answer's ``verdict_rule``: the rule's text and the numbers it used (per prompt set
    threshold, method, quantile, the null's calibration and held-out sizes, the held-out share
    above the threshold and the family-wise error it implies), the null's seed and size and its
    ablation."""
    any_t = next(iter(thresholds.values()), None)
    shares = [t["held_out_share"] for t in thresholds.values() if t.get("held_out_share") is not None]
    fwer = (min(1.0, any_t["n_tests"] * sum(shares) / len(shares)) if any_t and shares else None)
    return {"rule": VERDICT_RULE, "alpha": VERIFY_ALPHA, "correction": "bonferroni",
            "n_tests": any_t["n_tests"] if any_t else None,
            "quantile": any_t["quantile"] if any_t else None,
            "n_null": {k: t["n_null"] for k, t in thresholds.items()},
            "n_calibration": {k: t["n_calibration"] for k, t in thresholds.items()},
            "n_held_out": {k: t["n_held_out"] for k, t in thresholds.items()},
            "thresholds": {k: t["threshold"] for k, t in thresholds.items()},
            "method": {k: t["method"] for k, t in thresholds.items()},
            "resolved": {k: t["resolved"] for k, t in thresholds.items()},
            "held_out_share": {k: t["held_out_share"] for k, t in thresholds.items()},
            "expected_share": any_t["expected_share"] if any_t else None,
            "achieved_fwer": fwer, "split": any_t["split"] if any_t else None,
            "null_seed": None if null is None else null["seed"],
            "null_sample": None if null is None else null["n"], "null_requested": NULL_SAMPLE,
            "tested_edges": n_edges, "ablation": ablation, "computed": bool(thresholds),
            "summary": null_summary(thresholds)}


def null_summary(thresholds: dict[str, Any]) -> str:
    """"above the random-pair null (q=0.9975, calibrated on 95 of 190 null pairs; text > 0.12
    (gpd), random > 0.09 (gpd); held-out pairs above: 0 of 95, 0 of 95, expected 0.0025 each)",
    or what is missing."""
    if not thresholds:
        return "the random-pair null is not computed"
    t = next(iter(thresholds.values()))
    if all(v["threshold"] is None for v in thresholds.values()):
        return (f"the random-pair null is too small to resolve q={t['quantile']:.4g}: {t['n_calibration']} "
                f"calibration pairs, an empirical quantile needs {t['min_empirical']} and a tail fit 90; "
                "no verdict")
    parts = ", ".join(f"{k} > {v['threshold']:.3g} ({v['method']})" if v["threshold"] is not None
                      else f"{k} unresolved" for k, v in thresholds.items())
    held = ", ".join(f"{v['held_out_exceed']} of {v['n_held_out']}" for v in thresholds.values()
                     if v["threshold"] is not None)
    return (f"above the random-pair null (q={t['quantile']:.4g}, calibrated on {t['n_calibration']} of "
            f"{t['n_null']} null pairs; {parts}; held-out null pairs above: {held}, expected "
            f"{t['expected_share']:.2g} each)")


def _answer(pk_cs: Sequence[tuple[float | None, float | None]], ref: ModelRef, pairing: str,
            selection: str, edges: list[Edge4], names: list[tuple[str, str]],
            rows: dict[Edge4, dict[str, Any]], exact: dict[str, Any] | None,
            first: dict[str, Any] | None, null: dict[str, Any] | None, ablation: str, *,
            cached_only: bool) -> dict[str, Any]:
    thresholds = {} if null is None else null_thresholds(null, edges)
    summary = null_summary(thresholds)
    quantile = next((t["quantile"] for t in thresholds.values()), None)
    out = []
    for position, (source, target), (pk, cs) in zip(edges, names, pk_cs, strict=True):
        e = rows.get(position)
        if e is None:
            out.append({"source": source, "target": target, "pairing": pairing, "path": pairing[1],
                        "measure": "relative_output" if pairing == "OV" else "tvd",
                        "effect_text": None, "effect_random": None, "halves": {},
                        "pk": pk, "cs": cs, "verdict": NOT_MEASURED, "statistic": {}, "verdict_note": None,
                        "null_quantile": None})
        else:
            verdict = edge_verdict(e["halves"], thresholds)
            out.append({"source": e["source"], "target": e["target"], "pairing": pairing,
                        "path": e["path"], "measure": e["measure"],
                        "effect_text": e["effect_text"], "effect_random": e["effect_random"],
                        "halves": e["halves"], "pk": pk, "cs": cs, "verdict": verdict,
                        "statistic": edge_statistic(e["halves"]),
                        "verdict_note": summary if thresholds else None,
                        "null_quantile": quantile})
    meta = first or {}
    return {"model": ref.id, "pairing": pairing, "selection": selection, "ablation": ablation,
            "edges": out, "reliability": (exact or {}).get("reliability", {}),
            "n_prompts": meta.get("n_prompts", {}), "induction_length": meta.get("induction_length"),
            "method": meta.get("method"), "cached_only": cached_only,
            "verdict_rule": verdict_rule(thresholds, null, len(edges), ablation)}


class AblationService:
    """Path-ablation answers of one process: measured (through the result cache) or read."""

    def __init__(self, scores: ScoresService, views: ViewService, catalog: ModelCatalog) -> None:
        self.scores = scores
        self.views = views
        self.catalog = catalog

    def answer(self, ref: ModelRef, pairing: str, top: int | None,
               edge: tuple[str, str] | None = None, cached: bool = False,
               ablation: str = DEFAULT_ABLATION, null_seed: int = NULL_SEED) -> dict[str, Any]:
        """The API answer: per edge {source, target, pairing, effect_text, effect_random, pk, cs,
        verdict, ...}, reliability per prompt set and n_prompts. Edges: the ``top`` highest-PK
        forward pairs of ``pairing``, or the one ``edge`` (source, target) when given; a named head
        the model lacks, or a source not in an earlier layer than its target (no such forward
        edge), is NotFound.

        ``cached``: only what is cached (cache_only.CACHE_ONLY), nothing computed or loaded: an
        edge no cached ablation measured has verdict "not measured" and null effects; reliability
        only when exactly this edge set is cached; no edges while the model or its PK is not.

        ``ablation``: "mean" or "resample" (core.activations.ablation). Verdicts compare each
        edge with the random-pair null of the same model, pairing and ablation
        (``ablation_null`` drawn with ``null_seed``, computed once and cached; read only with
        ``cached``: "null not computed" while it is not cached)."""
        check_ablation_pairing(pairing)
        check_ablation_kind(ablation)
        cache = self.scores.cache
        if not cached:
            edges, names, selection = _resolve_edges(self.views, self.catalog, ref, pairing, top, edge)
            if not edges:
                raise Invalid(f"{ref.id} has no valid forward {pairing} pairs to ablate")
            result = cache.get(ref, "ablation", pairing=pairing, edges=tuple(edges), ablation=ablation)
            null = cache.get(ref, "ablation_null", pairing=pairing, ablation=ablation, seed=null_seed)
            rows = dict(zip(edges, result["edges"], strict=True))
            return _answer(_pk_cs(self.scores, ref, pairing, edges), ref, pairing, selection, edges,
                           names, rows, result, result, null, ablation, cached_only=False)
        token = CACHE_ONLY.set(True)
        try:
            try:
                edges, names, selection = _resolve_edges(self.views, self.catalog, ref, pairing, top, edge)
            except ColdMiss:  # the model or its PK not known yet: nothing can be measured
                selection = "edge" if edge is not None else f"top {top or DEFAULT_ABLATION_TOP} by PK"
                return _answer([], ref, pairing, selection, [], [], {}, None, None, None, ablation,
                               cached_only=True)
            rows, exact, first = cached_measurements(cache, ref, pairing, edges, ablation)
            try:
                null = cache.get(ref, "ablation_null", pairing=pairing, ablation=ablation, seed=null_seed)
            except ColdMiss:
                null = None
            try:
                pk_cs = _pk_cs(self.scores, ref, pairing, edges)
            except ColdMiss:
                pk_cs = [(None, None) for _ in edges]
            return _answer(pk_cs, ref, pairing, selection, edges, names, rows, exact, first, null,
                           ablation, cached_only=True)
        finally:
            CACHE_ONLY.reset(token)
