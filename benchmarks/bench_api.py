"""API latency: /api/health and warm reads with N concurrent clients, next to the same unloaded.

headgraph only: TransformerLens has no API server, so there is nothing to compare against.

Starts ``headgraph serve`` (launch.ServerProcess) on a free loopback port with a fresh cache,
serving the demo model and a bigger random-weight model put in HEADGRAPH_MODELS (``--big``:
``wide``, the default, is a 16-layer x 32-head model in the demo's format, cheap to build, with
4.5 MB of JSON per score grid; or any ``random:<preset>`` spec, e.g. random:gpt2-small with
0.4 MB grids; ``--big none`` for the demo alone). Warms the
views the dashboard reads (PK OQ/OK/OV as raw, normalized and z; CS; graph; scatter;
reference; top pairs), then measures three phases of ``--seconds`` each:

* no load, health: a prober alone GETs /api/health every ``--probe-ms`` ms;
* no load, warm reads: one client reads the warm views one after the other;
* load: ``--clients`` clients (persistent connections, an asyncio httpx pool in a separate
  process, so the prober does not share its GIL) read the warm views round-robin as fast as
  they can while the prober keeps probing /api/health.

With ``--anonymous``, a fourth phase on a second server in lab mode (HEADGRAPH_API_TOKEN set,
100 uploaded 1 MiB label sets, random models offered and never loaded): ``--clients``
anonymous clients hit cold graphs of the unloaded models, unknown label sets (alone and as a
graph overlay), /api/models and unknown model ids, all refused or answered from names, while
the prober measures /api/health (target: p99 < 100 ms; no 5xx, no model loaded).

Prints a Markdown table of client-side p50 / p99 (ms), with the server's own time per
request (its access log) under load beside them; ``--out FILE`` also appends it to FILE
(replacing an earlier "## API latency" section there). Target: health p99 < 100 ms under load.

    .venv/bin/python benchmarks/bench_api.py [--clients 32] [--seconds 15] [--big wide]
                                             [--out benchmarks/RESULTS.md]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from headgraph.core.models.demo import ARCHITECTURE
from headgraph.server.http.launch import ServerProcess

Endpoint = tuple[str, str, dict[str, Any]]  # (row label, path, query)
SECTION = "## API latency (bench_api.py)"
HEALTH_TARGET_P99_MS = 100.0
WIDE = {"architecture": ARCHITECTURE, "n_layers": 16, "n_heads": 32, "d_model": 256,
        "d_head": 8, "d_vocab": 64, "n_ctx": 64}


def dashboard_views(model: str, label: str) -> list[Endpoint]:
    """The reads the dashboard makes for one model (what a warm page load asks)."""
    views: list[Endpoint] = [(f"/api/pk ({label})", "/api/pk", {"model": model, "pairing": p, "metric": m})
                             for p in ("OQ", "OK", "OV") for m in ("raw", "normalized", "z")]
    views += [(f"{path} ({label})", path, {"model": model, **q}) for path, q in (
        ("/api/cs", {"mode": "K"}),
        ("/api/graph", {"pairings": "OQ,OK,OV", "k": 20}),
        ("/api/scatter", {"pairing": "OK", "top_percent": 5}),
        ("/api/reference", {}),
        ("/api/top", {"pairing": "OK", "k": 20, "metric": "pk"}))]
    return views


def percentile(values: Sequence[float], q: float) -> float:
    """q-th percentile (0..100) by linear interpolation (nan for no values)."""
    if not values:
        return float("nan")
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo, hi = int(pos), min(int(pos) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


# -- load generator (separate process) -------------------------------------------------------

def _load_process(url: str, endpoints: list[Endpoint], clients: int, seconds: float,
                  ready: Any, go: Any, results: Any) -> None:
    """``clients`` asyncio tasks, one persistent connection each, reading round-robin until the
    deadline; puts [(label, ms, status)] on ``results``."""

    async def main() -> list[tuple[str, float, int]]:
        limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
        async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
            # open every connection before the clock starts
            await asyncio.gather(*(client.get("/api/health") for _ in range(clients)))
            ready.set()
            while not go.is_set():
                await asyncio.sleep(0.005)
            deadline = time.perf_counter() + seconds
            out: list[tuple[str, float, int]] = []

            async def one(offset: int) -> None:
                i = offset
                while time.perf_counter() < deadline:
                    label, path, params = endpoints[i % len(endpoints)]
                    i += 1
                    t0 = time.perf_counter()
                    try:
                        r = await client.get(path, params=params)
                        status = r.status_code
                    except httpx.HTTPError:
                        status = 0
                    out.append((label, (time.perf_counter() - t0) * 1000, status))

            await asyncio.gather(*(one(k) for k in range(clients)))
            return out

    results.put(asyncio.run(main()))


# -- measurement phases ----------------------------------------------------------------------

class Prober:
    """GET /api/health every ``every_s`` on its own connection; latencies (ms) and failures."""

    def __init__(self, url: str, every_s: float) -> None:
        self.url, self.every_s = url, every_s
        self.ms: list[float] = []
        self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as c:
            c.get("/api/health")
            while not self._stop.is_set():
                t0 = time.perf_counter()
                try:
                    ok = c.get("/api/health").status_code == 200
                except httpx.HTTPError:
                    ok = False
                ms = (time.perf_counter() - t0) * 1000
                self.ms.append(ms)
                self.failed += not ok
                self._stop.wait(max(0.0, self.every_s - ms / 1000))

    def __enter__(self) -> Prober:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


def sequential_reads(url: str, endpoints: list[Endpoint], seconds: float
                     ) -> tuple[dict[str, list[float]], int]:
    """One client reading the views one after the other for ``seconds``: ms per row, non-200s."""
    lat: dict[str, list[float]] = {}
    bad = 0
    with httpx.Client(base_url=url, timeout=120) as c:
        c.get("/api/health")
        deadline, i = time.perf_counter() + seconds, 0
        while time.perf_counter() < deadline:
            label, path, params = endpoints[i % len(endpoints)]
            i += 1
            t0 = time.perf_counter()
            r = c.get(path, params=params)
            lat.setdefault(label, []).append((time.perf_counter() - t0) * 1000)
            bad += r.status_code != 200
    return lat, bad


def loaded_reads(url: str, endpoints: list[Endpoint], clients: int, seconds: float,
                 probe_s: float) -> tuple[dict[str, list[float]], int, Prober, tuple[float, float]]:
    """``clients`` concurrent readers (another process) while the prober runs; also the
    wall-clock window of the load (for the server's log)."""
    ctx = mp.get_context("spawn")
    ready, go, results = ctx.Event(), ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=_load_process, args=(url, endpoints, clients, seconds, ready, go, results))
    proc.start()
    if not ready.wait(120):
        proc.kill()
        raise RuntimeError("load generator did not connect")
    with Prober(url, probe_s) as prober:
        time.sleep(0.2)  # the prober's own baseline
        go.set()
        began = time.time()
        rows = results.get(timeout=seconds + 300)
        ended = time.time()
    proc.join(30)
    lat: dict[str, list[float]] = {}
    bad = 0
    for label, ms, status in rows:
        lat.setdefault(label, []).append(ms)
        bad += status != 200
    return lat, bad, prober, (began, ended)


ANONYMOUS_MODELS = ("random:gpt2-small", "random:gpt2-tiny", "random:qwen2-0.5b")
LABEL_SETS, LABEL_BYTES = 100, 1 << 20


def anonymous_views() -> list[Endpoint]:
    """What anonymous clients may ask of a lab server that must stay cheap."""
    views: list[Endpoint] = [(f"cold graph ({m})", "/api/graph", {"model": m}) for m in ANONYMOUS_MODELS]
    views += [("unknown label set", "/api/labels/nope", {}),
              ("graph + unknown labels", "/api/graph", {"model": "demo", "labels": "nope"}),
              ("/api/models", "/api/models", {}),
              ("unknown model", "/api/pk", {"model": "no-such-model", "pairing": "OK"})]
    return views


def anonymous_phase(args: argparse.Namespace, tmp: Path) -> tuple[Prober, dict[str, list[float]], dict[int, int], bool]:
    """The lab-mode phase: (prober, client ms per row, statuses, a model was loaded)."""
    token = "bench-anonymous-token-0123456789"
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HEADGRAPH_DEVICE": "cpu",
           "HEADGRAPH_API_TOKEN": token, "HEADGRAPH_MODELS": ",".join(ANONYMOUS_MODELS)}
    with ServerProcess(tmp / "lab-cache", workers=args.workers, env=env, startup_timeout=300) as srv:
        signed = {"Authorization": f"Bearer {token}"}
        classes = {f"L{i // 100}H{i % 100}": "x" * 60 for i in range(LABEL_BYTES // 80)}
        with httpx.Client(base_url=srv.url, timeout=120, headers=signed) as c:
            for i in range(LABEL_SETS):  # stored sets an unknown name must not read one by one
                body = json.dumps({"name": f"set{i:03d}", "classes": classes})
                c.post("/api/labels", content=body, headers={"content-type": "application/json"},
                       params={"replace": "true"}).raise_for_status()
        lat, _bad, prober, _window = loaded_reads(srv.url, anonymous_views(), args.clients, args.seconds,
                                                  args.probe_ms / 1000)
        statuses: dict[int, int] = {}
        for rec in srv.records():
            if rec.get("logger") == "headgraph.access" and rec.get("path") != "/api/health":
                statuses[int(rec["status"])] = statuses.get(int(rec["status"]), 0) + 1
        with httpx.Client(base_url=srv.url, timeout=60) as c:
            models = c.get("/api/models").json()["models"]
        loaded = any(m["info"] is not None for m in models if m["id"] in ANONYMOUS_MODELS)
    return prober, lat, statuses, loaded


def anonymous_report(args: argparse.Namespace, prober: Prober, lat: dict[str, list[float]],
                     statuses: dict[int, int], loaded: bool) -> str:
    p99 = percentile(prober.ms, 99)
    lines = ["", f"Lab mode, {args.clients} anonymous clients for {args.seconds:g} s ({LABEL_SETS} stored "
             f"1 MiB label sets; models {', '.join(ANONYMOUS_MODELS)} offered, none loaded):", "",
             "| what | n | p50 ms | p99 ms |", "|---|---|---|---|",
             f"| **/api/health** | {len(prober.ms)} | {_cell(prober.ms, 50)} | **{_cell(prober.ms, 99)}** |"]
    lines += [f"| {label} | {len(v)} | {_cell(v, 50)} | {_cell(v, 99)} |" for label, v in lat.items()]
    fives = sum(n for s, n in statuses.items() if s >= 500)
    lines += ["", f"Statuses {dict(sorted(statuses.items()))}; 5xx {fives}; a model loaded: {loaded}. "
              f"Target health p99 < {HEALTH_TARGET_P99_MS:.0f} ms: "
              f"**{'met' if p99 < HEALTH_TARGET_P99_MS and not fives and not loaded else 'NOT met'}**.", ""]
    return "\n".join(lines)


def server_ms(records: list[dict[str, Any]], window: tuple[float, float]) -> dict[str, list[float]]:
    """The server's own time (access log ``ms``) per path for requests logged in ``window``."""
    out: dict[str, list[float]] = {}
    for rec in records:
        if rec.get("logger") == "headgraph.access" and window[0] <= rec.get("ts", 0) <= window[1] + 1:
            out.setdefault(str(rec["path"]), []).append(float(rec["ms"]))
    return out


# -- report ----------------------------------------------------------------------------------

def _cell(values: Sequence[float], q: float) -> str:
    v = percentile(values, q)
    if v != v:
        return "-"
    return f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 1000 else f"{v / 1000:.2f} s"


def report(args: argparse.Namespace, models: list[str], sizes: dict[str, int],
           idle_health: Prober, idle: dict[str, list[float]], idle_bad: int,
           load: dict[str, list[float]], load_bad: int, load_health: Prober,
           srv: dict[str, list[float]], load_avg: tuple[str, str], warm_s: float) -> str:
    import torch

    every_idle = [x for v in idle.values() for x in v]
    every_load = [x for v in load.values() for x in v]
    srv_health = srv.get("/api/health", [])
    srv_reads = [x for p, v in srv.items() if p != "/api/health" for x in v]
    p99 = percentile(load_health.ms, 99)
    n = args.clients
    lines = [
        SECTION, "",
        f"{time.strftime('%Y-%m-%d %H:%M')}; {platform.machine()}, {os.cpu_count()} CPUs "
        f"(shared with other jobs while measured), torch {torch.__version__}. headgraph only: "
        "TransformerLens has no API server, so there is no TL comparison here. "
        f"`bench_api.py --clients {n} --seconds {args.seconds:g} --big {args.big}`: one "
        f"uvicorn worker (`--workers {args.workers}`), fresh cache, models {', '.join(models)}; "
        f"warm-up (cold computations) {warm_s:.0f} s. Load average (1/5/15 min) {load_avg[0]} "
        f"at start, {load_avg[1]} at end.",
        "",
        f"No load: /api/health probed alone every {args.probe_ms:g} ms for {args.seconds:g} s; "
        f"warm reads by one client, one after another, for {args.seconds:g} s. Load: {n} "
        f"clients (persistent connections, another process) reading the warm views round-robin "
        f"as fast as they can for {args.seconds:g} s while the prober keeps probing. Client-side "
        "latencies (what a caller waits, including the clients' own Python on the same 2 cores); "
        "server = the server's own time per request under load (its access log; per path, both "
        "models together). Warm views per "
        "model: PK OQ/OK/OV x raw/normalized/z, CS K, graph, scatter, reference, top 20; largest "
        "bodies " + ", ".join(f"{p} {b / 1e6:.2f} MB" for p, b in sizes.items()) + ".",
        "",
        f"| what | no load n | no load p50 ms | no load p99 ms | {n} clients n "
        f"| {n} clients p50 ms | {n} clients p99 ms | server p50 / p99 ms |",
        "|---|---|---|---|---|---|---|---|",
        f"| **/api/health** | {len(idle_health.ms)} | {_cell(idle_health.ms, 50)} "
        f"| {_cell(idle_health.ms, 99)} | {len(load_health.ms)} | {_cell(load_health.ms, 50)} "
        f"| **{_cell(load_health.ms, 99)}** | {_cell(srv_health, 50)} / {_cell(srv_health, 99)} |",
        f"| **warm reads (all)** | {len(every_idle)} | {_cell(every_idle, 50)} "
        f"| {_cell(every_idle, 99)} | {len(every_load)} | {_cell(every_load, 50)} "
        f"| **{_cell(every_load, 99)}** | {_cell(srv_reads, 50)} / {_cell(srv_reads, 99)} |",
    ]
    for label in dict.fromkeys([*idle, *load]):
        a, b = idle.get(label, []), load.get(label, [])
        sv = srv.get(label.split(" ")[0], [])
        lines.append(f"| {label} | {len(a)} | {_cell(a, 50)} | {_cell(a, 99)} | {len(b)} "
                     f"| {_cell(b, 50)} | {_cell(b, 99)} | {_cell(sv, 50)} / {_cell(sv, 99)} |")
    rate = len(every_load) / args.seconds
    lines += ["",
              f"Under load: {rate:.0f} warm reads/s, {load_bad} non-200 (no load: {idle_bad}); "
              f"health failures {load_health.failed} (no load {idle_health.failed}), worst health "
              f"{max(load_health.ms or [0]):.1f} ms. Target health p99 < "
              f"{HEALTH_TARGET_P99_MS:.0f} ms with {n} clients: "
              f"**{'met' if p99 < HEALTH_TARGET_P99_MS else 'NOT met'}**.", ""]
    return "\n".join(lines)


def write_out(path: Path, section: str) -> None:
    """Append ``section`` to ``path``, replacing an earlier section of this benchmark."""
    old = path.read_text() if path.exists() else ""
    if SECTION in old:
        start = old.index(SECTION)
        nxt = old.find("\n## ", start + len(SECTION))
        old = old[:start].rstrip("\n") + ("\n" + old[nxt:] if nxt >= 0 else "")
    sep = "\n\n" if old.strip() else ""
    path.write_text(old.rstrip("\n") + sep + section.rstrip("\n") + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=15.0, help="length of each phase")
    ap.add_argument("--probe-ms", type=float, default=20.0, help="health probe interval")
    ap.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    ap.add_argument("--big", default="wide",
                    help="second model: wide (16 x 32 heads, 4.5 MB grids), a random:<preset> "
                         "spec (random:gpt2-small: 0.4 MB grids) or none")
    ap.add_argument("--out", type=Path, help="also append the Markdown table to this file")
    ap.add_argument("--anonymous", action="store_true",
                    help="also the lab-mode phase: anonymous clients on cold and unknown names")
    args = ap.parse_args(argv)

    load_start = "/".join(f"{x:.2f}" for x in os.getloadavg())
    with tempfile.TemporaryDirectory() as tmp:
        big = args.big
        if big == "wide":
            cfg = Path(tmp) / "wide" / "config.json"
            cfg.parent.mkdir()
            cfg.write_text(json.dumps(WIDE))
            big = f"random:{cfg}"
        models = {"demo": "demo"} | ({} if big == "none" else {big: args.big})
        endpoints = [e for m, label in models.items() for e in dashboard_views(m, label)]
        env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HEADGRAPH_DEVICE": "cpu"}
        if big != "none":
            env["HEADGRAPH_MODELS"] = big
        with ServerProcess(Path(tmp) / "cache", workers=args.workers, env=env,
                           startup_timeout=300) as srv:
            t0 = time.perf_counter()
            sizes: dict[str, int] = {}
            with httpx.Client(base_url=srv.url, timeout=1800) as c:
                for _ in range(args.workers + 1):  # every worker sees every view
                    for label, path, params in endpoints:
                        r = c.get(path, params=params)
                        r.raise_for_status()
                        sizes[label] = max(sizes.get(label, 0), len(r.content))
            warm_s = time.perf_counter() - t0
            print(f"warm-up: {warm_s:.1f} s", file=sys.stderr)
            with Prober(srv.url, args.probe_ms / 1000) as idle_health:
                time.sleep(args.seconds)
            idle, idle_bad = sequential_reads(srv.url, endpoints, args.seconds)
            load, load_bad, load_health, window = loaded_reads(
                srv.url, endpoints, args.clients, args.seconds, args.probe_ms / 1000)
            time.sleep(1.0)  # the last access-log lines
            srv_ms = server_ms(srv.records(), window)
            errors = srv.server_errors()
        anonymous = anonymous_phase(args, Path(tmp)) if args.anonymous else None
    load_end = "/".join(f"{x:.2f}" for x in os.getloadavg())
    largest = dict(sorted(sizes.items(), key=lambda kv: -kv[1])[:4])
    table = report(args, list(models.values()), largest, idle_health, idle, idle_bad, load,
                   load_bad, load_health, srv_ms, (load_start, load_end), warm_s)
    if anonymous is not None:
        table += anonymous_report(args, *anonymous)
    print(table)
    if errors:
        print(f"server errors: {errors[:3]}", file=sys.stderr)
    if args.out:
        write_out(args.out, table)
    return 0 if not errors and load_bad == 0 and idle_bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
