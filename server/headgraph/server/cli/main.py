"""``headgraph`` command line: serve, compute, export, hubs, verify, datapk, validate, timeline,
compare, sweep, models, cache.

Results go to stdout (one JSON object, CSV or GraphML); progress bars and logs go to stderr
only, so ``headgraph export ... --format json | jq`` works. MODEL is a registry name
("demo", "gpt2", ...) or any local checkpoint folder (the model root restricts the server,
not the CLI, which runs with the user's own rights).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import logging
import os
import sys
from pathlib import Path
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from headgraph.core.names import DEFAULT_K, GRAPH_PAIRINGS, K_MAX, LAYER_ORDERS, RANK_METRICS
from headgraph.server.settings import Settings

if TYPE_CHECKING:
    from headgraph.server.services.wiring import Services
    from headgraph.server.models.offered import ModelRef
    from headgraph.server.services.views import ViewService

log = logging.getLogger("headgraph.cli")
METRICS = RANK_METRICS
EXPORT_FORMATS = ("csv", "json", "graphml")


def _settings(args: argparse.Namespace, **overrides: Any) -> Settings:
    extra: dict[str, Any] = dict(overrides)
    if getattr(args, "cache_dir", None):
        extra["cache_dir"] = Path(args.cache_dir)
    return Settings.from_env(**extra)


def _services(args: argparse.Namespace) -> Services:
    """The CLI's services (composition root), computing inline with the user's own rights."""
    from headgraph.server.services.wiring import build_services

    return build_services(_settings(args, allow_any_path=True), inline=True)


def _resolve(services: Services, model: str) -> ModelRef:
    """Registry name, or any existing local folder (relative paths included)."""
    registry = services.catalog.registry
    if Path(model).expanduser().is_dir() and model not in registry.allowed_ids():
        return registry.resolve_path(Path(model))
    return services.catalog.resolve(model)


def _fail(message: str, code: int = 2) -> int:
    print(f"headgraph: error: {message}", file=sys.stderr)
    return code


# -- serve ----------------------------------------------------------------------------------

SERVE_CONNECTIONS = 512

def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    if args.cache_dir:
        os.environ["HEADGRAPH_CACHE_DIR"] = str(Path(args.cache_dir).expanduser())
    try:
        settings = Settings.from_env()
    except ValueError as err:  # a bad HEADGRAPH_* value (a blank or short token, ...)
        return _fail(str(err))
    workers = args.workers or settings.workers
    os.environ["HEADGRAPH_WORKERS"] = str(workers)  # worker processes size their torch threads by it
    settings = Settings.from_env()
    if not settings.api_token and args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"headgraph: warning: serving on {args.host} with no HEADGRAPH_API_TOKEN: anyone "
              "who reaches the port may compute and upload (open mode)", file=sys.stderr)
    # Idle keep-alive connections close after 5 s; past SERVE_CONNECTIONS open connections
    # uvicorn answers 503 instead of queueing (a proxy in front should limit per client).
    common: dict[str, Any] = dict(
        host=args.host, port=args.port, access_log=False, log_level=args.log_level,
        timeout_graceful_shutdown=5, timeout_keep_alive=5,
        limit_concurrency=SERVE_CONNECTIONS)
    if workers > 1:
        # Each worker process builds its own app from the environment (shared diskcache).
        uvicorn.run("headgraph.server.http.app:create_app", factory=True, workers=workers, **common)
    else:
        from headgraph.server.http.app import create_app

        uvicorn.run(create_app(settings), **common)
    return 0


# -- compute --------------------------------------------------------------------------------

def cmd_compute(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from headgraph.core.names import parse_pairings
    from headgraph.server.services.jobs import run_compute

    services = _services(args)
    ref = _resolve(services, args.model)
    pairings = parse_pairings(args.pairings)
    bar = tqdm(total=1000, file=sys.stderr, desc=ref.id, unit="‰", disable=args.quiet,
               bar_format="{desc}: {percentage:3.0f}%|{bar}| {postfix}")

    def progress(stage: str, fraction: float, message: str) -> None:
        bar.n = int(round(fraction * 1000))
        bar.set_postfix_str(message)
        bar.refresh()

    try:
        done = run_compute(services.scores, services.catalog, ref, list(pairings), progress)
    finally:
        bar.close()
    stats = services.store.stats()
    print(json.dumps({"model": ref.id, "fingerprint": services.catalog.identity(ref).fingerprint,
                      "computed": done, "cache": stats["directory"]}))
    return 0


# -- export ---------------------------------------------------------------------------------

def export_records(views: ViewService, ref: ModelRef, pairing: str, top: int, metric: str,
                   order: str) -> list[dict[str, Any]]:
    """Ranked pairs with source, target, pk, normalized, cs (+ z when ranked by z); a pair
    whose target is a grouped-query KV group also has cs_of (its CS is the mean over the
    group's query heads, named there; ViewService.top)."""
    records = views.top(ref, pairing, top, metric, order)
    out = []
    for r in records:
        row = {"source": r["source"], "target": r["target"], "pk": r.get("pk"),
               "normalized": r.get("normalized"), "cs": r.get("cs")}
        if "cs_of" in r:
            row["cs_of"] = r["cs_of"]
        if metric == "z":
            row["z"] = r.get("z")
        out.append(row)
    return out


def cmd_export(args: argparse.Namespace) -> int:
    from headgraph.core.names import check_pairing

    services = _services(args)
    ref = _resolve(services, args.model)
    check_pairing(args.pairing)
    if args.format == "graphml":
        if args.metric == "cs":
            return _fail("graphml export ranks edges by pk, normalized or z (CS is an edge attribute)")
        text = services.graphs.graph_export(ref, "graphml", pairings=[args.pairing], granularity="head",
                                    k=args.top, threshold=None, threshold_on=args.metric,
                                    labels=None)
    else:
        rows = export_records(services.views, ref, args.pairing, args.top, args.metric, args.order)
        if args.format == "json":
            text = json.dumps({"model": ref.id, "pairing": args.pairing, "metric": args.metric,
                               "order": args.order, "pairs": rows}) + "\n"
        else:
            buf = io.StringIO()
            cols = ["source", "target", "pk", "normalized", "cs"]
            cols += ["cs_of"] if any("cs_of" in r for r in rows) else []
            cols += ["z"] if args.metric == "z" else []
            w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
            w.writeheader()
            for r in rows:
                w.writerow({c: "" if r.get(c) is None else r[c] for c in cols})
            text = buf.getvalue()
    if args.output:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    return 0


# -- hubs -----------------------------------------------------------------------------------

def cmd_hubs(args: argparse.Namespace) -> int:
    from headgraph.core.names import parse_pairings
    from headgraph.server.cli.hubs import hub_text

    services = _services(args)
    ref = _resolve(services, args.model)
    # The CLI waits for the pattern scores, so every hub is described by what its heads do.
    report = services.graphs.hubs(ref, pairings=parse_pairings(args.pairings), k=args.top, flags=True)
    rows = report["rows"] if args.rows is None else report["rows"][: args.rows]
    if args.json:
        sys.stdout.write(json.dumps({**report, "rows": rows}) + "\n")
    else:
        sys.stdout.write(hub_text(report, rows))
    sys.stdout.flush()
    return 0


# -- verify ---------------------------------------------------------------------------------

def cmd_verify(args: argparse.Namespace) -> int:
    from headgraph.server.computations.ablation import ablation_view
    from headgraph.server.cli.verify import verify_text

    services = _services(args)
    ref = _resolve(services, args.model)
    if (args.source is None) != (args.target is None):
        return _fail("give both --source and --target for one edge, or neither for the top edges")
    edge = None if args.source is None else (args.source, args.target)
    report = ablation_view(services.scores, services.views, services.catalog, ref,
                           args.pairing, args.top, edge)
    sys.stdout.write(json.dumps(report) + "\n" if args.json else verify_text(report))
    sys.stdout.flush()
    return 0


# -- datapk ---------------------------------------------------------------------------------

def cmd_datapk(args: argparse.Namespace) -> int:
    from headgraph.server.cli.datapk import datapk_text
    from headgraph.server.computations.data_pk import data_pk_view

    services = _services(args)
    ref = _resolve(services, args.model)
    report = data_pk_view(services.scores, services.catalog, ref, args.pairing, args.prompts,
                          args.top, args.rank_on)
    if args.json:
        keys = ("model", "pairing", "prompts", "rank_on", "k", "n_positions", "n_prompts",
                "method", "top")
        sys.stdout.write(json.dumps({k: report[k] for k in keys}) + "\n")
    else:
        sys.stdout.write(datapk_text(report))
    sys.stdout.flush()
    return 0


# -- validate -------------------------------------------------------------------------------

def cmd_validate(args: argparse.Namespace) -> int:
    from headgraph.server.cli.validate import validation_text
    from headgraph.server.computations.validation import validation_view

    services = _services(args)
    ref = _resolve(services, args.model)
    report = validation_view(services.scores, ref, args.pairing, args.n, args.k, args.seed)
    sys.stdout.write(json.dumps(report) + "\n" if args.json else validation_text(report))
    sys.stdout.flush()
    return 0


# -- models, cache --------------------------------------------------------------------------

def cmd_models(args: argparse.Namespace) -> int:
    services = _services(args)
    rows = []
    for entry in services.catalog.registry.entries():
        ident = services.catalog.known_identity(entry.ref)
        rows.append({"id": entry.ref.id, "kind": entry.ref.kind, "status": entry.status,
                     "message": entry.message,
                     "fingerprint": None if ident is None else ident.fingerprint})
    if args.json:
        print(json.dumps({"models": rows}))
    else:
        width = max(len(r["id"]) for r in rows)
        for r in rows:
            print(f"{r['id']:<{width}}  {r['kind']:<7}  {r['status']:<22}  {r['message']}")
    return 0


def cmd_cache(args: argparse.Namespace) -> int:
    from headgraph.server.cache.store import Store

    settings = _settings(args)
    store = Store(settings.cache_dir, size_limit=settings.cache_size_bytes)
    try:
        if args.action == "clear":
            removed = store.clear()
            print(json.dumps({"cleared": removed, "directory": str(store.directory)}))
        else:
            print(json.dumps(store.stats()))
    finally:
        store.close()
    return 0


# -- parser ---------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="headgraph", description="Attention-head affinity from weights "
                                "(Projection Kernel, Composition Score): API server and tools.")
    p.add_argument("-v", "--verbose", action="store_true", help="log progress details to stderr")
    sub = p.add_subparsers(dest="command", required=True)

    def cache_opt(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--cache-dir", help="result cache folder (default: $HEADGRAPH_CACHE_DIR "
                        "or ~/.cache/headgraph)")

    s = sub.add_parser("serve", help="run the API (and dashboard when installed)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8050)
    s.add_argument("--workers", type=int, default=None,
                   help="worker processes (default: $HEADGRAPH_WORKERS or 1)")
    s.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    cache_opt(s)
    s.set_defaults(func=cmd_serve)

    c = sub.add_parser("compute", help="precompute and cache everything for one model")
    c.add_argument("model", help="registry name (demo, gpt2, ...) or a local checkpoint folder")
    c.add_argument("--pairings", default=",".join(GRAPH_PAIRINGS))
    c.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    cache_opt(c)
    c.set_defaults(func=cmd_compute)

    e = sub.add_parser("export", help="ranked head pairs of one pairing (json, csv) or its graph (graphml)")
    e.add_argument("model", help="registry name (demo, gpt2, ...) or a local checkpoint folder")
    e.add_argument("--pairing", default="OK")
    e.add_argument("--top", type=int, default=DEFAULT_K, help=f"number of pairs / edges (1..{K_MAX})")
    e.add_argument("--metric", default="pk", choices=METRICS, help="ranking metric")
    e.add_argument("--order", default="forward", choices=list(LAYER_ORDERS))
    e.add_argument("--format", default="json", choices=EXPORT_FORMATS)
    e.add_argument("-o", "--output", help="write to this file instead of stdout")
    cache_opt(e)
    e.set_defaults(func=cmd_export)

    from headgraph.server.cli.hubs import add_hubs_parser

    add_hubs_parser(sub, cache_opt, cmd_hubs)

    from headgraph.server.cli.verify import add_verify_parser

    add_verify_parser(sub, cache_opt, cmd_verify)

    from headgraph.server.cli.datapk import add_datapk_parser

    add_datapk_parser(sub, cache_opt, cmd_datapk)

    from headgraph.server.cli.validate import add_validate_parser

    add_validate_parser(sub, cache_opt, cmd_validate)

    from headgraph.server.cli.compare import add_compare_parsers

    add_compare_parsers(sub, cache_opt, _services, _resolve)

    from headgraph.server.cli.sweep import add_sweep_parser

    add_sweep_parser(sub, cache_opt)

    m = sub.add_parser("models", help="list the models this deployment offers")
    m.add_argument("--json", action="store_true")
    cache_opt(m)
    m.set_defaults(func=cmd_models)

    k = sub.add_parser("cache", help="show or clear the result cache")
    k.add_argument("action", choices=["info", "clear"])
    cache_opt(k)
    k.set_defaults(func=cmd_cache)

    from headgraph.server.cli.plugins import add_plugin_commands

    add_plugin_commands(sub, cache_opt, set(sub.choices))  # e.g. `headgraph report` (frontend)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from headgraph.core.errors import HeadgraphError
    from headgraph.server.errors import ApiError
    from headgraph.server.logs import configure_logging

    configure_logging(logging.INFO if args.verbose or args.command == "serve" else logging.WARNING)
    if args.command in ("export", "hubs", "datapk") and not 1 <= args.top <= K_MAX:
        return _fail(f"--top must be in 1..{K_MAX}, got {args.top}")
    if args.command == "verify":
        from headgraph.server.computations.ablation import ABLATION_TOP_MAX

        if not 1 <= args.top <= ABLATION_TOP_MAX:
            return _fail(f"--top must be in 1..{ABLATION_TOP_MAX}, got {args.top}")
    if args.command == "hubs" and args.rows is not None and args.rows < 1:
        return _fail(f"--rows must be at least 1, got {args.rows}")
    try:
        return int(args.func(args) or 0)
    except (HeadgraphError, ApiError) as err:  # what the user asked for; a bug shows its traceback
        return _fail(str(err).splitlines()[0] if str(err) else type(err).__name__)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
