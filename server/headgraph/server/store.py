"""Persistent result store (diskcache) with cross-process single-flight, plus a model LRU.

Two caches live under the cache folder:

- ``results/``: computed values (plain dicts of numpy arrays / JSON-able data), keyed by
  model fingerprint + computation name + parameters + COMPUTE_VERSION, bounded in size with
  least-recently-stored eviction;
- ``meta/``: never evicted: per-key compute counters, single-flight locks, job states,
  model fingerprints and uploaded label sets.

Single-flight: a cold key requested by many threads of many worker processes is computed
once. Threads of one process queue on an in-process lock; one thread per process then takes
a diskcache lock whose entry expires unless its holder keeps refreshing it, so a killed
holder never blocks a key for longer than ``lock_expire_s``. The value is computed fully and
then written with one ``set``: a crash mid-compute leaves no partial entry.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar
from urllib.parse import urlencode

import diskcache

from headgraph.core.types import COMPUTE_VERSION

log = logging.getLogger("headgraph.store")

T = TypeVar("T")
_MISSING = object()  # sentinel for "no entry" (immutable; never mutated)
TOTAL_COUNTER = "count:__total__"


def _read(cache: diskcache.Cache, key: str, default: Any) -> Any:
    """``cache.get`` as one value (diskcache's inferred return type is a union of tuples)."""
    return cache.get(key, default=default, retry=True)


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


class KeyedLocks:
    """In-process mutexes per key, dropped when nobody holds or waits on them."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[Hashable, tuple[threading.Lock, int]] = {}

    @contextmanager
    def hold(self, key: Hashable) -> Iterator[None]:
        with self._guard:
            lock, users = self._locks.get(key, (threading.Lock(), 0))
            self._locks[key] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._guard:
                lock, users = self._locks[key]
                if users <= 1:
                    del self._locks[key]
                else:
                    self._locks[key] = (lock, users - 1)


class DiskLock:
    """Cross-process lock in a diskcache: an owner token with an expiry the holder refreshes.

    Unlike ``diskcache.Lock`` it never deletes a lock another holder took over after
    expiry, and a holder that dies stops refreshing, so its lock lapses after ``expire_s``.
    """

    def __init__(self, cache: diskcache.Cache, key: str, expire_s: float) -> None:
        self._cache = cache
        self._key = key
        self._expire = expire_s
        self._token = uuid.uuid4().hex
        self._stop = threading.Event()
        self._refresher: threading.Thread | None = None

    def acquire(self) -> None:
        delay = 0.002
        while not self._cache.add(self._key, self._token, expire=self._expire, retry=True):
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        self._stop.clear()
        self._refresher = threading.Thread(target=self._refresh, name=f"lock-refresh {self._key}",
                                           daemon=True)
        self._refresher.start()

    def _refresh(self) -> None:
        while not self._stop.wait(self._expire / 3):
            with self._cache.transact(retry=True):
                if self._cache.get(self._key, retry=True) == self._token:
                    self._cache.touch(self._key, expire=self._expire, retry=True)

    def release(self) -> None:
        self._stop.set()
        if self._refresher is not None:
            self._refresher.join()
        with self._cache.transact(retry=True):
            if self._cache.get(self._key, retry=True) == self._token:
                self._cache.delete(self._key, retry=True)

    def __enter__(self) -> DiskLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class Store:
    """diskcache result store shared by all worker processes using the same folder."""

    def __init__(self, directory: str | Path, *, size_limit: int = 20 << 30,
                 lock_expire_s: float = 30.0) -> None:
        self.directory = Path(directory).expanduser()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.results = diskcache.Cache(str(self.directory / "results"), timeout=60,
                                       size_limit=size_limit,
                                       eviction_policy="least-recently-stored")
        self.meta = diskcache.Cache(str(self.directory / "meta"), timeout=60,
                                    eviction_policy="none")
        self.lock_expire_s = lock_expire_s
        self._local = KeyedLocks()

    # -- plain access -------------------------------------------------------------------
    def get(self, key: str, default: Any = None) -> Any:
        """Cached value or ``default``."""
        value = _read(self.results, key, _MISSING)
        return default if value is _MISSING else value

    def has(self, key: str) -> bool:
        return _read(self.results, key, _MISSING) is not _MISSING

    def put(self, key: str, value: Any) -> None:
        """Write one finished value (one ``set``; raises if diskcache refuses it)."""
        if not self.results.set(key, value, retry=True):
            raise RuntimeError(f"cache refused to store {key}")

    # -- single flight ------------------------------------------------------------------
    def get_or_compute(self, key: str, compute: Callable[[], T]) -> T:
        """Return the cached value of ``key`` or compute it exactly once across processes."""
        value = _read(self.results, key, _MISSING)
        if value is not _MISSING:
            return value
        with self._local.hold(key):
            value = _read(self.results, key, _MISSING)
            if value is not _MISSING:
                return value
            with DiskLock(self.meta, "lock:" + key, self.lock_expire_s):
                value = _read(self.results, key, _MISSING)
                if value is not _MISSING:
                    return value
                started = time.perf_counter()
                value = compute()
                self.put(key, value)
                self.meta.incr("count:" + key, retry=True)
                self.meta.incr(TOTAL_COUNTER, retry=True)
                log.info("computed %s in %.0f ms", key, 1000 * (time.perf_counter() - started))
                return value

    def compute_count(self, key: str | None = None) -> int:
        """Real computations of ``key`` so far (all keys when None), over all processes."""
        return int(_read(self.meta, TOTAL_COUNTER if key is None else "count:" + key, 0))

    def compute_counts(self) -> dict[str, int]:
        """Per-key computation counters."""
        out: dict[str, int] = {}
        for k in self.meta.iterkeys():
            if isinstance(k, str) and k.startswith("count:") and k != TOTAL_COUNTER:
                out[k[len("count:"):]] = int(_read(self.meta, k, 0))
        return out

    # -- bookkeeping --------------------------------------------------------------------
    def cached_names(self) -> dict[str, list[str]]:
        """Fingerprint -> sorted computation names (with parameters) present in the cache."""
        out: dict[str, set[str]] = {}
        for k in self.results.iterkeys():
            parsed = parse_key(k) if isinstance(k, str) else None
            if parsed is not None:
                fp, name, query = parsed
                out.setdefault(fp, set()).add(name + (f"?{query}" if query else ""))
        return {fp: sorted(names) for fp, names in out.items()}

    def stats(self) -> dict[str, Any]:
        """Entry counts, bytes on disk, size bound and the total compute counter."""
        return {
            "directory": str(self.directory),
            "entries": len(self.results),  # pyright: ignore[reportArgumentType]  (diskcache: no stubs)
            "bytes": int(self.results.volume()),
            "size_limit": int(self.results.size_limit),  # pyright: ignore[reportAttributeAccessIssue]
            "computations": self.compute_count(),
        }

    def clear(self, keep_prefixes: tuple[str, ...] = ("labels:",)) -> int:
        """Drop every result, counter, job and fingerprint (uploaded label sets, under
        ``keep_prefixes``, are user data and stay); returns the number of entries removed."""
        removed = int(self.results.clear(retry=True))
        for key in list(self.meta.iterkeys()):
            if not (isinstance(key, str) and key.startswith(keep_prefixes)):
                removed += int(self.meta.delete(key, retry=True))
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

    def peek(self, key: Hashable) -> T | None:
        with self._guard:
            slot = self._items.get(key)
            return None if slot is None else slot.value

    def keys(self) -> list[Hashable]:
        with self._guard:
            return list(self._items)
