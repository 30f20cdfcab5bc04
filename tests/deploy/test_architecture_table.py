"""docs/architecture.md's "Concepts through the layers" table matches the code.

The table names each concept's module in every layer (core, computation, service, router, URL,
CLI, frontend). These tests read it and check it against the real registry, app and parser:
every registered computation has a row and lives in the module the row names; every module,
class and function named exists; every URL is a route of the app (its OpenAPI paths), declared
by a router of its row; every command is a ``headgraph`` subcommand.
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
SECTION = "## Concepts through the layers"
# Column header -> (distribution folder, package path inside it) of the modules its cells name.
MODULE_COLUMNS = {
    "core": ROOT / "core" / "headgraph" / "core",
    "computation": ROOT / "server" / "headgraph" / "server" / "computations",
    "service": ROOT / "server" / "headgraph" / "server" / "services",
    "router": ROOT / "server" / "headgraph" / "server" / "http" / "routers",
    "frontend": ROOT / "frontend" / "headgraph" / "frontend",
}
COLUMNS = ("concept", *MODULE_COLUMNS, "URL", "CLI")


def parse_table(text: str) -> list[dict[str, list[str]]]:
    """The section's table as one dict per row: column header -> the cell's backticked names."""
    lines = text.split("\n")
    start = lines.index(SECTION)
    rows = []
    header: list[str] | None = None
    for line in lines[start + 1:]:
        if line.startswith("## "):
            break
        if not line.startswith("|"):
            if header is not None and rows:
                break
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
        elif set("".join(cells)) <= set("-: "):
            continue  # the separator row
        else:
            assert len(cells) == len(header), f"row has {len(cells)} cells, header {len(header)}: {line}"
            row = {h: re.findall(r"`([^`]+)`", c) for h, c in zip(header, cells, strict=True)}
            row["concept"] = [cells[0]]
            rows.append(row)
    assert header is not None and sorted(header) == sorted(COLUMNS), header
    return rows


@functools.cache
def table() -> list[dict[str, list[str]]]:
    rows = parse_table(DOC.read_text(encoding="utf-8"))
    assert len(rows) >= 20
    return rows


def module_file(package: Path, dotted: str) -> Path | None:
    """The source file of ``dotted`` under ``package`` (a module or a package), or None."""
    base = package.joinpath(*dotted.split("."))
    for f in (base.with_suffix(".py"), base / "__init__.py"):
        if f.is_file():
            return f
    return None


def top_level_names(source: Path) -> set[str]:
    tree = ast.parse(source.read_text(encoding="utf-8"))
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}


def missing_modules(rows: list[dict[str, list[str]]]) -> list[str]:
    """Every ``module`` or ``module:Name`` of a module column that is no file or no top-level
    class / function of it (a computation's name is checked against the registry instead)."""
    missing = []
    for row in rows:
        for column, package in MODULE_COLUMNS.items():
            for ref in row[column]:
                module, _, name = ref.partition(":")
                f = module_file(package, module)
                if f is None:
                    missing.append(f"{row['concept'][0]}: {column} module {module!r}")
                elif name and column != "computation" and name not in top_level_names(f):
                    missing.append(f"{row['concept'][0]}: {column} {ref!r} has no {name}")
    return missing


def registered() -> dict[str, str]:
    """Registered computation name -> the computations module its function is defined in."""
    from headgraph.server.services.wiring import build_computations

    prefix = "headgraph.server.computations."
    return {c.name: c.fn.__module__.removeprefix(prefix) for c in build_computations()}


def test_every_registered_computation_has_a_row() -> None:
    named = {ref.partition(":")[2] for row in table() for ref in row["computation"]}
    assert set(registered()) - named == set()


def test_computation_cells_name_registered_computations_in_their_modules() -> None:
    reg = registered()
    wrong = []
    for row in table():
        for ref in row["computation"]:
            module, sep, name = ref.partition(":")
            if not sep or reg.get(name) != module:
                wrong.append(f"{row['concept'][0]}: {ref!r} (registered: {name} in {reg.get(name)})")
    assert wrong == []


def test_every_named_module_exists() -> None:
    assert missing_modules(table()) == []


def test_a_missing_module_or_an_unlisted_computation_is_caught() -> None:
    rows = [dict(r) for r in table()]
    rows[0] = {**rows[0], "core": ["scores.no_such_module"], "service": ["scores:NoSuchService"]}
    assert len(set(missing_modules(rows)) - set(missing_modules(table()))) == 2
    without = [r for r in rows if not any(ref.endswith(":pk") for ref in r["computation"])]
    named = {ref.partition(":")[2] for row in without for ref in row["computation"]}
    assert "pk" in set(registered()) - named


def test_every_url_is_a_route_of_its_rows_router(tmp_path: Path) -> None:
    from headgraph.server.http.app import create_app
    from headgraph.server.settings import Settings

    app = create_app(Settings(cache_dir=tmp_path / "cache", compute_processes=0))
    try:
        served = set(app.openapi()["paths"])  # every route the app's routers declare
    finally:
        app.state.services.close()
    wrong = []
    for row in table():
        declared = {r.path for m in row["router"]
                    for r in importlib.import_module(f"headgraph.server.http.routers.{m}").router.routes}
        for url in row["URL"]:
            path = url.partition("?")[0]
            if path not in served or path not in declared:
                wrong.append(f"{row['concept'][0]}: {url} (served: {path in served}, "
                             f"by {row['router']}: {path in declared})")
    assert wrong == []


def test_every_command_is_a_subcommand() -> None:
    from headgraph.server.cli.main import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    named = {c for row in table() for c in row["CLI"]}
    assert named - set(sub.choices) == set()
    assert "report" in sub.choices  # the frontend's plug-in command is installed here

