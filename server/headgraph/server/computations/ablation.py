"""The registered path-ablation computation and the view that joins it with PK and CS.

``ablation`` (core.activations.ablation.path_ablation) measures a set of O -> Q/K/V edges of one model on
its runnable model (the pattern source: the demo, a TransformerBridge, a GGUF booted on first
use); its key is the pairing and the exact edge set (layer positions), so the top-k of a
pairing and an explicit edge are cached like every other result. ``ablation_view`` resolves a
request (top-k by PK, or one named edge) into that edge set and adds each edge's PK and CS
(a KV-group target: the CS mean over its query heads, core.scores.ranking.kv_level_cs), and its
``verdict`` (``edge_verdict`` against the random-pair null ``ablation_null``: one rule for the
API, the CLI and the dashboard). With
``cached=True`` it only reads: each edge's effects come from any cached ablation of its pairing
that measured it (an edge's effects do not depend on the other edges measured with it), and an
edge none measured is "not measured".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from headgraph.core.errors import UnsupportedModel
from headgraph.core.names import GRAPH_PAIRINGS
from headgraph.server.errors import Invalid
from headgraph.server.limits import ABLATION_TOP_MAX

if TYPE_CHECKING:  # the CLI's parser reads the constants below without importing torch
    from headgraph.server.compute.registry import Computation, Inputs

ABLATION_PAIRINGS = GRAPH_PAIRINGS  # O -> Q / K / V: the paths path ablation cuts
DEFAULT_ABLATION_TOP = 10
ABLATION_PROMPTS = "default-20+rr20x20-seed0"  # the prompt sets (part of the cache key)

# The verdict of a measured edge, calibrated on random pairs of the same model, pairing and
# ablation (the null, ``ablation_null``): an edge's statistic on a prompt set is the smaller of
# its two split-half effects (both halves must reach it, so one lucky half of the prompts does
# not verify an edge); the threshold of a set is the 1 - VERIFY_ALPHA / (tested edges x prompt
# sets) quantile (Bonferroni) of the same statistic over one seeded half of the null (the tested
# edges left out; core.stats.calibration.held_out_threshold: empirical when that half resolves
# the quantile, else a conservative generalized Pareto tail, else "unresolved" and no verdict),
# and the other half measures the error it achieves. Computed from the null, never chosen.
VERIFIED = "verified"
NO_EFFECT = "no effect"
NOT_MEASURED = "not measured"
NO_NULL = "null not computed"
UNRESOLVED = "null too small"
VERDICTS = (VERIFIED, NO_EFFECT, NOT_MEASURED, NO_NULL, UNRESOLVED)
VERIFY_ALPHA = 0.05  # family-wise level over the tested edges and prompt sets
NULL_SAMPLE = 200  # random forward pairs (the validation's default sample: shared ablation chunks)
NULL_SEED = 0
SPLIT_SEED = 0  # the calibration / held-out split of the null (core.stats.calibration.split_null)
ABLATIONS = ("mean", "resample")
DEFAULT_ABLATION = "mean"
VERDICT_RULE = (f"verified when, on at least one prompt set (text or random tokens), the smaller of the "
                f"edge's two split-half effects (even and odd prompts) is above the random-pair null's "
                f"1 - {VERIFY_ALPHA:g} / (tested edges x 2 prompt sets) quantile (Bonferroni) of the same "
                f"statistic, calibrated on a seeded half of up to {NULL_SAMPLE} random forward pairs of the "
                "same model, pairing and ablation (the tested edges left out; empirical when that half "
                "has 1 / (1 - q) pairs, else a conservative generalized Pareto tail fit on at least 90) "
                "and checked on the other half (the share of its pairs above the threshold: the achieved "
                "error); 'no effect' otherwise; 'null too small' when no prompt set's quantile is "
                "resolved (the verdict is refused); 'not measured' when no ablation of the edge is "
                "cached; 'null not computed' when the edge is measured but its null is not cached "
                "(cached=true)")


def edge_statistic(halves: dict[str, Any] | None) -> dict[str, float | None]:
    """{prompt set: the smaller of its two split-half effects} (None when a half is missing)."""
    out: dict[str, float | None] = {}
    for name, values in (halves or {}).items():
        ok = bool(values) and all(v is not None and v == v for v in values)
        out[name] = min(float(v) for v in values) if ok else None
    return out


def null_thresholds(null: dict[str, Any], tested: list[tuple[int, int, int, int]]
                    ) -> dict[str, Any]:
    """The verdict rule's numbers for ``tested`` edges: per prompt set the held-out-calibrated
    threshold (core.stats.calibration.held_out_threshold, Bonferroni over tested edges x prompt
    sets, split seed SPLIT_SEED) over the null's statistics, the tested edges left out."""
    import numpy as np

    from headgraph.core.stats.calibration import held_out_threshold

    leave = {tuple(e) for e in tested}
    keep = [i for i, e in enumerate(null["pairs"]) if tuple(e) not in leave]
    sets = list(null["statistic"])
    n_tests = max(1, len(tested)) * len(sets)
    out: dict[str, Any] = {}
    for name in sets:
        values = np.asarray([null["statistic"][name][i] for i in keep], dtype=np.float64)
        values = values[np.isfinite(values)]
        if len(values) == 0:
            continue
        out[name] = held_out_threshold(values, n_tests=n_tests, alpha=VERIFY_ALPHA, seed=SPLIT_SEED).to_dict()
    return out


def edge_verdict(halves: dict[str, Any] | None, thresholds: dict[str, Any] | None) -> str:
    """"verified" | "no effect" for a measured edge's split halves ({prompt set: [even, odd]})
    against ``thresholds`` ({prompt set: a HeldOutThreshold dict}); "not measured" without
    halves; "null not computed" without thresholds; "null too small" when no set's threshold is
    resolved (VERDICT_RULE)."""
    if not halves:
        return NOT_MEASURED
    if not thresholds:
        return NO_NULL
    if all(t.get("threshold") is None for t in thresholds.values()):
        return UNRESOLVED
    for name, value in edge_statistic(halves).items():
        t = thresholds.get(name)
        if value is not None and t is not None and t.get("threshold") is not None and value > t["threshold"]:
            return VERIFIED
    return NO_EFFECT


def check_ablation_kind(value: Any) -> str:
    if value not in ABLATIONS:
        raise Invalid(f"unknown ablation {value!r}; allowed: {list(ABLATIONS)}", allowed=list(ABLATIONS))
    return value


def check_null_seed(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**31:
        raise Invalid(f"seed must be an integer in 0..2^31-1, got {value!r}")
    return value


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


def ablation(src: Inputs, *, pairing: str, edges: tuple[tuple[int, int, int, int], ...],
             ablation: str = DEFAULT_ABLATION) -> dict[str, Any]:
    """Path-ablation effects of ``edges`` on the text and random-token prompt sets, with
    split-half reliability (core.activations.ablation.path_ablation, mean or resample
    ablation), JSON data."""
    from headgraph.core.activations.ablation import Edge, path_ablation, path_of_pairing
    from headgraph.server.computations.convert import jsonable

    source = src.patterns
    if source is None:
        raise UnsupportedModel(f"{src.info.name} cannot be run here (weights read without a "
                               "runnable model), so its edges cannot be verified by ablation")
    path = path_of_pairing(pairing)
    result = path_ablation(source, [Edge(*e, path) for e in edges], ablation=ablation)
    return {"pairing": pairing, **jsonable(result.to_dict())}


def ablation_null(src: Inputs, *, pairing: str, ablation: str, seed: int) -> dict[str, Any]:
    """The random-pair null of the verdicts: NULL_SAMPLE forward pairs of ``pairing`` drawn
    uniformly (core.activations.validation.sample_forward_pairs, ``seed``; all of them when the
    model has fewer), measured in the ``ablation`` computation's chunks of ABLATION_TOP_MAX (the
    chunks the default validation measures first, so the two share them), and per prompt set
    each pair's statistic (``edge_statistic``) and effect."""
    from headgraph.core.activations.validation import sample_forward_pairs

    check_ablation_pairing(pairing)
    if src.patterns is None:
        raise UnsupportedModel(f"{src.info.name} cannot be run here, so it has no random-pair null")
    ps = src.result("pk", pairing=pairing, order="forward")
    sample = sample_forward_pairs(ps.valid.bool().numpy(), NULL_SAMPLE, seed)
    pairs = [tuple(int(x) for x in r) for r in sample.tolist()]
    statistic: dict[str, list[float | None]] = {}
    effects: dict[str, list[float | None]] = {}
    for start in range(0, len(pairs), ABLATION_TOP_MAX):
        chunk = tuple(pairs[start: start + ABLATION_TOP_MAX])
        res = src.result("ablation", pairing=pairing, edges=chunk, ablation=ablation)
        for e in res["edges"]:
            for name, value in edge_statistic(e["halves"]).items():
                statistic.setdefault(name, []).append(value)
                effects.setdefault(name, []).append(e[f"effect_{name}"])
    return {"pairing": pairing, "ablation": ablation, "seed": seed, "n": len(pairs),
            "pairs": [list(p) for p in pairs], "statistic": statistic, "effects": effects}


def _edges_key(p: dict[str, Any]) -> dict[str, Any]:
    key = {"pairing": p["pairing"], "edges": ";".join(".".join(map(str, e)) for e in p["edges"]),
           "prompts": ABLATION_PROMPTS}
    if p["ablation"] != DEFAULT_ABLATION:  # mean ablation keeps its earlier keys
        key["ablation"] = p["ablation"]
    return key


def ablation_computations() -> list[Computation]:
    from headgraph.server.compute.registry import MODEL, Computation

    return [Computation("ablation", ablation,
                        {"pairing": check_ablation_pairing, "edges": check_edges,
                         "ablation": check_ablation_kind}, key=_edges_key, reads=MODEL),
            Computation("ablation_null", ablation_null,
                        {"pairing": check_ablation_pairing, "ablation": check_ablation_kind,
                         "seed": check_null_seed},
                        key=lambda p: {**p, "n": NULL_SAMPLE, "prompts": ABLATION_PROMPTS},
                        reads=MODEL)]
