"""Locks of the result store's single flight: in-process mutexes per key (``KeyedLocks``) and
a cross-process lock in the cache folder (``DiskLock``) whose owner token names its holder,
so a killed holder never blocks a key for longer than its expiry and a dead holder on this
host is taken over at once.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Hashable, Iterator
from contextlib import contextmanager

import psutil

from headgraph.server.cache.folders import SafeCache
from headgraph.server.errors import one_line

log = logging.getLogger("headgraph.store")


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


# -- lock owners --------------------------------------------------------------------------------

def _host_id() -> str:
    """This host, as lock tokens name it: host name plus the PID namespace (containers that
    share a host name and a cache folder still tell their processes apart)."""
    try:
        ns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        ns = 0
    return f"{socket.gethostname()}/{ns}".replace("|", "_")


_HOST = _host_id()


def _start_time(pid: int) -> float | None:
    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.Error, OSError):
        return None


def _holder_alive(host: str, pid: int, started: float) -> bool:
    """False only when the holder is surely gone: same host, and its pid is free, a zombie,
    or another process (different start time: the pid was reused)."""
    if host != _HOST:
        return True  # cannot tell: wait for the expiry
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return abs(float(proc.create_time()) - started) < 0.05
    except psutil.NoSuchProcess:
        return False
    except (psutil.Error, OSError):
        return True


def lock_token(pid: int | None = None) -> str:
    """``host|pid|start time|random`` of process ``pid`` (default: this one): who holds a
    DiskLock, so a dead holder is recognised."""
    pid = os.getpid() if pid is None else pid
    return f"{_HOST}|{pid}|{_start_time(pid) or 0.0:.6f}|{uuid.uuid4().hex}"


def parse_token(token: object) -> tuple[str, int, float] | None:
    """(host, pid, start time) of a :func:`lock_token`; None for anything else."""
    if not isinstance(token, str):
        return None
    parts = token.split("|")
    if len(parts) != 4:
        return None
    try:
        return parts[0], int(parts[1]), float(parts[2])
    except ValueError:
        return None


class DiskLock:
    """Cross-process lock in a diskcache: an owner token with an expiry the holder refreshes.

    Unlike ``diskcache.Lock`` it never deletes a lock another holder took over after
    expiry, and a holder that dies stops refreshing, so its lock lapses after ``expire_s``;
    a holder on this host whose process no longer exists (or whose pid now belongs to
    another process) is taken over at once. The token names the holder (:func:`lock_token`).
    """

    def __init__(self, cache: SafeCache, key: str, expire_s: float) -> None:
        self._cache = cache
        self._key = key
        self._expire = expire_s
        self._token = lock_token()
        self._stop = threading.Event()
        self._refresher: threading.Thread | None = None

    def _take_over_dead_holder(self) -> bool:
        """Delete the lock when its holder is a dead process of this host; whether it did."""
        holder = self._cache.get(self._key)
        owner = parse_token(holder)
        if owner is None or _holder_alive(*owner):
            return False
        with self._cache.transact():
            if self._cache.get(self._key) != holder:  # released or taken meanwhile
                return False
            self._cache.delete(self._key)
        log.info("lock %s: took over from dead holder pid %d", self._key, owner[1])
        return True

    def acquire(self) -> None:
        delay = 0.002
        while not self._cache.add(self._key, self._token, expire=self._expire):
            if self._take_over_dead_holder():
                continue
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        self._stop.clear()
        self._refresher = threading.Thread(target=self._refresh, name=f"lock-refresh {self._key}",
                                           daemon=True)
        self._refresher.start()

    def _refresh(self) -> None:
        while not self._stop.wait(self._expire / 3):
            try:
                with self._cache.transact():
                    if self._cache.get(self._key) == self._token:
                        self._cache.touch(self._key, expire=self._expire)
            except Exception as err:  # retried at the next beat; may lapse meanwhile
                log.warning("lock %s not refreshed: %s: %s", self._key, type(err).__name__,
                            one_line(err, 200))

    def release(self) -> None:
        self._stop.set()
        if self._refresher is not None:
            self._refresher.join()
        try:
            with self._cache.transact():
                if self._cache.get(self._key) == self._token:
                    self._cache.delete(self._key)
        except Exception as err:  # it lapses after expire_s (nobody refreshes it)
            log.warning("lock %s not released: %s: %s", self._key, type(err).__name__,
                        one_line(err, 200))

    def __enter__(self) -> DiskLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


__all__ = ["DiskLock", "KeyedLocks", "lock_token", "parse_token"]
