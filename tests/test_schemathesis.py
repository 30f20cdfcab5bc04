"""Property-based fuzzing of every documented operation of a live server: no 5xx, ever."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx

from headgraph.server.launch import ServerProcess

SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")


def test_no_server_errors_under_schemathesis(tmp_path):
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HEADGRAPH_DEVICE": "cpu"}
    with ServerProcess(tmp_path / "cache", workers=1, env=env) as srv:
        # Warm the demo's heavier results so fuzzing measures the API, not first computations.
        for path in ("/api/reference", "/api/scatter", "/api/graph", "/api/patterns"):
            assert httpx.get(srv.url + path, timeout=300).status_code == 200
        ops = httpx.get(srv.url + "/openapi.json").json()["paths"]
        proc = subprocess.run(
            [str(SCHEMATHESIS), "run", srv.url + "/openapi.json",
             "--checks", "not_a_server_error", "--max-examples", "5", "--workers", "1",
             "--seed", "0", "--phases", "examples,coverage,fuzzing", "--request-timeout", "120",
             "--suppress-health-check", "all"],
            capture_output=True, text=True, timeout=600)
        requests = [r for r in srv.records() if r.get("logger") == "headgraph.access"]
        errors = srv.server_errors()
    assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-2000:]
    assert "Runtime Error" not in proc.stdout
    assert len(requests) > 10 * len(ops)  # fuzzing really exercised the API
    assert not errors, errors[:5]
    n_ops = sum(len(methods) for methods in ops.values())
    tested = re.search(r"Tested:\s+(\d+)", proc.stdout)
    assert tested and int(tested.group(1)) == n_ops  # every documented operation was fuzzed
