"""Recovery tables (the PK paper's Tables 1 and 2) for any model: GET /api/recovery (core.stats.recovery).

For one pairing and a reference — a label set (``labels=``: an edge is in it when both heads
are labelled) or a task circuit (``task=``, with ``method``, ``steps``, ``pairs`` as GET
/api/circuit: its head -> head edges into the pairing's input among its top ``edges`` edges,
by default the smallest circuit on its faithfulness curve reaching 0.8 of the metric gap) —
per metric (PK raw / normalized, CS, CKA, Procrustes, layer gap, random) the share of its top-k
edges' endpoints on reference heads, precision@k and ROC-AUC over all valid forward pairs,
with bootstrap 95% intervals and paired differences vs PK. Cold results (the circuit too) are
computed like every other (a compute process, once; in lab mode only with the token) and cached.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool

from headgraph.core.names import DEFAULT_K, GraphPairing
from headgraph.server.computations.circuits import (
    BUNDLED_PAIRS,
    DEFAULT_METHOD,
    DEFAULT_STEPS,
    TASK_NAME_PATTERN,
)
from headgraph.server.errors import Invalid
from headgraph.server.http.deps import ModelDep, RecoveryDep
from headgraph.server.http.params import ERRORS
from headgraph.server.http.responses import warm_json
from headgraph.server.http.routers.circuits import METHOD_PATTERN, CircuitsDep, circuits_content
from headgraph.server.http.schemas.recovery import RecoveryOut
from headgraph.server.limits import CIRCUIT_PAIRS_MAX, CIRCUIT_PAIRS_MIN, CIRCUIT_STEPS_MAX, RECOVERY_K_MAX

router = APIRouter(prefix="/api", tags=["recovery"])


@router.get("/recovery", response_model=RecoveryOut, responses=ERRORS,
            summary="Each metric's recovery of a label set's or a task circuit's edges: top-k share, "
                    "precision@k, ROC-AUC")
async def recovery(request: Request, *, ref: ModelDep,
                   pairing: GraphPairing = Query("OK", description="O -> Q / K / V"),
                   labels: str | None = Query(None, min_length=1, max_length=200,
                                              description="label set whose heads are the reference "
                                                          "(a built-in, an uploaded one or 'patterns'); "
                                                          "exactly one of labels and task"),
                   task: str | None = Query(None, pattern=TASK_NAME_PATTERN,
                                            description="a task from GET /api/tasks whose circuit's "
                                                        "head -> head edges are the reference"),
                   method: str | None = Query(None, pattern=METHOD_PATTERN,
                                              description=f"with task: the circuit's method "
                                                          f"(default {DEFAULT_METHOD})"),
                   steps: int | None = Query(None, ge=1, le=CIRCUIT_STEPS_MAX,
                                             description=f"with task: EAP-IG's steps (default "
                                                         f"{DEFAULT_STEPS}; eap: 1)"),
                   pairs: int | None = Query(None, ge=CIRCUIT_PAIRS_MIN, le=CIRCUIT_PAIRS_MAX,
                                             description="with a bundled task: its first n prompt "
                                                         f"pairs (default {BUNDLED_PAIRS})"),
                   edges: int | None = Query(None, ge=1,
                                             description="with task: the circuit's top n edges (every "
                                                         "kind; at most its edge count); default the "
                                                         "smallest circuit on the faithfulness curve "
                                                         "reaching 0.8 of the metric gap"),
                   k: int = Query(DEFAULT_K, ge=1, le=RECOVERY_K_MAX, description="top edges per metric"),
                   recovery: RecoveryDep, circuits: CircuitsDep) -> Any:
    if (labels is None) == (task is None):
        raise Invalid("give exactly one reference: labels= (a label set) or task= (a task's circuit)")
    if labels is not None:
        extra = [n for n, v in (("method", method), ("steps", steps), ("pairs", pairs),
                                ("edges", edges)) if v is not None]
        if extra:
            raise Invalid(f"{', '.join(extra)}: only with a task circuit (task=), not with a label set")
        return await warm_json(request, RecoveryOut, ref,
                               lambda: recovery.answer(ref, pairing, labels, k), labels=labels)
    assert task is not None
    _, jsonl = await run_in_threadpool(circuits.task_source, task)
    variant = None if jsonl is None else circuits_content(jsonl)
    return await warm_json(
        request, RecoveryOut, ref,
        lambda: recovery.answer_task(ref, pairing, task, k, method=method or DEFAULT_METHOD,
                                     steps=DEFAULT_STEPS if steps is None else steps,
                                     pairs=BUNDLED_PAIRS if pairs is None else pairs, edges=edges),
        variant=variant)
