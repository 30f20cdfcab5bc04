"""The registered task-circuit computation (core.circuits).

``circuit`` runs one task on one model's runnable copy: the task's metrics, every edge's
attribution (EAP or EAP-IG), the faithfulness curve of the top-n circuits (real
intervention, corrupt ablation) and EAP against real single-edge patching on a sample of
edges (Spearman), the curve measured on MIB's grid of edge fractions too (core.circuits.mib:
CPR and CMD), reporting its stage and fraction while it runs (server.compute.progress:
GET /api/circuit/progress reads them). Its key is the whole model (the store key's model fingerprint), the task's
name and content (``bundled-n32-seed0`` for a bundled task, whose prompts are a function of
the name and the model's tokenizer; the sha256 of the JSONL for an uploaded one), the method,
the steps and the payload's version (PAYLOAD_VERSION: an entry of an older shape is never
served), so a task replaced under the same name is a new result. Whether the model does the
task (metrics' ``able`` and ``ability``, core.circuits.ability) reads every prompt pair of a
bundled task, whatever ``pairs`` the circuit ran on.

The payload keeps every edge, strongest first, as arrays (writer index, reader index,
score) beside the writer and reader names: a few hundred KB for SmolLM2's ~70,000 edges.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from headgraph.core.errors import UnsupportedModel
from headgraph.core.names import BUNDLED_TASKS as CORE_BUNDLED_TASKS
from headgraph.server.errors import Invalid
from headgraph.server.limits import CIRCUIT_PAIRS_MAX, CIRCUIT_PAIRS_MIN, CIRCUIT_STEPS_MAX

if TYPE_CHECKING:  # the CLI's parser reads the constants below without importing torch
    from headgraph.server.compute.registry import Computation, Inputs

BUNDLED_TASKS: tuple[str, ...] = CORE_BUNDLED_TASKS  # core.circuits.bundled builds each
CIRCUIT_METHODS: tuple[str, ...] = ("eap", "eap-ig")  # core.circuits.attribution.METHODS
DEFAULT_METHOD = "eap-ig"
DEFAULT_STEPS = 5
BUNDLED_PAIRS = CIRCUIT_PAIRS_MAX  # prompt pairs of a bundled task (the default of ``pairs``)
BUNDLED_SEED = 0
PATCHED_EDGES = 24  # edges checked by real patching (Spearman against EAP)
CIRCUIT_SHARE = 0.8  # the share of the metric gap the shown circuit recovers
DEFAULT_TOP = 50
PAYLOAD_VERSION = 3  # in the cache key: 2 = the curve on MIB's grid and "mib" (CPR, CMD); 3 = metrics' "ability" (the paired sign tests, on every bundled pair)
TASK_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$"


def check_task_name(value: Any) -> str:
    if not isinstance(value, str) or not re.match(TASK_NAME_PATTERN, value):
        raise Invalid(f"a task name matches {TASK_NAME_PATTERN}, got {str(value)[:40]!r}")
    return value


def check_jsonl(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise Invalid("an uploaded task's JSONL must be text")
    return value


def check_method(value: Any) -> str:
    if value not in CIRCUIT_METHODS:
        raise Invalid(f"unknown method {value!r}; allowed: {list(CIRCUIT_METHODS)}",
                      allowed=list(CIRCUIT_METHODS))
    return value


def check_steps(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= CIRCUIT_STEPS_MAX:
        raise Invalid(f"steps must be an integer in 1..{CIRCUIT_STEPS_MAX}, got {value!r}")
    return value


def check_pairs(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not CIRCUIT_PAIRS_MIN <= value <= CIRCUIT_PAIRS_MAX:
        raise Invalid(f"pairs must be an integer in {CIRCUIT_PAIRS_MIN}..{CIRCUIT_PAIRS_MAX}, got {value!r}")
    return value


def task_content(task: str, jsonl: str | None, pairs: int = BUNDLED_PAIRS) -> str:
    """What a task's prompts are made of, for the cache key (module docstring); ``pairs``: a
    bundled task's first ``pairs`` prompt pairs (an uploaded one is used whole)."""
    if jsonl is None:
        return f"bundled-n{pairs}-seed{BUNDLED_SEED}"
    return "sha256-" + hashlib.sha256(jsonl.encode()).hexdigest()[:16]


def build_task(source: Any, task: str, jsonl: str | None, pairs: int = BUNDLED_PAIRS) -> Any:
    """core.circuits.tasks.Task of a bundled name (``jsonl`` None; ``pairs`` prompt pairs) or
    of uploaded JSONL, in ``source``'s token ids."""
    from headgraph.core.circuits.bundled import bundled_task
    from headgraph.core.circuits.tasks import parse_jsonl

    if jsonl is None:
        return bundled_task(task, source, n=pairs, seed=BUNDLED_SEED)
    return parse_jsonl(jsonl, source, name=task)


def stage_weights(steps: int) -> tuple[float, float, float]:
    """Shares of a circuit's run (attribution, faithfulness, patching check), from the
    forwards each takes: attribution two forwards and ``steps`` forward + backward pairs per
    batch; the faithfulness curve and the patching check two forwards, then one patched
    forward (about 1.5 plain ones) per curve point (~27 on a real model, MIB's grid
    included) or checked edge."""
    units = (2 + 3 * steps, 2 + 1.5 * 27, 2 + 1.5 * PATCHED_EDGES)
    total = sum(units)
    return units[0] / total, units[1] / total, units[2] / total


def _stage(stage: str, start: float, width: float) -> Callable[[float, str], None]:
    """A core progress callback (fraction of one stage, message) reporting the whole run's
    fraction (server.compute.progress)."""
    from headgraph.server.compute.progress import report

    def progress(fraction: float, message: str) -> None:
        report(stage, start + width * min(max(fraction, 0.0), 1.0), message)

    return progress


def with_every_pair(source: Any, metrics: Any, task: str, jsonl: str | None, pairs: int) -> Any:
    """``metrics`` (core TaskMetrics) with whether the model does the task decided on every
    prompt pair of a bundled task (BUNDLED_PAIRS; two forwards each, core.circuits.ability),
    however few pairs the circuit ran on; an uploaded task's circuit reads all its rows
    already. A tokenizer that cannot take all of them keeps the circuit's pairs."""
    from dataclasses import replace

    from headgraph.core.circuits.ability import task_ability
    from headgraph.core.errors import InvalidInput

    if jsonl is not None or pairs >= BUNDLED_PAIRS:
        return metrics
    try:
        every = build_task(source, task, None, BUNDLED_PAIRS)
    except InvalidInput:
        return metrics
    return replace(metrics, ability=task_ability(source, every))


def circuit(src: Inputs, *, task: str, jsonl: str | None, method: str, steps: int,
            pairs: int = BUNDLED_PAIRS) -> dict[str, Any]:
    """Task metrics, every edge's attribution, the faithfulness curve and the EAP vs patching
    check of ``task`` on ``src``'s runnable model (module docstring)."""
    import numpy as np

    from headgraph.core.circuits.attribution import attribute
    from headgraph.core.circuits.faithfulness import faithfulness, patching_check
    from headgraph.core.circuits.mib import curve_scores, mib_sizes
    from headgraph.server.computations.convert import jsonable

    from headgraph.server.compute.progress import report

    report("load", 0.0, "loading the model", force=True)
    source = src.patterns
    if source is None:
        raise UnsupportedModel(f"{src.info.name} cannot be run here (weights read without a "
                               "runnable model), so it has no task circuits")
    t = build_task(source, task, jsonl, pairs)
    att_w, faith_w, patch_w = stage_weights(steps)
    att = attribute(source, t, method=method, steps=steps,
                    progress=_stage("attribution", 0.0, att_w))
    metrics = with_every_pair(source, att.metrics, task, jsonl, pairs)
    curve = faithfulness(source, t, att, share=CIRCUIT_SHARE, extra=mib_sizes(att.n_edges),
                         progress=_stage("faithfulness", att_w, faith_w))
    mib = curve_scores(curve.sizes, curve.metrics, curve.clean, curve.total_edges)
    check = patching_check(source, t, att, n=PATCHED_EDGES,
                           progress=_stage("patching", att_w + faith_w, patch_w))
    report("store", 1.0, "keeping the result", force=True)
    order = att.order()
    return {"task": jsonable(t.to_dict()), "content": task_content(task, jsonl, pairs),
            "bundled": jsonl is None, "method": att.method, "steps": att.steps,
            "metrics": jsonable(metrics.to_dict()), "n_edges": att.n_edges,
            "layer_indices": list(att.layer_indices),
            "writers": [n.to_dict() for n in att.graph.writers],
            "readers": [n.to_dict() for n in att.graph.readers],
            "edge_writer": att.writer[order].numpy().astype(np.int32),
            "edge_reader": att.reader[order].numpy().astype(np.int32),
            "edge_score": att.scores[order].numpy().astype(np.float64),
            "faithfulness": jsonable(curve.to_dict()), "patching": jsonable(check.to_dict()),
            "mib": None if mib is None else jsonable(
                {**mib.to_dict(), "sizes": list(mib_sizes(att.n_edges))})}


def _key(p: dict[str, Any]) -> dict[str, Any]:
    return {"task": p["task"], "content": task_content(p["task"], p["jsonl"], p["pairs"]),
            "method": p["method"], "steps": p["steps"] if p["method"] == "eap-ig" else 1,
            "payload": PAYLOAD_VERSION}


def circuit_computations() -> list[Computation]:
    from headgraph.server.compute.registry import MODEL, Computation

    return [Computation("circuit", circuit,
                        {"task": check_task_name, "jsonl": check_jsonl, "method": check_method,
                         "steps": check_steps, "pairs": check_pairs}, key=_key, reads=MODEL)]
