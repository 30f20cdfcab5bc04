"""What every ``headgraph`` command shares: its settings and services, model names, errors.

Each command module (serve, compute, export, hubs, ...) holds its parser (``add_parser``),
its command (``run``) and its text output; ``cli.main`` only lists them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from headgraph.server.settings import Settings

if TYPE_CHECKING:
    from headgraph.server.models.offered import ModelRef
    from headgraph.server.services.wiring import Services


def settings_for(args: argparse.Namespace, **overrides: Any) -> Settings:
    """Settings from the environment, ``--cache-dir`` and ``overrides`` winning."""
    extra: dict[str, Any] = dict(overrides)
    if getattr(args, "cache_dir", None):
        extra["cache_dir"] = Path(args.cache_dir)
    return Settings.from_env(**extra)


def services_for(args: argparse.Namespace) -> Services:
    """The CLI's services (composition root), computing inline with the user's own rights."""
    from headgraph.server.services.wiring import build_services

    return build_services(settings_for(args, allow_any_path=True), inline=True)


def resolve_model(services: Services, model: str) -> ModelRef:
    """Registry name, or any existing local folder (relative paths included)."""
    registry = services.catalog.registry
    if Path(model).expanduser().is_dir() and model not in registry.allowed_ids():
        return registry.resolve_path(Path(model))
    return services.catalog.resolve(model)


def fail(message: str, code: int = 2) -> int:
    """Print ``headgraph: error: message`` to stderr; the exit code."""
    print(f"headgraph: error: {message}", file=sys.stderr)
    return code


def cache_opt(parser: argparse.ArgumentParser) -> None:
    """The ``--cache-dir`` option every command that reads or writes the cache takes."""
    parser.add_argument("--cache-dir", help="result cache folder (default: $HEADGRAPH_CACHE_DIR "
                        "or ~/.cache/headgraph)")


def model_arg(parser: argparse.ArgumentParser, examples: str = "demo, gpt2, ...") -> None:
    parser.add_argument("model", help=f"registry name ({examples}) or a local checkpoint folder")


@contextmanager
def progress_bar(desc: str, quiet: bool = False) -> Iterator[None]:
    """A progress bar on stderr (``desc: 42%|####  | stage: message``) fed by the
    computations' progress reports (compute.progress) while the block runs; none when ``quiet``."""
    from tqdm import tqdm

    from headgraph.server.compute.progress import listening

    bar = tqdm(total=1000, file=sys.stderr, desc=desc, unit="‰", disable=quiet,
               bar_format="{desc}: {percentage:3.0f}%|{bar}| {postfix}")

    def progress(stage: str, fraction: float, message: str) -> None:
        bar.n = int(round(fraction * 1000))
        bar.set_postfix_str(f"{stage}: {message}" if message else stage)
        bar.refresh()

    try:
        with listening(progress):
            yield
    finally:
        bar.close()
