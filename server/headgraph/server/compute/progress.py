"""Progress of a cold computation while it runs, readable from any process.

A computation that takes long (a task circuit: minutes on a real model) reports
``report(stage, fraction, message)`` while it runs; outside a recorded run that is a no-op.
``ResultCache.get`` records the run of a cold key (inline: in a compute process, the CLI, or
``compute_processes=0``) under ``recording``: each report is written (at most every
MIN_INTERVAL_S, the last one always) to the store's never-evicted ``meta`` cache under
``progress:<model id>|<name>|<key parameters>``: a key known without the model's weight
fingerprint, so a reader can ask before the model is loaded. The record names the process
running it (pid and start time, as job records do) and is removed when the run ends; a record
whose process is gone reads as not running.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from headgraph.server.compute.pool import process_alive, process_started

PREFIX = "progress:"
MIN_INTERVAL_S = 0.25  # the most often one run writes its record
STALE_S = 600.0  # a record not updated for this long reads as not running (another host)


def progress_key(model: str, name: str, key_params: dict[str, Any]) -> str:
    """The meta key of one run's record: model id, computation name, canonical parameters."""
    return PREFIX + f"{model}|{name}|" + json.dumps(key_params, sort_keys=True, default=str)


@dataclass
class _Recorder:
    meta: Any
    key: str
    started: float
    last: float = 0.0

    def write(self, stage: str, fraction: float, message: str, *, force: bool = False) -> None:
        now = time.time()
        if not force and now - self.last < MIN_INTERVAL_S:
            return
        self.last = now
        pid = os.getpid()
        self.meta.set(self.key, {"stage": stage, "fraction": round(min(max(fraction, 0.0), 1.0), 4),
                                 "message": message[:300], "started": self.started, "updated": now,
                                 "pid": pid, "pid_started": process_started(pid),
                                 "host": socket.gethostname()}, retry=True)


_CURRENT: ContextVar[_Recorder | None] = ContextVar("headgraph_progress", default=None)
Listener = Any  # callable(stage, fraction, message): a progress bar of the process running it
_LISTENER: ContextVar[Listener | None] = ContextVar("headgraph_progress_listener", default=None)


def report(stage: str, fraction: float, message: str = "", *, force: bool = False) -> None:
    """Record where the running computation is (``fraction`` of it done, in [0, 1]); a no-op
    outside a recorded run. ``force``: write even within MIN_INTERVAL_S of the last write.
    A listener (``listening``) of this process hears every report, recorded or not."""
    listener = _LISTENER.get()
    if listener is not None:
        try:
            listener(stage, min(max(fraction, 0.0), 1.0), message)
        except Exception:  # a progress bar must not fail the computation either
            pass
    rec = _CURRENT.get()
    if rec is not None:
        try:
            rec.write(stage, fraction, message, force=force)
        except Exception:  # progress is advisory: never fail a computation over it
            pass


@contextmanager
def listening(listener: Listener) -> Iterator[None]:
    """Call ``listener(stage, fraction, message)`` on every report of a computation run inline
    inside (the CLI's progress bar), besides any record."""
    token = _LISTENER.set(listener)
    try:
        yield
    finally:
        _LISTENER.reset(token)


@contextmanager
def recording(meta: Any, key: str) -> Iterator[None]:
    """Record the reports of the run inside (module docstring); the record goes at the end."""
    rec = _Recorder(meta, key, time.time())
    token = _CURRENT.set(rec)
    try:
        rec.write("start", 0.0, "starting", force=True)
        yield
    finally:
        _CURRENT.reset(token)
        try:
            meta.delete(key, retry=True)
        except Exception:
            pass


def read_progress(meta: Any, key: str) -> dict[str, Any] | None:
    """The record of a run in progress ({stage, fraction, message, elapsed_s}), or None when
    none runs (never started, finished, or its process gone)."""
    raw = meta.get(key, retry=True)
    if not isinstance(raw, dict):
        return None
    pid, started = raw.get("pid"), raw.get("pid_started")
    here = raw.get("host") == socket.gethostname()
    if here and isinstance(pid, int) and not process_alive(pid, float(started) if isinstance(started, (int, float))
                                                  else None):
        return None
    now = time.time()
    if now - float(raw.get("updated", 0.0)) > STALE_S:
        return None
    return {"stage": str(raw.get("stage", "")), "fraction": float(raw.get("fraction", 0.0)),
            "message": str(raw.get("message", "")),
            "elapsed_s": round(max(0.0, now - float(raw.get("started", now))), 1)}
