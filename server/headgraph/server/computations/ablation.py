"""The registered path-ablation computation and the view that joins it with PK and CS.

``ablation`` (core.activations.ablation.path_ablation) measures a set of O -> Q/K/V edges of one model on
its runnable model (the pattern source: the demo, a TransformerBridge, a GGUF booted on first
use); its key is the pairing and the exact edge set (layer positions), so the top-k of a
pairing and an explicit edge are cached like every other result. ``ablation_view`` resolves a
request (top-k by PK, or one named edge) into that edge set and adds each edge's PK and CS
(a KV-group target: the CS mean over its query heads, core.scores.ranking.kv_level_cs), and its
``verdict`` (``edge_verdict``: one rule for the API, the CLI and the dashboard). With
``cached=True`` it only reads: each edge's effects come from any cached ablation of its pairing
that measured it (an edge's effects do not depend on the other edges measured with it), and an
edge none measured is "not measured".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from headgraph.core.errors import UnsupportedModel
from headgraph.core.names import GRAPH_PAIRINGS
from headgraph.server.errors import Invalid

if TYPE_CHECKING:  # the CLI's parser reads the constants below without importing torch
    from headgraph.server.compute.registry import Computation, Inputs

ABLATION_PAIRINGS = GRAPH_PAIRINGS  # O -> Q / K / V: the paths path ablation cuts
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
    split-half reliability (core.activations.ablation.path_ablation), JSON data."""
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
