"""One model of a sweep: the task a Ray worker runs (server.sweep.run submits it).

The task builds the CLI's inline services on the sweep's cache, resolves the spec as
``headgraph compute`` does and computes the chosen results through the same stages as the
dashboard's background job (server.services.jobs.compute_plan), so every value lands under the keys
the server reads. Bad input (HeadgraphError, ApiError: an unknown model, not a model folder,
a hub model not available offline) is *returned* as a failure, never retried, and so is any
other error that another attempt would repeat (a bug, a file nobody can read); only TRANSIENT
errors (I/O, timeouts, memory) and a worker that died are left to Ray's ``max_retries`` /
``retry_exceptions``. Each attempt is counted in the cache's meta store, so the report can
say how many retries a model took wherever its worker ran.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from headgraph.core.errors import HeadgraphError
from headgraph.core.names import GRAPH_PAIRINGS
from headgraph.server.errors import ApiError, one_line
from headgraph.server.settings import Settings

DEFAULT_RETRIES = 2  # Ray retries of a failed task (the sweep CLI default)

# Result names of --results, in the job's order (the first word of a job's stage names):
# the scores, then what the default views render (graph, scatter, the pair panels of the
# default graph's edges), so a server on the swept cache serves those views without computing.
JOB_RESULTS: tuple[str, ...] = ("pk", "cs", "patterns", "z", "graph", "scatter", "reference",
                                "null", "tokens", "datapk", "pairs")
RESULTS: tuple[str, ...] = JOB_RESULTS
# Tests only: a spec listed here (comma-separated) fails its first attempt with a transient
# error, so a test can watch Ray retry it. Read by the driver and passed to the task.
FAIL_FIRST_ENV = "HEADGRAPH_SWEEP_FAIL_FIRST"


# What another attempt may cure (Ray retries these, and a worker that died); anything else
# a task raises is reported as the model's failure at once.
TRANSIENT: tuple[type[BaseException], ...] = (OSError, MemoryError)


class TransientFailure(OSError):
    """A failure worth another attempt (the injected one of FAIL_FIRST_ENV)."""


def parse_results(text: str) -> list[str]:
    """``pk,cs,graph`` / ``job`` / ``all`` -> result names in RESULTS order; ValueError else."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    chosen: set[str] = set()
    for n in names:
        if n == "job":
            chosen.update(JOB_RESULTS)
        elif n == "all":
            chosen.update(RESULTS)
        elif n in RESULTS:
            chosen.add(n)
        else:
            raise ValueError(f"unknown result {n!r}; choose from {', '.join(RESULTS)}, job, all")
    if not chosen:
        raise ValueError("no results chosen")
    return [n for n in RESULTS if n in chosen]


def attempt_key(sweep_id: str, index: int) -> str:
    return f"sweep:{sweep_id}:{index}"


def record_attempt(meta: Any, sweep_id: str, index: int) -> dict[str, Any]:
    """Count one attempt of task ``index`` in the meta cache; its record {attempts, started}."""
    key = attempt_key(sweep_id, index)
    with meta.transact(retry=True):
        raw = meta.get(key, retry=True)
        rec = dict(raw) if isinstance(raw, dict) else {"attempts": 0, "started": time.time()}
        rec["attempts"] = int(rec["attempts"]) + 1
        meta.set(key, rec, retry=True)
    return rec


def read_attempts(meta: Any, sweep_id: str, index: int) -> dict[str, Any]:
    raw = meta.get(attempt_key(sweep_id, index), retry=True)
    return dict(raw) if isinstance(raw, dict) else {"attempts": 0, "started": None}


def _download_revision(spec: str, root: Path | None) -> Path:
    """A hub revision (``org/model@rev``) as a folder under the model root (huggingface_hub;
    offline it must be there already)."""
    from headgraph.server.sweep.specs import hub_revision

    rev = hub_revision(spec)
    assert rev is not None
    if root is None:
        raise HeadgraphError(f"{spec}: a hub revision is downloaded into the model root; give "
                             "--model-root (or HEADGRAPH_MODEL_ROOT)")
    import huggingface_hub
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    folder = root / rev.folder_name
    try:
        huggingface_hub.snapshot_download(rev.repo, revision=rev.revision, local_dir=folder)
    except (LocalEntryNotFoundError, HfHubHTTPError, ValueError) as err:
        raise HeadgraphError(f"{spec}: cannot get this hub revision ({one_line(err)}); run the "
                             "sweep where the hub is reachable, or download it to a folder and "
                             "sweep the folder") from err
    return folder


def resolve_spec(services: Any, spec: str) -> Any:
    """The ModelRef of ``spec``: a registry id, a hub revision (downloaded), or any local
    folder or .gguf file (``local:<name>`` when it lies directly under the model root)."""
    from headgraph.server.sweep.specs import hub_revision, is_path_spec

    registry = services.catalog.registry
    if hub_revision(spec) is not None:
        return registry.resolve_path(_download_revision(spec, services.settings.model_root))
    if is_path_spec(spec) and spec not in registry.allowed_ids():
        return registry.resolve_path(Path(spec))
    return services.catalog.resolve(spec)


def result_steps(services: Any, ref: Any, results: Sequence[str]
                 ) -> list[tuple[str, Callable[[], Any]]]:
    """(stage, thunk) of the chosen results: the job's own stages
    (server.services.jobs.compute_plan, default views included) whose first word is chosen."""
    from headgraph.server.services.jobs import Shown, compute_plan

    pairings: list[str] = list(GRAPH_PAIRINGS)
    shown = Shown(graphs=services.graphs, details=services.details, views=services.views)
    return [(stage, thunk) for stage, thunk in
            compute_plan(services.scores, services.catalog, ref, pairings, shown)
            if stage.split()[0] in results]


def sweep_task(settings: Settings, spec: str, results: Sequence[str], sweep_id: str, index: int,
               fail_first: Sequence[str] = ()) -> dict[str, Any]:
    """Compute ``results`` of one model into the sweep's cache; its outcome as a dict
    (spec, model, status "done" | "failed", seconds, attempts, computed, fingerprint, error)."""
    from headgraph.server.services.wiring import build_services

    services = build_services(settings, inline=True)
    try:
        rec = record_attempt(services.store.meta, sweep_id, index)
        out: dict[str, Any] = {"spec": spec, "model": spec, "attempts": rec["attempts"],
                               "computed": [], "fingerprint": None, "model_fingerprint": None,
                               "error": None}
        if spec in fail_first and rec["attempts"] == 1:
            raise TransientFailure(f"{spec}: injected transient failure ({FAIL_FIRST_ENV})")
        try:
            ref = resolve_spec(services, spec)
            out["model"] = ref.id
            ident = services.catalog.identity(ref)
            out["fingerprint"], out["model_fingerprint"] = ident.fingerprint, ident.model_fingerprint
            for stage, thunk in result_steps(services, ref, results):
                thunk()
                out["computed"].append(stage)
            out["status"] = "done"
        except (HeadgraphError, ApiError) as err:  # bad input: reported, not retried
            out["status"], out["error"] = "failed", one_line(err) or type(err).__name__
        except TRANSIENT:
            raise
        except Exception as err:  # deterministic: another attempt would fail the same way
            out["status"] = "failed"
            out["error"] = f"{type(err).__name__}: {one_line(err)}"
        out["seconds"] = round(time.time() - float(rec["started"]), 2)
        return out
    finally:
        services.close()
