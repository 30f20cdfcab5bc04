"""The diskcache store: single flight across threads and processes, crash safety, size bound."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from headgraph.core.types import COMPUTE_VERSION
from headgraph.server.cache.locks import DiskLock
from headgraph.server.cache.store import ModelLRU, Store, make_key, parse_key


def test_keys_carry_version_fingerprint_name_and_sorted_params():
    k = make_key("abc123", "pk", {"pairing": "OK", "order": "forward"})
    assert k == f"v{COMPUTE_VERSION}/abc123/pk?order=forward&pairing=OK"
    assert make_key("abc123", "pk", {"order": "forward", "pairing": "OK"}) == k
    assert parse_key(k) == ("abc123", "pk", "order=forward&pairing=OK")
    assert make_key("abc123", "pk", {"pairing": "OV", "order": "forward"}) != k
    assert parse_key("v999/x/y") is None


def test_threads_compute_a_cold_key_once(tmp_path):
    store = Store(tmp_path / "c")
    calls = []
    start = threading.Barrier(16)
    results = []

    def compute():
        calls.append(1)
        time.sleep(0.3)
        return np.arange(5.0)

    def worker():
        start.wait()
        results.append(store.get_or_compute("k1", compute))

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert len(results) == 16 and all(np.array_equal(r, np.arange(5.0)) for r in results)
    assert store.compute_count("k1") == 1
    assert store.compute_count() == 1
    # warm: no further computation
    assert np.array_equal(store.get_or_compute("k1", compute), np.arange(5.0))
    assert len(calls) == 1


def _proc_compute(cache_dir: str, marker_dir: str, barrier) -> None:
    store = Store(cache_dir)
    barrier.wait()

    def compute():
        Path(marker_dir, f"computed-{os.getpid()}").touch()
        time.sleep(0.5)
        return {"value": 42}

    assert store.get_or_compute("shared", compute) == {"value": 42}
    store.close()


@pytest.mark.slow  # spawned processes racing on a cold key: ~7 s, more on a loaded machine
def test_processes_compute_a_cold_key_once(tmp_path):
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(4)
    markers = tmp_path / "markers"
    markers.mkdir()
    procs = [ctx.Process(target=_proc_compute, args=(str(tmp_path / "c"), str(markers), barrier))
             for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:  # done when each has exited: no fixed deadline of our own (pytest's timeout bounds it)
        p.join()
        assert p.exitcode == 0
    assert len(list(markers.iterdir())) == 1
    assert Store(tmp_path / "c").compute_count("shared") == 1


def test_a_killed_computation_leaves_no_entry_and_its_lock_lapses(tmp_path):
    cache = tmp_path / "c"
    script = textwrap.dedent(f"""
        import time
        from headgraph.server.cache.store import Store
        store = Store({str(cache)!r}, lock_expire_s=1.0)
        def compute():
            print("computing", flush=True)
            time.sleep(60)
            return "never"
        store.get_or_compute("slow", compute)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "computing"
        store = Store(cache, lock_expire_s=1.0)
        assert "lock:slow" in store.meta  # held by the child, refreshed while it lives
        time.sleep(1.5)
        dead_token = store.meta.get("lock:slow")
        assert dead_token is not None  # still refreshed (expiry 1 s < 1.5 s elapsed)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert not store.has("slow")  # no partial entry
    holders = []

    def recompute():
        holders.append(store.meta.get("lock:slow"))  # whose lock the computation runs under
        return "recomputed"

    # Takes the dead holder's lock over: at once, as its process is gone (a holder on another
    # host would be waited for until its lock lapses, nobody refreshing it).
    assert store.get_or_compute("slow", recompute) == "recomputed"
    assert len(holders) == 1 and holders[0] not in (None, dead_token)  # our own lock, not the dead one
    assert "lock:slow" not in store.meta  # and ours is released
    assert store.compute_count("slow") == 1  # the killed attempt never counted


def test_a_failed_computation_stores_nothing_and_releases_the_lock(tmp_path):
    store = Store(tmp_path / "c")

    def boom():
        raise RuntimeError("bad")

    with pytest.raises(RuntimeError):
        store.get_or_compute("k", boom)
    assert not store.has("k") and "lock:k" not in store.meta
    assert store.get_or_compute("k", lambda: 7) == 7


def test_disk_lock_never_deletes_a_lock_taken_over_after_expiry(tmp_path):
    store = Store(tmp_path / "c")
    a = DiskLock(store.meta, "lock:x", 0.3)
    a.acquire()
    a._stop.set()  # simulate a holder that stopped refreshing
    a._refresher.join()
    time.sleep(0.5)
    b = DiskLock(store.meta, "lock:x", 5.0)
    b.acquire()
    a.release()  # must not remove b's lock
    assert store.meta.get("lock:x") == b._token
    b.release()
    assert "lock:x" not in store.meta


def test_size_bound_evicts_old_results(tmp_path):
    store = Store(tmp_path / "c", size_limit=4 << 20)
    blob = np.zeros(100 * 1024 // 8)  # 100 KiB; diskcache culls 10 oldest per set when over
    for i in range(100):
        store.put(f"k{i}", blob + i)
    assert store.results.volume() < 5 << 20
    assert np.array_equal(store.get("k99"), blob + 99)
    assert not store.has("k0")


def test_store_survives_reopening(tmp_path):
    s1 = Store(tmp_path / "c")
    s1.get_or_compute("persist", lambda: [1, 2, 3])
    s1.close()
    s2 = Store(tmp_path / "c")
    assert s2.get_or_compute("persist", lambda: [9]) == [1, 2, 3]
    assert s2.compute_count("persist") == 1
    s2.meta.set("labels:mine", {"name": "mine"})
    assert s2.clear() > 0
    assert not s2.has("persist") and s2.compute_count() == 0
    assert s2.meta.get("labels:mine") == {"name": "mine"}  # uploaded label sets are kept


def test_model_lru_loads_once_and_evicts_least_recent():
    lru: ModelLRU[str] = ModelLRU(2)
    loads = []

    def loader(name):
        def load():
            loads.append(name)
            time.sleep(0.05)
            return name.upper()
        return load

    threads = [threading.Thread(target=lru.get, args=("a", loader("a"))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert loads == ["a"]
    lru.get("b", loader("b"))
    lru.get("a", loader("a"))  # touch a
    lru.get("c", loader("c"))  # evicts b
    assert set(lru.keys()) == {"a", "c"}
    assert lru.get("b", loader("b")) == "B"
    assert loads == ["a", "b", "c", "b"]
