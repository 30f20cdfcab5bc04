"""Compute worker processes: where models are loaded and cold results are computed.

The API process never runs model math itself. A cold cache key is computed by calling the
same :class:`~headgraph.server.service.Service` method in a child process (spawned, niced,
with its own model LRU), which stores the result in the shared diskcache; the API thread
that asked waits on the future (no GIL held) and then reads the store. So a computation,
even one that holds the GIL for long stretches (pure-Python or non-releasing C code), can
never stall the event loop; and a child that dies (out of memory) does not take the API down.

Errors cross the process boundary as plain data and are rebuilt as the same kinds of
exceptions (core HeadgraphError subclasses, API errors, ValueError), so HTTP statuses match
what an in-process computation would give.
"""

from __future__ import annotations

import functools
import logging
import multiprocessing
import os
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import TYPE_CHECKING, Any

import headgraph.core.errors as core_errors
from headgraph.core.errors import HeadgraphError
from headgraph.server.errors import ApiError, one_line, status_for
from headgraph.server.settings import Settings

if TYPE_CHECKING:
    from headgraph.server.service import Service

log = logging.getLogger("headgraph.compute")
RETURNS_VALUE = frozenset({"identity"})  # other methods store their result; nothing is sent back


class ComputeFailed(RuntimeError):
    """The compute process died or could not keep a result (reported as a 500 / job error)."""


# -- child side -----------------------------------------------------------------------------

def _init_worker(settings: Settings) -> None:
    """Child initializer: lower priority, size torch threads, log to the server's stderr."""
    from headgraph.server.logs import configure_logging

    configure_logging()
    if settings.compute_nice:
        try:
            os.nice(settings.compute_nice)
        except OSError:
            pass
    import torch

    torch.set_num_threads(settings.intra_op_threads)


@functools.lru_cache(maxsize=2)
def worker_service(settings: Settings) -> Service:
    """The child's own Service (computes inline), one per settings, kept for the process life."""
    from headgraph.server.service import Service

    return Service(settings, inline=True)


def run_in_worker(settings: Settings, method: str, args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> tuple[str, Any]:
    """Child entry point: call ``Service.<method>(*args, **kwargs)``; ("ok", value) or ("error", info)."""
    try:
        value = getattr(worker_service(settings), method)(*args, **kwargs)
        return "ok", value if method in RETURNS_VALUE else None
    except HeadgraphError as err:
        return "error", {"kind": "core", "cls": type(err).__name__, "status": status_for(err),
                         "message": str(err)}
    except ApiError as err:
        return "error", {"kind": "api", "cls": type(err).__name__, "status": err.status,
                         "message": err.message, "allowed": err.allowed}
    except ValueError as err:
        return "error", {"kind": "value", "cls": type(err).__name__, "message": str(err)}
    except Exception as err:
        log.error("computation %s failed: %s: %s", method, type(err).__name__, one_line(err),
                  exc_info=err)
        return "error", {"kind": "internal", "cls": type(err).__name__, "message": one_line(err)}


def rebuild_error(info: dict[str, Any]) -> Exception:
    """The exception a child reported, as the same kind of exception in this process."""
    kind, message = info.get("kind"), str(info.get("message", ""))
    if kind == "core":
        cls = getattr(core_errors, str(info.get("cls")), HeadgraphError)
        return (cls if isinstance(cls, type) and issubclass(cls, HeadgraphError)
                else HeadgraphError)(message)
    if kind == "api":
        return ApiError(message, status=int(info.get("status", 400)), allowed=info.get("allowed"))
    if kind == "value":
        return ValueError(message)
    return ComputeFailed(f"{info.get('cls', 'error')} in a computation: {message}")


# -- parent side ------------------------------------------------------------------------------

class ComputePool:
    """A lazily started pool of spawned compute processes for one API process."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._guard = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None

    def _executor(self) -> ProcessPoolExecutor:
        with self._guard:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(
                    max_workers=self.settings.compute_processes,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=_init_worker, initargs=(self.settings,))
            return self._pool

    def run(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``Service.<method>(*args, **kwargs)`` in a compute process; its value or error."""
        pool = self._executor()
        try:
            kind, value = pool.submit(run_in_worker, self.settings, method, args, kwargs).result()
        except BrokenProcessPool as err:
            with self._guard:
                if self._pool is pool:
                    self._pool = None
            pool.shutdown(wait=False, cancel_futures=True)
            raise ComputeFailed("the compute process stopped (out of memory?); try again") from err
        if kind == "ok":
            return value
        raise rebuild_error(value)

    def shutdown(self) -> None:
        with self._guard:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
