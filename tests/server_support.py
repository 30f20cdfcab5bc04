"""The one test launcher of a real server: ``headgraph serve`` as a subprocess on a free loopback
port (``headgraph.server.http.launch.ServerProcess``), offline, with Debian's chromium for image
exports; optionally models computed through the API first, and the server's log checked for
5xx answers and unexpected errors when it stops.

Tests reach it as conftest.py's ``launch_server`` fixture::

    with launch_server(tmp_path / "cache", env={"HEADGRAPH_API_TOKEN": TOKEN}) as srv:
        httpx.get(srv.url + "/api/health")
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from headgraph.server.http.launch import ServerProcess

CHROMIUM = "/usr/bin/chromium"
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "BROWSER_PATH": CHROMIUM}


def compute(url: str, model: str, *, timeout: float = 300, poll: float = 0.2) -> dict[str, Any]:
    """Compute ``model`` through the API of the server at ``url`` (POST /api/models/compute,
    then its job polled until it ends); the job's last record, which must be ``done``."""
    with httpx.Client(base_url=url, timeout=timeout) as http:
        job = http.post("/api/models/compute", params={"model": model}).json()["job"]
        while (rec := http.get(f"/api/jobs/{job['id']}").json())["state"] in ("queued", "running"):
            time.sleep(poll)
    assert rec["state"] == "done", rec
    return rec


@contextmanager
def serve(cache_dir: str | Path, *, env: Mapping[str, str] | None = None, workers: int = 1,
          warm: Iterable[str] = (), check_errors: bool = False, **kwargs: Any) -> Iterator[ServerProcess]:
    """A started ``ServerProcess`` on ``cache_dir``, stopped on exit.

    env: extra environment over OFFLINE_ENV (HEADGRAPH_*); workers: uvicorn workers; warm:
    models computed through the API before the server is handed over; check_errors: assert,
    once it stopped, that it answered no request with a 5xx and logged no unexpected error
    (the log is read before the server stops, so whatever the body did is included). Other
    keyword arguments go to ServerProcess (log_path, startup_timeout, ...).
    """
    srv = ServerProcess(cache_dir, workers=workers, env={**OFFLINE_ENV, **(env or {})}, **kwargs).start()
    errors: list[dict[str, Any]] = []
    try:
        for model in warm:
            compute(srv.url, model)
        yield srv
        if check_errors:
            errors = srv.server_errors()
    finally:
        srv.stop()
    assert not errors, errors
