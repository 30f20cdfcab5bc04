"""The registered path-ablation computation and the view that joins it with PK and CS.

``ablation`` (core.ablation.path_ablation) measures a set of O -> Q/K/V edges of one model on
its runnable model (the pattern source: the demo, a TransformerBridge, a GGUF booted on first
use); its key is the pairing and the exact edge set (layer positions), so the top-k of a
pairing and an explicit edge are cached like every other result. ``ablation_view`` resolves a
request (top-k by PK, or one named edge) into that edge set and adds each edge's PK and CS
(a KV-group target: the CS mean over its query heads, core.ranking.kv_level_cs).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from headgraph.core.errors import UnsupportedModel
from headgraph.server.errors import Invalid

if TYPE_CHECKING:  # the CLI's parser reads the constants below without importing torch
    from headgraph.server.computation import Computation, Inputs
    from headgraph.server.registry import ModelRef

ABLATION_PAIRINGS = ("OQ", "OK", "OV")
ABLATION_TOP_MAX = 50  # edges per request: each costs a few forward passes
DEFAULT_ABLATION_TOP = 10


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
    from headgraph.core.ablation import Edge, path_ablation, path_of_pairing
    from headgraph.server.convert import jsonable

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
            "prompts": "default-20+rr20x20-seed0"}


def ablation_computations() -> list[Computation]:
    from headgraph.server.computation import Computation

    return [Computation("ablation", ablation,
                        {"pairing": check_ablation_pairing, "edges": check_edges},
                        key=_edges_key)]


# -- the request-level view -----------------------------------------------------------------

def _pk_cs(scores: Any, ref: ModelRef, pairing: str, edges: list[tuple[int, int, int, int]]
           ) -> list[tuple[float | None, float | None]]:
    from headgraph.core.ranking import kv_level_cs

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


def ablation_view(scores: Any, views: Any, catalog: Any, ref: ModelRef, pairing: str,
                  top: int | None, edge: tuple[str, str] | None = None) -> dict[str, Any]:
    """The API answer: per edge {source, target, pairing, effect_text, effect_random, pk, cs,
    ...}, reliability per prompt set and n_prompts. Edges: the ``top`` highest-PK forward
    pairs of ``pairing``, or the one ``edge`` (source, target) when given; a named head the
    model lacks, or a source not in an earlier layer than its target (no such forward edge),
    is NotFound."""
    from headgraph.server.convert import parse_node
    from headgraph.server.errors import NotFound

    check_ablation_pairing(pairing)
    info = catalog.model_info(ref)
    if edge is not None:
        source, target = edge
        sl, sh = parse_node(source, "O", info)
        tl, th = parse_node(target, pairing[1], info)
        if sl >= tl:
            raise NotFound(f"no forward edge {source} -> {target}: an ablated edge's source "
                           "must be in an earlier layer than its target")
        edges = [(sl, sh, tl, th)]
        selection = "edge"
    else:
        k = DEFAULT_ABLATION_TOP if top is None else top
        if isinstance(k, bool) or not 1 <= k <= ABLATION_TOP_MAX:
            raise Invalid(f"top must be in 1..{ABLATION_TOP_MAX}, got {k!r}")
        records = views.top(ref, pairing, k, "pk", "forward")
        edges = [parse_node(r["source"], "O", info) + parse_node(r["target"], pairing[1], info)
                 for r in records]
        selection = f"top {k} by PK"
    if not edges:
        raise Invalid(f"{ref.id} has no valid forward {pairing} pairs to ablate")
    result = scores.cache.get(ref, "ablation", pairing=pairing, edges=tuple(edges))
    rows = []
    for e, (pk, cs) in zip(result["edges"], _pk_cs(scores, ref, pairing, edges), strict=True):
        rows.append({"source": e["source"], "target": e["target"], "pairing": pairing,
                     "path": e["path"], "measure": e["measure"],
                     "effect_text": e["effect_text"], "effect_random": e["effect_random"],
                     "halves": e["halves"], "pk": pk, "cs": cs})
    return {"model": ref.id, "pairing": pairing, "selection": selection, "edges": rows,
            "reliability": result["reliability"], "n_prompts": result["n_prompts"],
            "induction_length": result["induction_length"], "method": result["method"]}
