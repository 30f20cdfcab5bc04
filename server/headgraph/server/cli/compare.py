"""``headgraph timeline SERIES`` and ``headgraph compare A B`` (server.services.comparisons).

Both print tables to stdout; ``--csv FILE`` / ``--json FILE`` also write the trajectories or
the comparison (``-`` for stdout instead of the table). The JSON is what GET /api/timeline and
GET /api/compare answer.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from headgraph.server.cli.common import cache_opt, resolve_model, services_for
from headgraph.server.cli.tables import csv_text, text_table

if TYPE_CHECKING:
    pass



def _num(v: float | None, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def timeline_text(report: dict[str, Any]) -> str:
    """One row per edge: its PK at each step and the change from the first step to the last."""
    lines = [f"series: {report['series']}  pairing: {report['pairing']}  {report['selection']}"]
    heads = ["edge"] + [f"step {s}" for s in report["steps"]] + ["change"]
    rows = [[f"{e['source']} -> {e['target']}"] + [_num(v) for v in e["pk"]] + [_num(e["change"])]
            for e in report["edges"]]
    return "\n".join(lines + text_table(heads, rows)) + "\n"


def compare_text(report: dict[str, Any]) -> str:
    """Summary, edges gained / lost / changed and hubs moved, as tables."""
    s = report["summary"]
    lines = [f"A: {report['a']}  B: {report['b']}  pairing: {report['pairing']}  "
             f"metric: {report['metric']}  top-k: {report['k']}",
             f"|B - A| max {s['max_abs_diff']:.3f}, mean {s['mean_abs_diff']:.3f}; "
             f"{s['n_gained']} gained, {s['n_lost']} lost, {s['n_kept']} kept"]
    heads = ["edge", "status", "A", "B", "B - A", "rank A", "rank B"]
    for part in ("gained", "lost", "changed"):
        lines += ["", f"{part}:"]
        rows = [[f"{c['source']} -> {c['target']}", c["status"], _num(c["a"]), _num(c["b"]),
                 f"{c['delta']:+.3f}", str(c["rank_a"] or "-"), str(c["rank_b"] or "-")]
                for c in report[part]]
        lines += text_table(heads, rows) if rows else ["  (none)"]
    lines += ["", "hubs:"]
    rows = [[m["name"], m["status"], str(m["rank_a"] or "-"), str(m["rank_b"] or "-"),
             str(m["degree_a"]), str(m["degree_b"])] for m in report["hub_moves"]]
    lines += text_table(["head", "status", "rank A", "rank B", "degree A", "degree B"], rows) \
        if rows else ["  (none)"]
    return "\n".join(lines) + "\n"


def compare_csv(report: dict[str, Any]) -> str:
    """Every edge of either top-k: source,target,status,a,b,delta,rank_a,rank_b."""
    heads = ["source", "target", "status", "a", "b", "delta", "rank_a", "rank_b"]
    return csv_text(heads, ([c[h] for h in heads]
                            for c in report["gained"] + report["lost"] + report["changed"]))


def _write(target: str | None, text: str) -> bool:
    """Write ``text`` to a file (True when that file was stdout, ``-``)."""
    if target is None:
        return False
    if target == "-":
        sys.stdout.write(text)
        return True
    Path(target).expanduser().write_text(text)
    return False


def _outputs(args: argparse.Namespace, table: str, as_json: dict[str, Any], as_csv: Callable[[], str]
             ) -> int:
    to_stdout = _write(args.json, json.dumps(as_json) + "\n")
    to_stdout = _write(args.csv, as_csv()) or to_stdout
    if not to_stdout:
        sys.stdout.write(table)
    sys.stdout.flush()
    return 0


def add_parser(sub: Any) -> None:
    """Register ``timeline`` and ``compare`` on the subcommand parsers ``sub``."""
    from headgraph.server.limits import GRAPH_K_MAX, TIMELINE_EDGES_MAX

    def cmd_timeline(args: argparse.Namespace) -> int:
        from headgraph.server.services.comparisons import (
            parse_edges,
            resolve_series,
            timeline,
            timeline_csv,
            timeline_json,
        )

        if not 1 <= args.k <= TIMELINE_EDGES_MAX:
            raise SystemExit(f"headgraph: error: --k must be in 1..{TIMELINE_EDGES_MAX}, got {args.k}")
        svc = services_for(args)
        series = resolve_series(svc.catalog, args.series)
        tl = timeline(svc.scores, svc.catalog, series, args.pairing, k=args.k,
                      metric=args.metric, edges=parse_edges(args.edge))
        report = timeline_json(tl, series, args.k, args.metric)
        return _outputs(args, timeline_text(report), report, lambda: timeline_csv(tl))

    def cmd_compare(args: argparse.Namespace) -> int:
        from headgraph.server.services.comparisons import compare, compare_json

        if not 1 <= args.k <= GRAPH_K_MAX:
            raise SystemExit(f"headgraph: error: --k must be in 1..{GRAPH_K_MAX}, got {args.k}")
        svc = services_for(args)
        a, b = resolve_model(svc, args.a), resolve_model(svc, args.b)
        d = compare(svc.scores, svc.catalog, a, b, args.pairing, k=args.k, metric=args.metric)
        report = compare_json(d, a, b, svc.catalog)
        return _outputs(args, compare_text(report), report, lambda: compare_csv(report))

    t = sub.add_parser(
        "timeline", help="per-edge PK over a series of checkpoints (e.g. demo-series)",
        description="Follow edges of one pairing across the checkpoints of a series: the last "
        "checkpoint's top-k (or --edge) with their PK at every step. SERIES is a named series "
        "(demo-series) or a comma list of model ids / folders. Same answer as GET /api/timeline.")
    t.add_argument("series", help="demo-series, or MODEL1,MODEL2,... in step order")
    t.add_argument("--pairing", default="OK")
    t.add_argument("--k", type=int, default=10, help=f"top-k edges of the last checkpoint (1..{TIMELINE_EDGES_MAX})")
    t.add_argument("--metric", default="pk", choices=["pk", "normalized"])
    t.add_argument("--edge", action="append", help="follow this edge instead: SOURCE,TARGET (repeatable)")
    t.add_argument("--csv", help="write the trajectories as CSV (one row per edge and step; - = stdout)")
    t.add_argument("--json", help="write the whole answer as JSON (- = stdout)")
    cache_opt(t)
    t.set_defaults(func=cmd_timeline)

    c = sub.add_parser(
        "compare", help="two models or checkpoints of one head layout: edges gained/lost/changed, hubs",
        description="Compare one pairing's PK between A and B (same layers and heads): |B - A|, "
        "the top-k edges gained, lost and changed, and the hubs of each top-k graph. Same "
        "answer as GET /api/compare.")
    c.add_argument("a", help="model A (e.g. demo@step-30)")
    c.add_argument("b", help="model B (e.g. demo)")
    c.add_argument("--pairing", default="OK")
    c.add_argument("--k", type=int, default=20, help=f"top-k edges per model (1..{GRAPH_K_MAX})")
    c.add_argument("--metric", default="pk", choices=["pk", "normalized"])
    c.add_argument("--csv", help="write every edge of either top-k as CSV (- = stdout)")
    c.add_argument("--json", help="write the whole answer as JSON (- = stdout)")
    cache_opt(c)
    c.set_defaults(func=cmd_compare)
