"""Safe access to the diskcache folders under the cache folder: damaged index databases moved
aside, read-only and full disks turned into one clear reason.

- :func:`open_cache`: opens one diskcache sub-folder (``results/``, ``meta/``). A ``cache.db``
  that is not a database (or is malformed) is moved aside to ``<name>.corrupt-<time>`` and a
  fresh one is opened; a folder that cannot be written (permissions, read-only mount, full
  disk) is opened with :class:`~headgraph.server.cache.diskcache_reader.ReadOnlyCache`, a reader of
  diskcache's on-disk format.
- :class:`SafeCache`: the subset of the diskcache API the server uses, over either backend.
  Reads never raise for a damaged entry (a miss, logged); writes that fail because the folder
  is read-only or the disk is full raise :class:`~headgraph.server.errors.CacheUnavailable`
  (503) with a one-line reason that names no absolute path
  (:mod:`headgraph.server.cache.write_errors`).

Stored values are checksummed by :mod:`headgraph.server.cache.values`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import diskcache

from headgraph.server.cache.diskcache_reader import DBNAME, ReadOnlyCache
from headgraph.server.cache.values import BadValue, decode_value, encode_value
from headgraph.server.cache.write_errors import (
    LOCKED,
    READ_ONLY,
    diagnose,
    is_corruption,
    write_failure_reason,
)
from headgraph.server.errors import CacheUnavailable, one_line

log = logging.getLogger("headgraph.store")

T = TypeVar("T")

# -- the wrapper ---------------------------------------------------------------------------------

_ABSENT = object()
_READ_ERRORS = (OSError, EOFError, sqlite3.Error, diskcache.Timeout, pickle.UnpicklingError,
                ValueError, TypeError, AttributeError, ImportError, IndexError, KeyError)
_LOCKED_PREFIX = LOCKED.split(" (")[0]


class SafeCache:
    """One diskcache folder (writable :class:`diskcache.Cache` or :class:`ReadOnlyCache`)
    behind the subset of the diskcache API the server uses.

    Reads: a value that cannot be read is ``default`` (logged). Writes: ``CacheUnavailable``
    with the reason when the folder is read-only (``read_only_reason``) or a write fails
    because the folder or disk cannot take it; SQLite busy timeouts are retried for a while
    (diskcache's own ``retry=True`` would spin forever on a database that refuses writes);
    ``set`` of a key under ``optional_prefixes`` (memos rebuilt when missing) is skipped then.
    The ``retry`` arguments are accepted for compatibility and ignored. A read-only cache
    given ``reopen`` tries to become writable again at most every ``reopen_s`` seconds
    (space freed, permissions fixed).
    """

    def __init__(self, name: str, backend: diskcache.Cache | ReadOnlyCache,
                 read_only_reason: str | None = None, *,
                 reopen: Callable[[], diskcache.Cache] | None = None, reopen_s: float = 10.0,
                 busy_s: float = 120.0) -> None:
        self.name = name
        self.optional_prefixes: tuple[str, ...] = ()
        # keys whose values are records (label sets, jobs, model identities): stored with a
        # checksum (``cache.values``) and read back only when intact
        self.checked_prefixes: tuple[str, ...] = ()
        self.backend = backend
        self.read_only_reason = read_only_reason
        self.busy_s = busy_s
        self._reopen = reopen
        self.reopen_s = reopen_s
        self._last_try = time.monotonic()
        self._reopen_guard = threading.Lock()

    @property
    def directory(self) -> str:
        return str(self.backend.directory)

    def unavailable(self) -> str | None:
        """Why this cache cannot be written now (None: it can); a read-only one given
        ``reopen`` is tried again first when its last try is ``reopen_s`` old."""
        if self.read_only_reason is None or self._reopen is None \
                or time.monotonic() - self._last_try < self.reopen_s:
            return self.read_only_reason
        with self._reopen_guard:
            if self.read_only_reason is not None \
                    and time.monotonic() - self._last_try >= self.reopen_s:
                self._last_try = time.monotonic()
                try:
                    backend = self._reopen()
                except Exception as err:
                    log.debug("%s: still read-only (%s: %s)", self.name, type(err).__name__,
                              one_line(err, 200))
                else:
                    self.backend, self.read_only_reason = backend, None
                    log.warning("%s: the cache can be written again", self.name)
        return self.read_only_reason

    # -- reads --------------------------------------------------------------------------------
    def read(self, key: Any, default: Any = None) -> Any:
        """The stored value or ``default``; raises what the backend raises (for callers that
        tell "missing" from "unreadable")."""
        if self.read_only_reason is not None:
            self.unavailable()  # writable again (space freed)? then read what writers stored
        backend = self.backend
        if isinstance(backend, ReadOnlyCache):
            return backend.get(key, default)
        return backend.get(key, default=default, retry=False)

    def get(self, key: Any, default: Any = None, retry: bool = True) -> Any:
        """The stored value, or ``default`` when missing or unreadable (logged). A record
        (``checked_prefixes``) whose checksum fails is missing too (logged); one stored before
        records were checksummed (a plain dict, list or string) is read as it is."""
        try:
            raw = self.read(key, _ABSENT)
        except _READ_ERRORS as err:
            log.warning("%s: cannot read %r (%s: %s): treated as missing", self.name, key,
                        type(err).__name__, one_line(err, 200))
            return default
        if raw is _ABSENT:
            return default
        if not self._checked(key):
            return raw
        if isinstance(raw, (dict, list, str, int, float)):  # a record from before checksums
            return raw
        try:
            return decode_value(raw)
        except BadValue as err:
            log.warning("%s: record %r is %s: treated as missing", self.name, key, err)
            return default

    def _checked(self, key: Any) -> bool:
        return bool(self.checked_prefixes) and isinstance(key, str) \
            and key.startswith(self.checked_prefixes)

    def __contains__(self, key: Any) -> bool:
        try:
            return key in self.backend
        except _READ_ERRORS as err:
            log.warning("%s: cannot look up %r (%s: %s)", self.name, key, type(err).__name__,
                        one_line(err, 200))
            return False

    def iterkeys(self, reverse: bool = False) -> Iterator[Any]:
        """Stored keys; stops (logged) at an index error or a key that cannot be decoded."""
        try:
            yield from self.backend.iterkeys(reverse=reverse)
        except _READ_ERRORS as err:
            log.warning("%s: listing keys stopped (%s: %s)", self.name, type(err).__name__,
                        one_line(err, 200))

    def __len__(self) -> int:
        try:
            return int(len(self.backend))  # pyright: ignore[reportArgumentType]  (diskcache: no stubs)
        except _READ_ERRORS:
            return 0

    def volume(self) -> int:
        try:
            return int(self.backend.volume())
        except _READ_ERRORS:
            return 0

    @property
    def size_limit(self) -> int:
        try:
            return int(self.backend.size_limit)  # pyright: ignore[reportAttributeAccessIssue]
        except _READ_ERRORS:
            return 0

    # -- writes -------------------------------------------------------------------------------
    def _writer(self) -> diskcache.Cache:
        reason = self.unavailable()
        backend = self.backend
        if reason is not None or not isinstance(backend, diskcache.Cache):
            raise CacheUnavailable(reason or READ_ONLY.format("opened read-only"))
        return backend

    def _rollback(self, cache: diskcache.Cache) -> None:
        """End a transaction a failed COMMIT left open (diskcache does not), so this
        connection neither keeps the write lock nor fails its next BEGIN."""
        if getattr(cache, "_txn_id", None) == threading.get_ident():
            return  # inside an outer transact() of this thread: it rolls back
        con = getattr(getattr(cache, "_local", None), "con", None)
        if isinstance(con, sqlite3.Connection) and con.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                con.execute("ROLLBACK")

    def _failed(self, what: str, err: Exception, cache: diskcache.Cache) -> Exception:
        """The exception to raise for a failed write: CacheUnavailable with the reason, or
        ``err`` itself when the folder and disk are not the cause."""
        self._rollback(cache)
        if isinstance(err, CacheUnavailable):
            return err
        reason = write_failure_reason(err)
        if reason is None:
            return err
        reason = diagnose(self.directory, reason)
        log.warning("%s: %s failed: %s", self.name, what, reason)
        return CacheUnavailable(reason)

    def _write(self, what: str, op: Callable[[diskcache.Cache], T]) -> T:
        cache = self._writer()
        deadline = time.monotonic() + self.busy_s
        while True:
            try:
                return op(cache)
            except diskcache.Timeout as err:  # BEGIN IMMEDIATE failed: busy 60 s, or refused
                reason = write_failure_reason(err)
                if (reason is None or reason.startswith(_LOCKED_PREFIX)) \
                        and time.monotonic() < deadline:
                    self._rollback(cache)
                    time.sleep(0.05)
                    continue
                self._rollback(cache)
                log.warning("%s: %s failed: %s", self.name, what, reason or "timed out")
                raise CacheUnavailable(reason or LOCKED.format("timed out")) from err
            except Exception as err:
                out = self._failed(what, err, cache)
                if out is err:
                    raise
                raise out from err

    def set(self, key: Any, value: Any, expire: float | None = None, tag: str | None = None,
            retry: bool = True) -> bool:
        """Store ``value``; a key under ``optional_prefixes`` that cannot be stored now is
        skipped (False) instead of raising CacheUnavailable."""
        stored = encode_value(value) if self._checked(key) else value
        try:
            return bool(self._write(f"storing {key!r}",
                                    lambda c: c.set(key, stored, expire=expire, tag=tag,
                                                    retry=False)))
        except CacheUnavailable as err:
            if not (isinstance(key, str) and key.startswith(self.optional_prefixes)):
                raise
            log.info("%s: %s not stored (a memo, kept in memory): %s", self.name, key,
                     err.message)
            return False

    def add(self, key: Any, value: Any, expire: float | None = None, tag: str | None = None,
            retry: bool = True) -> bool:
        return bool(self._write(f"adding {key!r}",
                                lambda c: c.add(key, value, expire=expire, tag=tag, retry=False)))

    def incr(self, key: Any, delta: int = 1, default: int = 0, retry: bool = True) -> int:
        return int(self._write(f"incrementing {key!r}",
                               lambda c: c.incr(key, delta, default, retry=False)))

    def touch(self, key: Any, expire: float | None = None, retry: bool = True) -> bool:
        return bool(self._write(f"touching {key!r}",
                                lambda c: c.touch(key, expire=expire, retry=False)))

    def delete(self, key: Any, retry: bool = True) -> bool:
        return bool(self._write(f"deleting {key!r}", lambda c: c.delete(key, retry=False)))

    def clear(self, retry: bool = True) -> int:
        return int(self._write("clearing", lambda c: c.clear(retry=False)))

    @contextlib.contextmanager
    def transact(self, retry: bool = True) -> Iterator[None]:
        """diskcache's write transaction; CacheUnavailable when it cannot be had or committed.
        An exception in the block rolls back and is re-raised as it was."""
        stack = contextlib.ExitStack()

        def begin(c: diskcache.Cache) -> diskcache.Cache:
            stack.enter_context(c.transact(retry=False))
            return c

        cache = self._write("starting a transaction", begin)
        try:
            yield
        except BaseException as err:
            try:
                stack.__exit__(type(err), err, err.__traceback__)  # ROLLBACK
            except Exception:  # one SQLite had already done itself
                self._rollback(cache)
            raise
        try:
            stack.close()  # COMMIT
        except Exception as err:
            out = self._failed("committing", err, cache)
            if out is err:
                raise
            raise out from err

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self.backend.close()


# -- opening -------------------------------------------------------------------------------------

def _writable(path: Path) -> bool:
    """Whether this process may create files in ``path`` (its closest existing folder)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    kwargs: dict[str, Any] = {"effective_ids": True} if os.access in os.supports_effective_ids else {}
    return os.access(path, os.W_OK, **kwargs)


def _probe(cache: diskcache.Cache) -> None:
    """Read the index once (a header that diskcache's open did not touch fails here)."""
    cache._sql("SELECT key, raw FROM Cache ORDER BY rowid LIMIT 1").fetchall()  # pyright: ignore[reportPrivateUsage]


def _open_writable(path: Path, settings: dict[str, Any]) -> diskcache.Cache:
    cache = diskcache.Cache(str(path), **settings)
    try:
        _probe(cache)
    except BaseException:
        with contextlib.suppress(Exception):
            cache.close()
        raise
    return cache


@contextlib.contextmanager
def _repair_lock(directory: Path) -> Iterator[None]:
    """An exclusive lock on ``directory/.repair.lock`` (processes opening the same folder
    repair it one at a time); no lock where files cannot be created or locked."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield
        return
    try:
        f = open(directory / ".repair.lock", "a+b")  # noqa: SIM115 - held for the block
    except OSError:
        yield
        return
    with f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        except OSError:
            pass
        yield


def _move_aside(directory: Path, name: str, err: BaseException, settings: dict[str, Any]
                ) -> diskcache.Cache:
    path = directory / name
    with _repair_lock(directory):
        try:  # another process may have repaired it while we waited
            return _open_writable(path, settings)
        except Exception as again:
            if not is_corruption(again):
                raise
        aside = directory / f"{name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        os.rename(path, aside)
        log.error("cache %s/ was damaged (%s: %s): moved aside to %s; starting a fresh one "
                  "(its entries will be recomputed)", name, type(err).__name__,
                  one_line(err, 200), aside)
        return _open_writable(path, settings)


def _read_only(path: Path, name: str, reason: str, reopen: Callable[[], diskcache.Cache]
               ) -> SafeCache:
    try:
        reader = ReadOnlyCache(path)
    except sqlite3.Error as err:
        log.error("cache %s/ cannot be read either (%s: %s): every result is cold", name,
                  type(err).__name__, one_line(err, 200))
        reader = ReadOnlyCache(path, empty=True)
    log.warning("cache %s/ opened read-only, serving what is stored and refusing new "
                "results: %s", name, reason)
    return SafeCache(name, reader, read_only_reason=reason, reopen=reopen)


def open_cache(directory: Path, name: str, **settings: Any) -> SafeCache:
    """Open ``directory/name`` as a :class:`SafeCache`: writable when possible, its index
    moved aside and rebuilt when damaged, read-only (with the reason) when it cannot be
    written."""
    path = directory / name
    try:
        return SafeCache(name, _open_writable(path, settings))
    except Exception as err:
        failure: BaseException = err
    if is_corruption(failure):
        try:
            return SafeCache(name, _move_aside(directory, name, failure, settings))
        except Exception as err:
            failure = err
    reason = write_failure_reason(failure)
    if not _writable(path) or not _writable(path / DBNAME):
        reason = READ_ONLY.format(f"no write permission in {name}/")
    elif reason is None:
        raise failure
    else:
        reason = diagnose(path if path.is_dir() else directory, reason)
    return _read_only(path, name, reason, lambda: _open_writable(path, settings))
