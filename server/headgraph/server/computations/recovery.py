"""Registered computations of the PK paper's baselines and recovery tables.

``similarity`` (core.scores.similarity): linear CKA or orthogonal Procrustes similarity of one
pairing, a PairScores grid cached like PK's. ``recovery`` (core.stats.recovery): every metric's
recovery of a reference head set on one pairing (the paper's Tables 1 and 2: endpoint share,
precision@k and ROC-AUC, head-cluster bootstrap intervals, paired differences vs PK), from the cached PK,
CS and similarity grids. The reference is the caller's, and part of the cache key: a head set
(``heads``: a label set's heads, resolved by the recovery service) or an edge set (``edges``:
a circuit's head -> head edges, "L0H1>L1KV0.K", core.circuits.reference) with ``circuit``,
the circuit's identity (a task circuit's "task NAME CONTENT METHOD steps=N", or a file's
"file KIND sha256-..."). A task circuit is an activation-level result, so a recovery against
one is keyed by the whole model (``reads``); one against a head set or a file reads weights only.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from headgraph.core.names import HeadRef, check_order, check_pairing, cs_mode_of
from headgraph.server.errors import Invalid
from headgraph.server.limits import RECOVERY_EDGES_MAX, RECOVERY_HEADS_MAX, RECOVERY_K_MAX

if TYPE_CHECKING:
    from headgraph.server.compute.registry import Computation, Inputs

N_RESAMPLES = 1000
BOOTSTRAP = "heads-v1"  # the bootstrap's unit and NaN rule (core.stats.recovery), in the cache key
CIRCUIT_ID_PATTERN = r"^(task|file) [A-Za-z0-9_.\-=: ]{1,300}$"
_EDGE_NAME = re.compile(r"^L\d+H\d+>L\d+(H|KV)\d+\.[QKV]$")


def check_kind(value: Any) -> str:
    from headgraph.core.scores.similarity import check_similarity

    return check_similarity(value)


def check_k(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= RECOVERY_K_MAX:
        raise Invalid(f"k must be an integer in 1..{RECOVERY_K_MAX}, got {value!r}")
    return value


def check_heads(value: Any) -> tuple[str, ...]:
    """A reference head set: canonical query-head names ("L9H6"), sorted, without repeats."""
    if isinstance(value, str) or not isinstance(value, (list, tuple, set, frozenset)):
        raise Invalid(f"reference heads must be a list of head names, got {type(value).__name__}")
    heads = sorted(set(value))
    if not heads or len(heads) > RECOVERY_HEADS_MAX:
        raise Invalid(f"a reference needs 1..{RECOVERY_HEADS_MAX} heads, got {len(heads)}")
    for h in heads:
        if not HeadRef.is_label(h) or HeadRef.parse(h).kv:
            raise Invalid(f"{str(h)[:40]!r} is not a head name like 'L9H6'")
    return tuple(heads)


def check_edges(value: Any) -> tuple[str, ...]:
    """A reference edge set: circuit edge names ("L0H1>L1KV0.K"), sorted, without repeats."""
    if isinstance(value, str) or not isinstance(value, (list, tuple, set, frozenset)):
        raise Invalid(f"reference edges must be a list of edge names, got {type(value).__name__}")
    edges = sorted(set(value))
    if not edges or len(edges) > RECOVERY_EDGES_MAX:
        raise Invalid(f"a reference needs 1..{RECOVERY_EDGES_MAX} edges, got {len(edges)}")
    for e in edges:
        if not isinstance(e, str) or not _EDGE_NAME.match(e):
            raise Invalid(f"{str(e)[:40]!r} is not a head -> head edge name like 'L0H1>L1H3.K'")
    return tuple(edges)


def check_circuit(value: Any) -> str:
    if not isinstance(value, str) or not re.match(CIRCUIT_ID_PATTERN, value):
        raise Invalid(f"a circuit identity matches {CIRCUIT_ID_PATTERN}, got {str(value)[:60]!r}")
    return value


def similarity(src: Inputs, *, kind: str, pairing: str, order: str) -> dict[str, Any]:
    """CKA or Procrustes of one pairing (core.scores.similarity.similarity)."""
    from headgraph.core.scores.similarity import similarity as core_similarity
    from headgraph.server.computations.convert import pair_scores_payload

    return pair_scores_payload(core_similarity(src.heads, kind, pairing, order=order))


def metric_grids(src: Inputs, pairing: str) -> tuple[dict[str, Any], Any]:
    """{metric: float64 grid [L, Hs, L, Ht] (NaN where undefined)} of every recovery metric,
    read from the cached results, and the pairing's PK validity (core.stats.recovery's order
    and baselines)."""
    import torch

    from headgraph.core.scores.ranking import kv_level_cs
    from headgraph.core.stats.recovery import METRICS, metric_grids as core_grids

    pk = src.result("pk", pairing=pairing, order="forward")
    valid = pk.valid.to(torch.bool)
    nan = torch.tensor(float("nan"), dtype=torch.float64)

    def on_valid(grid: Any, ok: Any) -> Any:
        return torch.where(ok.to(torch.bool) & valid, grid.to(torch.float64), nan)

    grids: dict[str, Any] = {"pk": on_valid(pk.scores, pk.valid),
                             "pk_normalized": on_valid(pk.normalized, pk.valid)}
    mode = cs_mode_of(pairing)
    if mode is not None:
        kv = kv_level_cs(src.result("cs", mode=mode, order="forward"), pk.scores.shape[3])
        grids["cs"] = on_valid(kv.scores, kv.valid)
    for kind in ("cka", "procrustes"):
        res = src.result("similarity", kind=kind, pairing=pairing, order="forward")
        grids[kind] = on_valid(res.scores, res.valid)
    # the trivial baselines need only the grid's shape and layers
    base, _ = core_grids(src.heads, pairing, metrics=("layer_gap", "random"))
    grids.update(base)
    return {m: grids[m] for m in METRICS if m in grids}, valid


def recovery(src: Inputs, *, pairing: str, heads: tuple[str, ...] | None, k: int,
             edges: tuple[str, ...] | None = None, circuit: str | None = None) -> dict[str, Any]:
    """Every metric's recovery of the reference ``heads`` or ``edges`` on ``pairing`` (JSON data)."""
    from headgraph.core.circuits.reference import circuit_reference, describe
    from headgraph.core.stats.recovery import recovery_table, reference_from_heads
    from headgraph.server.computations.convert import jsonable

    if (heads is None) == (edges is None) or (edges is None) != (circuit is None):
        raise Invalid("a recovery reference is a head set, or an edge set with its circuit")
    grids, valid = metric_grids(src, pairing)
    info = src.info
    _, hs, _, ht = valid.shape
    if edges is not None:
        named = [(w, r) for w, _, r in (e.partition(">") for e in edges)]
        cref = circuit_reference(named, pairing, info.layer_indices,
                                 info.n_heads, info.n_kv_heads)
        if cref.shape != tuple(valid.shape):
            raise Invalid(f"the {pairing} grid {tuple(valid.shape)} is not the circuit's {cref.shape}")
        ref, s_ref, t_ref = cref.mask()
        table = recovery_table(grids, valid, ref, source_ref=s_ref, target_ref=t_ref, k=k,
                               pairing=pairing, layer_indices=info.layer_indices,
                               n_resamples=N_RESAMPLES, seed=0)
        cells = describe(cref, info.layer_indices)["cells"]
        return {**jsonable(table.to_dict()), "reference_edges": cells,
                "reference_heads": [], "unknown_heads": []}
    assert heads is not None
    ref, s_ref, t_ref = reference_from_heads(heads, info.layer_indices, hs, ht, info.n_heads)
    table = recovery_table(grids, valid, ref, source_ref=s_ref, target_ref=t_ref, k=k,
                           pairing=pairing, layer_indices=info.layer_indices,
                           n_resamples=N_RESAMPLES, seed=0)
    refs = {h: HeadRef.parse(h) for h in heads}
    known = [h for h, r in refs.items() if r.layer in info.layer_indices and r.head < info.n_heads]
    return {**jsonable(table.to_dict()), "reference_heads": list(known),
            "unknown_heads": [h for h in heads if h not in set(known)]}


def _digest(names: tuple[str, ...]) -> str:
    return hashlib.sha256(",".join(names).encode()).hexdigest()[:16]


def _key(p: dict[str, Any]) -> dict[str, Any]:
    """A head set's key as before edge sets existed (its cached results stay); an edge set's
    names its digest, size and circuit."""
    common = {"pairing": p["pairing"], "k": p["k"], "resamples": N_RESAMPLES, "bootstrap": BOOTSTRAP}
    if p["edges"] is None:
        return {**common, "heads": _digest(p["heads"])}
    return {**common, "edges": _digest(p["edges"]), "n_edges": len(p["edges"]),
            "circuit": p["circuit"]}


def _reads(key: Mapping[str, Any]) -> str:
    from headgraph.server.compute.registry import MODEL, WEIGHTS

    return MODEL if str(key.get("circuit") or "").startswith("task ") else WEIGHTS


def recovery_computations() -> list[Computation]:
    from headgraph.server.computations.convert import pair_scores_from_payload
    from headgraph.server.compute.registry import Computation, optional

    return [
        Computation("similarity", similarity, {"kind": check_kind, "pairing": check_pairing,
                                               "order": check_order},
                    load=pair_scores_from_payload),
        Computation("recovery", recovery, {"pairing": check_pairing, "heads": optional(check_heads),
                                           "k": check_k, "edges": optional(check_edges),
                                           "circuit": optional(check_circuit)},
                    key=_key, reads=_reads),
    ]
