"""Which compute processes a task goes to, and in which order: lanes and their queues.

A task sent to the compute processes goes to a lane: "interactive" (what a person's page or a
command asks for: the default), "background" (a compute job's stages, sent under
:func:`background`) or "small" (the stages of a job whose whole plan is estimated to take
seconds: a small model's, sent under ``background(small=True)``). Each lane has its own compute
processes, so a view is never stuck behind a job's stage that runs for minutes, and a small
model's job (which its page's views wait for) is never stuck behind a big model's current
stage; only small models are loaded in the small lane's process, so it costs little memory. Within a lane, tasks wait in the lane's own queue, not in
the executor's, and a freed process takes the cheapest waiting task first: a job's stage
carries its estimated cost (server.compute.estimate), an interactive task costs nothing (first
come, first served), so the small stages of a small model's job go before a big model's next
stage instead of waiting for its whole job. With two lanes (``HEADGRAPH_COMPUTE_LANES=2``)
small jobs share the background lane; with one lane (``HEADGRAPH_COMPUTE_LANES=1``: a
model too big to be loaded twice) both kinds share its processes, interactive tasks first.

>>> with background(cost=5.0):
...     current()
('background', 5.0)
>>> with background(cost=5.0, small=True):
...     current()
('small', 5.0)
>>> current()
('interactive', 0.0)
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

LANES: tuple[str, ...] = ("interactive", "background", "small")
_LANE: ContextVar[str] = ContextVar("headgraph_lane", default="interactive")
_COST: ContextVar[float] = ContextVar("headgraph_task_cost", default=0.0)


@contextmanager
def background(cost: float = 0.0, *, small: bool = False) -> Iterator[None]:
    """Tasks sent from inside go to the background lane (the small lane with ``small``: a
    stage of a job estimated to take seconds), queued by ``cost`` (smaller first)."""
    lane, price = _LANE.set("small" if small else "background"), _COST.set(float(cost))
    try:
        yield
    finally:
        _COST.reset(price)
        _LANE.reset(lane)


def current() -> tuple[str, float]:
    """(lane, cost) of a task sent from here."""
    return _LANE.get(), _COST.get()


class LaneQueue:
    """Processes of one lane and the tasks waiting for them.

    At most ``slots`` tasks are in the executor at once (one per process), the rest wait here
    ordered by (priority, arrival); ``make_executor`` builds the executor on first use and
    again after its processes broke (a process killed, out of memory). Thread-safe."""

    def __init__(self, make_executor: Callable[[], ProcessPoolExecutor], slots: int) -> None:
        self._make = make_executor
        self.slots = max(1, slots)
        self._guard = threading.Lock()
        self._executor: ProcessPoolExecutor | None = None
        self._waiting: list[tuple[float, int, Future[Any], Callable[..., Any], tuple[Any, ...]]] = []
        self._order = itertools.count()
        self._busy = 0

    @property
    def executor(self) -> ProcessPoolExecutor | None:
        """The live executor (None before the first task or after a break)."""
        return self._executor

    def submit(self, fn: Callable[..., Any], *args: Any, priority: float = 0.0) -> Future[Any]:
        """A future of ``fn(*args)`` run in one of the lane's processes once a process is free
        and no cheaper task waits. Its exception is BrokenProcessPool when the process died."""
        outer: Future[Any] = Future()
        with self._guard:
            heapq.heappush(self._waiting, (float(priority), next(self._order), outer, fn, args))
        self._dispatch()
        return outer

    def _dispatch(self) -> None:
        while True:
            with self._guard:
                if self._busy >= self.slots or not self._waiting:
                    return
                _, _, outer, fn, args = heapq.heappop(self._waiting)
                if not outer.set_running_or_notify_cancel():
                    continue  # cancelled while it waited (shutdown)
                if self._executor is None:
                    self._executor = self._make()
                executor = self._executor
                self._busy += 1
            try:
                inner = executor.submit(fn, *args)
            except (BrokenProcessPool, RuntimeError) as err:  # broken, or shut down meanwhile
                with self._guard:
                    self._busy -= 1
                    if self._executor is executor:
                        self._executor = None
                executor.shutdown(wait=False, cancel_futures=True)
                outer.set_exception(err if isinstance(err, BrokenProcessPool)
                                    else BrokenProcessPool(str(err)))
                continue
            inner.add_done_callback(lambda done, outer=outer, executor=executor:
                                    self._finished(done, outer, executor))

    def _finished(self, inner: Future[Any], outer: Future[Any],
                  executor: ProcessPoolExecutor) -> None:
        err = inner.exception() if not inner.cancelled() else BrokenProcessPool("cancelled")
        broken = isinstance(err, BrokenProcessPool)
        with self._guard:
            self._busy -= 1
            if broken and self._executor is executor:
                self._executor = None  # the next task starts fresh processes
        if broken:
            executor.shutdown(wait=False, cancel_futures=True)
        if err is not None:
            outer.set_exception(err)
        else:
            outer.set_result(inner.result())
        self._dispatch()

    def shutdown(self) -> None:
        """Cancel what waits and stop the processes (without waiting for them)."""
        with self._guard:
            waiting, self._waiting = self._waiting, []
            executor, self._executor = self._executor, None
        for _, _, outer, _, _ in waiting:
            outer.cancel()
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)


__all__ = ["LANES", "LaneQueue", "background", "current"]
