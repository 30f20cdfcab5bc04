"""Every number of a findings report, read from the headgraph HTTP API (never computed here).

``collect`` asks a running server for the model's info, reference (KL grid, nulls), pattern
scores, the paper's head graph (top-k per pairing, hubs, sink flags), the class overlay the
dashboard opens the model with (its label set, for the graph's class colours), the top tokens of each
role, the path ablation of the top OK edges, the validation of PK / CS / data-PK against
those effects, the recovery tables of the model's label set (OQ, OK, OV) and raw vs norm-aware
PK on that label set (GET /api/subspaces), and each bundled task's circuit with the recovery tables
against it (``task_recovery``). Cold results are computed by that server (minutes for a real model).
``LocalServer`` starts ``headgraph serve`` as a subprocess on a free loopback port: the
frontend reaches the server only over HTTP, so it runs the server's module, never imports it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from headgraph.frontend.api.names import O_PAIRINGS
from headgraph.frontend.state.url import default_overlay

ROLES = ("Q", "K", "V", "O")
GRAPH_PAIRINGS = O_PAIRINGS
PAPER_K = 20  # the paper's head graph: top-20 edges per pairing
TOKENS_K = 10
TIMEOUT_S = 3600.0  # a cold SmolLM2 validation takes minutes on two cores


class ApiFailure(RuntimeError):
    """The API answered an error (its message), or could not be reached."""


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class LocalServer:
    """``python -m headgraph.server.cli.main serve`` on a free loopback port, stopped on exit."""

    def __init__(self, cache_dir: Path | None, log_path: Path, host: str = "127.0.0.1",
                 startup_timeout: float = 180.0) -> None:
        self.cache_dir, self.log_path, self.host = cache_dir, log_path, host
        self.port = _free_port(host)
        self.url = f"http://{host}:{self.port}"
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> LocalServer:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if self.cache_dir is not None:
            env["HEADGRAPH_CACHE_DIR"] = str(self.cache_dir.expanduser())
        cmd = [sys.executable, "-m", "headgraph.server.cli.main", "serve", "--host", self.host,
               "--port", str(self.port), "--workers", "1", "--log-level", "warning"]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ApiFailure(f"the server exited ({self.proc.returncode}); see {self.log_path}")
            try:
                if httpx.get(self.url + "/api/health", timeout=2.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.__exit__()
        raise ApiFailure(f"the server did not answer within {self.startup_timeout:.0f} s; see {self.log_path}")

    def __exit__(self, *exc: Any) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def get(client: httpx.Client, path: str, **params: Any) -> dict[str, Any]:
    """One GET of the API as JSON; an error answer raises ApiFailure with its message."""
    try:
        r = client.get(path, params=params)
    except httpx.HTTPError as err:
        raise ApiFailure(f"GET {path}: {err}") from err
    if r.status_code != 200:
        try:
            body = r.json()
            detail = (body.get("error") or {}).get("message") or body.get("detail") or body.get("message") or r.text
        except (ValueError, AttributeError):
            detail = r.text
        raise ApiFailure(f"GET {path} -> {r.status_code}: {str(detail)[:300]}")
    return r.json()


def optional(client: httpx.Client, path: str, **params: Any) -> dict[str, Any] | None:
    """Like ``get``, but a 4xx (a model that cannot run, no vocabulary) is None, not an error."""
    try:
        return get(client, path, **params)
    except ApiFailure as err:
        if " -> 4" in str(err):
            return {"unavailable": str(err).split(": ", 1)[-1]}  # the API's message
        raise


def collect(client: httpx.Client, model: str, *, ablation_top: int = 10,
            validation_pairing: str = "OK", say: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """The API answers a report is made of, keyed by what they are; ``say`` hears each step."""
    out: dict[str, Any] = {"model": model, "url": str(client.base_url)}
    out["health"] = get(client, "/api/health")
    out["info"] = get(client, "/api/models/info", model=model)
    say("random reference (KL grid, nulls)")
    out["reference"] = get(client, "/api/reference", model=model)
    # Pattern scores first: the graph describes and flags its heads only once they are cached.
    say("attention-pattern scores")
    out["patterns"] = optional(client, "/api/patterns", model=model)
    say(f"head graph (top-{PAPER_K} per pairing) and hubs")
    out["graph"] = get(client, "/api/graph", model=model, pairings=",".join(GRAPH_PAIRINGS), k=PAPER_K)
    say("class overlay (the dashboard's default label set)")
    out["overlay"] = overlay(client, model)
    say("top tokens per role")
    out["tokens"] = {role: optional(client, "/api/tokens", model=model, role=role, k=TOKENS_K, anisotropic="true")
                     for role in ROLES}
    say(f"path ablation of the top-{ablation_top} OK edges")
    out["ablation"] = optional(client, "/api/ablation", model=model, pairing="OK", top=ablation_top)
    say(f"validation of the metrics against ablation ({validation_pairing})")
    out["validation"] = optional(client, "/api/validation", model=model, pairing=validation_pairing)
    labels = recovery_labels(client, model)
    say(f"recovery tables of the label set '{labels}' (top-{PAPER_K}, {', '.join(GRAPH_PAIRINGS)})")
    out["recovery"] = {"labels": labels, "k": PAPER_K,
                       "pairings": {p: optional(client, "/api/recovery", model=model, pairing=p, labels=labels,
                                                k=PAPER_K) for p in GRAPH_PAIRINGS}}
    say(f"raw vs norm-aware subspaces on the label set '{labels}' (top-{PAPER_K}, {', '.join(GRAPH_PAIRINGS)})")
    out["subspaces"] = {"labels": labels, "k": PAPER_K,
                        "pairings": {p: optional(client, "/api/subspaces", model=model, pairing=p, labels=labels,
                                                 k=PAPER_K) for p in GRAPH_PAIRINGS}}
    out["tasks"] = task_recovery(client, model, say=say)
    return out


CIRCUIT_KEYS = ("task", "bundled", "content", "method", "steps", "metrics", "n_edges", "share", "circuit_size")


def task_recovery(client: httpx.Client, model: str, *, say: Callable[[str], None] = lambda _: None
                  ) -> dict[str, Any]:
    """Per bundled task (GET /api/tasks): its circuit's metrics and size (GET /api/circuit, at its
    default method and size; ``able`` says whether the model does the task) and, for a task the
    model does, the recovery tables against that circuit (GET /api/recovery?task=, top-PAPER_K,
    OQ / OK / OV). Any failure here (a model that cannot run, a refused pairing, a server error)
    is an ``unavailable`` marker with its message, so the rest of the report still renders."""
    listed = tolerant(client, "/api/tasks")
    if not available(listed):
        return listed
    tasks: dict[str, Any] = {}
    for t in listed.get("tasks") or []:
        if not t.get("bundled"):
            continue
        name = t["name"]
        say(f"circuit of the task '{name}' (cold: minutes for a real model)")
        circuit = tolerant(client, "/api/circuit", model=model, task=name, top=1)
        entry: dict[str, Any] = {"description": t.get("description"), "n_rows": t.get("n_rows"),
                                 "circuit": circuit if not available(circuit)
                                 else {k: circuit.get(k) for k in CIRCUIT_KEYS}}
        if available(circuit) and (circuit.get("metrics") or {}).get("able"):
            say(f"recovery of the '{name}' circuit (top-{PAPER_K}, {', '.join(GRAPH_PAIRINGS)})")
            entry["pairings"] = {p: tolerant(client, "/api/recovery", model=model, task=name, pairing=p,
                                             k=PAPER_K) for p in GRAPH_PAIRINGS}
        tasks[name] = entry
    return {"k": PAPER_K, "tasks": tasks}


def tolerant(client: httpx.Client, path: str, **params: Any) -> dict[str, Any]:
    """Like ``optional``, but any failure (a 5xx, a lost connection) is an ``unavailable`` marker
    too, with ``failure`` set (not the model's refusal): for a stage the rest of the report does
    not depend on."""
    try:
        return optional(client, path, **params) or {"unavailable": f"GET {path}: no answer", "failure": True}
    except ApiFailure as err:
        return {"unavailable": str(err), "failure": True}


def recovery_labels(client: httpx.Client, model: str) -> str:
    """The label set a report recovers: the dashboard's default for ``model`` (a built-in set
    made for it, else its own ``patterns`` set; state.url.default_overlay)."""
    data = get(client, "/api/labels")
    sets = data.get("label_sets", data.get("labels", [])) if isinstance(data, dict) else data
    return default_overlay(model, sets if isinstance(sets, list) else [])


def overlay(client: httpx.Client, model: str) -> dict[str, Any]:
    """The label set the dashboard opens ``model`` with (state.url.default_overlay): its name,
    class order (GET /api/labels) and head -> class map (GET /api/labels/NAME), or an
    ``unavailable`` marker (e.g. no pattern scores for a model that cannot be run)."""
    sets = get(client, "/api/labels").get("label_sets", [])
    name = default_overlay(model, sets)
    answer = optional(client, f"/api/labels/{name}", model=model)
    if not available(answer) or answer is None:
        return answer or {"unavailable": f"label set {name}"}
    order = next((list(s.get("classes") or []) for s in sets if s.get("name") == name), [])
    return {"name": name, "order": order, "classes": dict(answer.get("classes") or {})}


def available(answer: dict[str, Any] | None) -> bool:
    """True for a real API answer (not None, not an ``unavailable`` 4xx marker)."""
    return isinstance(answer, dict) and "unavailable" not in answer


def why_missing(answer: dict[str, Any] | None, otherwise: str) -> str:
    """Why an answer is missing: the API's refusal ("this model could not be run: ...") or
    ``otherwise``."""
    if isinstance(answer, dict) and answer.get("unavailable"):
        return f"this model could not be run: {answer['unavailable']}"
    return otherwise
