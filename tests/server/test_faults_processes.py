"""Process faults with real processes: a server killed with SIGKILL takes its compute
processes (and the multiprocessing resource tracker) along, none of which writes a result
afterwards; after a restart its job reads failed on the first request and a POST retries it;
a compute process killed under a running job fails that job, and a retry finishes.

One random model with a few seconds per step (a small GPT-2 config) makes a kill land
mid-computation; deadlines are generous (behaviour, not speed).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from headgraph.server.http.launch import ServerProcess

# serial (run alone, after the parallel part): kill-to-exit times of compute processes
# servers and compute processes killed and restarted: ~1 min
pytestmark = [pytest.mark.slow, pytest.mark.serial]

ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HEADGRAPH_DEVICE": "cpu"}
# seconds for the reference and each null (steps a kill can land in); loads in a few seconds
CONFIG = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_layer": 2, "n_head": 8,
          "n_embd": 256, "n_positions": 64, "vocab_size": 512, "bos_token_id": 256,
          "eos_token_id": 256}
SLOW_STAGES = ("reference", "null")  # steps long enough to be killed in (the nulls' pass)


def gone(proc: psutil.Process) -> bool:
    """The process exited (a zombie nobody reaped counts: it runs nothing)."""
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait up to ``timeout`` s for every process to exit; the ones still running."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [p for p in procs if not gone(p)]
        if not alive:
            return []
        time.sleep(0.1)
    return [p for p in procs if not gone(p)]


def describe(procs: list[psutil.Process]) -> list[str]:
    out = []
    for p in procs:
        try:
            out.append(f"{p.pid}: {' '.join(p.cmdline())[:160]}")
        except psutil.Error:
            out.append(f"{p.pid}: (gone)")
    return out


def result_keys(cache_dir: Path) -> set[str]:
    """Keys in the result cache, read straight from its SQLite index (read-only)."""
    db = cache_dir / "results" / "cache.db"
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        return {str(row[0]) for row in con.execute("SELECT key FROM Cache")}
    finally:
        con.close()


def job(url: str, job_id: str) -> dict[str, Any]:
    r = httpx.get(f"{url}/api/jobs/{job_id}", timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def poll(url: str, job_id: str, until: Callable[[dict[str, Any]], bool], timeout: float = 240.0
         ) -> dict[str, Any]:
    """Poll a job every 50 ms until ``until(state)`` or it finished; its last state."""
    deadline = time.monotonic() + timeout
    state = job(url, job_id)
    while time.monotonic() < deadline and not until(state) \
            and state["state"] not in ("done", "failed"):
        time.sleep(0.05)
        state = job(url, job_id)
    return state


def in_slow_stage(state: dict[str, Any]) -> bool:
    return state["state"] == "running" and state["stage"].startswith(SLOW_STAGES)


def submit(url: str, model: str, pairings: str) -> dict[str, Any]:
    r = httpx.post(url + "/api/models/compute", params={"model": model, "pairings": pairings},
                   timeout=60)
    assert r.status_code == 202, r.text
    return r.json()


@pytest.fixture(scope="module")
def model_env(tmp_path_factory) -> tuple[str, dict[str, str], Path]:
    root = tmp_path_factory.mktemp("faults")
    cfg = root / "gpt2-mid.json"
    cfg.write_text(json.dumps(CONFIG))
    model = f"random:{cfg}"
    return model, {**ENV, "HEADGRAPH_MODELS": f"demo,{model}"}, root / "cache"


@pytest.fixture(scope="module")
def killed(model_env) -> dict[str, Any]:
    """A server SIGKILLed while its compute process is inside a multi-second step."""
    model, env, cache_dir = model_env
    srv = ServerProcess(cache_dir, workers=1, env=env).start()
    children: list[psutil.Process] = []
    try:
        first = submit(srv.url, model, "OK")
        job_id = first["job"]["id"]
        state = poll(srv.url, job_id, in_slow_stage)
        assert in_slow_stage(state), (state, srv.log())
        assert srv.proc is not None
        server = psutil.Process(srv.proc.pid)
        children = server.children(recursive=True)  # compute process(es), resource tracker
        seen = describe(children)
        time.sleep(0.5)  # well inside the step now
        before = result_keys(cache_dir)
        os.kill(server.pid, signal.SIGKILL)  # uvicorn itself (one worker: no supervisor)
        srv.proc.wait(30)
        killed_at = time.monotonic()
        still = wait_gone(children, 15.0)
        gone_after = time.monotonic() - killed_at
        time.sleep(2.0)  # a survivor would store the step's result about now
        after = result_keys(cache_dir)
        return {"job": job_id, "stage": state["stage"], "children": seen,
                "still": describe(still), "gone_after": gone_after, "before": before,
                "after": after, "cache_dir": cache_dir, "log": srv.log()}
    finally:
        srv.stop()
        for p in children:  # never leave a survivor behind (the test reports it)
            try:
                p.kill()
            except psutil.Error:
                pass


@pytest.fixture(scope="module")
def restarted(model_env, killed):
    """A fresh server on the killed one's cache."""
    _, env, cache_dir = model_env
    srv = ServerProcess(cache_dir, workers=1, env=env).start()
    yield srv
    errors = srv.server_errors()
    srv.stop()
    assert not errors, errors


def test_a_killed_server_takes_its_compute_processes_along(killed):
    kinds = " ".join(killed["children"])
    assert "spawn_main" in kinds, killed["children"]  # a compute process was there
    assert "resource_tracker" in kinds, killed["children"]  # and the resource tracker
    assert not killed["still"], (killed["still"], killed["log"][-3000:])
    assert killed["after"] == killed["before"]  # nothing stored after the kill
    name, _, pairing = killed["stage"].partition(" ")  # the step the kill interrupted
    assert not [k for k in killed["after"]
                if f"/{name}?" in k and (not pairing or f"pairing={pairing}" in k)]


def test_b_job_of_a_dead_server_reads_failed_at_once_and_a_post_retries_it(killed, restarted,
                                                                          model_env):
    model = model_env[0]
    state = job(restarted.url, killed["job"])  # the first request: no staleness wait
    assert state["state"] == "failed", state
    assert "stopped" in state["error"] and "POST again" in state["error"]
    retry = submit(restarted.url, model, "OK")
    assert retry["created"] is True and retry["job"]["attempt"] == 2
    assert retry["job"]["id"] != killed["job"]
    again = submit(restarted.url, model, "OK")  # joins the live attempt
    assert again["created"] is False and again["job"]["id"] == retry["job"]["id"]
    done = poll(restarted.url, retry["job"]["id"], lambda s: False)
    assert done["state"] == "done", done
    assert any("/reference?" in k for k in result_keys(killed["cache_dir"]))


def test_c_a_killed_compute_process_fails_its_job_and_a_retry_finishes(restarted, model_env):
    model = model_env[0]
    first = submit(restarted.url, model, "OQ")["job"]
    state = poll(restarted.url, first["id"], lambda s: s["stage"] == "null")
    assert state["state"] == "running" and state["stage"] == "null", state
    assert restarted.proc is not None
    compute = [p for p in psutil.Process(restarted.proc.pid).children(recursive=True)
               if "spawn_main" in " ".join(p.cmdline())]
    assert compute
    for p in compute:
        p.kill()
    failed = poll(restarted.url, first["id"], lambda s: False)
    assert failed["state"] == "failed", failed
    assert "compute process stopped" in failed["error"], failed
    retry = submit(restarted.url, model, "OQ")
    assert retry["created"] is True and retry["job"]["attempt"] == 2
    done = poll(restarted.url, retry["job"]["id"], lambda s: False)
    assert done["state"] == "done", done
    assert wait_gone(compute, 10.0) == []


def test_d_a_killed_supervisor_takes_its_uvicorn_workers_along(tmp_path: Path) -> None:
    """``--workers 2``: uvicorn's supervisor killed with SIGKILL leaves no worker serving."""
    srv = ServerProcess(tmp_path / "cache", workers=2, env=ENV).start()
    try:
        assert httpx.get(srv.url + "/api/health", timeout=30).status_code == 200
        assert srv.proc is not None
        supervisor = psutil.Process(srv.proc.pid)
        deadline = time.monotonic() + 60
        workers: list[psutil.Process] = []
        while time.monotonic() < deadline:  # both workers up (each answers health)
            workers = [c for c in supervisor.children() if "multiprocessing" in " ".join(c.cmdline())]
            if len(workers) >= 2:
                break
            time.sleep(0.2)
        assert len(workers) >= 2, describe(supervisor.children())
        assert httpx.get(srv.url + "/api/pk", params={"model": "demo"}, timeout=120).status_code == 200
        family = supervisor.children(recursive=True)
        os.kill(supervisor.pid, signal.SIGKILL)
        alive = wait_gone(family, 20)
        assert not alive, describe(alive)
        with pytest.raises(httpx.TransportError):
            httpx.get(srv.url + "/api/health", timeout=5)
    finally:
        srv.stop()
