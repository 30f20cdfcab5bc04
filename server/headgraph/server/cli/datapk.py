"""``headgraph datapk``: the data-weighted PK table (server.computations.data_pk.data_pk_view).

"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from headgraph.server.cli.common import cache_opt, fail, resolve_model, services_for
from headgraph.server.cli.tables import cell, text_table
from headgraph.server.computations.data_pk import (
    DATA_PK_PAIRINGS,
    DATA_PK_PROMPTS,
    DATA_PK_RANK_ON,
    DEFAULT_DATA_PK_TOP,
)
from headgraph.server.limits import GRAPH_K_MAX

COLUMNS = (("rank", "rank", "{}"), ("source", "source", "{}"), ("target", "target", "{}"),
           ("pk", "pk", "{:.3f}"), ("cs", "cs", "{:.3f}"), ("out_share", "out_share", "{:.4f}"),
           ("in_share", "in_share", "{:.4f}"), ("in baseline", "in_share_baseline", "{:.4f}"))


def datapk_text(report: dict[str, Any]) -> str:
    """The top edges of a data-weighted PK answer as an aligned table under its definitions."""
    cells = [[cell(r.get(key), fmt) for _, key, fmt in COLUMNS] for r in report["top"]]
    base = report["top"][0]["out_share_baseline"] if report["top"] else None
    lines = [f"model: {report['model']}  pairing: {report['pairing']}  prompts: "
             f"{report['prompts']} ({report['n_prompts']} sequences, {report['n_positions']} "
             f"positions)  top {report['k']} by {report['rank_on']}",
             "out_share = tr(U^T C_S U) / tr(C_S): share of the source's output variance in the "
             "target's read subspace (random plane: r/d"
             + ("" if base is None else f" = {base:.4f}") + ")",
             "in_share = tr(U^T C_S U) / tr(U^T C_X U): share of the variance the target reads "
             "that the source contributes (in baseline: tr(C_S) / tr(C_X))",
             *text_table([title for title, _, _ in COLUMNS], cells, align="rllrrrrr")]
    return "\n".join(lines) + "\n"


def add_parser(sub: Any) -> None:
    """Register ``datapk`` on the subcommand parsers ``sub``."""
    d = sub.add_parser(
        "datapk", help="data-weighted PK: top edges by out_share / in_share beside PK and CS",
        description="Run the model once over a prompt set and measure, for every forward O -> "
        "Q/K/V pair, the share of the source head's output variance inside the target's read "
        "subspace (out_share) and the share of the variance the target reads that the source "
        "contributes (in_share); print the top edges with their PK and CS. Needs a runnable "
        "model (the demo, a Hugging Face checkpoint, a GGUF). Cached like GET /api/datapk.")
    d.add_argument("model", help="registry name (demo, smollm2, ...) or a local checkpoint folder")
    d.add_argument("--pairing", default="OK", choices=list(DATA_PK_PAIRINGS))
    d.add_argument("--prompts", default="text", choices=list(DATA_PK_PROMPTS),
                   help="text: the bundled prompts; random: repeated random tokens")
    d.add_argument("--top", type=int, default=DEFAULT_DATA_PK_TOP, help=f"edges (1..{GRAPH_K_MAX})")
    d.add_argument("--rank-on", default="out_share", choices=list(DATA_PK_RANK_ON))
    d.add_argument("--json", action="store_true",
                   help="the top edges as one JSON object instead of the table")
    cache_opt(d)
    d.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.top <= GRAPH_K_MAX:
        return fail(f"--top must be in 1..{GRAPH_K_MAX}, got {args.top}")

    services = services_for(args)
    ref = resolve_model(services, args.model)
    report = services.data_pk.answer(ref, args.pairing, args.prompts, args.top, args.rank_on)
    if args.json:
        keys = ("model", "pairing", "prompts", "rank_on", "k", "n_positions", "n_prompts",
                "method", "top")
        sys.stdout.write(json.dumps({k: report[k] for k in keys}) + "\n")
    else:
        sys.stdout.write(datapk_text(report))
    sys.stdout.flush()
    return 0
