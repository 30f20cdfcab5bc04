"""``headgraph subgraph``: a bounded subgraph of a model's head graph
(server.services.subgraphs.SubgraphService.subgraph, the answer of GET /api/subgraph)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from headgraph.core.names import GRAPH_PAIRINGS, SUBGRAPH_RANK_ON
from headgraph.core.names import SUBGRAPH_CAP as DEFAULT_CAP
from headgraph.server.cli.common import cache_opt, fail, model_arg, resolve_model, services_for
from headgraph.server.limits import GRAPH_K_MAX, SUBGRAPH_CAP_MAX, SUBGRAPH_DEPTH_MAX


def subgraph_text(answer: dict[str, Any]) -> str:
    """The answer as text: its rule and counts, then one line per edge (best first)."""
    lines = [f"model: {answer['model']}", f"rule: {answer['rule']}",
             f"nodes: {', '.join(n['name'] for n in answer['nodes']) or '-'}",
             f"edges: {len(answer['edges'])} of {answer['total']}"
             + (f" ({answer['hint']})" if answer["left_out"] else "")]
    for e in answer["edges"]:
        cs = "-" if e["cs"] is None else f"{e['cs']:.4f}"
        lines.append(f"{e['rank']:>4}  {e['pairing']}  {e['source']:>7} -> {e['target']:<7}  "
                     f"PK {e['score']:.4f}  normalized {e['normalized']:.4f}  CS {cs}")
    return "\n".join(lines) + "\n"


def add_parser(sub: Any) -> None:
    """Register ``subgraph`` on the subcommand parsers ``sub``."""
    s = sub.add_parser(
        "subgraph", help="a bounded subgraph: edges among heads, a head's neighbourhood, or a layer "
        "range's top edges",
        description="Answer one subgraph query on MODEL's forward scores (cached like the API's, "
        "GET /api/subgraph returns the same): --heads (every edge among a head set), --head with "
        "--depth and --k (each reached head's k strongest incident edges, depth steps out) or "
        "--layers a-b with --k (the k best edges per pairing inside). At most --cap edges, best "
        "first by --rank-on; the answer says how many it left out.",
        epilog="examples: headgraph subgraph demo --heads L0H1,L0H4,L1H3 | headgraph subgraph demo "
               "--head L1H3 --depth 2 --k 3 | headgraph subgraph gpt2 --layers 4-6 --k 10 --json")
    model_arg(s)
    what = s.add_mutually_exclusive_group(required=True)
    what.add_argument("--heads", help="comma-separated heads: the edges among them (L0H1,L1H3; L6KV1 a KV group)")
    what.add_argument("--head", help="one head: its neighbourhood")
    what.add_argument("--layers", help="blocks a-b (both included): the top-k edges per pairing inside")
    s.add_argument("--depth", type=int, default=1, help=f"--head: steps out (1..{SUBGRAPH_DEPTH_MAX})")
    s.add_argument("--k", type=int, default=None,
                   help=f"--head: incident edges per head (default 5); --layers: edges per pairing "
                        f"(default 20); 1..{GRAPH_K_MAX}")
    s.add_argument("--pairings", default=",".join(GRAPH_PAIRINGS), help="comma-separated pairings")
    s.add_argument("--rank-on", default="pk", choices=SUBGRAPH_RANK_ON, help="ranking scale (cs: O -> Q/K/V only)")
    s.add_argument("--cap", type=int, default=DEFAULT_CAP, help=f"the most edges printed (1..{SUBGRAPH_CAP_MAX})")
    s.add_argument("--json", action="store_true", help="the API's JSON answer instead of text")
    cache_opt(s)
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.cap <= SUBGRAPH_CAP_MAX:
        return fail(f"--cap must be in 1..{SUBGRAPH_CAP_MAX}, got {args.cap}")
    from headgraph.core.names import parse_pairings

    services = services_for(args)
    ref = resolve_model(services, args.model)
    answer = services.subgraphs.subgraph(
        ref, pairings=list(parse_pairings(args.pairings)), rank_on=args.rank_on, heads=args.heads,
        head=args.head, depth=args.depth, k=args.k, layers=args.layers, cap=args.cap)
    sys.stdout.write(json.dumps(answer) + "\n" if args.json else subgraph_text(answer))
    sys.stdout.flush()
    return 0
