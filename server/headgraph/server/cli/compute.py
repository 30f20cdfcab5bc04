"""``headgraph compute MODEL``: precompute and cache every result of one model (the job)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from headgraph.core.names import GRAPH_PAIRINGS
from headgraph.server.cli.common import cache_opt, resolve_model, services_for


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from headgraph.core.names import parse_pairings
    from headgraph.server.services.jobs import Timing, run_compute

    services = services_for(args)
    ref = resolve_model(services, args.model)
    pairings = parse_pairings(args.pairings)
    mode = "none" if args.quiet else args.progress
    bar = tqdm(total=1000, file=sys.stderr, desc=ref.id, unit="‰", disable=mode != "bar",
               bar_format="{desc}: {percentage:3.0f}%|{bar}| {postfix}")
    timing = Timing({}, None)

    def progress(stage: str, fraction: float, message: str) -> None:
        if mode == "json":  # one line per stage, for scripts and benchmarks
            print(json.dumps({"time": time.time(), "stage": stage, "fraction": round(fraction, 4),
                              "message": message, "remaining_s": timing.remaining_s}),
                  file=sys.stderr, flush=True)
        bar.n = int(round(fraction * 1000))
        bar.set_postfix_str(message)
        bar.refresh()

    def finished(done: list[str], planned: list[str], unavailable: dict[str, str], t: Timing) -> None:
        nonlocal timing
        timing = t

    try:
        done, unavailable = run_compute(services.scores, services.catalog, ref, list(pairings),
                                        progress, finished, shown=services.jobs.shown)
    finally:
        bar.close()
    stats = services.store.stats()
    ident = services.catalog.identity(ref)
    out = {"model": ref.id, "fingerprint": ident.fingerprint,
           "model_fingerprint": ident.model_fingerprint,
           "computed": done, "cache": stats["directory"],
           "seconds": {k: round(v, 2) for k, v in timing.seconds.items()}}
    if unavailable:  # stages this model cannot give, with the reason
        out["unavailable"] = unavailable
    print(json.dumps(out))
    return 0


def add_parser(sub: Any) -> None:
    c = sub.add_parser("compute", help="precompute and cache everything for one model")
    c.add_argument("model", help="registry name (demo, gpt2, ...) or a local checkpoint folder")
    c.add_argument("--pairings", default=",".join(GRAPH_PAIRINGS))
    c.add_argument("--progress", choices=["bar", "json", "none"], default="bar",
                   help="progress on stderr: a bar, a JSON line per stage (time, stage, fraction, "
                        "message, estimated seconds left) or nothing")
    c.add_argument("-q", "--quiet", action="store_true", help="no progress (--progress none)")
    cache_opt(c)
    c.set_defaults(func=run)
