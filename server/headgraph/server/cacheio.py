"""Safe access to the diskcache folders under the cache folder: checked values, damaged index
databases moved aside, read-only and full disks turned into one clear reason.

- :func:`encode_value` / :func:`decode_value`: a stored result is ``MAGIC`` (magic + format
  version) + a blake2b digest of the payload + the pickled payload; anything else (flipped
  bytes, a truncated file, an entry of an older format) raises :class:`BadValue`.
- :func:`open_cache`: opens one diskcache sub-folder (``results/``, ``meta/``). A ``cache.db``
  that is not a database (or is malformed) is moved aside to ``<name>.corrupt-<time>`` and a
  fresh one is opened; a folder that cannot be written (permissions, read-only mount, full
  disk) is opened with :class:`ReadOnlyCache`, a reader of diskcache's on-disk format.
- :class:`SafeCache`: the subset of the diskcache API the server uses, over either backend.
  Reads never raise for a damaged entry (a miss, logged); writes that fail because the folder
  is read-only or the disk is full raise :class:`~headgraph.server.errors.CacheUnavailable`
  (503) with a one-line reason that names no absolute path.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import logging
import os
import pickle
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import diskcache

from headgraph.server.errors import CacheUnavailable, one_line

log = logging.getLogger("headgraph.store")

T = TypeVar("T")

# -- value format ------------------------------------------------------------------------------

MAGIC = b"HGV\x01"  # "headgraph value", format version 1
DIGEST_SIZE = 32
HEADER_SIZE = len(MAGIC) + DIGEST_SIZE


class BadValue(Exception):
    """A stored value that is not ours or not intact (the message says which)."""


def _digest(payload: bytes | memoryview) -> bytes:
    return hashlib.blake2b(payload, digest_size=DIGEST_SIZE).digest()


def encode_value(value: Any) -> bytes:
    """``MAGIC`` + blake2b(payload) + payload, payload = ``value`` pickled."""
    payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    return MAGIC + _digest(payload) + payload


def check_value(raw: Any) -> memoryview:
    """The payload of a stored value whose header and digest are intact; BadValue otherwise."""
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise BadValue(f"of an older format ({type(raw).__name__}, not checksummed bytes)")
    view = memoryview(raw)
    if len(view) < HEADER_SIZE or view[: len(MAGIC)] != MAGIC:
        raise BadValue(f"not a checksummed value (no header; {len(view)} bytes)")
    payload = view[HEADER_SIZE:]
    if not hmac.compare_digest(bytes(view[len(MAGIC):HEADER_SIZE]), _digest(payload)):
        raise BadValue(f"damaged (checksum mismatch; {len(view)} bytes)")
    return payload


def decode_value(raw: Any) -> Any:
    """The value stored as ``raw`` by :func:`encode_value`; BadValue when it is not intact or
    cannot be unpickled."""
    payload = check_value(raw)
    try:
        return pickle.loads(payload)
    except Exception as err:  # intact bytes of a class that moved or changed
        raise BadValue(f"not loadable ({type(err).__name__}: {one_line(err, 200)})") from err


# -- failure reasons ---------------------------------------------------------------------------

READ_ONLY = "the cache folder is read-only (cannot store new results): {}"
FULL = "the cache disk is full (cannot store new results): {}"
NOT_WRITABLE = "the cache folder cannot be written (cannot store new results): {}"
DAMAGED = "the cache index database is damaged (cannot store new results): {}"
LOCKED = "the cache database stayed locked (cannot store new results): {}"
_LOCKED_PREFIX, _NOT_WRITABLE_PREFIX = LOCKED.split(" (")[0], NOT_WRITABLE.split(" (")[0]

_FULL_ERRNOS = {errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC)}
_READ_ONLY_ERRNOS = {errno.EROFS, errno.EACCES, errno.EPERM}
# SQLite primary result codes (sqlite3.Error.sqlite_errorcode & 0xff, Python 3.11+)
_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_READONLY, _SQLITE_IOERR = 5, 6, 8, 10
_SQLITE_CORRUPT, _SQLITE_FULL, _SQLITE_CANTOPEN, _SQLITE_NOTADB = 11, 13, 14, 26
_ABS_PATH = re.compile(r"(?<![\w.])(?:/[^/\s'\"]+)+/?")


def scrub(text: str) -> str:
    """``text`` without absolute paths (each one shortened to its last component)."""
    return _ABS_PATH.sub(lambda m: m.group(0).rstrip("/").rsplit("/", 1)[-1], text)


def _chain(err: BaseException) -> Iterator[BaseException]:
    """``err`` and what caused it (``__cause__``, else ``__context__``, even when suppressed)."""
    seen: set[int] = set()
    cur: BaseException | None = err
    while cur is not None and id(cur) not in seen and len(seen) < 16:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or cur.__context__


def _sqlite_code(err: sqlite3.Error) -> int | None:
    code = getattr(err, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None


def is_corruption(err: BaseException) -> bool:
    """A SQLite error saying the database file is not a database or is malformed."""
    for e in _chain(err):
        if isinstance(e, sqlite3.DatabaseError):
            code, msg = _sqlite_code(e), str(e).lower()
            if code in (_SQLITE_CORRUPT, _SQLITE_NOTADB) or "not a database" in msg \
                    or "malformed" in msg:
                return True
    return False


def write_failure_reason(err: BaseException) -> str | None:
    """The one-line reason (no absolute path) why a cache write failed because of the cache
    folder or its disk; None when ``err`` is something else (a bug, a bad value)."""
    for e in _chain(err):
        if isinstance(e, CacheUnavailable):
            return e.message
        if isinstance(e, OSError) and e.errno is not None:
            detail = e.strerror or errno.errorcode.get(e.errno, str(e.errno))
            if e.errno in _FULL_ERRNOS:
                return FULL.format(detail)
            if e.errno in _READ_ONLY_ERRNOS:
                return READ_ONLY.format(detail)
            if e.errno == errno.EIO:
                return NOT_WRITABLE.format(detail)
        if isinstance(e, sqlite3.Error):
            code, msg = _sqlite_code(e), str(e)
            low, detail = msg.lower(), scrub(one_line(msg, 200))
            if code == _SQLITE_FULL or "disk is full" in low:
                return FULL.format(detail)
            if code == _SQLITE_READONLY or "readonly database" in low:
                return READ_ONLY.format(detail)
            if code in (_SQLITE_IOERR, _SQLITE_CANTOPEN) or "disk i/o error" in low \
                    or "unable to open database file" in low:
                return NOT_WRITABLE.format(detail)
            if code in (_SQLITE_CORRUPT, _SQLITE_NOTADB) or "malformed" in low \
                    or "not a database" in low:
                return DAMAGED.format(detail)
            if code in (_SQLITE_BUSY, _SQLITE_LOCKED) or "database is locked" in low:
                return LOCKED.format(detail)
    return None


def diagnose(directory: str | Path, reason: str) -> str:
    """``reason`` made precise where SQLite said only "disk I/O error" (it drops the errno):
    a 64 KiB probe file written in ``directory`` tells a full disk (ENOSPC, EFBIG, EDQUOT)
    or a read-only folder from other I/O errors."""
    if not reason.startswith(_NOT_WRITABLE_PREFIX):
        return reason
    probe = Path(directory, f".write-probe-{os.getpid()}-{threading.get_ident()}")
    try:
        with open(probe, "wb") as f:
            f.write(bytes(1 << 16))
            f.flush()
            os.fsync(f.fileno())
    except OSError as err:
        return write_failure_reason(err) or reason
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    return reason


def _writable(path: Path) -> bool:
    """Whether this process may create files in ``path`` (its closest existing folder)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    kwargs: dict[str, Any] = {"effective_ids": True} if os.access in os.supports_effective_ids else {}
    return os.access(path, os.W_OK, **kwargs)


# -- the read-only reader ----------------------------------------------------------------------

_MODE_RAW, _MODE_BINARY, _MODE_TEXT, _MODE_PICKLE = 1, 2, 3, 4
_DBNAME = "cache.db"


class ReadOnlyCache:
    """Reads a diskcache 5.x folder without writing anything (no tables, settings or WAL).

    SQLite is opened with ``mode=ro`` (sees a live writer's WAL), else ``immutable=1`` (a
    folder where not even the ``-shm`` file can be created). Keys of raw types only (str,
    bytes, int, float: what the server uses); a missing ``cache.db`` reads as empty.
    """

    def __init__(self, directory: str | Path, *, empty: bool = False) -> None:
        self._directory = str(directory)
        self._db = Path(self._directory, _DBNAME)
        self._local = threading.local()
        self._uri: str | None = None
        self._generation = 0  # bumped when the URI changes: threads reconnect
        if not empty and self._db.is_file():
            last: sqlite3.Error | None = None
            for flag in ("mode=ro", "immutable=1"):
                try:
                    self._uri = self._probe(flag)
                    break
                except sqlite3.Error as err:
                    last = err
            if self._uri is None and last is not None:
                raise last

    def _probe(self, flag: str) -> str:
        """The URI opening ``cache.db`` with ``flag``, once a read through it worked."""
        uri = f"{self._db.absolute().as_uri()}?{flag}"
        con = sqlite3.connect(uri, uri=True, timeout=60)
        try:
            con.execute("SELECT key, raw FROM Cache LIMIT 1").fetchall()
            con.execute("SELECT key, value FROM Settings LIMIT 1").fetchall()
        finally:
            con.close()
        return uri

    def _upgrade(self) -> bool:
        """From ``immutable=1`` (blind to a writer's WAL) to ``mode=ro`` once that works (a
        writer now holds the database open: a miss may be what it just stored); whether it
        did. Tried on every miss (a failed probe costs well under a millisecond)."""
        if self._uri is None or not self._uri.endswith("immutable=1"):
            return False
        try:
            self._uri = self._probe("mode=ro")
        except sqlite3.Error:
            return False
        self._generation += 1
        return True

    @property
    def directory(self) -> str:
        return self._directory

    def _con(self) -> sqlite3.Connection | None:
        if self._uri is None:
            return None
        stamp = (os.getpid(), self._generation)
        if getattr(self._local, "stamp", None) != stamp:
            self._local.con = None
            self._local.stamp = stamp
        con = getattr(self._local, "con", None)
        if con is None:
            con = self._local.con = sqlite3.connect(self._uri, uri=True, timeout=60)
        return con

    @staticmethod
    def _db_key(key: Any) -> tuple[Any, int] | None:
        if type(key) in (str, float) or (type(key) is int and -(2**63) <= key < 2**63):
            return key, 1
        if type(key) is bytes:
            return sqlite3.Binary(key), 1
        return None  # pickled keys: not used by the server

    def _row(self, key: Any, columns: str) -> tuple[Any, ...] | None:
        con, db_key = self._con(), self._db_key(key)
        if con is None or db_key is None:
            return None
        select = (f"SELECT {columns} FROM Cache WHERE key = ? AND raw = ?"
                  " AND (expire_time IS NULL OR expire_time > ?)")
        rows = con.execute(select, (*db_key, time.time())).fetchall()
        if not rows and self._upgrade():  # maybe stored by a writer we could not see
            con = self._con()
            assert con is not None
            rows = con.execute(select, (*db_key, time.time())).fetchall()
        return rows[0] if rows else None

    def get(self, key: Any, default: Any = None, retry: bool = False) -> Any:
        row = self._row(key, "mode, filename, value")
        if row is None:
            return default
        mode, filename, value = row
        try:
            if mode == _MODE_RAW:
                return bytes(value) if isinstance(value, memoryview) else value
            if mode == _MODE_PICKLE and value is not None:
                return pickle.loads(value)
            full = os.path.join(self._directory, filename)
            if mode == _MODE_BINARY:
                with open(full, "rb") as f:
                    return f.read()
            if mode == _MODE_TEXT:
                with open(full, encoding="UTF-8") as f:
                    return f.read()
            if mode == _MODE_PICKLE:
                with open(full, "rb") as f:
                    return pickle.load(f)
        except FileNotFoundError:  # as diskcache: the value was deleted meanwhile
            return default
        raise ValueError(f"unknown diskcache value mode {mode!r}")

    def __contains__(self, key: Any) -> bool:
        return self._row(key, "rowid") is not None

    def iterkeys(self, reverse: bool = False) -> Iterator[Any]:
        con = self._con()
        if con is None:
            return
        order = "DESC" if reverse else "ASC"
        rows = con.execute(f"SELECT key, raw FROM Cache ORDER BY key {order}, raw {order}").fetchall()
        for key, raw in rows:
            yield (bytes(key) if isinstance(key, memoryview) else key) if raw else pickle.loads(key)

    def _setting(self, name: str, default: Any) -> Any:
        con = self._con()
        if con is None:
            return default
        rows = con.execute("SELECT value FROM Settings WHERE key = ?", (name,)).fetchall()
        return rows[0][0] if rows else default

    def __len__(self) -> int:
        return int(self._setting("count", 0))

    def volume(self) -> int:
        con = self._con()
        if con is None:
            return 0
        ((pages,),) = con.execute("PRAGMA page_count").fetchall()
        ((page_size,),) = con.execute("PRAGMA page_size").fetchall()
        return int(pages) * int(page_size) + int(self._setting("size", 0))

    @property
    def size_limit(self) -> int:
        return int(self._setting("size_limit", 0))

    def close(self) -> None:
        con = getattr(self._local, "con", None)
        if con is not None:
            con.close()
            self._local.con = None


# -- the wrapper ---------------------------------------------------------------------------------

_READ_ERRORS = (OSError, EOFError, sqlite3.Error, diskcache.Timeout, pickle.UnpicklingError,
                ValueError, TypeError, AttributeError, ImportError, IndexError, KeyError)


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
        """The stored value, or ``default`` when missing or unreadable (logged)."""
        try:
            return self.read(key, default)
        except _READ_ERRORS as err:
            log.warning("%s: cannot read %r (%s: %s): treated as missing", self.name, key,
                        type(err).__name__, one_line(err, 200))
            return default

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
        try:
            return bool(self._write(f"storing {key!r}",
                                    lambda c: c.set(key, value, expire=expire, tag=tag,
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
    if not _writable(path) or not _writable(path / _DBNAME):
        reason = READ_ONLY.format(f"no write permission in {name}/")
    elif reason is None:
        raise failure
    else:
        reason = diagnose(path if path.is_dir() else directory, reason)
    return _read_only(path, name, reason, lambda: _open_writable(path, settings))
