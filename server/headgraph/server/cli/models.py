"""``headgraph models``: the models this deployment offers, with their status and fingerprint."""

from __future__ import annotations

import argparse
import json
from typing import Any

from headgraph.server.cli.common import cache_opt, services_for


def run(args: argparse.Namespace) -> int:
    services = services_for(args)
    rows = []
    for entry in services.catalog.registry.entries():
        ident = services.catalog.known_identity(entry.ref)
        rows.append({"id": entry.ref.id, "kind": entry.ref.kind, "status": entry.status,
                     "message": entry.message,
                     "fingerprint": None if ident is None else ident.fingerprint,
                     "model_fingerprint": None if ident is None else ident.model_fingerprint})
    if args.json:
        print(json.dumps({"models": rows}))
    else:
        width = max(len(r["id"]) for r in rows)
        for r in rows:
            print(f"{r['id']:<{width}}  {r['kind']:<7}  {r['status']:<22}  {r['message']}")
    return 0


def add_parser(sub: Any) -> None:
    m = sub.add_parser("models", help="list the models this deployment offers")
    m.add_argument("--json", action="store_true")
    cache_opt(m)
    m.set_defaults(func=run)
