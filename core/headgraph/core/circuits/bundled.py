"""The bundled tasks by name (core.names.BUNDLED_TASKS): ``ioi``, ``induction`` and
``successor`` (core.circuits.tasks), ``ioi-mib``, ``addition``, ``subtraction`` and ``mcqa``
(core.circuits.benchmark_tasks), each built for one model's tokenizer from a seed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from headgraph.core.circuits.benchmark_tasks import addition, ioi_mib, mcqa, subtraction
from headgraph.core.circuits.tasks import Task, induction, ioi, successor
from headgraph.core.errors import InvalidInput
from headgraph.core.names import BUNDLED_TASKS

BUILDERS: dict[str, Callable[..., Task]] = {
    "ioi": ioi, "induction": induction, "successor": successor, "ioi-mib": ioi_mib,
    "addition": addition, "subtraction": subtraction, "mcqa": mcqa}


def bundled_task(name: str, model: Any, *, n: int = 32, seed: int = 0) -> Task:
    """A bundled task by name for ``model`` (its demo model, pattern source, bridge or
    LoadedModel): ``n`` prompt pairs drawn from ``seed``; the first n of a longer draw."""
    if name not in BUNDLED_TASKS:
        raise InvalidInput(f"unknown task {name!r}; bundled: {list(BUNDLED_TASKS)}",
                           allowed=list(BUNDLED_TASKS))
    return BUILDERS[name](model, n=n, seed=seed)


__all__ = ["BUILDERS", "BUNDLED_TASKS", "bundled_task"]
