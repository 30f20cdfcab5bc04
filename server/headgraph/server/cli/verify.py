"""``headgraph verify``: path-ablation effects of the top PK edges (server.computations.ablation).

"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from headgraph.server.cli.common import cache_opt, fail, resolve_model, services_for
from headgraph.server.cli.tables import cell, text_table
from headgraph.server.computations.ablation import ABLATION_PAIRINGS, ABLATIONS, DEFAULT_ABLATION, DEFAULT_ABLATION_TOP
from headgraph.server.limits import ABLATION_TOP_MAX

VERIFY_COLUMNS = (("source", "source", "{}"), ("target", "target", "{}"), ("pk", "pk", "{:.3f}"),
                  ("cs", "cs", "{:.3f}"), ("effect text", "effect_text", "{:.4f}"),
                  ("effect random", "effect_random", "{:.4f}"), ("verdict", "verdict", "{}"))


def verify_text(report: dict[str, Any]) -> str:
    """The path-ablation table (server.computations.ablation.ablation_view) as aligned text."""
    cells = [[cell(r.get(key), fmt) for _, key, fmt in VERIFY_COLUMNS]
             for r in report["edges"]]
    measure = "TVD of the target's attention rows" if report["pairing"] != "OV" else \
        "relative change of the target's output"
    rel = "; ".join(f"{name} {cell(v.get('reliability'), '{:.3f}')}"
                    for name, v in report["reliability"].items())
    lines = [f"model: {report['model']}  pairing: {report['pairing']} ({report['selection']})",
             f"effect: source output {report.get('ablation', 'mean')}-ablated on the target's "
             f"{report['pairing'][1]} input only ({measure})",
             "prompts: " + ", ".join(f"{k} {v}" for k, v in report["n_prompts"].items()),
             f"split-half reliability (Spearman-Brown): {rel}",
             f"verdict: {report['verdict_rule']['rule']}",
             f"here: verified = {report['verdict_rule']['summary']}",
             *text_table([title for title, _, _ in VERIFY_COLUMNS], cells, align="llrrrrr")]
    return "\n".join(lines) + "\n"


def add_parser(sub: Any) -> None:
    """Register ``verify`` on the subcommand parsers ``sub``."""
    v = sub.add_parser(
        "verify", help="activation-level check of the top PK edges: path-ablation effects",
        description="Mean- (or resample-) ablate each edge's source head output on its target's Q, K or V "
        "input only (LayerNorm/RMSNorm scale frozen) and print the change of the target "
        "(attention TVD for OQ/OK, relative output change for OV) on the bundled text prompts "
        "and on repeated random tokens, with split-half reliability. Needs a runnable model "
        "(the demo, a Hugging Face checkpoint, a GGUF). An edge is verified when it is above "
        "the random-pair null of the same model and pairing (a Bonferroni quantile, computed "
        "once and cached). Cached like GET /api/ablation.")
    v.add_argument("model", help="registry name (demo, smollm2, ...) or a local checkpoint folder")
    v.add_argument("--pairing", default="OK", choices=list(ABLATION_PAIRINGS))
    v.add_argument("--top", type=int, default=DEFAULT_ABLATION_TOP,
                   help=f"the k highest-PK edges (1..{ABLATION_TOP_MAX})")
    v.add_argument("--source", help="one edge's source head (with --target), e.g. L0H0")
    v.add_argument("--target", help="one edge's target head or KV group, e.g. L1H3 or L17KV1")
    v.add_argument("--ablation", default=DEFAULT_ABLATION, choices=list(ABLATIONS),
                   help="mean: the source's output replaced by its mean over the prompt set; "
                        "resample: by its value on the next prompt at the same position")
    v.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    cache_opt(v)
    v.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.top <= ABLATION_TOP_MAX:
        return fail(f"--top must be in 1..{ABLATION_TOP_MAX}, got {args.top}")

    services = services_for(args)
    ref = resolve_model(services, args.model)
    if (args.source is None) != (args.target is None):
        return fail("give both --source and --target for one edge, or neither for the top edges")
    edge = None if args.source is None else (args.source, args.target)
    report = services.ablation.answer(ref, args.pairing, args.top, edge, ablation=args.ablation)
    sys.stdout.write(json.dumps(report) + "\n" if args.json else verify_text(report))
    sys.stdout.flush()
    return 0
