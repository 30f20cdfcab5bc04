"""Fault injection, part 5 of issue 14: a cache that cannot lie.

Every stored result carries a checksum: flipped bytes, a truncated value, an unreadable value
file or an entry of the old format is a miss (logged, recomputed), never an answer. A damaged
index database is moved aside at start. A read-only cache folder or a full disk still serves
every stored result and answers a cold one with a 503 and the reason. A lock whose holder
died on this host is taken over at once.

The store is exercised directly (fast) and through real servers on loopback: the cache folder
is damaged between two runs of ``headgraph serve``. Read-only folders need a process that
permissions apply to: as root, the server runs without CAP_DAC_OVERRIDE/CAP_DAC_READ_SEARCH
(dropped from its capability bounding set); a full disk is RLIMIT_FSIZE on the running server
and its compute process (writes past it fail with EFBIG, as on a full disk).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import os
import pickle
import re
import shutil
import sqlite3
import stat
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil
import pytest

from headgraph.server.cache.diskcache_reader import ReadOnlyCache
from headgraph.server.cache.values import MAGIC, decode_value
from headgraph.server.http.launch import ServerProcess
from headgraph.server.cache.locks import DiskLock, lock_token
from headgraph.server.cache.store import Store

# serial (run alone, after the parallel part): lock waits within 5 s
pytestmark = pytest.mark.serial

BASE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HEADGRAPH_DEVICE": "cpu"}
PK_OK = {"model": "demo", "pairing": "OK"}  # warm in the warm cache
PK_OV = {"model": "demo", "pairing": "OV"}  # warm too
PK_QK = {"model": "demo", "pairing": "QK"}  # cold in every copy of the warm cache
PK_VK = {"model": "demo", "pairing": "VK"}  # cold too
ABS_PATH = re.compile(r"(^|[\s'\"(=:])/[\w.-]+/")


# -- damaging a cache folder (what a disk, a crash or a person does) ---------------------------

def stored_rows(results: Path) -> dict[str, tuple[int, str | None]]:
    """key -> (diskcache mode, value file) of every entry of a diskcache folder."""
    con = sqlite3.connect(results / "cache.db")
    try:
        return {k: (m, f) for k, m, f in con.execute("SELECT key, mode, filename FROM Cache")}
    finally:
        con.close()


def key_of(results: Path, name: str, query_part: str) -> str:
    keys = [k for k in stored_rows(results) if f"/{name}?" in k and query_part in k]
    assert len(keys) == 1, keys
    return keys[0]


def damage_value(results: Path, key: str, how: str) -> None:
    """Flip 16 bytes in the middle of the stored value of ``key``, or cut it in half, in place:
    in its value file (large values) or in its row of cache.db (small ones)."""
    mode, filename = stored_rows(results)[key]

    def damaged(data: bytes) -> bytes:
        if how == "truncate":
            return data[: len(data) // 2]
        mid = len(data) // 2
        return data[:mid] + bytes(b ^ 0xFF for b in data[mid:mid + 16]) + data[mid + 16:]

    if filename is not None:
        path = results / filename
        path.write_bytes(damaged(path.read_bytes()))
        return
    con = sqlite3.connect(results / "cache.db")
    try:
        ((value,),) = con.execute("SELECT value FROM Cache WHERE key = ?", (key,)).fetchall()
        con.execute("UPDATE Cache SET value = ? WHERE key = ?", (damaged(bytes(value)), key))
        con.commit()
    finally:
        con.close()
    assert mode == 1


def corrupt_header(db: Path) -> None:
    """Overwrite the SQLite header ("SQLite format 3\\0") of ``db``: no longer a database.
    Its write-ahead log is checkpointed into it first (as a clean close does), so no newer
    copy of page 1 in the -wal file hides the damage."""
    con = sqlite3.connect(db)
    try:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    finally:
        con.close()
    assert not Path(f"{db}-wal").exists() or Path(f"{db}-wal").stat().st_size == 0
    with open(db, "r+b") as f:
        f.write(b"not a database!!")


def set_writable(folder: Path, writable: bool) -> None:
    """chmod the tree under ``folder`` (itself included) read-only or back to writable."""
    paths = [folder, *folder.rglob("*")]
    for p in (paths if writable else reversed(paths)):
        mode = p.stat().st_mode
        p.chmod(mode | stat.S_IWUSR if writable else mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


# -- processes that permissions and file-size limits apply to ---------------------------------

_PR_CAPBSET_DROP, _CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH = 24, 1, 2


def _drop_dac_caps() -> None:  # preexec_fn: root without permission bypass (inherited by children)
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH):
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def unprivileged() -> Callable[[], None] | None:
    """preexec_fn under which a read-only folder is read-only (None: this user already is)."""
    return _drop_dac_caps if os.geteuid() == 0 else None


def read_only_works(tmp: Path) -> bool:
    """Whether a child started with :func:`unprivileged` is refused a write in a 0555 folder."""
    folder = tmp / "probe-ro"
    folder.mkdir()
    set_writable(folder, False)
    try:
        done = subprocess.run(["sh", "-c", f"touch '{folder}/x'"], preexec_fn=unprivileged(),
                              capture_output=True)
        return done.returncode != 0
    except OSError:
        return False
    finally:
        set_writable(folder, True)


def run_python(script: str, *args: str, preexec: Callable[[], None] | None = None) -> Any:
    """Run ``script`` in a fresh interpreter; the JSON it prints last."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args],
                          capture_output=True, text=True, timeout=120, preexec_fn=preexec)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


class Server(ServerProcess):
    """ServerProcess started with a preexec_fn, its output read through a pipe (so a file-size
    limit on the server never applies to its log)."""

    def __init__(self, cache_dir: Path, *, preexec: Callable[[], None] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(cache_dir, env=BASE_ENV, **kwargs)
        self.preexec = preexec
        self._pump: threading.Thread | None = None

    def start(self) -> Server:
        env = dict(os.environ)
        env.update({"HEADGRAPH_CACHE_DIR": str(self.cache_dir), "PYTHONUNBUFFERED": "1"})
        env.update(self.extra_env)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "headgraph.server.cli.main", "serve", "--host", self.host,
               "--port", str(self.port), "--workers", str(self.workers)]
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True, preexec_fn=self.preexec)
        self._pump = threading.Thread(target=self._copy, args=(self.proc,), daemon=True)
        self._pump.start()
        self.wait_healthy()
        return self

    def _copy(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        with open(self.log_path, "ab") as log:
            for line in proc.stdout:
                log.write(line)
                log.flush()

    def stop(self, timeout: float = 20.0) -> None:
        super().stop(timeout)
        if self._pump is not None:
            self._pump.join(10)

    def processes(self) -> list[psutil.Process]:
        assert self.proc is not None
        root = psutil.Process(self.proc.pid)
        return [root, *root.children(recursive=True)]


def get(srv: ServerProcess, path: str, params: dict[str, str] | None = None) -> httpx.Response:
    return httpx.get(srv.url + path, params=params, timeout=120)


def store_warnings(srv: ServerProcess) -> list[str]:
    return [r.get("msg", "") for r in srv.records()
            if r.get("logger") == "headgraph.store" and r.get("level") in ("warning", "error")]


def internal_errors(srv: ServerProcess) -> list[dict[str, Any]]:
    """Requests answered 500 and unexpected-error records (a 503 with a reason is expected)."""
    return [r for r in srv.server_errors() if int(r.get("status", 500)) != 503]


def assert_clear_503(resp: httpx.Response, *words: str) -> str:
    assert resp.status_code == 503, resp.text
    assert resp.headers.get("retry-after")
    message = resp.json()["error"]["message"]
    assert "cannot store new results" in message and "\n" not in message
    assert all(w in message for w in words), message
    assert not ABS_PATH.search(message), message  # no server path
    return message


# -- the store directly -------------------------------------------------------------------------

def test_values_are_stored_as_checksummed_bytes(tmp_path):
    store = Store(tmp_path / "c")
    value = {"grid": np.arange(6.0).reshape(2, 3), "name": "pk"}
    store.put("k", value)
    raw = store.results.backend.get("k")  # what diskcache holds: our bytes
    assert isinstance(raw, bytes) and raw.startswith(MAGIC)
    payload = raw[len(MAGIC) + 32:]
    assert raw[len(MAGIC):len(MAGIC) + 32] == hashlib.blake2b(payload, digest_size=32).digest()
    assert np.array_equal(pickle.loads(payload)["grid"], value["grid"])
    got = store.get("k")
    assert np.array_equal(got["grid"], value["grid"]) and got["name"] == "pk"
    assert store.has("k") and not store.has("other")
    assert np.array_equal(decode_value(raw)["grid"], value["grid"])


def test_records_in_meta_are_checksummed_and_a_damaged_one_reads_missing(tmp_path, caplog):
    """Label sets, jobs and model identities live in meta/: each is stored with a checksum,
    so a flipped byte makes the record missing (logged), never a changed record served;
    records from before checksums are read as they are; counters and locks stay plain."""
    from headgraph.core.graphs.labels import LabelSet
    from headgraph.server.errors import NotFound
    from headgraph.server.services.labels import LabelService

    store = Store(tmp_path / "c")
    labels = LabelService(store, scores=None)  # type: ignore[arg-type]  # no per-model sets
    labels.save_label_set(LabelSet(name="mine", description="", classes={"induction": ["L1H6"]}))
    raw = store.meta.backend.get("labels:mine")
    assert isinstance(raw, bytes) and raw.startswith(MAGIC)
    assert labels.label_set("mine").classes == {"induction": ["L1H6"]}
    store.meta.backend.set("labels:legacy", {"name": "legacy", "classes": {"a": ["L0H0"]}})
    assert labels.label_set("legacy").classes == {"a": ["L0H0"]}
    store.meta.incr("count:x")
    assert store.meta.get("count:x") == 1
    store.close()
    damage_value(tmp_path / "c" / "meta", "labels:mine", "flip")
    store = Store(tmp_path / "c")
    labels = LabelService(store, scores=None)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING), pytest.raises(NotFound):
        labels.label_set("mine")
    assert "labels:mine" in caplog.text and "checksum" in caplog.text
    assert "mine" not in labels.label_sets()
    store.close()


@pytest.mark.parametrize(("how", "size"), [
    (how, size) for how in ("flip", "truncate", "old-format") for size in (100, 100_000)
] + [("missing-file", 100_000)], ids=lambda v: v if isinstance(v, str) else
    ("inline" if v < 32768 else "file"))
def test_a_damaged_value_is_a_logged_miss_and_is_recomputed(tmp_path, caplog, how, size):
    store = Store(tmp_path / "c")
    value = np.arange(size // 8, dtype=np.float64)
    key = "v1/fp/pk?pairing=OK"
    if how == "old-format":  # what the store wrote before values carried a checksum
        store.results.backend.set(key, value)
    else:
        store.put(key, value)
        _mode, filename = stored_rows(store.directory / "results")[key]
        assert (filename is None) == (size < 32768)
        if how == "missing-file":
            (store.directory / "results" / str(filename)).unlink()
        else:
            damage_value(store.directory / "results", key, how)
    caplog.set_level(logging.WARNING, logger="headgraph.store")
    assert not store.has(key)  # never reported present
    assert store.get(key, "default") == "default"
    assert any(key in r.getMessage() and "miss" in r.getMessage() for r in caplog.records)
    assert key not in store.results  # the bad entry is gone
    calls = []
    again = store.get_or_compute(key, lambda: calls.append(1) or value)
    assert calls == [1] and np.array_equal(again, value) and np.array_equal(store.get(key), value)


def test_a_corrupt_index_database_is_moved_aside_and_rebuilt(tmp_path, caplog):
    cache = tmp_path / "c"
    s1 = Store(cache)
    s1.put("k", [1, 2])
    s1.meta.set("labels:mine", {"name": "mine"})
    s1.close()
    corrupt_header(cache / "results" / "cache.db")
    corrupt_header(cache / "meta" / "cache.db")
    with pytest.raises(sqlite3.DatabaseError):  # what the server died of before
        sqlite3.connect(cache / "results" / "cache.db").execute("SELECT * FROM Cache").fetchall()
    caplog.set_level(logging.ERROR, logger="headgraph.store")
    s2 = Store(cache)
    aside = sorted(p.name for p in cache.iterdir() if ".corrupt-" in p.name)
    assert [a.split(".corrupt-")[0] for a in aside] == ["meta", "results"]
    assert all((cache / a / "cache.db").read_bytes()[:16] == b"not a database!!" for a in aside)
    assert sum("moved aside" in r.getMessage() for r in caplog.records) == 2
    assert s2.get("k") is None and s2.get_or_compute("k", lambda: [3]) == [3]
    assert s2.read_only_reason is None and s2.compute_count("k") == 1


def test_a_read_only_store_serves_stored_values_and_refuses_new_ones(tmp_path):
    assert read_only_works(tmp_path), ("cannot make a folder read-only for a child process "
                                       "here (root without CAP_SETPCAP to drop DAC overrides?)")
    cache = tmp_path / "c"
    s = Store(cache)
    s.get_or_compute("warm", lambda: [1, 2, 3])
    s.meta.set("labels:mine", {"name": "mine"})
    s.close()
    set_writable(cache, False)
    try:
        out = run_python("""
            import json, sys
            from headgraph.server.errors import CacheUnavailable
            from headgraph.server.cache.locks import DiskLock
            from headgraph.server.cache.store import Store
            store = Store(sys.argv[1])
            out = {"reason": store.read_only_reason, "warm": store.get("warm"),
                   "has": store.has("warm"), "label": store.meta.get("labels:mine"),
                   "count": store.compute_count("warm"), "counts": store.compute_counts(),
                   "names": store.cached_names(), "stats": store.stats(), "calls": 0,
                   "memo": store.meta.set("model:demo|bridge", {"fingerprint": "f"})}
            def compute():
                out["calls"] += 1
                return 5
            for name, write in [("cold", lambda: store.get_or_compute("cold", compute)),
                                ("put", lambda: store.put("cold", 5)),
                                ("meta", lambda: store.meta.set("labels:x", {})),
                                ("lock", lambda: DiskLock(store.meta, "lock:x", 5).acquire())]:
                try:
                    write()
                    out[name] = None
                except CacheUnavailable as err:
                    out[name] = [err.status, err.message]
            print(json.dumps(out))
            """, str(cache), preexec=unprivileged())
    finally:
        set_writable(cache, True)
    assert out["reason"] and out["reason"].startswith("the cache folder is read-only")
    assert out["warm"] == [1, 2, 3] and out["has"] and out["label"] == {"name": "mine"}
    assert out["count"] == 1 and out["counts"] == {"warm": 1} and out["names"] == {}
    assert out["stats"]["directory"] == "c" and out["stats"]["entries"] == 1
    for name in ("cold", "put", "meta", "lock"):
        status, message = out[name]
        assert status == 503 and message.startswith("the cache folder is read-only"), message
        assert not ABS_PATH.search(message)
    assert out["cold"][1] == out["reason"]
    assert out["calls"] == 0  # nothing computed that could not be kept
    assert out["memo"] is False  # a model-identity memo is skipped, not an error
    assert ReadOnlyCache(cache / "results").get("absent", "d") == "d"


def test_a_full_disk_refuses_new_values_keeps_old_ones_and_recovers(tmp_path):
    out = run_python("""
        import json, resource, sys
        from headgraph.server.errors import CacheUnavailable
        from headgraph.server.cache.store import Store
        store = Store(sys.argv[1])
        store.get_or_compute("warm", lambda: list(range(10)))
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))  # writes past 4 KiB: EFBIG
        out = {"calls": 0}
        def compute():
            out["calls"] += 1
            return 7
        for name, write in [("small", lambda: store.put("small", [1])),
                            ("big", lambda: store.put("big", bytes(200_000))),
                            ("cold", lambda: store.get_or_compute("cold", compute))]:
            try:
                write()
                out[name] = None
            except CacheUnavailable as err:
                out[name] = [err.status, err.message]
        out["warm"] = store.get("warm")
        out["has"] = [store.has("small"), store.has("big")]
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))  # space freed
        out["after"] = store.get_or_compute("cold", compute)
        out["lock_left"] = "lock:cold" in store.meta
        print(json.dumps(out))
        """, str(tmp_path / "c"))
    for name in ("small", "big", "cold"):
        status, message = out[name]
        assert status == 503 and message.startswith("the cache disk is full"), (name, message)
        assert not ABS_PATH.search(message)
    assert out["warm"] == list(range(10)) and out["has"] == [False, False]
    assert out["after"] == 7 and out["calls"] == 1  # computed only once it could be kept
    assert not out["lock_left"]


def test_a_folder_made_read_only_after_opening_refuses_a_cold_value_before_computing(tmp_path):
    """The store opened writable; the folder turns read-only under it (its SQLite files stay
    writable through their open handles, a new value file cannot be made): a cold value is
    refused with the reason before its computation runs, not after."""
    assert read_only_works(tmp_path), ("cannot make a folder read-only for a child process "
                                       "here (root without CAP_SETPCAP to drop DAC overrides?)")
    folder = tmp_path / "c"
    out = run_python("""
        import json, os, stat, sys
        from pathlib import Path
        from headgraph.server.errors import CacheUnavailable
        from headgraph.server.cache.store import Store
        store = Store(sys.argv[1])
        store.get_or_compute("warm", lambda: list(range(10)))
        for p in [Path(sys.argv[1]), *Path(sys.argv[1]).rglob("*")]:
            p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
        out = {"calls": 0, "reason": store.read_only_reason}
        def compute():
            out["calls"] += 1
            return bytes(200_000)  # a value file of its own, as results are
        try:
            store.get_or_compute("cold", compute)
            out["cold"] = None
        except CacheUnavailable as err:
            out["cold"] = [err.status, err.message]
        out["warm"] = store.get("warm")
        print(json.dumps(out))
        """, str(folder), preexec=unprivileged())
    set_writable(folder, True)
    assert out["reason"] is None  # opened writable: only a write can tell
    status, message = out["cold"]
    assert status == 503 and message.startswith("the cache folder is read-only"), message
    assert not ABS_PATH.search(message)
    assert out["calls"] == 0 and out["warm"] == list(range(10))


def test_a_store_opened_on_a_full_disk_sees_new_values_and_becomes_writable_again(tmp_path):
    out = run_python("""
        import json, resource, sys
        from headgraph.server.cache.store import Store
        first = Store(sys.argv[1])
        first.put("a", 1)
        first.close()  # clean close: no -wal/-shm left, as after a normal shutdown
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))
        api = Store(sys.argv[1])  # the API process starting on a full disk
        out = {"reason": api.read_only_reason, "a": api.get("a")}
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))  # space freed
        child = Store(sys.argv[1])  # a compute process started later
        out["child_reason"] = child.read_only_reason
        child.put("b", 2)
        out["b"] = api.get("b")  # what the child stored, read by the read-only API store
        api.results.reopen_s = api.meta.reopen_s = 0
        out["after"] = api.read_only_reason
        api.put("c", 3)
        out["c"] = child.get("c")
        print(json.dumps(out))
        """, str(tmp_path / "c"))
    assert out["reason"].startswith("the cache disk is full") and out["a"] == 1
    assert out["child_reason"] is None and out["b"] == 2
    assert out["after"] is None and out["c"] == 3


def test_before_write_can_refuse_a_write(tmp_path):
    store = Store(tmp_path / "c")
    assert store.before_write is None and Store.before_write is None
    calls = []

    def refuse() -> None:
        calls.append(1)
        raise RuntimeError("the API process is gone")

    store.before_write = refuse
    with pytest.raises(RuntimeError, match="gone"):
        store.put("k", 1)
    with pytest.raises(RuntimeError, match="gone"):
        store.get_or_compute("k", lambda: 2)
    assert calls == [1, 1] and not store.has("k") and "lock:k" not in store.meta
    store.before_write = calls.clear
    store.put("k", 3)
    assert store.get("k") == 3


def test_a_lock_whose_holder_died_on_this_host_is_taken_over_at_once(tmp_path):
    store = Store(tmp_path / "c")
    holder = subprocess.Popen(["sleep", "60"])
    store.meta.add("lock:k", lock_token(holder.pid), expire=60)
    waiter = DiskLock(store.meta, "lock:k", 60)
    got = threading.Event()
    thread = threading.Thread(target=lambda: (waiter.acquire(), got.set()), daemon=True)
    thread.start()
    assert not got.wait(0.5)  # a live holder keeps its lock
    holder.kill()
    holder.wait()
    started = time.monotonic()
    assert got.wait(10) and time.monotonic() - started < 5  # not the 60 s expiry
    assert store.meta.get("lock:k") == waiter._token
    waiter.release()
    # a holder whose pid now belongs to another process (same pid, other start time)
    host, pid, start, nonce = lock_token().split("|")
    store.meta.add("lock:k", f"{host}|{pid}|{float(start) - 100:.6f}|{nonce}", expire=60)
    started = time.monotonic()
    with DiskLock(store.meta, "lock:k", 60):
        assert time.monotonic() - started < 5
    assert "lock:k" not in store.meta


def test_cache_stats_name_the_folder_not_its_path(tmp_path):
    store = Store(tmp_path / "cache-folder")
    assert store.stats()["directory"] == "cache-folder"


# -- real servers -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """A cache folder where a server stored PK of the demo model (pairings OK, OV); its
    answers."""
    folder = tmp_path_factory.mktemp("warm") / "cache"
    answers = {}
    with Server(folder) as srv:
        for params in (PK_OK, PK_OV):
            resp = get(srv, "/api/pk", params)
            assert resp.status_code == 200, resp.text
            answers[params["pairing"]] = resp.json()
    return folder, answers


def copy_of(warm_cache: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "cache"
    shutil.copytree(warm_cache, folder)
    return folder


@pytest.mark.slow  # a real server on a warm cache (itself a server run) per test: ~8 s each
def test_flipped_or_truncated_values_are_recomputed_by_the_server(warm, tmp_path):
    warm_cache, answers = warm
    cache = copy_of(warm_cache, tmp_path)
    flipped = key_of(cache / "results", "pk", "pairing=OK")
    truncated = key_of(cache / "results", "pk", "pairing=OV")
    damage_value(cache / "results", flipped, "flip")
    damage_value(cache / "results", truncated, "truncate")
    with Server(cache) as srv:
        for params, key in ((PK_OK, flipped), (PK_OV, truncated)):
            resp = get(srv, "/api/pk", params)
            assert resp.status_code == 200, resp.text
            assert resp.json() == answers[params["pairing"]]  # recomputed, not 3.4e38
            assert any(key in m and "treated as a miss" in m for m in store_warnings(srv))
            assert get(srv, "/api/pk", params).json() == answers[params["pairing"]]
        assert internal_errors(srv) == []
    store = Store(cache)
    assert store.has(flipped) and store.has(truncated)  # stored again, intact
    assert store.compute_count(flipped) == store.compute_count(truncated) == 2


@pytest.mark.slow  # a real server on a warm cache (itself a server run) per test: ~8 s each
def test_a_corrupt_index_database_is_moved_aside_at_start(warm, tmp_path):
    warm_cache, answers = warm
    answer = answers["OK"]
    cache = copy_of(warm_cache, tmp_path)
    corrupt_header(cache / "results" / "cache.db")
    with Server(cache) as srv:
        aside = [p for p in cache.iterdir() if p.name.startswith("results.corrupt-")]
        assert len(aside) == 1  # moved aside once, though two processes opened the store
        assert any("moved aside" in m and aside[0].name in m for m in store_warnings(srv))
        resp = get(srv, "/api/pk", PK_OK)
        assert resp.status_code == 200 and resp.json() == answer
        assert get(srv, "/api/cache/stats").json()["entries"] >= 1
        assert internal_errors(srv) == []


@pytest.mark.slow  # a real server on a warm cache (itself a server run) per test: ~8 s each
def test_a_read_only_cache_folder_serves_warm_results_and_503s_cold_ones(warm, tmp_path):
    assert read_only_works(tmp_path), ("cannot make a folder read-only for a child process "
                                       "here (root without CAP_SETPCAP to drop DAC overrides?)")
    warm_cache, answers = warm
    cache = copy_of(warm_cache, tmp_path)
    memo = Store(cache)  # forget the demo's identity (as a new version of core would)
    forgotten = [k for k in memo.meta.iterkeys() if str(k).startswith("model:")]
    assert forgotten and all(memo.meta.delete(k) for k in forgotten)
    memo.close()
    set_writable(cache, False)
    try:
        with Server(cache, preexec=unprivileged()) as srv:
            assert get(srv, "/api/health").status_code == 200
            for params in (PK_OK, PK_OV):  # the identity is learnt again, not stored
                resp = get(srv, "/api/pk", params)
                assert resp.status_code == 200, resp.text
                assert resp.json() == answers[params["pairing"]]
            message = assert_clear_503(get(srv, "/api/pk", PK_QK), "read-only")
            assert assert_clear_503(get(srv, "/api/cs", {"model": "demo"}), "read-only") == message
            stats = get(srv, "/api/cache/stats")
            assert stats.status_code == 200 and stats.json()["directory"] == "cache"
            assert get(srv, "/api/models").status_code == 200
            assert get(srv, "/api/pk", PK_OK).status_code == 200
            assert internal_errors(srv) == []
    finally:
        set_writable(cache, True)


@pytest.mark.slow  # a real server on a warm cache (itself a server run) per test: ~8 s each
def test_a_full_disk_503s_cold_results_and_the_server_keeps_serving(warm, tmp_path):
    warm_cache, answers = warm
    cache = copy_of(warm_cache, tmp_path)
    with Server(cache) as srv:
        assert get(srv, "/api/pk", PK_QK).status_code == 200  # compute process up, writable
        procs = srv.processes()
        assert len(procs) >= 2
        limits = {p.pid: p.rlimit(psutil.RLIMIT_FSIZE) for p in procs}
        for p in procs:  # from now on no file of theirs grows past 4 KiB (EFBIG)
            p.rlimit(psutil.RLIMIT_FSIZE, (4096, limits[p.pid][1]))
        message = assert_clear_503(get(srv, "/api/pk", PK_VK), "disk is full")
        assert get(srv, "/api/pk", PK_OK).json() == answers["OK"]  # warm reads keep working
        assert assert_clear_503(get(srv, "/api/pk", PK_VK)) == message  # and again, no crash
        assert get(srv, "/api/health").status_code == 200
        for p in procs:  # space freed
            p.rlimit(psutil.RLIMIT_FSIZE, limits[p.pid])
        assert get(srv, "/api/pk", PK_VK).status_code == 200
        assert srv.proc is not None and srv.proc.poll() is None
        assert internal_errors(srv) == []
        assert not any("worker stopped" in json.dumps(r) for r in srv.records())


@pytest.mark.slow  # a real server on a warm cache (itself a server run): ~8 s
def test_a_cache_made_read_only_while_serving_503s_a_cold_result_before_any_compute(warm, tmp_path):
    """The server opened its cache writable; the folder turns read-only while it serves. A
    cold result is a 503 with the reason before anything is computed: no compute process is
    started for it (they start on the first cold computation). Writable again, it computes."""
    assert read_only_works(tmp_path), ("cannot make a folder read-only for a child process "
                                       "here (root without CAP_DAC_OVERRIDE to drop?)")
    warm_cache, answers = warm
    cache = copy_of(warm_cache, tmp_path)
    try:
        server = Server(cache, preexec=unprivileged())
        with server as srv:
            assert get(srv, "/api/pk", PK_OK).json() == answers["OK"]  # warm: no compute process
            before = {p.pid for p in server.processes()}
            set_writable(cache, False)
            assert_clear_503(get(srv, "/api/pk", PK_QK), "read-only")
            assert {p.pid for p in server.processes()} == before  # nothing spawned, loaded or computed
            assert get(srv, "/api/pk", PK_OV).json() == answers["OV"]  # warm reads go on
            set_writable(cache, True)
            assert get(srv, "/api/pk", PK_QK).status_code == 200
            assert {p.pid for p in server.processes()} > before  # a cold result does start one
            assert internal_errors(srv) == []
    finally:
        set_writable(cache, True)
