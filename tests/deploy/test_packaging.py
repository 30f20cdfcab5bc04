"""The three distributions: what each wheel ships and what each declares it needs.

headgraph-core must install without any web framework (notebook users), the server needs core
and never the frontend, and the frontend needs neither (it talks HTTP); all three share the
`headgraph` namespace, so no wheel may ship `headgraph/__init__.py`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from test_dependencies import closure  # the installed closure of a distribution's requirements

pytestmark = pytest.mark.slow  # builds the three wheels: ~15 s

ROOT = Path(__file__).resolve().parents[2]
PARTS = {"core": "headgraph_core", "server": "headgraph_server", "frontend": "headgraph_frontend"}
WEB = {"fastapi", "starlette", "uvicorn", "dash", "flask", "plotly", "a2wsgi", "diskcache", "kaleido",
       "python-multipart", "werkzeug"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path]:
    # Built from copies: setuptools writes build/ and *.egg-info next to the sources it builds.
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheels")
    junk = shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    for part in PARTS:
        shutil.copytree(ROOT / part, src / part, ignore=junk)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out),
                    *(str(src / part) for part in PARTS)], check=True, timeout=300)
    return {part: next(out.glob(f"{stem}-*.whl")) for part, stem in PARTS.items()}


def wheel_files(path: Path) -> list[str]:
    with zipfile.ZipFile(path) as zf:
        return [n for n in zf.namelist() if ".dist-info/" not in n]


def wheel_requires(path: Path) -> set[str]:
    with zipfile.ZipFile(path) as zf:
        meta = next(zf.read(n).decode() for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
    reqs = [Requirement(line.split(":", 1)[1].strip()) for line in meta.splitlines()
            if line.startswith("Requires-Dist:")]
    return {canonical(r.name) for r in reqs if not (r.marker and "extra" in str(r.marker))}


@pytest.mark.parametrize("part", list(PARTS))
def test_each_wheel_ships_only_its_own_subpackage(wheels, part):
    files = wheel_files(wheels[part])
    assert files and all(f.startswith(f"headgraph/{part}/") for f in files), files
    assert "headgraph/__init__.py" not in files  # a namespace shared by the three
    assert not any(f.endswith((".c", ".so", "setup.py")) for f in files)


def test_core_wheel_carries_the_demo_model_and_types_marker(wheels):
    files = set(wheel_files(wheels["core"]))
    assert {"headgraph/core/data/demo/model.safetensors", "headgraph/core/data/demo/config.json",
            "headgraph/core/py.typed", "headgraph/core/names.py",
            "headgraph/core/scores/pk.py", "headgraph/core/models/loading.py"} <= files
    # the bundled checkpoint series (core.series): step-named folders one level deeper
    assert "headgraph/core/data/demo_series/step-3000/model.safetensors" in files


def test_declared_dependencies_point_one_way(wheels):
    core, server, frontend = (wheel_requires(wheels[p]) for p in PARTS)
    assert not core & (WEB | {"headgraph-server", "headgraph-frontend"})
    assert "headgraph-core" in server and "fastapi" in server
    assert not server & {"headgraph-frontend", "dash", "plotly", "kaleido"}
    assert not frontend & {"headgraph-core", "headgraph-server", "torch"}
    assert {"dash", "httpx"} <= frontend


def test_core_installs_without_any_web_framework():
    needs = closure("headgraph-core")
    assert "torch" in needs and "transformer-lens" in needs  # the closure was really walked
    assert not needs & WEB, sorted(needs & WEB)


def test_the_server_finds_the_dashboard_through_its_entry_point():
    eps = {ep.name: ep.value for ep in entry_points(group="headgraph.frontends")}
    assert eps == {"dashboard": "headgraph.frontend.app:mount_frontend"}
