"""``headgraph validate``: weight metrics against path-ablation effects (server.computations.validation).

"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from headgraph.server.cli.common import cache_opt, resolve_model, services_for
from headgraph.server.cli.tables import interval, text_table
from headgraph.server.computations.ablation import ABLATION_PAIRINGS
from headgraph.server.computations.validation import DEFAULT_SAMPLE, DEFAULT_TOP
from headgraph.server.limits import VALIDATION_SAMPLE_MAX, VALIDATION_TOP_MAX


def validation_text(report: dict[str, Any]) -> str:
    """Per prompt set and metric: Spearman over the random sample, mean effect and Spearman of its top-k."""
    lines = [f"model: {report['model']}  pairing: {report['pairing']}  random forward pairs: "
             f"{report['n_sample']} (seed {report['seed']})  top-k: {report['k']}",
             power_text(report.get("power")), report["method"]]
    for prompt_set, rows in report["summary"].items():
        cells = [(r["metric"], interval(r["random_rho"]), interval(r["top_mean_effect"]),
                  interval(r["top_rho"])) for r in rows]
        heads = (f"{prompt_set} prompts", "rho (random sample)", f"mean effect of top {report['k']}",
                 f"rho within top {report['k']}")
        lines += ["", *text_table(heads, cells)]
        for d in (report.get("paired") or {}).get(prompt_set, []):
            diff = interval({"value": d["difference"], "low": d["low"], "high": d["high"]})
            lines.append(f"  {d['metric_a']} - {d['metric_b']}: {diff} (paired, n = {d['n']}): "
                         + VERDICT_WORDS.get(d["verdict"], "undefined").format(a=d["metric_a"], b=d["metric_b"]))
    if report.get("precision"):
        lines += ["", f"top-{report['k']} precision against held-out random pairs (thresholds from one seeded half "
                      "of the null, the other half judged; verified share, one-sided Fisher exact test):"]
        for r in report["precision"]:
            if r.get("verified") is None:
                lines.append(f"  {r['metric']}: unresolved (q = {r['quantile']:.4g}: {r.get('n_calibration')} "
                             "calibration pairs are too few), no verdict")
                continue
            lines.append(f"  {r['metric']}: {r['verified']} of {r['k']} verified vs {r['null_verified']} of "
                         f"{r['n_null']} held-out random pairs (q = {r['quantile']:.4g}), p = {r['p_value']:.2g}, "
                         f"achieved FWER {r.get('achieved_fwer') or 0:.2g}")
    return "\n".join(lines) + "\n"


VERDICT_WORDS = {"A": "{a} better", "B": "{b} better", "tie": "no difference"}


def power_text(power: dict[str, Any] | None) -> str:
    """"64 of 200 requested pairs (all the model has): power 0.65 for rho = 0.3 (90 reach 0.8)"."""
    if not power:
        return ""
    short = " (all the model has)" if power["n"] < power["requested"] else ""
    value = "undefined" if power["power"] is None else f"{power['power']:.2f}"
    return (f"{power['n']} of {power['requested']} requested pairs{short}: power {value} for rho = "
            f"{power['rho']:g} at alpha {power['alpha']:g} ({power['n_for_80']} pairs reach 0.8)")


def add_parser(sub: Any) -> None:
    """Register ``validate`` on the subcommand parsers ``sub``."""
    v = sub.add_parser(
        "validate", help="PK, CS and data-weighted PK against path-ablation effects, with bootstrap CIs",
        description="Draw random forward O -> Q/K/V pairs and each metric's top pairs, measure their "
        "path-ablation effects on the bundled text prompts and on repeated random tokens, and print "
        "per metric (and the layer-gap and source-variance baselines) the Spearman against the effect "
        "and the mean effect of its top-k, with bootstrap 95%% intervals, PK minus each other metric "
        "with a paired bootstrap interval (the decision rule) and the sample's power for rho = 0.3. "
        "Needs a runnable model. Cached like GET /api/validation.")
    v.add_argument("model", help="registry name (demo, smollm2, ...) or a local checkpoint folder")
    v.add_argument("--pairing", default="OK", choices=list(ABLATION_PAIRINGS))
    v.add_argument("--n", type=int, default=DEFAULT_SAMPLE, help=f"random forward pairs (1..{VALIDATION_SAMPLE_MAX}; all of them when fewer)")
    v.add_argument("--k", type=int, default=DEFAULT_TOP, help=f"top pairs per metric (1..{VALIDATION_TOP_MAX})")
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--json", action="store_true", help="the whole answer as one JSON object")
    cache_opt(v)
    v.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:

    services = services_for(args)
    ref = resolve_model(services, args.model)
    report = services.validation.answer(ref, args.pairing, args.n, args.k, args.seed)
    sys.stdout.write(json.dumps(report) + "\n" if args.json else validation_text(report))
    sys.stdout.flush()
    return 0
