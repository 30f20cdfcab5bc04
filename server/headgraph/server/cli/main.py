"""``headgraph`` command line: serve, compute, export, hubs, verify, datapk, validate, recovery,
circuit, timeline, compare, sweep, models, cache, subgraph (and plug-in commands such as ``report``).

Results go to stdout (one JSON object, CSV or GraphML); progress bars and logs go to stderr
only, so ``headgraph export ... --format json | jq`` works. MODEL is a registry name
("demo", "gpt2", ...) or any local checkpoint folder (the model root restricts the server,
not the CLI, which runs with the user's own rights). Each command lives in its own module
(parser, command, text output); this one lists them.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from headgraph.server.cli import (
    cache,
    circuit,
    compare,
    compute,
    datapk,
    export,
    hubs,
    models,
    recovery,
    serve,
    subgraph,
    sweep,
    validate,
    verify,
)
from headgraph.server.cli.common import cache_opt, fail
from headgraph.server.cli.plugins import add_plugin_commands

COMMANDS = (serve, compute, export, hubs, verify, datapk, validate, recovery, circuit, compare, sweep,
            models, cache, subgraph)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="headgraph", description="Attention-head affinity from weights "
                                "(Projection Kernel, Composition Score): API server and tools.")
    p.add_argument("-v", "--verbose", action="store_true", help="log progress details to stderr")
    sub = p.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    add_plugin_commands(sub, cache_opt, set(sub.choices))  # e.g. `headgraph report` (frontend)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from headgraph.core.errors import HeadgraphError
    from headgraph.server.errors import ApiError
    from headgraph.server.logs import configure_logging

    configure_logging(logging.INFO if args.verbose or args.command == "serve" else logging.WARNING)
    try:
        return int(args.func(args) or 0)
    except (HeadgraphError, ApiError) as err:  # what the user asked for; a bug shows its traceback
        return fail(str(err).splitlines()[0] if str(err) else type(err).__name__)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
