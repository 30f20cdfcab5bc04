"""Extra ``headgraph`` subcommands found through the ``headgraph.commands`` entry point group.

An installed distribution (the frontend's ``headgraph report``, say) registers a callable
``add_parser(subparsers, cache_opt)`` that adds its subparser and sets ``func``; the server
finds it by name only, so it never imports the frontend. A plugin that fails to load is
logged and skipped: the built-in commands always work.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

COMMANDS_GROUP = "headgraph.commands"
log = logging.getLogger("headgraph.cli")


def add_plugin_commands(sub: Any, cache_opt: Callable[[argparse.ArgumentParser], None],
                        taken: set[str]) -> list[str]:
    """Add every ``headgraph.commands`` entry point not named like a command in ``taken``;
    returns the names added."""
    added = []
    for ep in sorted(entry_points(group=COMMANDS_GROUP), key=lambda e: e.name):
        if ep.name in taken:
            log.warning("plugin command %r ignored: a built-in command has that name", ep.name)
            continue
        try:
            register = ep.load()
            register(sub, cache_opt)
        except Exception as err:  # a broken plugin must not break the CLI
            log.warning("plugin command %r (%s) not loaded: %s", ep.name, ep.value, err)
            continue
        added.append(ep.name)
    return added
