"""A reader of diskcache 5.x's on-disk format that writes nothing: how a cache folder that
cannot be written (permissions, read-only mount, full disk) still serves what it stores.

Kept apart from :class:`headgraph.server.cache.folders.SafeCache`, which puts it behind the same API
as a writable :class:`diskcache.Cache`.
"""

from __future__ import annotations

import os
import pickle
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_MODE_RAW, _MODE_BINARY, _MODE_TEXT, _MODE_PICKLE = 1, 2, 3, 4
DBNAME = "cache.db"


class ReadOnlyCache:
    """Reads a diskcache 5.x folder without writing anything (no tables, settings or WAL).

    SQLite is opened with ``mode=ro`` (sees a live writer's WAL), else ``immutable=1`` (a
    folder where not even the ``-shm`` file can be created). Keys of raw types only (str,
    bytes, int, float: what the server uses); a missing ``cache.db`` reads as empty.
    """

    def __init__(self, directory: str | Path, *, empty: bool = False) -> None:
        self._directory = str(directory)
        self._db = Path(self._directory, DBNAME)
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
