"""Sweeps: the chosen results of many models computed on Ray into one result cache.

``run_sweep`` submits one task per model spec (server.sweep.task.sweep_task) to a Ray
runtime: a local one started here (``workers`` CPUs, no dashboard, no usage stats) or an
existing cluster (``address``; its workers must see the same cache folder, e.g. a shared
file system). Failed attempts are retried by Ray itself (``max_retries`` with
``retry_exceptions``); progress is a tqdm bar over completed tasks. Results go into the
diskcache folder the server reads, under the server's own keys, so ``headgraph serve`` on
that cache (with :attr:`SweepReport.serve_env`) lists every swept model and serves its
results without computing.

Ray is an optional dependency (``pip install 'headgraph-server[sweep]'``); without it a sweep
fails with SweepUnavailable, saying so.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from headgraph.server.settings import Settings
from headgraph.server.sweep.specs import default_model_root, registry_ids, serve_env
from headgraph.server.sweep.task import DEFAULT_RETRIES, FAIL_FIRST_ENV, TRANSIENT, read_attempts, sweep_task
INSTALL_HINT = "pip install 'headgraph-server[sweep]' (or: pip install 'ray>=2.9')"


class SweepUnavailable(RuntimeError):
    """Ray is not installed (or the cluster cannot be reached)."""


@dataclass
class SweepReport:
    """What a sweep did: one outcome per spec (sweep_task's dict, retries added), the cache
    and the HEADGRAPH_* settings under which a server lists and serves every swept model."""

    rows: list[dict[str, Any]]
    cache_dir: Path
    serve_env: dict[str, str]
    seconds: float
    workers: int | None
    address: str | None = None
    results: list[str] = field(default_factory=list)

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["status"] != "done"]

    def to_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "cache": str(self.cache_dir), "serve_env": self.serve_env,
                "seconds": round(self.seconds, 2), "workers": self.workers,
                "address": self.address, "results": self.results}


def import_ray() -> Any:
    """The ``ray`` module, or SweepUnavailable saying how to install it."""
    try:
        import ray
    except ImportError as err:
        raise SweepUnavailable(f"headgraph sweep runs on Ray, which is not installed: "
                               f"{INSTALL_HINT}") from err
    return ray


def start_ray(ray: Any, address: str | None, workers: int | None) -> bool:
    """Connect to ``address`` or start a local runtime of ``workers`` CPUs (unless this
    process already has one); True when this call started it (and should shut it down)."""
    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage reports, no network
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                              "configure_logging": False}
    if address:
        kwargs["address"] = address
    else:
        kwargs["num_cpus"] = workers or os.cpu_count() or 1
    try:
        ray.init(**kwargs)
    except ConnectionError as err:
        raise SweepUnavailable(f"cannot reach the Ray cluster at {address}: {err}") from err
    return True


def _failure(err: BaseException) -> str:
    """One line saying why a task failed for good (the task's own exception when Ray has it)."""
    from headgraph.server.errors import one_line

    cause = getattr(err, "cause", None)
    inner = cause if isinstance(cause, BaseException) else err
    return f"{type(inner).__name__}: {one_line(inner)}"


def sweep_settings(settings: Settings, specs: Sequence[str], model_root: Path | None) -> Settings:
    """The settings every task computes with: the CLI's (any local path), the swept registry
    ids offered, and the model root that names folders ``local:<name>`` as the server will."""
    models = tuple(dict.fromkeys([*settings.models, *registry_ids(specs)]))
    return replace(settings, allow_any_path=True, models=models,
                   model_root=default_model_root(specs, model_root or settings.model_root))


def run_sweep(settings: Settings, specs: Sequence[str], results: Sequence[str], *,
              workers: int | None = None, address: str | None = None,
              retries: int = DEFAULT_RETRIES, model_root: Path | None = None,
              progress: bool = True) -> SweepReport:
    """Compute ``results`` of every spec on Ray into ``settings.cache_dir``; one report row
    per spec, in the order given, whatever happened to the others."""
    ray = import_ray()
    from tqdm import tqdm

    run = sweep_settings(settings, specs, model_root)
    fail_first = [s.strip() for s in os.environ.get(FAIL_FIRST_ENV, "").split(",") if s.strip()]
    sweep_id = uuid.uuid4().hex[:12]
    started = time.perf_counter()
    owns = start_ray(ray, address, workers)
    try:
        task = ray.remote(num_cpus=1, max_retries=retries,
                          retry_exceptions=list(TRANSIENT))(sweep_task)
        refs = {task.remote(run, spec, list(results), sweep_id, i, fail_first): i
                for i, spec in enumerate(specs)}
        rows: list[dict[str, Any] | None] = [None] * len(specs)
        pending = list(refs)
        with tqdm(total=len(specs), desc="sweep", unit="model", file=sys.stderr,
                  disable=not progress) as bar:
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)
                for ref in ready:
                    i = refs[ref]
                    try:
                        rows[i] = ray.get(ref)
                    except Exception as err:  # retries exhausted (or the worker died for good)
                        rows[i] = {"spec": specs[i], "model": specs[i], "status": "failed",
                                   "error": _failure(err), "computed": [], "fingerprint": None,
                                   "model_fingerprint": None, "ended": time.time()}
                    bar.update(1)
    finally:
        if owns:
            ray.shutdown()
    report_rows = _with_attempts(run, sweep_id, [r for r in rows if r is not None])
    return SweepReport(rows=report_rows, cache_dir=run.cache_dir,
                       serve_env=serve_env([r["model"] for r in report_rows if r["status"] == "done"],
                                           settings.models, run.cache_dir, run.model_root),
                       seconds=time.perf_counter() - started, workers=None if address else
                       (workers or os.cpu_count() or 1), address=address, results=list(results))


def _with_attempts(settings: Settings, sweep_id: str, rows: list[dict[str, Any]]
                   ) -> list[dict[str, Any]]:
    """Rows with ``retries`` (attempts - 1, from the attempt records the tasks kept in the
    cache) and ``seconds`` for tasks that never returned; the records are then dropped."""
    from headgraph.server.cache.store import Store
    from headgraph.server.sweep.task import attempt_key

    store = Store(settings.cache_dir, size_limit=settings.cache_size_bytes,
                  lock_expire_s=settings.lock_expire_s)
    try:
        out = []
        for i, row in enumerate(rows):
            rec = read_attempts(store.meta, sweep_id, i)
            attempts = max(int(row.get("attempts") or 0), int(rec["attempts"]))
            seconds = row.get("seconds")
            ended = row.pop("ended", None)
            if seconds is None and rec["started"] is not None and ended is not None:
                seconds = round(float(ended) - float(rec["started"]), 2)
            out.append({**row, "attempts": attempts, "retries": max(attempts - 1, 0),
                        "seconds": seconds})
            store.meta.delete(attempt_key(sweep_id, i), retry=True)
        return out
    finally:
        store.close()
