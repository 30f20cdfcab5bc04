"""Each distribution declares exactly what it imports, and imports with only what it declares.

Two checks per distribution (core, server, frontend), without installing anything:
- its source's imports (every ``import``, also inside functions) name only the standard
  library, ``headgraph`` packages it depends on, and the distributions its pyproject declares,
  and every declared distribution is imported somewhere (none unused);
- in a fresh interpreter that refuses every top-level module outside the standard library and
  the installed closure of its declared dependencies, every module of the distribution imports
  (what ``pip install headgraph-<part>`` alone would give).
"""

from __future__ import annotations

import ast
import functools
import json
import subprocess
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, distribution, packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement

pytestmark = pytest.mark.slow  # imports every module of the three distributions in fresh subprocesses: ~35 s

ROOT = Path(__file__).resolve().parents[2]
PARTS = ("core", "server", "frontend")
# Declared for what they bring at run time, not imported by name.
RUNTIME_ONLY = {
    "server": {"python-multipart"},  # parses uploads (starlette imports it)
    "frontend": {"kaleido", "a2wsgi", "flask"},
}


def canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def pyproject(part: str) -> dict:
    return tomllib.loads((ROOT / part / "pyproject.toml").read_text())


def declared(part: str) -> dict[str, Requirement]:
    """Its dependencies and its extras' (an extra's import sits behind a clear message)."""
    project = pyproject(part)["project"]
    extras = [r for group in project.get("optional-dependencies", {}).values() for r in group]
    reqs = [Requirement(r) for r in [*project["dependencies"], *extras]]
    return {canonical(r.name): r for r in reqs}


def sources(part: str) -> list[Path]:
    return sorted((ROOT / part / "headgraph" / part).rglob("*.py"))


def module_name(part: str, path: Path) -> str:
    rel = path.relative_to(ROOT / part).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imported_tops(part: str) -> dict[str, set[str]]:
    """Top-level module -> the files importing it (absolute imports only)."""
    tops: dict[str, set[str]] = {}
    for path in sources(part):
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if name.startswith("headgraph."):
                    top = ".".join(name.split(".")[:2])
                tops.setdefault(top, set()).add(path.name)
    return tops


@functools.cache
def installed_tops() -> dict[str, list[str]]:
    """Top-level module -> the installed distributions providing it (one scan of site-packages)."""
    return packages_distributions()


def distribution_of(top: str) -> set[str]:
    return {canonical(d) for d in installed_tops().get(top, [])}


@pytest.mark.parametrize("part", PARTS)
def test_imports_equal_declared_dependencies(part):
    wanted = declared(part)
    used: set[str] = set()
    undeclared: dict[str, set[str]] = {}
    for top, files in imported_tops(part).items():
        if top in sys.stdlib_module_names or top == "__future__":
            continue
        if top.startswith("headgraph."):
            dist = canonical("headgraph-" + top.split(".")[1])
            if dist != f"headgraph-{part}":
                (used.add(dist) if dist in wanted else undeclared.setdefault(dist, files))
            continue
        dists = distribution_of(top)
        assert dists, f"{part} imports {top!r}, which no installed distribution provides"
        if dists & wanted.keys():
            used |= dists & wanted.keys()
        else:
            undeclared.setdefault(top, files)
    assert not undeclared, f"{part} imports what its pyproject does not declare: {undeclared}"
    unused = set(wanted) - used - RUNTIME_ONLY.get(part, set())
    assert not unused, f"{part} declares what it never imports: {sorted(unused)}"


def closure(name: str, extras: frozenset[str] = frozenset(), seen: set[str] | None = None) -> set[str]:
    """``name`` and every distribution it needs, transitively, as installed here."""
    seen = set() if seen is None else seen
    key = canonical(name)
    if key in seen:
        return seen
    seen.add(key)
    try:
        dist = distribution(name)
    except PackageNotFoundError:
        return seen
    for line in dist.requires or []:
        req = Requirement(line)
        if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in ("", *extras)):
            closure(req.name, frozenset(req.extras), seen)
    return seen


GUARD = r"""
import importlib, importlib.abc, importlib.machinery, json, sys

allowed, modules = json.loads(sys.argv[1]), json.loads(sys.argv[2])
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top in sys.stdlib_module_names or top.startswith("_") or top in allowed or (
                top == "headgraph" and (name == "headgraph" or ".".join(name.split(".")[:2]) in allowed)):
            return None
        if "." not in name and importlib.machinery.PathFinder.find_spec(name) is None:
            return None  # not installed at all: an optional import's usual miss
        raise ModuleNotFoundError(f"{name} is not in the declared dependencies", name=name)
sys.meta_path.insert(0, Refuse())
failed = {}
for m in modules:
    try:
        importlib.import_module(m)
    except Exception as err:
        failed[m] = f"{type(err).__name__}: {err}"
print(json.dumps(failed))
"""


@pytest.mark.parametrize("part", PARTS)
def test_every_module_imports_with_only_the_declared_dependencies(part):
    dists = closure(f"headgraph-{part}")
    allowed = {top for top, names in packages_distributions().items()
               if {canonical(n) for n in names} & dists and top != "headgraph"}
    allowed |= {f"headgraph.{d.split('-', 1)[1]}" for d in dists if d.startswith("headgraph-")}
    modules = [module_name(part, p) for p in sources(part)]
    out = subprocess.run([sys.executable, "-c", GUARD, json.dumps(sorted(allowed)), json.dumps(modules)],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    failed = json.loads(out.stdout.strip().splitlines()[-1])
    assert not failed, failed
