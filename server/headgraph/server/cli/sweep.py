"""``headgraph sweep SPEC...``: the chosen results of many models computed on Ray (server.sweep.run).

The parser, the command and the summary table live here so cli.py only registers it.
Progress (a bar over completed models) goes to stderr, the summary table (or ``--json``)
to stdout; the exit status is 1 when some model failed, 2 for bad arguments or no Ray.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from headgraph.server.cli.common import cache_opt
from headgraph.server.cli.tables import text_table
from headgraph.server.settings import Settings

COLUMNS = (("model", "model"), ("status", "status"), ("seconds", "seconds"),
           ("retries", "retries"), ("message", "error"))


def _cell(row: dict[str, Any], key: str) -> str:
    value = row.get(key)
    if key == "seconds":
        return "-" if value is None else f"{float(value):.1f}"
    if key == "error" and value is None:
        return f"{len(row.get('computed') or [])} results cached"
    return "-" if value is None else str(value)


def summary_text(report: dict[str, Any]) -> str:
    """The per-model table (model, status, seconds, retries, message), the totals and the
    command that serves every swept model from the sweep's cache."""
    rows = report["rows"]
    cells = [[_cell(r, key) for _, key in COLUMNS] for r in rows]
    done = sum(r["status"] == "done" for r in rows)
    where = f"Ray cluster {report['address']}" if report.get("address") else \
        f"local Ray runtime, {report.get('workers')} workers"
    minutes = report["seconds"] / 60
    rate = f"{done / minutes:.1f} models/min" if minutes > 0 else "-"
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in report["serve_env"].items())
    lines = [*text_table([title for title, _ in COLUMNS], cells, align="llrrl", strip=True), "",
             f"{done} of {len(rows)} models done in {report['seconds']:.1f} s ({rate}; {where}); "
             f"results: {','.join(report['results'])}",
             f"serve them: {env} headgraph serve"]
    return "\n".join(lines) + "\n"


def cmd_sweep(args: argparse.Namespace) -> int:
    from headgraph.server.sweep.run import SweepUnavailable, run_sweep
    from headgraph.server.sweep.specs import expand_specs
    from headgraph.server.sweep.task import parse_results

    def fail(message: str) -> int:
        print(f"headgraph: error: {message}", file=sys.stderr)
        return 2

    try:
        results = parse_results(args.results)
    except ValueError as err:
        return fail(f"--results: {err}")
    if args.workers is not None and args.workers < 1:
        return fail(f"--workers must be at least 1, got {args.workers}")
    if args.retries < 0:
        return fail(f"--retries must be at least 0, got {args.retries}")
    if args.workers is not None and args.address:
        return fail("--workers sizes a local Ray runtime; an existing cluster (--address) has its own")
    specs = expand_specs(args.specs)
    if not specs:
        return fail("no model specs given")
    overrides: dict[str, Any] = {}
    if args.cache_dir:
        overrides["cache_dir"] = Path(args.cache_dir)
    try:
        settings = Settings.from_env(**overrides)
        report = run_sweep(settings, specs, results, workers=args.workers, address=args.address,
                           retries=args.retries,
                           model_root=Path(args.model_root) if args.model_root else None,
                           progress=not args.quiet)
    except (SweepUnavailable, ValueError) as err:
        return fail(str(err))
    out = report.to_dict()
    sys.stdout.write(json.dumps(out) + "\n" if args.json else summary_text(out))
    sys.stdout.flush()
    return 1 if report.failed else 0


def add_parser(sub: Any) -> None:
    """Register ``sweep`` on the subcommand parsers ``sub``."""
    from headgraph.server.sweep.task import DEFAULT_RETRIES, RESULTS

    s = sub.add_parser(
        "sweep", help="compute many models on Ray into the result cache (needs the 'sweep' extra)",
        description="Compute the chosen results of every model SPEC as Ray tasks (a local Ray "
        "runtime, or an existing cluster with --address) into the result cache the server "
        "reads, retrying failed tasks, then print one row per model. A server started on that "
        "cache with the printed settings lists every swept model and serves its results "
        "without computing. Needs Ray: pip install 'headgraph-server[sweep]'.",
        epilog="examples: headgraph sweep demo random:gpt2-tiny | headgraph sweep 'ckpts/step-*' "
               "--workers 2 | headgraph sweep org/model@rev1,rev2 --model-root ./models")
    s.add_argument("specs", nargs="+", metavar="SPEC",
                   help="a model spec (registry name, random: spec, hub id, local folder or "
                   ".gguf), a glob of checkpoint folders, or a hub revision list org/model@rev1,rev2")
    s.add_argument("--results", default="job",
                   help=f"comma list of {', '.join(RESULTS)}; 'job' (default: what the dashboard's "
                   "compute job caches, all but graph) or 'all'")
    s.add_argument("--workers", type=int, default=None,
                   help="CPUs of the local Ray runtime, one model per CPU (default: all)")
    s.add_argument("--address", default=None,
                   help="an existing Ray cluster (e.g. 'auto' or ray://host:10001); its workers "
                   "must see the same cache folder")
    s.add_argument("--retries", type=int, default=DEFAULT_RETRIES,
                   help=f"Ray retries of a failed task (default {DEFAULT_RETRIES}; bad specs are "
                   "not retried)")
    s.add_argument("--model-root", default=None,
                   help="model root (default: $HEADGRAPH_MODEL_ROOT, else the one folder all swept "
                   "checkpoints sit in); hub revisions are downloaded into it")
    s.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    cache_opt(s)
    s.set_defaults(func=cmd_sweep)
