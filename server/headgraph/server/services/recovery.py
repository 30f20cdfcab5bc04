"""Recovery tables as the API and the CLI answer them: a reference resolved, then the cached (or
computed) ``recovery`` of one pairing (server/computations/recovery.py, core.stats.recovery).

The reference is one of: a label set's heads (``answer``); a task circuit's head -> head edges
at a stated size (``answer_task``: the circuit computed through the cache under the same key as
GET /api/circuit, so a computed one is reused); a circuit file's (``answer_file``: a MIB
circuit-track file, or headgraph's own circuit answer as ``headgraph circuit --json`` writes
it). Edges map onto the pairing's cells by core.circuits.reference.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from headgraph.core.errors import InvalidInput
from headgraph.core.names import check_pairing
from headgraph.server.computations.circuits import BUNDLED_PAIRS, DEFAULT_METHOD, DEFAULT_STEPS
from headgraph.server.computations.recovery import check_k
from headgraph.server.errors import Invalid
from headgraph.server.models.offered import ModelRef
from headgraph.server.services.circuits import CircuitService
from headgraph.server.services.labels import LabelService
from headgraph.server.services.scores import ScoresService

METHOD = ("top-k share of reference heads among each metric's top-k edges' endpoints, "
          "precision@k (share of top-k edges in the reference) and ROC-AUC over all valid "
          "forward pairs; 95% stratified bootstrap percentile intervals (1000 resamples) and "
          "paired differences vs PK on the same resamples; baselines: layer gap (nearer layers "
          "first) and seeded random")
LABEL_RULE = "an edge is in the reference when both its heads are labelled (any class)"
EDGE_RULE = ("an edge is in the reference when the circuit has it: a head's write into the "
             "pairing's input (Q, K or V; a KV head's on a grouped-query model) of a later head; "
             "reference heads are the sources and targets of reference edges")


class RecoveryService:
    """Recovery answers of one process (computed through the result cache)."""

    def __init__(self, scores: ScoresService, labels: LabelService, circuits: CircuitService) -> None:
        self.scores = scores
        self.labels = labels
        self.circuits = circuits

    def answer(self, ref: ModelRef, pairing: str, labels: str, k: int) -> dict[str, Any]:
        """Every metric's recovery of the label set ``labels``'s heads on ``pairing``: an edge
        is in the reference when both its heads are labelled (any class). NotFound for an
        unknown set (listing them); Invalid for a set with no head of this model."""
        check_pairing(pairing)
        check_k(k)
        label_set = self.labels.label_set(labels, ref)
        if label_set is None:
            raise Invalid("give a label set (labels=) as the reference")
        info = self.scores.catalog.model_info(ref)
        heads = sorted(label_set.classes)
        mine = [h for h in heads if in_model(h, info)]
        if not mine:
            raise Invalid(f"label set {label_set.name!r} names no head of {ref.id} "
                          f"({len(heads)} heads, e.g. {heads[:3]})")
        result = self.scores.cache.get(ref, "recovery", pairing=pairing, heads=tuple(mine), k=k,
                                       edges=None, circuit=None)
        return {"model": ref.id, "labels": label_set.name, **result,
                "reference": f"label set {label_set.name!r}: {LABEL_RULE}", "circuit": None,
                "method": f"{METHOD}; {LABEL_RULE}"}

    def answer_task(self, ref: ModelRef, pairing: str, task: str, k: int, *,
                    method: str = DEFAULT_METHOD, steps: int = DEFAULT_STEPS,
                    pairs: int = BUNDLED_PAIRS, edges: int | None = None,
                    jsonl: str | None = None) -> dict[str, Any]:
        """Every metric's recovery of ``task``'s circuit (``method``, ``steps``, ``pairs`` as GET
        /api/circuit; ``jsonl``: the task's rows themselves) on ``pairing``: its head -> head
        edges among its top ``edges`` edges, by default the smallest circuit on its
        faithfulness curve reaching the share (core.circuits.reference.circuit_size)."""
        from headgraph.core.circuits.reference import circuit_size

        check_circuit_pairing(pairing)
        check_k(k)
        steps = steps if method == "eap-ig" else 1
        r = self.circuits.result(ref, task, method, steps, jsonl=jsonl, pairs=pairs)
        curve = r["faithfulness"]
        n = int(r["n_edges"])
        size, rule = _invalid(lambda: circuit_size(n, curve_size=curve["circuit_size"],
                                                   share=curve["share"], edges=edges))
        writers, readers = r["writers"], r["readers"]
        ranked = [(writers[w]["name"], readers[x]["name"])
                  for w, x in zip(r["edge_writer"][:size].tolist(), r["edge_reader"][:size].tolist(),
                                  strict=True)]
        name = r["task"].get("name", task) if isinstance(r["task"], Mapping) else task
        recovered = dict(zip(curve["sizes"], curve["recovered"], strict=True)).get(size)
        circuit = {"source": "task", "task": name, "content": r["content"], "method": r["method"],
                   "steps": r["steps"], "n_edges": n, "size": size, "rule": rule,
                   "share": curve["share"], "recovered": recovered}
        identity = f"task {name} {r['content']} {r['method']} steps={r['steps']}"
        what = f"the {r['method']} circuit of task {name!r}"
        return self._edges_answer(ref, pairing, k, ranked, identity, what, circuit)

    def answer_file(self, ref: ModelRef, pairing: str, data: Any, k: int, *, name: str,
                    digest: str, edges: int | None = None) -> dict[str, Any]:
        """Every metric's recovery of a circuit file's head -> head edges on ``pairing``:
        ``data`` a parsed MIB circuit file ({cfg, nodes, edges}: its in_graph edges, or the
        top ``edges`` by |score|) or headgraph's circuit answer ({edges, circuit, n_edges,
        circuit_size}: its circuit, or its top ``edges``); ``digest`` the file's sha256 (hex),
        ``name`` what to call it. Invalid for anything else, or a file of another shape."""
        check_circuit_pairing(pairing)
        check_k(k)
        info = self.scores.catalog.model_info(ref)
        if isinstance(data, Mapping) and isinstance(data.get("edges"), Mapping) and "cfg" in data:
            kind = "mib"
            ranked, circuit = _invalid(lambda: _mib_edges(data, info, edges))
        elif isinstance(data, Mapping) and isinstance(data.get("edges"), list) and "n_edges" in data:
            kind = "headgraph"
            ranked, circuit = _invalid(lambda: _answer_edges(data, info, edges))
        else:
            raise Invalid(f"{name}: not a circuit file (a MIB circuit file {{cfg, nodes, edges}}, "
                          "or headgraph's circuit answer, as 'headgraph circuit --json' writes it)")
        circuit = {"source": kind, "file": name, "sha256": digest, **circuit}
        identity = f"file {kind} sha256-{digest[:16]}"
        return self._edges_answer(ref, pairing, k, ranked, identity, f"the circuit of {name}", circuit)

    def _edges_answer(self, ref: ModelRef, pairing: str, k: int, ranked: Sequence[tuple[str, str]],
                      identity: str, what: str, circuit: dict[str, Any]) -> dict[str, Any]:
        from headgraph.core.circuits.reference import circuit_reference

        info = self.scores.catalog.model_info(ref)
        try:
            cref = circuit_reference(ranked, pairing, info.layer_indices, info.n_heads, info.n_kv_heads)
        except InvalidInput as err:
            raise Invalid(f"{what} on {ref.id}: {err}") from None
        circuit = {**circuit, "n_head_edges": cref.n_head_edges,
                   "n_reference_edges": len(cref.positions)}
        if not cref.positions:
            raise Invalid(f"{what} has no {pairing} head -> head edge at {circuit['rule']} "
                          f"({cref.n_head_edges} head -> head edges on any input); give a larger "
                          "size (edges=N) or another pairing")
        result = self.scores.cache.get(ref, "recovery", pairing=pairing, heads=None, k=k,
                                       edges=cref.names, circuit=identity)
        reference = (f"{what}: its {len(cref.positions)} {pairing} head -> head edges among "
                     f"{circuit['rule']}")
        return {"model": ref.id, "labels": None, **result, "reference": reference,
                "circuit": circuit, "method": f"{METHOD}; {EDGE_RULE}; reference: {reference}"}


def check_circuit_pairing(pairing: str) -> str:
    """``pairing`` when a circuit can be its reference (OQ, OK, OV), else Invalid (before any
    circuit is computed)."""
    from headgraph.core.circuits.reference import TARGET_PATHS

    if pairing not in TARGET_PATHS:
        raise Invalid(f"a circuit is a reference on an O -> Q / K / V pairing, not {str(pairing)[:8]!r}",
                      allowed=list(TARGET_PATHS))
    return pairing


def _invalid(fn: Any) -> Any:
    """``fn()``, core's InvalidInput as Invalid (a 422 with the same message)."""
    try:
        return fn()
    except InvalidInput as err:
        raise Invalid(str(err)) from None


def _mib_edges(data: Mapping[str, Any], info: Any, edges: int | None
               ) -> tuple[list[tuple[str, str]], dict[str, Any]]:
    """A MIB file's circuit edges ((writer, reader) names) and what they are: its in_graph
    edges, or with ``edges`` its top n by |score| (K / V edges regrouped per KV head first)."""
    from headgraph.core.circuits.mib import from_mib

    cfg = data.get("cfg")
    if isinstance(cfg, Mapping) and (cfg.get("n_layers"), cfg.get("n_heads")) != (info.n_layers, info.n_heads):
        raise InvalidInput(f"the file's graph has {cfg.get('n_layers')} layers x {cfg.get('n_heads')} "
                           f"heads; the model {info.n_layers} x {info.n_heads}")
    mib = from_mib(data, n_kv_heads=info.n_kv_heads, layer_indices=info.layer_indices)
    n = len(mib.edges)
    if edges is None:
        chosen = list(mib.circuit)
        if not chosen:
            raise InvalidInput(f"the file marks no edge in_graph; give a size (edges=N, 1..{n})")
        rule = f"the file's {len(chosen)} in_graph edges of {n}"
    else:
        if isinstance(edges, bool) or not isinstance(edges, int) or not 1 <= edges <= n:
            raise InvalidInput(f"edges must be an integer in 1..{n} (the file's edges), got {edges!r}")
        chosen = sorted(mib.edges, key=lambda e: -abs(e.score))[:edges]
        rule = f"the top {edges} of {n} edges by |score| (a given size)"
    return ([(e.writer, e.reader) for e in chosen],
            {"n_edges": n, "size": len(chosen), "rule": rule})


def _answer_edges(data: Mapping[str, Any], info: Any, edges: int | None
                  ) -> tuple[list[tuple[str, str]], dict[str, Any]]:
    """A headgraph circuit answer's top edges ((writer, reader) names) and what they are: its
    circuit (circuit_size, the smallest on its curve reaching the share) or its top ``edges``,
    each of which the file must list."""
    from headgraph.core.circuits.reference import circuit_size

    layers = data.get("layer_indices")
    if layers is not None and list(layers) != list(info.layer_indices):
        raise InvalidInput(f"the file's circuit has layers {list(layers)[:8]}, the model "
                           f"{list(info.layer_indices)[:8]}")
    n = data["n_edges"]
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InvalidInput(f"n_edges must be a positive integer, got {n!r}")
    share = data.get("share", 0.8)
    size, rule = circuit_size(n, curve_size=data.get("circuit_size"),
                              share=share if isinstance(share, (int, float)) else 0.8, edges=edges)
    listed: dict[int, tuple[str, str]] = {}
    for e in [*data["edges"], *(data.get("circuit") or [])]:
        if not isinstance(e, Mapping) or not all(isinstance(e.get(f), str) for f in ("writer", "reader")) \
                or isinstance(e.get("rank"), bool) or not isinstance(e.get("rank"), int):
            raise InvalidInput("each listed edge needs rank, writer and reader")
        listed[e["rank"]] = (e["writer"], e["reader"])
    missing = [i for i in range(1, size + 1) if i not in listed]
    if missing:
        raise InvalidInput(f"the file lists {len(listed)} edges, not the top {size} (rank {missing[0]} "
                           "is missing): write it with a larger --top, or give a smaller size")
    return [listed[i] for i in range(1, size + 1)], {"n_edges": n, "size": size, "rule": rule}


def file_digest(raw: bytes) -> str:
    """A circuit file's sha256 (hex), its identity in the recovery cache key."""
    return hashlib.sha256(raw).hexdigest()


def in_model(head: str, info: Any) -> bool:
    """Whether a query-head name ("L9H6") is a head of the model ``info`` describes."""
    from headgraph.core.names import HeadRef

    r = HeadRef.parse(head)
    return r.layer in info.layer_indices and r.head < info.n_heads
