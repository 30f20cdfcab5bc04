"""``headgraph circuit``: a task's circuit (server.computations.circuits, core.circuits).

Prints the task metric (clean, corrupt, accuracy; whether the model does the task by
core.circuits.ability's paired sign tests, with their p-values), the strongest edges by
attribution, the circuit size reaching the stated share of the metric gap, the faithfulness
curve, MIB's CPR and CMD and the EAP vs patching Spearman; ``--mib`` writes the circuit as a
MIB circuit-track file. Cached like GET /api/circuit.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from headgraph.server.cli.common import cache_opt, fail, progress_bar, resolve_model, services_for
from headgraph.server.cli.tables import text_table
from headgraph.server.computations.circuits import (
    BUNDLED_PAIRS,
    BUNDLED_TASKS,
    CIRCUIT_METHODS,
    DEFAULT_METHOD,
    DEFAULT_STEPS,
    TASK_NAME_PATTERN,
)
from headgraph.server.limits import CIRCUIT_PAIRS_MAX, CIRCUIT_PAIRS_MIN, CIRCUIT_STEPS_MAX, CIRCUIT_TOP_MAX

DEFAULT_CLI_TOP = 20


def _num(value: Any, fmt: str = "{:.3f}") -> str:
    return "-" if value is None else fmt.format(value)


def able_line(m: dict[str, Any]) -> str:
    """Whether the model does the task, with the two sign tests' p-values (metrics' ability)."""
    a = m["ability"]
    tests = (f"answer beats distractor p = {a['answer']['p']:.2g} ({a['answer']['wins']}/"
             f"{a['answer']['n']}), follows the prompt p = {a['follows']['p']:.2g} "
             f"({a['follows']['wins']}/{a['follows']['n']}); {a['n_units']} units of "
             f"{a['n_pairs']} prompt pairs, alpha {a['alpha']:g}")
    if m["able"] is None:
        return (f"too few pairs to tell whether the model does this task ({tests}; it takes "
                f"{a['min_units']} units to reach it)")
    if m["able"]:
        return f"the model does this task ({tests})"
    return f"the model does not do this task ({tests}): its circuit explains little"


def circuit_text(r: dict[str, Any]) -> str:
    """The circuit answer (services.circuits.CircuitService.answer) as text."""
    m, f, p = r["metrics"], r["faithfulness"], r["patching"]
    method = r["method"] + (f" ({r['steps']} steps)" if r["method"] == "eap-ig" else "")
    lines = [f"model: {r['model']}  task: {r['task']['name']} ({r['task']['n_pairs']} prompt "
             f"pairs)  method: {method}",
             f"metric (logit difference answer - distractor, last position): clean "
             f"{_num(m['clean'])} (accuracy {_num(m['clean_accuracy'], '{:.0%}')}), corrupt "
             f"{_num(m['corrupt'])} (accuracy {_num(m['corrupt_accuracy'], '{:.0%}')})"]
    lines.append(able_line(m))
    size = r["circuit_size"]
    lines.append(f"circuit: {size} of {r['n_edges']} edges recover >= {r['share']:.0%} of the "
                 "clean - corrupt gap" if size is not None else
                 f"circuit: no top-n of the {r['n_edges']} edges recovers {r['share']:.0%}")
    lines.append("faithfulness (top-n edges kept, the others corrupt): " + ", ".join(
        f"{n}: {_num(x, '{:.2f}')}" for n, x in zip(f["sizes"], f["recovered"])))
    mib = r.get("mib")
    if mib is not None:
        lines.append(f"MIB (fractions 0.1%..100% of edges): CPR {_num(mib['cpr'])} (higher is "
                     f"better, 0.999 at most for f <= 1), CMD {_num(mib['cmd'])} (lower is "
                     "better)")
    lines.append(f"EAP vs real edge patching on {p['n_edges']} edges: Spearman "
                 f"{_num(p['spearman'])}")
    rows = [(str(e["rank"]), e["writer"], e["reader"], f"{e['score']:+.4f}",
             "*" if e["in_circuit"] else "") for e in r["edges"]]
    lines += text_table(("rank", "writer", "reader", "score", "circuit"), rows)
    return "\n".join(lines) + "\n"


def add_parser(sub: Any) -> None:
    """Register ``circuit`` on the subcommand parsers ``sub``."""
    c = sub.add_parser(
        "circuit", help="a task's circuit: edge attribution (EAP / EAP-IG) and faithfulness",
        description="Run a task (prompt pairs with an answer and a distractor) and score every "
        "writer -> reader edge of the residual-stream graph (embeddings, heads, MLPs -> each "
        "head's Q, K / V of each KV group, MLPs, logits) by edge attribution patching, check "
        "the top-n circuits by real intervention (faithfulness) and EAP against single-edge "
        "patching. Needs a runnable model. Cached like GET /api/circuit.")
    c.add_argument("model", help="registry name (demo, smollm2, ...) or a local checkpoint folder")
    c.add_argument("--task", default="induction",
                   help=f"a bundled task ({', '.join(BUNDLED_TASKS)}), a task uploaded to the "
                        "cache, or a JSONL file of {clean, corrupt, answer, distractor} rows")
    c.add_argument("--method", default=DEFAULT_METHOD, choices=list(CIRCUIT_METHODS))
    c.add_argument("--steps", type=int, default=DEFAULT_STEPS,
                   help=f"EAP-IG's integration steps (1..{CIRCUIT_STEPS_MAX}; eap: 1)")
    c.add_argument("--pairs", type=int, default=BUNDLED_PAIRS,
                   help=f"a bundled task's first n prompt pairs ({CIRCUIT_PAIRS_MIN}..{CIRCUIT_PAIRS_MAX}; "
                        "fewer: a quicker circuit of a large model)")
    c.add_argument("--top", type=int, default=DEFAULT_CLI_TOP,
                   help=f"edges listed, strongest first (1..{CIRCUIT_TOP_MAX})")
    c.add_argument("--json", action="store_true", help="one JSON object instead of the text")
    c.add_argument("--mib", metavar="PATH",
                   help="also write the circuit as a MIB circuit-track JSON file (every edge's "
                        "score; grouped-query K / V scores split equally per query head; the "
                        "circuit's edges in_graph)")
    c.add_argument("--mib-size", type=int, default=None, metavar="N",
                   help="with --mib: the top N edges in_graph (default: the circuit size)")
    c.add_argument("-q", "--quiet", action="store_true",
                   help="no progress bar (stderr: stage and share of the run done)")
    cache_opt(c)
    c.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.top <= CIRCUIT_TOP_MAX:
        return fail(f"--top must be in 1..{CIRCUIT_TOP_MAX}, got {args.top}")
    if not 1 <= args.steps <= CIRCUIT_STEPS_MAX:
        return fail(f"--steps must be in 1..{CIRCUIT_STEPS_MAX}, got {args.steps}")
    if not CIRCUIT_PAIRS_MIN <= args.pairs <= CIRCUIT_PAIRS_MAX:
        return fail(f"--pairs must be in {CIRCUIT_PAIRS_MIN}..{CIRCUIT_PAIRS_MAX}, got {args.pairs}")
    jsonl = None
    name = args.task
    path = Path(args.task).expanduser()
    if args.task.endswith(".jsonl") or path.is_file():
        try:
            jsonl = path.read_bytes().decode("utf-8-sig")
        except OSError as err:
            return fail(f"cannot read {args.task}: {err.strerror or err}")
        except UnicodeDecodeError as err:
            return fail(f"{args.task} is not UTF-8 text (byte {err.start})")
        name = re.sub(r"[^A-Za-z0-9_.\-]", "-", path.stem)[:64].lstrip("-_.") or "file"
        if not re.match(TASK_NAME_PATTERN, name):
            name = "file"
    services = services_for(args)
    ref = resolve_model(services, args.model)
    steps = args.steps if args.method == "eap-ig" else 1
    with progress_bar(f"{ref.id} {name}", quiet=args.quiet):
        report = services.circuits.answer(ref, name, args.method, steps, args.top, jsonl=jsonl,
                                          pairs=args.pairs)
        if args.mib:
            mib = services.circuits.mib_file(ref, name, args.method, steps, size=args.mib_size,
                                             jsonl=jsonl, pairs=args.pairs)
            try:
                Path(args.mib).expanduser().write_text(json.dumps(mib))
            except OSError as err:
                return fail(f"cannot write {args.mib}: {err.strerror or err}")
    sys.stdout.write(json.dumps(report) + "\n" if args.json else circuit_text(report))
    sys.stdout.flush()
    return 0
