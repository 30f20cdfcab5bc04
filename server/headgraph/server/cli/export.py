"""``headgraph export MODEL``: ranked head pairs of one pairing with PK, CS, CKA and Procrustes
(JSON, CSV) or its graph (GraphML)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from headgraph.core.names import (
    DEFAULT_K,
    LAYER_ORDERS,
    RANK_METRICS,
    SIMILARITY_KINDS,
    SIMILARITY_MODES,
)
from headgraph.server.cli.common import cache_opt, fail, resolve_model, services_for
from headgraph.server.cli.tables import csv_text
from headgraph.server.limits import GRAPH_K_MAX

if TYPE_CHECKING:
    from headgraph.server.models.offered import ModelRef
    from headgraph.server.services.views import ViewService

EXPORT_FORMATS = ("csv", "json", "graphml")


def export_records(views: ViewService, ref: ModelRef, pairing: str, top: int, metric: str,
                   order: str, similarity: str = "compute") -> list[dict[str, Any]]:
    """Ranked pairs with source, target, pk, normalized, cs, cka, procrustes (+ z when ranked
    by z); a pair whose target is a grouped-query KV group also has cs_of (its CS is the mean
    over the group's query heads, named there; CKA and Procrustes are the KV head's own, as
    PK; ViewService.top). ``similarity="cached"``: CKA / Procrustes only from grids already
    cached (the ranked one always computed)."""
    records = views.top(ref, pairing, top, metric, order, similarity)
    out = []
    for r in records:
        row = {"source": r["source"], "target": r["target"], "pk": r.get("pk"),
               "normalized": r.get("normalized"), "cs": r.get("cs"),
               **{kind: r.get(kind) for kind in SIMILARITY_KINDS}}
        if "cs_of" in r:
            row["cs_of"] = r["cs_of"]
        if metric == "z":
            row["z"] = r.get("z")
        out.append(row)
    return out


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.top <= GRAPH_K_MAX:
        return fail(f"--top must be in 1..{GRAPH_K_MAX}, got {args.top}")
    from headgraph.core.names import check_pairing

    services = services_for(args)
    ref = resolve_model(services, args.model)
    check_pairing(args.pairing)
    if args.format == "graphml":
        if args.metric in ("cs", *SIMILARITY_KINDS):
            return fail("graphml export ranks edges by pk, normalized or z (CS is an edge "
                        "attribute; CKA and Procrustes are in the json and csv exports)")
        text = services.graphs.graph_export(ref, "graphml", pairings=[args.pairing], granularity="head",
                                    k=args.top, threshold=None, threshold_on=args.metric,
                                    labels=None)
    else:
        rows = export_records(services.views, ref, args.pairing, args.top, args.metric, args.order,
                              args.similarity)
        if args.format == "json":
            text = json.dumps({"model": ref.id, "pairing": args.pairing, "metric": args.metric,
                               "order": args.order, "pairs": rows}) + "\n"
        else:
            cols = ["source", "target", "pk", "normalized", "cs"]
            cols += ["cs_of"] if any("cs_of" in r for r in rows) else []
            cols += SIMILARITY_KINDS
            cols += ["z"] if args.metric == "z" else []
            text = csv_text(cols, ([r.get(c) for c in cols] for r in rows))
    if args.output:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    return 0


def add_parser(sub: Any) -> None:
    e = sub.add_parser("export", help="ranked head pairs of one pairing (json, csv) or its graph (graphml)")
    e.add_argument("model", help="registry name (demo, gpt2, ...) or a local checkpoint folder")
    e.add_argument("--pairing", default="OK")
    e.add_argument("--top", type=int, default=DEFAULT_K, help=f"number of pairs / edges (1..{GRAPH_K_MAX})")
    e.add_argument("--metric", default="pk", choices=RANK_METRICS, help="ranking metric")
    e.add_argument("--order", default="forward", choices=list(LAYER_ORDERS))
    e.add_argument("--similarity", default="compute", choices=list(SIMILARITY_MODES),
                   help="the cka / procrustes columns: compute both grids (default; each about "
                        "as costly as PK's), or only read grids already cached (others empty)")
    e.add_argument("--format", default="json", choices=EXPORT_FORMATS)
    e.add_argument("-o", "--output", help="write to this file instead of stdout")
    cache_opt(e)
    e.set_defaults(func=run)
