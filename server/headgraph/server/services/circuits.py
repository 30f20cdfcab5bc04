"""Tasks and their circuits, as the API, the CLI and the dashboard ask for them.

:class:`CircuitService` lists the bundled tasks (core.circuits.tasks) and the uploaded ones,
stores an upload (JSONL checked row by row; with a model, also in that model's tokens, so a
row the model cannot read is refused naming it and nothing is stored) in the store's meta
records (``tasks:<name>``, like uploaded label sets), and answers a circuit from the
registered ``circuit`` computation (server.computations.circuits): the task metric, the top
edges, the circuit (the smallest top-n reaching the stated share of the metric gap), the
faithfulness curve and the EAP vs patching check.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from headgraph.core.errors import InvalidInput
from headgraph.server.cache.store import Store
from headgraph.server.computations.circuits import (
    BUNDLED_PAIRS,
    BUNDLED_TASKS,
    CIRCUIT_SHARE,
    DEFAULT_METHOD,
    DEFAULT_STEPS,
    DEFAULT_TOP,
    build_task,
    check_method,
    check_pairs,
    check_steps,
    check_task_name,
)
from headgraph.server.compute.results import ResultCache
from headgraph.server.errors import Conflict, Invalid, NotFound
from headgraph.server.limits import CIRCUIT_TOP_MAX, TASK_UPLOAD_BYTES_MAX
from headgraph.server.models.catalog import ModelCatalog
from headgraph.server.models.offered import ModelRef

TASK_PREFIX = "tasks:"
MAX_TASKS = 100  # uploaded tasks kept
BUNDLED_DESCRIPTIONS: dict[str, str] = {
    "ioi": "indirect-object identification (Wang et al. 2023): 'When Mary and John went to the "
           "store, John gave a drink to' -> ' Mary' vs ' John'; corrupt: a third name for the "
           "repeated subject; names kept when one token for the model's tokenizer",
    "induction": "repeated random tokens: 10 random tokens then the first 9 again -> the 10th "
                 "vs a token in neither prompt; corrupt: the first half replaced, so nothing "
                 "repeats (any vocabulary, the demo's too)",
    "successor": "ordered lists (weekdays, months, letters): 'Sequence: Monday, Tuesday, "
                 "Wednesday,' -> ' Thursday' vs ' Sunday'; corrupt: the same items reversed",
    "ioi-mib": "MIB's IOI (circuit track): 'Then, Mary and John went to the garden. John gave a "
               "ring to' -> ' Mary' vs ' John'; corrupt (MIB's s2_io_flip): the repeated subject "
               "replaced by the indirect object, so the distractor becomes the answer; each pair "
               "also mirrored",
    "addition": "two-digit addition: 'Calculate:\\n23 + 45 =' -> the result's first token (the "
                "whole number, or its tens digit where the tokenizer splits digits) vs the "
                "corrupt prompt's; corrupt: other operands; each pair also mirrored",
    "subtraction": "two-digit subtraction with a two-digit result: 'Calculate:\\n71 - 25 =' -> "
                   "the result's first token (as for addition) vs the corrupt prompt's; corrupt: "
                   "other operands; each pair also mirrored",
    "mcqa": "multiple choice (after MIB's CopyColors MCQA): 'The apple is red. What color is the "
            "apple?' with options A-D, then 'Answer:' -> the right letter; corrupt: the options "
            "permuted so the right colour sits under another letter (the distractor); each pair "
            "also mirrored",
}


def _summary(name: str, *, bundled: bool, description: str, n_rows: int | None,
             content: str | None) -> dict[str, Any]:
    return {"name": name, "bundled": bundled, "description": description, "n_rows": n_rows,
            "content": content}


class CircuitService:
    """Tasks (bundled and uploaded) and circuit answers of one process."""

    def __init__(self, store: Store, cache: ResultCache, catalog: ModelCatalog) -> None:
        self.store = store
        self.cache = cache
        self.catalog = catalog

    # -- tasks ---------------------------------------------------------------------------------
    def _uploaded(self, name: str) -> dict[str, Any] | None:
        raw = self.store.meta.get(TASK_PREFIX + name, retry=True)
        return raw if isinstance(raw, dict) and isinstance(raw.get("jsonl"), str) else None

    def uploaded_names(self) -> list[str]:
        return sorted(k[len(TASK_PREFIX):] for k in self.store.meta.iterkeys()
                      if isinstance(k, str) and k.startswith(TASK_PREFIX))

    def tasks(self) -> list[dict[str, Any]]:
        """Bundled tasks, then uploaded ones (no model is loaded)."""
        out = [_summary(n, bundled=True, description=BUNDLED_DESCRIPTIONS[n],
                        n_rows=BUNDLED_PAIRS, content=None) for n in BUNDLED_TASKS]
        for name in self.uploaded_names():
            raw = self._uploaded(name)
            if raw is not None:
                out.append(_summary(name, bundled=False, description=raw.get("description", ""),
                                    n_rows=raw.get("n_rows"), content=raw.get("content")))
        return out

    def task_source(self, name: str) -> tuple[str, str | None]:
        """(name, JSONL) of a task: None for a bundled one; NotFound lists the known names."""
        check_task_name(name)
        if name in BUNDLED_TASKS:
            return name, None
        raw = self._uploaded(name)
        if raw is None:
            known = [*BUNDLED_TASKS, *self.uploaded_names()]
            raise NotFound(f"unknown task {name!r}; known: {known}", allowed=known)
        return name, raw["jsonl"]

    def save_task(self, name: str, data: bytes | str, *, description: str = "",
                  ref: ModelRef | None = None, replace: bool = False) -> dict[str, Any]:
        """Store an uploaded JSONL task under ``name`` (checked first: core.circuits.tasks.
        read_jsonl, and in ``ref``'s tokens when given; InvalidInput names the line, nothing
        stored). Conflict for a bundled name, for an existing name without ``replace``, and
        past MAX_TASKS uploads."""
        from headgraph.core.circuits.tasks import read_jsonl

        check_task_name(name)
        if name in BUNDLED_TASKS:
            raise Conflict(f"task name {name!r} is a bundled task; upload under another name")
        if len(data) > TASK_UPLOAD_BYTES_MAX:
            raise Invalid(f"a task is at most {TASK_UPLOAD_BYTES_MAX} bytes")
        rows = read_jsonl(data)
        text = data if isinstance(data, str) else data.decode("utf-8-sig")
        if ref is not None:
            self.check_task(ref, name, text)
        content = "sha256-" + hashlib.sha256(text.encode()).hexdigest()[:16]
        value = {"name": name, "description": description[:1000], "jsonl": text,
                 "n_rows": len(rows), "content": content}
        meta, key = self.store.meta, TASK_PREFIX + name
        with meta.transact(retry=True):
            exists = meta.get(key, retry=True) is not None
            if exists and not replace:
                raise Conflict(f"a task named {name!r} exists; upload under another name, or "
                               "pass replace=true to replace it")
            if not exists and len(self.uploaded_names()) >= MAX_TASKS:
                raise Conflict(f"the server keeps at most {MAX_TASKS} uploaded tasks; replace "
                               "one (replace=true) instead")
            if not meta.set(key, value, retry=True):
                raise Conflict(f"task {name!r} could not be stored")
        return _summary(name, bundled=False, description=value["description"],
                        n_rows=len(rows), content=content)

    def check_task(self, ref: ModelRef, name: str, jsonl: str) -> None:
        """InvalidInput naming the first row ``ref``'s tokenizer cannot take."""
        source = self.catalog.loaded(ref).patterns
        if source is None:
            raise Invalid(f"{ref.id} cannot be run here, so a task cannot be checked against it")
        build_task(source, name, jsonl)

    # -- circuits ------------------------------------------------------------------------------
    def progress(self, ref: ModelRef, task: str, method: str = DEFAULT_METHOD,
                 steps: int = DEFAULT_STEPS, pairs: int = BUNDLED_PAIRS) -> dict[str, Any]:
        """Where the circuit of ``task`` is, never loading a model or computing: "cached",
        "running" (stage, fraction of the whole run, message, elapsed_s) or "idle"
        (ResultCache.progress)."""
        check_method(method)
        check_steps(steps)
        check_pairs(pairs)
        name, jsonl = self.task_source(task)
        steps = steps if method == "eap-ig" else 1
        pairs = pairs if jsonl is None else BUNDLED_PAIRS
        out = self.cache.progress(ref, "circuit", task=name, jsonl=jsonl, method=method,
                                  steps=steps, pairs=pairs)
        return {"model": ref.id, "task": name, "method": method, "steps": steps, "stage": None,
                "fraction": 1.0 if out["state"] == "cached" else None, "message": None,
                "elapsed_s": None, **out}

    def answer(self, ref: ModelRef, task: str, method: str = DEFAULT_METHOD,
               steps: int = DEFAULT_STEPS, top: int = DEFAULT_TOP, *,
               jsonl: str | None = None, lookup: Sequence[str] = (),
               pairs: int = BUNDLED_PAIRS) -> dict[str, Any]:
        """The API answer: task metrics, the ``top`` strongest edges, the circuit (the smallest
        top-n recovering CIRCUIT_SHARE of the metric gap, its edges when at most CIRCUIT_TOP_MAX),
        the faithfulness curve and the EAP vs patching check. ``jsonl``: the task's rows
        themselves (a file the CLI read), not a stored task. ``lookup``: edges
        ("WRITER>READER", "L0H0>L1H3.K") answered as ``lookup`` with their rank among all
        edges; one the graph does not have is left out. ``pairs``: a bundled task's first
        ``pairs`` prompt pairs (CIRCUIT_PAIRS_MIN..CIRCUIT_PAIRS_MAX: a quicker circuit of a large model;
        an uploaded task is used whole)."""
        check_method(method)
        check_steps(steps)
        check_pairs(pairs)
        if isinstance(top, bool) or not isinstance(top, int) or not 1 <= top <= CIRCUIT_TOP_MAX:
            raise Invalid(f"top must be in 1..{CIRCUIT_TOP_MAX}, got {top!r}")
        r = self._result(ref, task, method, steps, jsonl, pairs)
        size = r["faithfulness"]["circuit_size"]
        n_circuit = size if size is not None and size <= CIRCUIT_TOP_MAX else 0
        shown = max(top, n_circuit)
        edges = self._edges(r, shown)
        for e in edges:
            e["in_circuit"] = size is not None and e["rank"] <= size
        found = self._lookup(r, lookup, size)
        return {"model": ref.id, "task": r["task"], "bundled": r["bundled"],
                "content": r["content"], "method": r["method"], "steps": r["steps"],
                "metrics": r["metrics"], "n_edges": r["n_edges"],
                "layer_indices": r["layer_indices"], "share": CIRCUIT_SHARE,
                "circuit_size": size, "edges": edges[:top],
                "circuit": [e for e in edges if e["in_circuit"]][:CIRCUIT_TOP_MAX],
                "faithfulness": r["faithfulness"], "patching": r["patching"],
                "mib": r.get("mib"), "lookup": found}

    def result(self, ref: ModelRef, task: str, method: str = DEFAULT_METHOD,
               steps: int = DEFAULT_STEPS, *, jsonl: str | None = None,
               pairs: int = BUNDLED_PAIRS) -> dict[str, Any]:
        """The whole cached (or computed) ``circuit`` payload (every edge, strongest first):
        what a recovery table against the circuit reads (services.recovery)."""
        return self._result(ref, task, method, steps, jsonl, pairs)

    def _result(self, ref: ModelRef, task: str, method: str, steps: int, jsonl: str | None,
                pairs: int, *, cached_only: bool = False) -> dict[str, Any]:
        """The cached (or computed) ``circuit`` payload of a stored task or of ``jsonl``;
        ``cached_only``: NotFound instead of computing."""
        check_method(method)
        check_steps(steps)
        check_pairs(pairs)
        if jsonl is None:
            name, jsonl = self.task_source(task)
        else:
            from headgraph.core.circuits.tasks import read_jsonl

            name = check_task_name(task)
            read_jsonl(jsonl)
        params = {"task": name, "jsonl": jsonl, "method": method,
                  "steps": steps if method == "eap-ig" else 1,
                  "pairs": pairs if jsonl is None else BUNDLED_PAIRS}
        if cached_only and not self.cache.has(ref, "circuit", **params):
            raise NotFound(f"the {method} circuit of {name!r} on {ref.id} is not computed yet: "
                           "ask GET /api/circuit with the same parameters first")
        try:
            return self.cache.get(ref, "circuit", **params)
        except InvalidInput as err:  # a row this model's tokenizer cannot take
            raise Invalid(f"task {name!r} on {ref.id}: {err}") from None

    def mib_file(self, ref: ModelRef, task: str, method: str = DEFAULT_METHOD,
                 steps: int = DEFAULT_STEPS, *, size: int | None = None,
                 jsonl: str | None = None, pairs: int = BUNDLED_PAIRS,
                 cached_only: bool = False) -> dict[str, Any]:
        """The circuit as a MIB circuit file (core.circuits.mib.to_mib: every edge's score,
        grouped-query K / V scores split equally per query head; the top ``size`` edges in the
        circuit, default the circuit_size of the answer, none when no top-n reaches the
        share). ``cached_only``: NotFound when not computed (the HTTP export never computes)."""
        from headgraph.core.circuits.mib import to_mib

        r = self._result(ref, task, method, steps, jsonl, pairs, cached_only=cached_only)
        n = r["n_edges"]
        if size is None:
            size = r["faithfulness"]["circuit_size"] or 0
        if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= n:
            raise Invalid(f"size must be in 0..{n}, got {size!r}")
        readers = r["readers"]
        n_heads = sum(1 for x in readers if x["kind"] == "Q" and x["layer"] == 0)
        n_kv = sum(1 for x in readers if x["kind"] == "K" and x["layer"] == 0)
        try:
            return to_mib(self._edges(r, n), n_layers=len(r["layer_indices"]), n_heads=n_heads,
                          n_kv_heads=n_kv, size=size)
        except InvalidInput as err:
            raise Invalid(str(err)) from None

    @staticmethod
    def _lookup(r: dict[str, Any], wanted: Sequence[str], size: int | None) -> list[dict[str, Any]]:
        """The edges named "WRITER>READER" among all of ``r``'s, with their rank (1 = the
        largest |score|) and whether they are in the circuit of ``size`` edges."""
        if not wanted:
            return []
        import numpy as np

        w_of = {n["name"]: i for i, n in enumerate(r["writers"])}
        r_of = {n["name"]: i for i, n in enumerate(r["readers"])}
        out = []
        for item in dict.fromkeys(wanted):
            writer, _, reader = str(item).partition(">")
            if writer not in w_of or reader not in r_of:
                continue
            hit = np.flatnonzero((r["edge_writer"] == w_of[writer]) & (r["edge_reader"] == r_of[reader]))
            if not hit.size:
                continue
            i = int(hit[0])
            W, R = r["writers"][w_of[writer]], r["readers"][r_of[reader]]
            out.append({"rank": i + 1, "writer": W["name"], "reader": R["name"], "path": R["kind"],
                        "writer_kind": W["kind"], "writer_layer": W["layer"], "writer_head": W["head"],
                        "reader_layer": R["layer"], "reader_head": R["head"],
                        "score": float(r["edge_score"][i]),
                        "in_circuit": size is not None and i + 1 <= size})
        return out

    @staticmethod
    def _edges(r: dict[str, Any], n: int) -> list[dict[str, Any]]:
        writers, readers = r["writers"], r["readers"]
        out = []
        for rank, (w, rd, s) in enumerate(zip(r["edge_writer"][:n].tolist(),
                                              r["edge_reader"][:n].tolist(),
                                              r["edge_score"][:n].tolist(), strict=True)):
            W, R = writers[w], readers[rd]
            out.append({"rank": rank + 1, "writer": W["name"], "reader": R["name"],
                        "path": R["kind"], "writer_kind": W["kind"], "writer_layer": W["layer"],
                        "writer_head": W["head"], "reader_layer": R["layer"],
                        "reader_head": R["head"], "score": float(s)})
        return out
