"""API latency under load: 16 concurrent clients hammering cached reads of the demo model.

Starts ``headgraph serve`` on a free loopback port with a fresh cache, warms every endpoint
once, then runs N client threads (keep-alive httpx clients, round-robin over the endpoints)
for a fixed duration and prints a p50 / p99 latency table. Target: p99 < 50 ms.

    .venv/bin/python benchmarks/bench_api.py [--clients 16] [--seconds 10] [--workers 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import torch

from headgraph.server.launch import ServerProcess

ENDPOINTS: list[tuple[str, dict[str, object]]] = [
    ("/api/health", {}),
    ("/api/models", {}),
    ("/api/pk", {"model": "demo", "pairing": "OK"}),
    ("/api/pk", {"model": "demo", "pairing": "OV", "metric": "z"}),
    ("/api/cs", {"model": "demo", "mode": "K"}),
    ("/api/top", {"model": "demo", "pairing": "OK", "k": 20}),
    ("/api/graph", {"model": "demo", "pairings": "OQ,OK,OV", "k": 20}),
    ("/api/pair", {"model": "demo", "pairing": "OK", "source": "L0H3", "target": "L1H5"}),
    ("/api/scatter", {"model": "demo", "pairing": "OK"}),
    ("/api/tokens", {"model": "demo", "role": "O", "k": 10}),
    ("/api/patterns", {"model": "demo"}),
]
TARGET_P99_MS = 50.0


def percentile(values: list[float], q: float) -> float:
    """q-th percentile (0..100) by linear interpolation."""
    if not values:
        return float("nan")
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo, hi = int(pos), min(int(pos) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def hammer(url: str, clients: int, seconds: float) -> tuple[dict[str, list[float]], int]:
    """Run ``clients`` threads for ``seconds``; latencies (ms) per endpoint and error count."""
    lat: dict[str, list[float]] = {p: [] for p, _ in ENDPOINTS}
    errors = [0]
    lock = threading.Lock()
    start = threading.Barrier(clients)
    deadline = [0.0]

    def client(offset: int) -> None:
        local: dict[str, list[float]] = {p: [] for p, _ in ENDPOINTS}
        bad = 0
        with httpx.Client(base_url=url, timeout=30) as c:
            c.get("/api/health")  # connect before the clock starts (keep-alive afterwards)
            start.wait()
            i = offset
            while time.perf_counter() < deadline[0]:
                path, params = ENDPOINTS[i % len(ENDPOINTS)]
                i += 1
                t0 = time.perf_counter()
                r = c.get(path, params=params)
                ms = (time.perf_counter() - t0) * 1000
                if r.status_code != 200:
                    bad += 1
                local[path].append(ms)
        with lock:
            for p, v in local.items():
                lat[p].extend(v)
            errors[0] += bad

    deadline[0] = time.perf_counter() + seconds + 0.5
    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return lat, errors[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--workers", type=int, default=2, help="uvicorn worker processes")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)

    with tempfile.TemporaryDirectory() as tmp:
        env = {"HF_HUB_OFFLINE": "1", "HEADGRAPH_DEVICE": "cpu"}
        with ServerProcess(Path(tmp) / "cache", workers=args.workers, env=env) as srv:
            t0 = time.perf_counter()
            with httpx.Client(base_url=srv.url, timeout=600) as c:
                for _ in range(args.workers * 2):  # every worker process sees every endpoint
                    for path, params in ENDPOINTS:
                        r = c.get(path, params=params)
                        r.raise_for_status()
            print(f"warm-up (cold compute + per-worker model identity): "
                  f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)
            mark = time.time()
            lat, errors = hammer(srv.url, args.clients, args.seconds)
            server_ms: dict[str, list[float]] = {}
            for rec in srv.records():  # the server's own access log: time inside the app
                if rec.get("logger") == "headgraph.access" and rec.get("ts", 0) >= mark:
                    server_ms.setdefault(str(rec["path"]), []).append(float(rec["ms"]))

    every = [v for vals in lat.values() for v in vals]
    print(f"\n{args.clients} clients, {args.workers} workers, {args.seconds:.0f} s, "
          f"{len(every)} requests ({len(every) / args.seconds:.0f} req/s), {errors} non-200\n")
    print("client-side latency (what a caller waits) and server-side time (inside the app)")
    print(f"{'endpoint':<16}{'n':>7}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}{'srv p50':>9}{'srv p99':>9}")
    for path in dict.fromkeys(p for p, _ in ENDPOINTS):
        v, sv = lat[path], server_ms.get(path, [])
        print(f"{path:<16}{len(v):>7}{percentile(v, 50):>9.1f}{percentile(v, 99):>9.1f}"
              f"{max(v):>9.1f}{percentile(sv, 50):>9.2f}{percentile(sv, 99):>9.2f}")
    p99 = percentile(every, 99)
    s_all = [x for v in server_ms.values() for x in v]
    print(f"{'ALL':<16}{len(every):>7}{percentile(every, 50):>9.1f}{p99:>9.1f}{max(every):>9.1f}"
          f"{percentile(s_all, 50):>9.2f}{percentile(s_all, 99):>9.2f}")
    print(f"mean {statistics.fmean(every):.1f} ms; target p99 < {TARGET_P99_MS:.0f} ms: "
          f"{'MET' if p99 < TARGET_P99_MS else 'NOT MET'}")
    return 0 if errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
