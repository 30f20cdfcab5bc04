"""Capture the dashboard's views as PNG screenshots under docs/.

Starts the server with ``headgraph.server.http.launch.ServerProcess`` (through tests/browser.py's
``start_server``) on a free loopback port with a fresh cache (or --cache-dir), lets
the demo model compute, then opens each view through its shareable link and saves a full-page
screenshot. The links name no overlay, so the views show the dashboard's default one: the
API's per-model ``patterns`` set (heads classed by the demo's own attention patterns):

    docs/dashboard-graph.png  docs/heatmap.png  docs/scatter.png
    docs/reference.png        docs/tokens.png   docs/pair.png

Usage: .venv/bin/python scripts/screenshots.py [--out docs] [--cache-dir DIR]
Needs Debian's chromium at /usr/bin/chromium (never ``playwright install``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from browser import Server, launch_browser, start_server, wait_figure  # noqa: E402

VIEWPORT = {"width": 1440, "height": 900}


def prepare(server: Server) -> dict[str, Any]:
    """Compute the demo model; return a few API answers the shots use."""
    with httpx.Client(base_url=server.url, timeout=300) as http:
        job = http.post("/api/models/compute", params={"model": "demo"}).json()["job"]
        while (state := http.get(f"/api/jobs/{job['id']}").json())["state"] in ("queued", "running"):
            time.sleep(0.3)
        if state["state"] != "done":
            raise RuntimeError(f"compute failed: {state.get('error')}")
        top = http.get("/api/top", params={"model": "demo", "pairing": "OK", "k": 1}).json()["pairs"][0]
        return {"top": top}


def has_data(kind: str) -> Callable[[dict[str, Any]], bool]:
    return lambda f: bool(f and f["data"]) and any(t.get("type") == kind for t in f["data"])


def shoot(page: Any, url: str, path: Path, waits: list[tuple[str, Callable[[dict[str, Any]], bool]]],
          panel: str | None = None) -> None:
    page.goto(url)
    for graph_id, predicate in waits:
        wait_figure(page, graph_id, predicate, timeout=120)
    if panel:
        page.locator(panel).wait_for(state="visible", timeout=60_000)
    page.wait_for_timeout(1200)  # let transitions and fonts settle
    page.screenshot(path=str(path), full_page=True)
    print(f"wrote {path}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs"), help="folder for the PNG files")
    ap.add_argument("--cache-dir", default=None, help="server cache (default: a fresh temp folder)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(args.cache_dir) if args.cache_dir else Path(tmp) / "cache"
        server = start_server(cache)
        try:
            info = prepare(server)
            src, tgt = info["top"]["source"], info["top"]["target"]
            base = f"{server.url}/?model=demo"  # no overlay named: the default ("patterns")
            with sync_playwright() as p:
                browser = launch_browser(p)
                page = browser.new_page(viewport=VIEWPORT, device_scale_factor=1)
                shoot(page, f"{base}&view=graph&k=20&head={tgt}", out / "dashboard-graph.png",
                      [("graph", lambda f: sum(1 for t in f["data"] if t.get("mode") == "lines") >= 3)],
                      panel="#head-panel-title")
                shoot(page, f"{base}&view=heatmap&pairing=OK&metric=raw&head={src}", out / "heatmap.png",
                      [("heatmap", has_data("heatmap")), ("head-grid", has_data("heatmap"))])
                shoot(page, f"{base}&view=scatter&pairing=OK&top_percent=5", out / "scatter.png",
                      [("scatter", lambda f: len(f["data"]) >= 4)])
                shoot(page, f"{base}&view=reference&pairing=OK", out / "reference.png",
                      [("kl-grid", has_data("heatmap")), ("ref-hist", has_data("bar")),
                       ("null-fig", has_data("scatter"))])
                shoot(page, f"{base}&view=tokens&role=O", out / "tokens.png",
                      [("token-grid", has_data("heatmap")), ("patterns", has_data("heatmap"))])
                shoot(page, f"{base}&view=graph&k=5&pairing=OK&pair={src},{tgt}", out / "pair.png",
                      [("graph", lambda f: any(t.get("mode") == "lines" for t in f["data"])),
                       ("cosines", has_data("bar"))], panel="#pair-panel-title")
                browser.close()
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
