"""Every request limit has one name and one value: no two modules of core, server and frontend
bind the same limit name to different values, and GET /api/vocabulary's ``limits`` are exactly
the server's limit constants (headgraph.server.limits), so the page's bounds are the API's."""

from __future__ import annotations

import ast
import operator
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from headgraph.server import limits
from headgraph.server.http.app import create_app
from headgraph.server.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = [ROOT / "core" / "headgraph" / "core", ROOT / "server" / "headgraph" / "server",
            ROOT / "frontend" / "headgraph" / "frontend"]
# A limit's name: a bound (``..._MAX``, ``..._MIN``, ``MAX_...``, ``MIN_...``) or a ``...LIMIT...``.
LIMIT_NAME = re.compile(r"^(?:[A-Z0-9_]+_(?:MAX|MIN)(?:_[A-Z]+)?|(?:MAX|MIN)_[A-Z0-9_]+|[A-Z0-9_]*LIMIT[A-Z0-9_]*)$")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Pow: operator.pow, ast.LShift: operator.lshift}


def value_of(node: ast.expr, known: dict[str, Any]) -> Any:
    """A constant expression's value (numbers, + - * / // ** <<, names already bound), else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = value_of(node.operand, known)
        return None if inner is None else -inner
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = value_of(node.left, known), value_of(node.right, known)
        return None if left is None or right is None else _OPS[type(node.op)](left, right)
    if isinstance(node, ast.Name):
        return known.get(node.id)
    return None


def module_limits() -> dict[str, dict[str, Any]]:
    """Limit name -> {module path: value} over every module-level binding in the three packages;
    a name bound to another name takes that name's value (resolved over all modules)."""
    bindings: list[tuple[str, str, ast.expr]] = []
    for package in PACKAGES:
        for path in sorted(package.rglob("*.py")):
            for stmt in ast.parse(path.read_text(encoding="utf-8")).body:
                if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                    name, value = stmt.targets[0].id, stmt.value
                elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value:
                    name, value = stmt.target.id, stmt.value
                else:
                    continue
                bindings.append((str(path.relative_to(ROOT)), name, value))
    known: dict[str, Any] = {}
    for _ in range(3):  # aliases of aliases
        for _, name, node in bindings:
            value = value_of(node, known)
            if value is not None:
                known.setdefault(name, value)
    found: dict[str, dict[str, Any]] = defaultdict(dict)
    for where, name, node in bindings:
        value = value_of(node, known)
        if LIMIT_NAME.match(name) and value is not None:
            found[name][where] = value
    return found


def test_the_scan_finds_the_limits_it_must() -> None:
    found = module_limits()
    # core's, the server's (one literal each) and the page's own; an import is no binding.
    assert found["GRAPH_K_MAX"] == {"core/headgraph/core/names.py": 1000}
    assert found["RECOVERY_K_MAX"] == {"server/headgraph/server/limits.py": 200}
    assert found["API_BODY_BYTES_MAX"] == {"server/headgraph/server/limits.py": 2 << 20}
    assert found["SUBGRAPH_CAP_MAX"] == {"core/headgraph/core/names.py": 2000}  # an alias, resolved
    assert "TASK_EDGES_SHOWN_MAX" in found and len(found) > 30


def test_no_limit_name_has_two_values() -> None:
    clashes = {name: where for name, where in module_limits().items() if len(set(where.values())) > 1}
    assert not clashes, f"one limit name, several values: {clashes}"


def test_every_server_limit_is_bound_in_one_module() -> None:
    """The request limits (headgraph.server.limits, core's among them) each have one home."""
    found = module_limits()
    names = [n for n in limits.__all__ if n.isupper()]
    assert len(names) == len(set(names)) >= 25
    for name in names:
        assert len(found[name]) == 1, f"{name} is bound in {sorted(found[name])}"
        assert next(iter(found[name].values())) == getattr(limits, name)


def test_the_vocabulary_serves_exactly_the_server_limits(tmp_path: Path) -> None:
    source = ast.parse((ROOT / "server" / "headgraph" / "server" / "limits.py").read_text(encoding="utf-8"))
    defined = {t.id for s in source.body if isinstance(s, ast.Assign) for t in s.targets if isinstance(t, ast.Name)}
    imported = {a.asname or a.name for s in source.body if isinstance(s, ast.ImportFrom) for a in s.names}
    expected = {name.lower(): getattr(limits, name) for name in sorted(defined | imported) if name.isupper()}
    with TestClient(create_app(Settings(cache_dir=tmp_path / "cache"))) as client:
        served = client.get("/api/vocabulary")
        spec = client.get("/openapi.json").json()
    assert served.status_code == 200
    body = served.json()
    assert body["limits"] == expected
    assert all(type(v) is type(expected[k]) for k, v in body["limits"].items())  # 1e6 stays a float
    assert body["k_max"] == expected["graph_k_max"] and body["max_edges"] == expected["threshold_edges_max"]
    documented = spec["components"]["schemas"]["Limits"]["properties"]
    assert set(documented) == set(expected) and all(p.get("description") for p in documented.values())
