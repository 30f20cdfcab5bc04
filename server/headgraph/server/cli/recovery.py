"""``headgraph recovery``: every metric's recovery of a reference on one pairing (the PK paper's
Tables 1 and 2; server.services.recovery, core.stats.recovery). The reference is a label set's
heads (``--labels``), a task circuit's head -> head edges (``--task``: computed through the
cache like ``headgraph circuit``, so a computed circuit is reused) or a circuit file's
(``--circuit``: a MIB circuit-track file or ``headgraph circuit --json``'s answer)."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from headgraph.core.names import DEFAULT_K, GRAPH_PAIRINGS
from headgraph.server.cli.common import cache_opt, fail, progress_bar, resolve_model, services_for
from headgraph.server.cli.tables import interval, text_table
from headgraph.server.computations.circuits import (
    BUNDLED_PAIRS,
    BUNDLED_TASKS,
    CIRCUIT_METHODS,
    DEFAULT_METHOD,
    DEFAULT_STEPS,
    TASK_NAME_PATTERN,
)
from headgraph.server.limits import CIRCUIT_PAIRS_MAX, CIRCUIT_PAIRS_MIN, CIRCUIT_STEPS_MAX, RECOVERY_K_MAX

MAX_FILE_BYTES = 256 << 20  # a circuit file read whole (SmolLM2's MIB file is tens of MB)


def _reference_line(report: dict[str, Any]) -> str:
    c = report.get("circuit")
    if c is None:
        return f"reference: label set {report['labels']!r} ({len(report['reference_heads'])} heads)"
    what = (f"{c['method']} circuit of task {c['task']!r} ({c['content']}"
            + (f", steps {c['steps']}" if c["method"] == "eap-ig" else "") + ")"
            if c["source"] == "task" else f"{c['source']} circuit file {c['file']}")
    recovered = "" if c.get("recovered") is None else f", recovering {c['recovered']:.2f} of the gap"
    return (f"reference: the {what}: {c['n_reference_edges']} {report['pairing']} head -> head edges "
            f"among {c['rule']}{recovered} ({c['n_head_edges']} head -> head edges on Q, K, V)")


def recovery_text(report: dict[str, Any]) -> str:
    """One row per metric: endpoint share, precision@k and ROC-AUC with intervals, and the
    paired differences vs the baseline (PK); the reference (a circuit's size rule) above."""
    k = report["k"]
    lines = [f"model: {report['model']}  pairing: {report['pairing']}  k: {k}",
             _reference_line(report),
             f"valid pairs: {report['n_valid']}  in the reference: {report['n_reference']} "
             f"(base rate {report['base_rate']:.3f})",
             report["method"], ""]
    heads = ("metric", f"top-{k} endpoint share", f"precision@{k}", "ROC-AUC",
             f"precision - {report['baseline']}", f"AUC - {report['baseline']}")
    cells = [(r["metric"], interval(r["endpoint_share"]), interval(r["precision"]),
              interval(r["auc"]), interval(r["precision_diff"]), interval(r["auc_diff"]))
             for r in report["rows"]]
    lines += text_table(heads, cells)
    return "\n".join(lines) + "\n"


def add_parser(sub: Any) -> None:
    """Register ``recovery`` on the subcommand parsers ``sub``."""
    r = sub.add_parser(
        "recovery", help="each metric's recovery of a label set's or a task circuit's edges (the PK "
                         "paper's Tables 1 and 2)",
        description="For one O -> Q/K/V pairing and a reference, print per metric (PK raw / normalized, "
        "CS, CKA, Procrustes, layer gap, random) the share of its top-k edges' endpoints on reference "
        "heads, precision@k and ROC-AUC over all valid forward pairs, with head-level bootstrap 95%% "
        "intervals and paired differences vs PK. The reference: a label set (an edge is in it when "
        "both heads are labelled), or a circuit's head -> head edges into the pairing's input (Q, K "
        "or V; a KV head's on a grouped-query model) among its top edges: by default the smallest "
        "circuit on the faithfulness curve reaching 0.8 of the metric gap (a MIB file: its in_graph "
        "edges), or --edges N. Cached like GET /api/recovery.")
    r.add_argument("model", help="registry name (demo, smollm2, ...) or a local checkpoint folder")
    ref = r.add_mutually_exclusive_group(required=True)
    ref.add_argument("--labels", help="label set whose heads are the reference (built-in, uploaded or "
                                      "'patterns')")
    ref.add_argument("--task", help=f"a task whose circuit is the reference: bundled "
                                    f"({', '.join(BUNDLED_TASKS)}), uploaded to the cache, or a JSONL "
                                    "file of {clean, corrupt, answer, distractor} rows")
    ref.add_argument("--circuit", metavar="FILE",
                     help="a circuit file as the reference: MIB circuit-track JSON (its in_graph "
                          "edges) or 'headgraph circuit --json' output (its circuit)")
    r.add_argument("--method", default=None, choices=list(CIRCUIT_METHODS),
                   help=f"with --task: the circuit's method (default {DEFAULT_METHOD})")
    r.add_argument("--steps", type=int, default=None,
                   help=f"with --task: EAP-IG's integration steps (1..{CIRCUIT_STEPS_MAX}, default {DEFAULT_STEPS})")
    r.add_argument("--pairs", type=int, default=None,
                   help=f"with a bundled --task: its first n prompt pairs ({CIRCUIT_PAIRS_MIN}..{CIRCUIT_PAIRS_MAX})")
    r.add_argument("--edges", type=int, default=None, metavar="N",
                   help="with --task / --circuit: the circuit's top N edges (every kind) instead of "
                        "the smallest reaching 0.8 of the gap (a MIB file: top N by |score|)")
    r.add_argument("--pairing", default="OK", choices=list(GRAPH_PAIRINGS))
    r.add_argument("--k", type=int, default=DEFAULT_K, help=f"top edges per metric (1..{RECOVERY_K_MAX})")
    r.add_argument("--json", action="store_true", help="the whole answer as one JSON object")
    r.add_argument("-q", "--quiet", action="store_true",
                   help="no progress bar while a task's circuit is computed")
    cache_opt(r)
    r.set_defaults(func=run)


def task_arg(text: str) -> tuple[str, str | None]:
    """(name, JSONL) of ``--task``: a JSONL file's rows under a name from its stem, else the
    name of a bundled or uploaded task (JSONL None). OSError / UnicodeDecodeError for a file
    that cannot be read as UTF-8."""
    path = Path(text).expanduser()
    if not (text.endswith(".jsonl") or path.is_file()):
        return text, None
    jsonl = path.read_bytes().decode("utf-8-sig")
    name = re.sub(r"[^A-Za-z0-9_.\-]", "-", path.stem)[:64].lstrip("-_.") or "file"
    return (name if re.match(TASK_NAME_PATTERN, name) else "file"), jsonl


def run(args: argparse.Namespace) -> int:
    if args.labels is not None:
        extra = [f"--{n}" for n in ("method", "steps", "pairs", "edges") if getattr(args, n) is not None]
        if extra:
            return fail(f"{', '.join(extra)}: only with --task or --circuit, not with --labels")
    if args.circuit is not None:
        extra = [f"--{n}" for n in ("method", "steps", "pairs") if getattr(args, n) is not None]
        if extra:
            return fail(f"{', '.join(extra)}: only with --task, not with --circuit (the file is the circuit)")
    if args.steps is not None and not 1 <= args.steps <= CIRCUIT_STEPS_MAX:
        return fail(f"--steps must be in 1..{CIRCUIT_STEPS_MAX}, got {args.steps}")
    if args.pairs is not None and not CIRCUIT_PAIRS_MIN <= args.pairs <= CIRCUIT_PAIRS_MAX:
        return fail(f"--pairs must be in {CIRCUIT_PAIRS_MIN}..{CIRCUIT_PAIRS_MAX}, got {args.pairs}")
    if args.edges is not None and args.edges < 1:
        return fail(f"--edges must be a positive integer, got {args.edges}")
    if args.circuit is not None:
        path = Path(args.circuit).expanduser()
        try:
            if path.stat().st_size > MAX_FILE_BYTES:
                return fail(f"{args.circuit} is larger than {MAX_FILE_BYTES >> 20} MiB")
            raw = path.read_bytes()
            data = json.loads(raw)
        except OSError as err:
            return fail(f"cannot read {args.circuit}: {err.strerror or err}")
        except (UnicodeDecodeError, ValueError) as err:
            return fail(f"{args.circuit} is not JSON: {err}")
        from headgraph.server.services.recovery import file_digest

        services = services_for(args)
        ref = resolve_model(services, args.model)
        report = services.recovery.answer_file(ref, args.pairing, data, args.k, name=path.name,
                                               digest=file_digest(raw), edges=args.edges)
    elif args.task is not None:
        try:
            name, jsonl = task_arg(args.task)
        except OSError as err:
            return fail(f"cannot read {args.task}: {err.strerror or err}")
        except UnicodeDecodeError as err:
            return fail(f"{args.task} is not UTF-8 text (byte {err.start})")
        services = services_for(args)
        ref = resolve_model(services, args.model)
        with progress_bar(f"{ref.id} {name}", quiet=args.quiet):
            report = services.recovery.answer_task(
                ref, args.pairing, name, args.k, method=args.method or DEFAULT_METHOD,
                steps=DEFAULT_STEPS if args.steps is None else args.steps,
                pairs=BUNDLED_PAIRS if args.pairs is None else args.pairs, edges=args.edges,
                jsonl=jsonl)
    else:
        services = services_for(args)
        ref = resolve_model(services, args.model)
        report = services.recovery.answer(ref, args.pairing, str(args.labels), args.k)
    sys.stdout.write(json.dumps(report) + "\n" if args.json else recovery_text(report))
    sys.stdout.flush()
    return 0

