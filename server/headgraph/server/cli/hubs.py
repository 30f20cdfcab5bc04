"""``headgraph hubs``: the ranked hub table of the paper's head graph (server.services.graphs.GraphService.hubs).

"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from headgraph.core.names import DEFAULT_K, GRAPH_PAIRINGS
from headgraph.server.cli.common import cache_opt, fail, resolve_model, services_for
from headgraph.server.cli.tables import text_table
from headgraph.server.limits import GRAPH_K_MAX

HUB_COLUMNS = (("rank", "rank", "{}"), ("node", "name", "{}"), ("in", "in_degree", "{}"),
               ("out", "out_degree", "{}"), ("total", "degree", "{}"),
               ("weighted", "weighted_degree", "{:.4f}"), ("pagerank", "pagerank", "{:.4f}"),
               ("betweenness", "betweenness", "{:.4f}"), ("hub", "is_hub", "{}"))


def hub_text(report: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """The ranked hub table as aligned text, preceded by the graph and hub rules."""
    cells = [[fmt.format(("yes" if r[key] else "") if key == "is_hub" else r[key])
              for _, key, fmt in HUB_COLUMNS] for r in rows]
    lines = [f"model: {report['model']}",
             f"graph: {report['graph_rule']} (head granularity, pairings "
             f"{','.join(report['pairings'])}; edges "
             + ", ".join(f"{p} {n}" for p, n in report["edge_counts"].items()) + ")",
             f"rule: {report['rule']}",
             f"hubs: {', '.join(report['hubs']) or '-'}",
             *hub_notes(report, rows),
             *text_table([title for title, _, _ in HUB_COLUMNS], cells, align="rlrrrrrrr")]
    return "\n".join(lines) + "\n"


def hub_notes(report: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """Above the table: what each listed node's heads do (core.activations.flags descriptions, "not
    measured" without pattern scores; "sink" marked) and the degree ties, as ties."""
    if not rows:
        return []
    width = max(len(r["name"]) for r in rows)
    rule = report.get("describe_rule")
    lines = ["what the heads do: " + (rule or "not measured (the model has no pattern scores)")]
    for r in rows:
        rank = f"{r.get('degree_rank', r['rank'])}{'=' if r.get('tie') else ''}"
        what = r.get("description") or "not measured"
        sink = "  [attention sink]" if r.get("sink") else ""
        lines.append(f"  {r['name']:<{width}}  degree rank {rank:<4} {what}{sink}")
    ties: dict[int, list[str]] = {}
    for r in rows:
        if r.get("tie"):
            ties.setdefault(int(r["degree"]), []).append(r["name"])
    if ties:
        lines.append("ties (equal total degree): " + "; ".join(
            f"{' = '.join(names)} ({d})" for d, names in ties.items()))
    return lines


def add_parser(sub: Any) -> None:
    """Register ``hubs`` on the subcommand parsers ``sub``."""
    h = sub.add_parser(
        "hubs", help="ranked hub table of the paper's head graph (PK top-k per pairing); "
        "`headgraph hubs gpt2` prints L4H7 first on real GPT-2 small",
        description="Build the paper's head graph (Projection Kernel, forward layer order, head "
        "granularity, the top-K edges of each pairing) from MODEL's weights and print every "
        "node ranked by total degree (ties: weighted degree, then name) with in/out/total "
        "degree, weighted degree, PageRank, betweenness and whether the hub rule calls it a "
        "hub. Results are cached like the API's (GET /api/graph with the same parameters "
        "returns the same table). Paper check (Yamagiwa et al. 2026): on real GPT-2 small, "
        "`headgraph hubs gpt2` should print L4H7 first; it needs the weights on disk (Hugging "
        "Face cache or a local folder).",
        epilog="examples: headgraph hubs gpt2 | headgraph hubs ./my-checkpoint --json | "
               "headgraph hubs demo --pairings OK --top 10")
    h.add_argument("model", help="registry name (demo, gpt2, ...) or a local checkpoint folder")
    h.add_argument("--pairings", default=",".join(GRAPH_PAIRINGS), help="comma-separated pairings (paper: OQ,OK,OV)")
    h.add_argument("--top", type=int, default=DEFAULT_K,
                   help=f"edges kept per pairing, the K of top-K (paper: 20; 1..{GRAPH_K_MAX})")
    h.add_argument("--rows", type=int, default=None, help="print only the first N ranked nodes")
    h.add_argument("--json", action="store_true", help="one JSON object instead of the text table")
    cache_opt(h)
    h.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.top <= GRAPH_K_MAX:
        return fail(f"--top must be in 1..{GRAPH_K_MAX}, got {args.top}")
    if args.rows is not None and args.rows < 1:
        return fail(f"--rows must be at least 1, got {args.rows}")
    from headgraph.core.names import parse_pairings

    services = services_for(args)
    ref = resolve_model(services, args.model)
    # The CLI waits for the pattern scores, so every hub is described by what its heads do.
    report = services.graphs.hubs(ref, pairings=parse_pairings(args.pairings), k=args.top, flags=True)
    rows = report["rows"] if args.rows is None else report["rows"][: args.rows]
    if args.json:
        sys.stdout.write(json.dumps({**report, "rows": rows}) + "\n")
    else:
        sys.stdout.write(hub_text(report, rows))
    sys.stdout.flush()
    return 0
