"""``headgraph cache info|clear``: the result cache's counters, or an empty cache."""

from __future__ import annotations

import argparse
import json
from typing import Any

from headgraph.server.cli.common import cache_opt, settings_for


def run(args: argparse.Namespace) -> int:
    from headgraph.server.cache.store import Store

    settings = settings_for(args)
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


def add_parser(sub: Any) -> None:
    k = sub.add_parser("cache", help="show or clear the result cache")
    k.add_argument("action", choices=["info", "clear"])
    cache_opt(k)
    k.set_defaults(func=run)
