"""``headgraph serve``: the API (and the dashboard, when a frontend is installed) on uvicorn."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from headgraph.server.cli.common import cache_opt, fail
from headgraph.server.settings import SERVE_CONNECTIONS, Settings


def run(args: argparse.Namespace) -> int:
    import uvicorn

    if args.cache_dir:
        os.environ["HEADGRAPH_CACHE_DIR"] = str(Path(args.cache_dir).expanduser())
    try:
        settings = Settings.from_env()
    except ValueError as err:  # a bad HEADGRAPH_* value (a blank or short token, ...)
        return fail(str(err))
    workers = args.workers or settings.workers
    os.environ["HEADGRAPH_WORKERS"] = str(workers)  # worker processes size their torch threads by it
    settings = Settings.from_env()
    if not settings.api_token and args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"headgraph: warning: serving on {args.host} with no HEADGRAPH_API_TOKEN: anyone "
              "who reaches the port may compute and upload (open mode)", file=sys.stderr)
    # Idle keep-alive connections close after 5 s, and a connection that does not finish its
    # headers in time is closed, one address holds at most connections_per_client connections
    # (http.protocol); past SERVE_CONNECTIONS open connections uvicorn answers 503 instead of
    # queueing.
    common: dict[str, Any] = dict(
        host=args.host, port=args.port, access_log=False, log_level=args.log_level,
        timeout_graceful_shutdown=5, timeout_keep_alive=5,
        limit_concurrency=SERVE_CONNECTIONS, http="headgraph.server.http.protocol:HeaderTimeoutProtocol",
        # X-Forwarded-For is trusted only from the proxies named in HEADGRAPH_FORWARDED_ALLOW_IPS
        # (none by default): otherwise any client could name itself another (per-client limits)
        proxy_headers=bool(settings.forwarded_allow_ips),
        forwarded_allow_ips=settings.forwarded_allow_ips or None)
    if workers > 1:
        # Each worker process builds its own app from the environment (shared diskcache).
        uvicorn.run("headgraph.server.http.app:create_app", factory=True, workers=workers, **common)
    else:
        from headgraph.server.http.app import create_app

        uvicorn.run(create_app(settings), **common)
    return 0


def add_parser(sub: Any) -> None:
    s = sub.add_parser("serve", help="run the API (and dashboard when installed)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8050)
    s.add_argument("--workers", type=int, default=None,
                   help="worker processes (default: $HEADGRAPH_WORKERS or 1)")
    s.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    cache_opt(s)
    s.set_defaults(func=run)
