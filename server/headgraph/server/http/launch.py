"""Start ``headgraph serve`` as a subprocess on a free loopback port (tests, benchmarks, scripts).

    with ServerProcess(cache_dir=tmp, workers=2) as srv:
        httpx.get(srv.url + "/api/health")
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import httpx

from headgraph.server.logs import ACCESS_LOGGER


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """``python -m headgraph.server.cli.main serve`` in its own process group, stopped on exit.

    env: extra environment (HEADGRAPH_*, HF_HUB_OFFLINE, ...); the server's stderr (JSON
    request logs) goes to ``log_path`` (default: ``cache_dir/../server-<port>.log``).
    """

    def __init__(self, cache_dir: str | Path, *, workers: int = 1, env: Mapping[str, str] | None = None,
                 host: str = "127.0.0.1", port: int | None = None, log_path: str | Path | None = None,
                 startup_timeout: float = 120.0) -> None:
        self.cache_dir = Path(cache_dir)
        self.workers = workers
        self.host = host
        self.port = port or free_port(host)
        self.url = f"http://{host}:{self.port}"
        self.extra_env = dict(env or {})
        self.log_path = Path(log_path) if log_path else self.cache_dir.parent / f"server-{self.port}.log"
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> ServerProcess:
        env = dict(os.environ)
        env.update({"HEADGRAPH_CACHE_DIR": str(self.cache_dir), "PYTHONUNBUFFERED": "1"})
        env.update(self.extra_env)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - held open while the server runs
        cmd = [sys.executable, "-m", "headgraph.server.cli.main", "serve", "--host", self.host,
               "--port", str(self.port), "--workers", str(self.workers)]
        self.proc = subprocess.Popen(cmd, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.wait_healthy()
        return self

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}; log:\n{self.log()}")
            try:
                if httpx.get(self.url + "/api/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"server not healthy after {self.startup_timeout} s; log:\n{self.log()}")

    def log(self, tail: int | None = 20000) -> str:
        """The server's output so far (its last ``tail`` characters; None: all of it)."""
        try:
            text = self.log_path.read_text(errors="replace")
            return text if tail is None else text[-tail:]
        except OSError:
            return ""

    def records(self) -> list[dict[str, Any]]:
        """The server's JSON log records (request lines, errors) so far."""
        out = []
        for line in self.log(tail=None).splitlines():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
        return out

    def server_errors(self) -> list[dict[str, Any]]:
        """Requests answered with 5xx and unexpected-error records (what clients must never see)."""
        return [r for r in self.records()
                if (r.get("logger") == ACCESS_LOGGER and int(r.get("status", 0)) >= 500)
                or (r.get("logger") == "headgraph.errors" and r.get("level") == "error")]

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM the server's process group (uvicorn and its workers), SIGKILL if it lingers."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(5)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
