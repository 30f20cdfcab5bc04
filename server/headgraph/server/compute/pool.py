"""Compute processes: where models are loaded and cold results are computed.

The API process never runs model math itself. A cold cache key is computed by sending a
task naming a registered computation (``Compute(name, ref, params)``, see
server/compute/registry.py) to a child process (spawned, niced, with its own model LRU); the
child looks the computation up by that name in its own registry, runs it inline and stores
the result in the shared diskcache; the API thread that asked waits on the future (no GIL
held) and then reads the store. So a computation, even one holding the GIL for long
stretches, can never stall the event loop; and a child that dies (out of memory) does not
take the API down.

The child builds its services with the ``worker_factory`` the composition root hands the
pool (this module imports neither the services nor the composition root). Errors cross the
process boundary as plain data and are rebuilt as the same kinds of exceptions (core
HeadgraphError subclasses, API errors: 4xx); anything else, a bare ValueError included,
becomes ComputeFailed (a 500), whose traceback is logged by the child.

A compute process dies with the API process that spawned it and never writes after it: its
initializer remembers the parent (pid and start time) and starts a watchdog thread that
``os._exit``s the child within ~0.5 s of the parent being gone (reparented, no such pid, a
zombie, or a reused pid); the child's store checks the parent right before every result
write too (``Store.before_write``), so even a computation holding the GIL cannot store a
result after the server died. Once every child is gone, the multiprocessing resource
tracker (which exits when the last holder of its pipe does) follows. PR_SET_PDEATHSIG is
not used: it fires when the parent *thread* that spawned a child exits, and the executor
spawns children from short-lived request threads.
"""

from __future__ import annotations

import functools
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any, Protocol

import psutil

import headgraph.core.errors as core_errors
from headgraph.core.errors import HeadgraphError, InvalidInput
from headgraph.server.compute.lanes import LANES, LaneQueue, current
from headgraph.server.compute.nice import run_at_nice
from headgraph.server.errors import ApiError, one_line, status_for
from headgraph.server.models.catalog import Identify
from headgraph.server.models.offered import ModelRef
from headgraph.server.settings import Settings

log = logging.getLogger("headgraph.compute")


class ComputeFailed(RuntimeError):
    """The compute process died or could not keep a result (reported as a 500 / job error)."""


# -- tasks ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Compute:
    """Run the registered computation ``name`` on ``ref`` with ``params``; the child stores it."""

    name: str
    ref: ModelRef
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ComputeMany:
    """Run ``name`` for several parameter sets at once (shared work done once); all stored."""

    name: str
    ref: ModelRef
    params: tuple[dict[str, Any], ...] = ()


Task = Identify | Compute | ComputeMany


class ComputeWorker(Protocol):
    """What a compute process runs tasks on (built by the composition root, inline)."""

    def identify(self, ref: ModelRef) -> Any: ...

    def compute(self, name: str, ref: ModelRef, params: dict[str, Any]) -> None: ...

    def compute_many(self, name: str, ref: ModelRef, params: list[dict[str, Any]]) -> None: ...


WorkerFactory = Callable[[Settings], ComputeWorker]


# -- processes ------------------------------------------------------------------------------

WATCH_S = 0.5  # how often a compute process checks that its parent is still there
START_SLACK_S = 1.0  # start times (from /proc, in s) of one process never differ by more


def process_started(pid: int) -> float | None:
    """Start time (epoch s) of process ``pid``; None when there is none."""
    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.Error, OSError, ValueError):
        return None


def process_alive(pid: int, started: float | None = None) -> bool:
    """True when process ``pid`` runs (not a zombie) and, with ``started``, is the process that
    started then (not a later one that reused the pid)."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return started is None or abs(float(proc.create_time()) - started) <= START_SLACK_S
    except (psutil.Error, OSError, ValueError):
        return False


# -- child side -------------------------------------------------------------------------------

_parent: tuple[int, float | None] | None = None  # (pid, start time) of this child's API process


def parent_alive() -> bool:
    """In a compute process: is the API process that spawned it still there? (True elsewhere.)"""
    if _parent is None:
        return True
    pid, started = _parent
    if os.name == "posix" and os.getppid() != pid:  # reparented: the parent exited
        return False
    return process_alive(pid, started)


def exit_if_orphaned() -> None:
    """End this compute process at once (no cleanup, no write) when its parent is gone."""
    if parent_alive():
        return
    pid = _parent[0] if _parent is not None else None
    try:
        log.warning("process %d: the process that started it (pid %s) is gone; exiting",
                    os.getpid(), pid)
    finally:
        os._exit(1)


def _watch_parent() -> None:
    while True:
        time.sleep(WATCH_S)
        exit_if_orphaned()


def watch_parent() -> None:
    """Remember this process's parent and exit within ~WATCH_S of it going away."""
    global _parent
    spawner = multiprocessing.parent_process()  # its pid was recorded when it spawned us
    ppid = spawner.pid if spawner is not None and spawner.pid else os.getppid()
    _parent = (ppid, process_started(ppid))
    threading.Thread(target=_watch_parent, name="headgraph-parent-watch", daemon=True).start()


def _init_worker(settings: Settings) -> None:
    """Child initializer: die with the parent, run at nice ``compute_nice`` (or the API's own
    level when that is lower already), size torch threads, log to the server's stderr."""
    watch_parent()  # first: a parent killed while this child started is noticed too
    from headgraph.server.logs import configure_logging

    configure_logging()
    run_at_nice(settings.compute_nice)
    import torch

    torch.set_num_threads(settings.intra_op_threads)


@functools.lru_cache(maxsize=2)
def _worker(settings: Settings, factory: WorkerFactory) -> ComputeWorker:
    """The child's own services (computing inline), one per settings, kept for its life; in a
    compute process their store checks the parent before every result write."""
    worker = factory(settings)
    store = getattr(worker, "store", None)  # Services.store (a ComputeWorker needs none)
    if store is not None and _parent is not None:
        store.before_write = exit_if_orphaned  # Store calls it right before each result write
    return worker


def run_task(settings: Settings, factory: WorkerFactory, task: Task) -> tuple[str, Any]:
    """Child entry point: run ``task``; ("ok", value) or ("error", info)."""
    try:
        worker = _worker(settings, factory)
        if isinstance(task, Identify):
            return "ok", worker.identify(task.ref)
        if isinstance(task, Compute):
            worker.compute(task.name, task.ref, dict(task.params))
        else:
            worker.compute_many(task.name, task.ref, [dict(p) for p in task.params])
        return "ok", None
    except HeadgraphError as err:
        return "error", {"kind": "core", "cls": type(err).__name__, "status": status_for(err),
                         "message": str(err), "allowed": getattr(err, "allowed", None)}
    except ApiError as err:
        return "error", {"kind": "api", "cls": type(err).__name__, "status": err.status,
                         "message": err.message, "allowed": err.allowed}
    except Exception as err:  # a bug (ValueError included): logged here with its traceback
        log.error("task %r failed: %s: %s", task, type(err).__name__, one_line(err), exc_info=err)
        return "error", {"kind": "internal", "cls": type(err).__name__, "message": one_line(err)}


def rebuild_error(info: dict[str, Any]) -> Exception:
    """The exception a child reported, as the same kind of exception in this process."""
    kind, message = info.get("kind"), str(info.get("message", ""))
    if kind == "core":
        cls = getattr(core_errors, str(info.get("cls")), HeadgraphError)
        if not (isinstance(cls, type) and issubclass(cls, HeadgraphError)):
            cls = HeadgraphError
        if issubclass(cls, InvalidInput):
            return cls(message, allowed=info.get("allowed"))
        return cls(message)
    if kind == "api":
        return ApiError(message, status=int(info.get("status", 400)), allowed=info.get("allowed"))
    return ComputeFailed(f"{info.get('cls', 'error')} in a computation: {message}")


# -- parent side ------------------------------------------------------------------------------

class ComputePool:
    """Lazily started compute processes for one API process, in lanes (compute.lanes): the
    interactive, background and small lanes' (``compute_lanes`` 3), small jobs in the
    background lane (2), or one shared lane (1), each of ``compute_processes`` processes."""

    def __init__(self, settings: Settings, worker_factory: WorkerFactory) -> None:
        self.settings = settings
        self.worker_factory = worker_factory
        count = max(1, min(settings.compute_lanes, len(LANES)))
        queues = [LaneQueue(self._new_executor, settings.compute_processes) for _ in range(count)]
        # lane i uses queue i, or the last one there is: (1) all share; (2) small -> background
        self.lanes: dict[str, LaneQueue] = {lane: queues[min(i, count - 1)]
                                            for i, lane in enumerate(LANES)}

    def _new_executor(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(max_workers=self.settings.compute_processes,
                                   mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_init_worker, initargs=(self.settings,))

    def run(self, task: Task) -> Any:
        """Run ``task`` in a compute process of the lane it was sent from (compute.lanes:
        interactive unless inside ``background``); its value (Identify) or None, else its
        error. In a shared lane interactive tasks go first."""
        lane, cost = current()
        priority = cost if lane != "interactive" or self.settings.compute_lanes != 1 else -1.0
        future = self.lanes[lane].submit(run_task, self.settings, self.worker_factory, task,
                                         priority=priority)
        try:
            kind, value = future.result()
        except BrokenProcessPool as err:
            raise ComputeFailed("the compute process stopped (out of memory?); try again") from err
        if kind == "ok":
            return value
        raise rebuild_error(value)

    def processes(self) -> list[Any]:
        """The live compute processes of every lane (multiprocessing Process objects)."""
        found: dict[int, Any] = {}
        for queue in self.lanes.values():
            executor = queue.executor
            for proc in (getattr(executor, "_processes", None) or {}).values():
                found[proc.pid] = proc
        return list(found.values())

    def shutdown(self) -> None:
        for queue in {id(q): q for q in self.lanes.values()}.values():
            queue.shutdown()
