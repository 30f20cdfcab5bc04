"""``headgraph recovery``: every metric's recovery of a label set's circuit on one pairing (the PK
paper's Tables 1 and 2; server.computations.recovery, core.stats.recovery)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from headgraph.core.names import DEFAULT_K, GRAPH_PAIRINGS
from headgraph.server.cli.common import cache_opt, resolve_model, services_for
from headgraph.server.computations.recovery import K_MAX


def _ci(est: dict[str, Any] | None) -> str:
    if est is None or est["value"] is None:
        return "-"
    if est["low"] is None or est["high"] is None:
        return f"{est['value']:.3f}"
    return f"{est['value']:.3f} [{est['low']:.3f}, {est['high']:.3f}]"


def recovery_text(report: dict[str, Any]) -> str:
    """One row per metric: endpoint share, precision@k and ROC-AUC with intervals, and the
    paired differences vs the baseline (PK)."""
    k = report["k"]
    lines = [f"model: {report['model']}  pairing: {report['pairing']}  reference: label set "
             f"{report['labels']!r} ({len(report['reference_heads'])} heads)  k: {k}",
             f"valid pairs: {report['n_valid']}  in the reference: {report['n_reference']} "
             f"(base rate {report['base_rate']:.3f})",
             report["method"], ""]
    heads = ("metric", f"top-{k} endpoint share", f"precision@{k}", "ROC-AUC",
             f"precision - {report['baseline']}", f"AUC - {report['baseline']}")
    cells = [(r["metric"], _ci(r["endpoint_share"]), _ci(r["precision"]), _ci(r["auc"]),
              _ci(r["precision_diff"]), _ci(r["auc_diff"])) for r in report["rows"]]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(heads)]
    lines.append("  ".join(h.ljust(w) for h, w in zip(heads, widths)))
    lines += ["  ".join(v.ljust(w) for v, w in zip(c, widths)) for c in cells]
    return "\n".join(lines) + "\n"


def add_parser(sub: Any) -> None:
    """Register ``recovery`` on the subcommand parsers ``sub``."""
    r = sub.add_parser(
        "recovery", help="each metric's recovery of a label set's circuit (the PK paper's Tables 1 and 2)",
        description="For one O -> Q/K/V pairing and a label set as the reference (an edge is in it when "
        "both heads are labelled), print per metric (PK raw / normalized, CS, CKA, Procrustes, layer "
        "gap, random) the share of its top-k edges' endpoints on reference heads, precision@k and "
        "ROC-AUC over all valid forward pairs, with bootstrap 95%% intervals and paired differences "
        "vs PK. Cached like GET /api/recovery.")
    r.add_argument("model", help="registry name (demo, smollm2, ...) or a local checkpoint folder")
    r.add_argument("--labels", required=True,
                   help="label set whose heads are the reference (built-in, uploaded or 'patterns')")
    r.add_argument("--pairing", default="OK", choices=list(GRAPH_PAIRINGS))
    r.add_argument("--k", type=int, default=DEFAULT_K, help=f"top edges per metric (1..{K_MAX})")
    r.add_argument("--json", action="store_true", help="the whole answer as one JSON object")
    cache_opt(r)
    r.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    services = services_for(args)
    ref = resolve_model(services, args.model)
    report = services.recovery.answer(ref, args.pairing, args.labels, args.k)
    sys.stdout.write(json.dumps(report) + "\n" if args.json else recovery_text(report))
    sys.stdout.flush()
    return 0
