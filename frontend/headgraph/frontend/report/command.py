"""``headgraph report MODEL``: the findings page of one model, in one command.

Registered by the ``headgraph.commands`` entry point (the server's CLI finds it by name and
never imports the frontend). Starts ``headgraph serve`` on a free loopback port (or reads
``--url``), fetches every number over HTTP, decides the paper's claims and writes
``OUT/findings/<model>.md``, its figures in ``OUT/findings/<model>/`` and the index
``OUT/findings/README.md``. Errors (unknown model, unreachable server) are one line and exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

# The page's modules (figures, the dashboard's plotting code, the server for a local run) are
# imported when the command runs: every ``headgraph`` call loads this module to list it.


def add_parser(sub: Any, cache_opt: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add the ``report`` subcommand to the ``headgraph`` CLI's subparsers."""
    r = sub.add_parser(
        "report", help="findings page (markdown + figures) of one model: where the paper's claims hold",
        description="Start a headgraph server on a free loopback port (or use --url), fetch every "
        "number of MODEL over its HTTP API (cold results are computed: minutes for a real model), "
        "decide each claim of the PK paper by a stated rule and write OUT/findings/<model>.md with "
        "its figures in OUT/findings/<model>/ and the index OUT/findings/README.md.",
        epilog="examples: headgraph report demo | headgraph report smollm2 --cache-dir /tmp/hg-cache")
    r.add_argument("model", help="a model id the server lists (headgraph models): demo, smollm2, ...")
    r.add_argument("--out", default="docs", help="folder the findings/ folder goes in (default: docs)")
    r.add_argument("--url", help="use the headgraph server at this URL instead of starting one")
    cache_opt(r)
    r.set_defaults(func=run)


def _say(message: str) -> None:
    print(f"headgraph report: {message}", file=sys.stderr, flush=True)


def _client(url: str) -> httpx.Client:
    from headgraph.frontend.report.numbers import TIMEOUT_S

    token = os.environ.get("HEADGRAPH_API_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=url.rstrip("/"), timeout=TIMEOUT_S, headers=headers)


def fetch(model: str, url: str | None, cache_dir: str | None) -> dict[str, Any]:
    """The report's API answers, from ``url`` or from a server started for this run."""
    from headgraph.frontend.report.numbers import LocalServer, collect

    if url:
        with _client(url) as client:
            return collect(client, model, say=_say)
    log = Path(tempfile.gettempdir()) / f"headgraph-report-{os.getpid()}.log"
    _say(f"starting a headgraph server (log: {log})")
    with LocalServer(Path(cache_dir) if cache_dir else None, log) as server, _client(server.url) as client:
        return collect(client, model, say=_say)


def write_report(numbers: dict[str, Any], out: Path) -> Path:
    """Write the page, its figures and the index under ``out/findings``; returns the page."""
    from headgraph.frontend.report.charts import all_charts, write_pngs
    from headgraph.frontend.report.claims import all_verdicts
    from headgraph.frontend.report.markdown import index_page, render, slug

    folder = out / "findings"
    name = slug(numbers["model"])
    charts = all_charts(numbers)
    for old in (folder / name).glob("*.png") if (folder / name).is_dir() else ():
        old.unlink()  # figures the model no longer has (a model that can no longer run)
    write_pngs(charts, folder / name)
    page = folder / f"{name}.md"
    page.write_text(render(numbers, all_verdicts(numbers), charts, name), encoding="utf-8")
    (folder / "README.md").write_text(index_page(folder), encoding="utf-8")
    return page


def run(args: argparse.Namespace) -> int:
    """The subcommand: fetch, decide, write; prints each verdict; 2 on a bad model or server."""
    from headgraph.frontend.report.claims import all_verdicts
    from headgraph.frontend.report.numbers import ApiFailure

    try:
        numbers = fetch(args.model, args.url, getattr(args, "cache_dir", None))
    except ApiFailure as err:
        print(f"headgraph: error: {err}", file=sys.stderr)
        return 2
    _say("drawing the figures")
    try:
        page = write_report(numbers, Path(args.out))
    except (OSError, RuntimeError) as err:
        print(f"headgraph: error: could not write the report: {err}", file=sys.stderr)
        return 2
    for v in all_verdicts(numbers):
        print(f"{v.key}: {v.verdict} ({v.because})")
    print(f"wrote {page}")
    return 0

