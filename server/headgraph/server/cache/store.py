"""Persistent result store (diskcache) with cross-process single-flight, plus a model LRU.

Two caches live under the cache folder:

- ``results/``: computed values (plain dicts of numpy arrays / JSON-able data), keyed by
  model fingerprint + computation name + parameters + COMPUTE_VERSION, bounded in size with
  least-recently-stored eviction;
- ``meta/``: never evicted: per-key compute counters, single-flight locks, job states,
  model fingerprints and uploaded label sets.

A cache that cannot lie: every result is stored as checksummed bytes (server/cache/values.py:
header + blake2b digest + pickle); a value that fails its check, cannot be read or is of an
older format is a miss (logged, deleted, recomputed), never an answer. A damaged index
database is moved aside and rebuilt when the store opens; a folder that cannot be written
(permissions, read-only mount, full disk) opens read-only: stored results are still served,
and storing a new one raises CacheUnavailable (503) with the reason.

Single-flight: a cold key requested by many threads of many worker processes is computed
once. Threads of one process queue on an in-process lock; one thread per process then takes
a diskcache lock whose entry expires unless its holder keeps refreshing it, so a killed
holder never blocks a key for longer than ``lock_expire_s`` (and a holder on this host whose
process is gone is taken over at once; both locks: server.cache.locks). The value is
computed fully and then written with one ``set``: a crash mid-compute leaves no partial entry.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar
from urllib.parse import urlencode


from headgraph.core.types import COMPUTE_VERSION
from headgraph.server.cache.folders import open_cache
from headgraph.server.cache.locks import DiskLock, KeyedLocks
from headgraph.server.cache.values import BadValue, check_value, decode_value, encode_value
from headgraph.server.cache.write_errors import probe_write
from headgraph.server.errors import CacheUnavailable, one_line

log = logging.getLogger("headgraph.store")

T = TypeVar("T")
_MISSING = object()  # sentinel for "no entry" (immutable; never mutated)
TOTAL_COUNTER = "count:__total__"
# meta entries that are memos (the catalog's model identities, relearnt by loading the
# model): not storing one on a read-only or full cache is no error, it stays in memory
OPTIONAL_META = ("model:", "failed:")
# meta entries that are records (everything but counters and lock tokens): checksummed
CHECKED_META = ("labels:", "tasks:", "model:", "failed:", "job:", "jobkey:", "jobs:", "sweep:")
FAILED = "failed:"  # meta prefix: a computation the model cannot do, remembered until a retry


def make_key(fingerprint: str, name: str, params: Mapping[str, Any] | None = None) -> str:
    """Cache key ``v{COMPUTE_VERSION}/{fingerprint}/{name}?{sorted params}``."""
    query = urlencode(sorted((k, str(v)) for k, v in (params or {}).items()))
    return f"v{COMPUTE_VERSION}/{fingerprint}/{name}" + (f"?{query}" if query else "")


def parse_key(key: str) -> tuple[str, str, str] | None:
    """(fingerprint, name, query) of a key made by :func:`make_key` for this version."""
    prefix = f"v{COMPUTE_VERSION}/"
    if not isinstance(key, str) or not key.startswith(prefix):
        return None
    parts = key[len(prefix):].split("/", 1)
    if len(parts) != 2:
        return None
    name, _, query = parts[1].partition("?")
    return parts[0], name, query


class Store:
    """diskcache result store shared by all worker processes using the same folder.

    ``before_write``: called (no arguments) right before every result write; it may raise to
    refuse the write (compute processes refuse once their API process is gone).
    ``read_only_reason``: why new results cannot be stored (None when they can).
    """

    before_write: Callable[[], None] | None = None

    def __init__(self, directory: str | Path, *, size_limit: int = 20 << 30,
                 lock_expire_s: float = 30.0) -> None:
        self.directory = Path(directory).expanduser()
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as err:  # opened read-only (empty) below, with the reason
            log.warning("cache folder cannot be created: %s", one_line(err))
        self.results = open_cache(self.directory, "results", timeout=60, size_limit=size_limit,
                                  eviction_policy="least-recently-stored")
        self.meta = open_cache(self.directory, "meta", timeout=60, eviction_policy="none")
        self.meta.optional_prefixes = OPTIONAL_META
        self.meta.checked_prefixes = CHECKED_META
        self.lock_expire_s = lock_expire_s
        self.before_write: Callable[[], None] | None = None
        self._local = KeyedLocks()

    @property
    def read_only_reason(self) -> str | None:
        """Why new results cannot be stored now (read-only folder, full disk), else None."""
        return self.results.unavailable() or self.meta.unavailable()

    def cannot_store(self) -> str | None:
        """Why a result computed now could not be stored: ``read_only_reason``, or what a probe
        write in the results folder finds (a folder made read-only or a disk filled since the
        store opened shows only when a file is written); None when it could. Asked before a
        cold computation (and before loading a model for one), so it is refused before it
        runs, not after."""
        return self.read_only_reason or probe_write(self.results.directory)

    # -- checked values -----------------------------------------------------------------
    def _raw(self, key: str) -> Any:
        """The stored bytes of ``key`` (``_MISSING``: none); ``BadValue`` when unreadable."""
        try:
            raw = self.results.read(key, _MISSING)
        except Exception as err:  # OSError, sqlite3.DatabaseError, an old-format pickle...
            raise BadValue(f"unreadable ({type(err).__name__}: {one_line(err, 200)})") from err
        if raw is _MISSING and key in self.results:  # listed, but its value file is gone
            raise BadValue("unreadable (its value file is missing)")
        return raw

    def _bad(self, key: str, err: BadValue) -> None:
        """Log a damaged entry and delete it if it is still the same one."""
        log.warning("cached value %s is %s: treated as a miss (recomputed)", key, err)
        if self.results.read_only_reason is not None:
            return
        try:
            if self.before_write is not None:
                self.before_write()
            with self.results.transact():
                try:
                    check_value(self.results.read(key, _MISSING))
                except Exception:
                    pass  # still damaged or unreadable (or gone)
                else:
                    return  # replaced by a good value meanwhile
                self.results.delete(key)
        except Exception as exc:  # best effort: the next put replaces it anyway
            log.warning("damaged entry %s not deleted: %s: %s", key, type(exc).__name__,
                        one_line(exc, 200))

    def _load(self, key: str) -> Any:
        """The checked value of ``key``, or ``_MISSING`` (absent or damaged: logged, deleted)."""
        try:
            raw = self._raw(key)
            return raw if raw is _MISSING else decode_value(raw)
        except BadValue as err:
            self._bad(key, err)
            return _MISSING

    # -- plain access -------------------------------------------------------------------
    def get(self, key: str, default: Any = None) -> Any:
        """Cached value or ``default`` (also for a damaged entry, which is logged and deleted)."""
        value = self._load(key)
        return default if value is _MISSING else value

    def has(self, key: str) -> bool:
        """Whether ``key`` holds an intact value (its checksum is verified, not unpickled)."""
        try:
            raw = self._raw(key)
            if raw is _MISSING:
                return False
            check_value(raw)
            return True
        except BadValue as err:
            self._bad(key, err)
            return False

    def put(self, key: str, value: Any) -> None:
        """Write one finished value (one ``set``); CacheUnavailable when the cache cannot
        store it (read-only folder, full disk), or whatever ``before_write`` raises."""
        data = encode_value(value)
        if self.before_write is not None:
            self.before_write()
        if not self.results.set(key, data):
            raise RuntimeError(f"cache refused to store {key}")

    # -- single flight ------------------------------------------------------------------
    def _count(self, key: str) -> None:
        try:
            self.meta.incr("count:" + key)
            self.meta.incr(TOTAL_COUNTER)
        except CacheUnavailable as err:  # bookkeeping only: the value is stored
            log.warning("compute counter of %s not updated: %s", key, err.message)

    def get_or_compute(self, key: str, compute: Callable[[], T]) -> T:
        """Return the cached value of ``key`` or compute it exactly once across processes.

        CacheUnavailable (nothing computed) when the cache cannot store new results
        (``cannot_store``), or (after computing) when storing it fails for that reason."""
        value = self._load(key)
        if value is not _MISSING:
            return value
        reason = self.cannot_store()
        if reason is not None:  # nothing computed could be kept: no lock, no work
            raise CacheUnavailable(reason)
        with self._local.hold(key):
            value = self._load(key)
            if value is not _MISSING:
                return value
            with DiskLock(self.meta, "lock:" + key, self.lock_expire_s):
                value = self._load(key)
                if value is not _MISSING:
                    return value
                started = time.perf_counter()
                value = compute()
                self.put(key, value)
                self._count(key)
                log.info("computed %s in %.0f ms", key, 1000 * (time.perf_counter() - started))
                return value

    def compute_count(self, key: str | None = None) -> int:
        """Real computations of ``key`` so far (all keys when None), over all processes."""
        value = self.meta.get(TOTAL_COUNTER if key is None else "count:" + key, 0)
        return int(value) if isinstance(value, int) else 0

    def compute_counts(self) -> dict[str, int]:
        """Per-key computation counters."""
        out: dict[str, int] = {}
        for k in list(self.meta.iterkeys()):
            if isinstance(k, str) and k.startswith("count:") and k != TOTAL_COUNTER:
                value = self.meta.get(k, 0)
                out[k[len("count:"):]] = int(value) if isinstance(value, int) else 0
        return out

    # -- bookkeeping --------------------------------------------------------------------
    def cached_names(self) -> dict[str, list[str]]:
        """Fingerprint -> sorted computation names (with parameters) present in the cache
        (listed keys; a damaged value shows until it is read)."""
        out: dict[str, set[str]] = {}
        for k in list(self.results.iterkeys()):
            parsed = parse_key(k) if isinstance(k, str) else None
            if parsed is not None:
                fp, name, query = parsed
                out.setdefault(fp, set()).add(name + (f"?{query}" if query else ""))
        return {fp: sorted(names) for fp, names in out.items()}

    def stats(self) -> dict[str, Any]:
        """Entry counts, bytes on disk, size bound and the total compute counter; the cache
        folder by its name only (no server path goes to clients)."""
        return {
            "directory": self.directory.name,
            "entries": len(self.results),
            "bytes": self.results.volume(),
            "size_limit": self.results.size_limit,
            "computations": self.compute_count(),
        }

    # -- computations a model cannot do ------------------------------------------------------
    def failure(self, key: str) -> dict[str, str] | None:
        """{"cls": the core error's class name, "message"} of a remembered failure of ``key``
        (None: none)."""
        raw = self.meta.get(FAILED + key, retry=True)
        return raw if isinstance(raw, dict) else None

    def remember_failure(self, key: str, cls: str, message: str) -> None:
        """Remember that computing ``key`` failed for a reason of the model's (not of this
        server's): the same error is answered at once until ``forget_failures``."""
        self.meta.set(FAILED + key, {"cls": cls, "message": message}, retry=True)

    def forget_failures(self, fingerprint: str) -> int:
        """Forget the remembered failures of one model (a user asked to compute it again)."""
        removed = 0
        for key in list(self.meta.iterkeys()):
            if isinstance(key, str) and key.startswith(FAILED):
                parsed = parse_key(key[len(FAILED):])
                if parsed is not None and parsed[0] == fingerprint:
                    removed += int(self.meta.delete(key, retry=True))
        return removed

    def clear(self, keep_prefixes: tuple[str, ...] = ("labels:",)) -> int:
        """Drop every result, counter, job and fingerprint (uploaded label sets, under
        ``keep_prefixes``, are user data and stay); returns the number of entries removed."""
        if self.before_write is not None:
            self.before_write()
        removed = self.results.clear()
        for key in list(self.meta.iterkeys()):
            if not (isinstance(key, str) and key.startswith(keep_prefixes)):
                removed += int(self.meta.delete(key))
        return removed

    def close(self) -> None:
        self.results.close()
        self.meta.close()


@dataclass
class _Slot(Generic[T]):
    value: T


class ModelLRU(Generic[T]):
    """Per-process LRU of loaded models keyed by (spec, processing, device); loads once."""

    def __init__(self, capacity: int = 2) -> None:
        self.capacity = max(1, capacity)
        self._items: OrderedDict[Hashable, _Slot[T]] = OrderedDict()
        self._guard = threading.Lock()
        self._loading = KeyedLocks()

    def get(self, key: Hashable, load: Callable[[], T]) -> T:
        with self._guard:
            slot = self._items.get(key)
            if slot is not None:
                self._items.move_to_end(key)
                return slot.value
        with self._loading.hold(key):
            with self._guard:
                slot = self._items.get(key)
                if slot is not None:
                    return slot.value
            value = load()
            with self._guard:
                self._items[key] = _Slot(value)
                self._items.move_to_end(key)
                while len(self._items) > self.capacity:
                    self._items.popitem(last=False)
            return value

    def keys(self) -> list[Hashable]:
        with self._guard:
            return list(self._items)
