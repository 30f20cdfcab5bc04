"""Why a cache write failed, in one line that names no absolute path.

:func:`write_failure_reason` reads an exception chain (OSError errnos, SQLite result codes and
messages) as a read-only folder, a full disk, an unwritable folder, a damaged index or a lock
that was never released; :func:`probe_write` asks a folder whether it can take a new file now;
:func:`diagnose` makes SQLite's bare "disk I/O error" precise with such a probe; :func:`is_corruption` tells a damaged index database (moved aside and rebuilt by
:func:`headgraph.server.cache.folders.open_cache`); :func:`scrub` takes absolute paths out of a
message. Kept apart from the cache code that acts on these reasons.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

from headgraph.server.errors import CacheUnavailable, one_line

READ_ONLY = "the cache folder is read-only (cannot store new results): {}"
FULL = "the cache disk is full (cannot store new results): {}"
NOT_WRITABLE = "the cache folder cannot be written (cannot store new results): {}"
DAMAGED = "the cache index database is damaged (cannot store new results): {}"
LOCKED = "the cache database stayed locked (cannot store new results): {}"
_NOT_WRITABLE_PREFIX = NOT_WRITABLE.split(" (")[0]

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


PROBE_BYTES = 1 << 16


def probe_write(directory: str | Path, *, sync: bool = False) -> str | None:
    """Why ``directory`` cannot take a new file now (read-only, full disk, unwritable), or
    None when a PROBE_BYTES probe file can be written there (and deleted). Cheap enough to ask
    before a cold computation, so one whose result could not be kept is refused before it
    runs; ``sync`` also fsyncs it (for filesystems that report a full disk only then)."""
    probe = Path(directory, f".write-probe-{os.getpid()}-{threading.get_ident()}")
    try:
        with open(probe, "wb") as f:
            f.write(bytes(PROBE_BYTES))
            f.flush()
            if sync:
                os.fsync(f.fileno())
    except OSError as err:
        return write_failure_reason(err) or NOT_WRITABLE.format(err.strerror or type(err).__name__)
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    return None


def diagnose(directory: str | Path, reason: str) -> str:
    """``reason`` made precise where SQLite said only "disk I/O error" (it drops the errno):
    a probe file written in ``directory`` (``probe_write``) tells a full disk (ENOSPC, EFBIG,
    EDQUOT) or a read-only folder from other I/O errors."""
    if not reason.startswith(_NOT_WRITABLE_PREFIX):
        return reason
    return probe_write(directory, sync=True) or reason
