"""Property-based fuzzing of every documented operation of a live server with every
schemathesis check (`--checks all`): no server error, no response outside its schema, no
undocumented status, schema-valid requests accepted and invalid ones rejected; in open mode,
and in lab mode (HEADGRAPH_API_TOKEN set) both without and with the token."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.slow  # fuzzes every operation of a live server three times: ~2.5 min


SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
CONFIG = Path(__file__).with_name("schemathesis.toml")  # per-operation settings, with reasons
HOOKS = Path(__file__).with_name("schemathesis_hooks.py")  # a JSONL body's serializer
SLOW_PATH = "/api/circuit"
TOKEN = "schemathesis-lab-token-0123456789"
WARM = ("/api/reference", "/api/scatter", "/api/graph", "/api/patterns", "/api/validation",
        "/api/circuit")


ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HEADGRAPH_DEVICE": "cpu"}


@pytest.fixture(scope="module")
def warm_cache(launch_server, tmp_path_factory):
    """A cache holding the demo's heavier results (computed once by an open server, which is
    then stopped), so fuzzing measures the API, not first computations; each mode's server
    starts on its own copy (lab mode reads it like any cache: anonymous reads are cache-only)."""
    cache = tmp_path_factory.mktemp("schemathesis-warm") / "cache"
    with launch_server(cache, workers=1, env=ENV) as srv:
        for path in WARM:
            assert httpx.get(srv.url + path, timeout=300).status_code == 200
    return cache


@pytest.mark.parametrize("mode", ["open", "lab-anonymous", "lab-token"])
def test_every_check_holds_under_schemathesis(launch_server, warm_cache, tmp_path, mode):
    env = dict(ENV)
    if mode != "open":
        env["HEADGRAPH_API_TOKEN"] = TOKEN
    shutil.copytree(warm_cache, tmp_path / "cache")
    with launch_server(tmp_path / "cache", workers=1, env=env) as srv:
        ops = httpx.get(srv.url + "/openapi.json").json()["paths"]
        base = [str(SCHEMATHESIS), "--config-file", str(CONFIG), "run", srv.url + "/openapi.json",
                "--checks", "all", "--workers", "1", "--seed", "0", "--request-timeout", "300",
                "--suppress-health-check", "all"]
        if mode == "lab-token":
            base += ["--header", f"Authorization: Bearer {TOKEN}"]
        # every operation but the task circuit, then the circuit alone with one example (each
        # cold parameter set of it is a minute of real interventions here)
        runs = [base + ["--max-examples", "10" if mode == "open" else "6",
                        "--phases", "examples,coverage,fuzzing", "--exclude-path", SLOW_PATH],
                base + ["--max-examples", "1", "--phases", "examples,fuzzing",
                        "--include-path", SLOW_PATH]]
        hooks = {**os.environ, "SCHEMATHESIS_HOOKS": str(HOOKS)}
        procs = [subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=hooks)
                 for cmd in runs]
        requests = [r for r in srv.records() if r.get("logger") == "headgraph.access"]
        statuses = {r.get("status") for r in requests}
        errors = srv.server_errors()
    for proc in procs:
        assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-2000:]
        assert "Runtime Error" not in proc.stdout
    assert len(requests) > 10 * len(ops)  # fuzzing really exercised the API
    assert not errors, errors[:5]
    assert not any(s >= 500 for s in statuses if isinstance(s, int))
    if mode == "lab-anonymous":
        assert 401 in statuses  # uploads, jobs and cold reads were refused without the token
    n_ops = sum(len(methods) for methods in ops.values())
    tested = [re.search(r"Tested:\s+(\d+)", proc.stdout) for proc in procs]
    assert all(tested) and sum(int(t.group(1)) for t in tested if t) == n_ops  # every operation fuzzed
