"""HTTP client for the headgraph API: the frontend's only way to reach data.

The dashboard never imports ``headgraph.core``; every number it shows comes from these calls.
Failures become :class:`ApiError` carrying the API's one-line message (shown in the page).
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Mapping
from typing import Any

import httpx

from headgraph.frontend.api.answers import (
    AblationOut,
    AuthOut,
    CircuitOut,
    CircuitProgressOut,
    CompareOut,
    GraphOut,
    HeadOut,
    Health,
    Job,
    JobSubmitted,
    LabelSetOut,
    LabelSetSummary,
    ModelInfoOut,
    ModelSummary,
    PairOut,
    PatternsOut,
    Queue,
    RecoveryOut,
    ReferenceOut,
    ScatterOut,
    ScoreGrid,
    SeriesOut,
    SubgraphOut,
    TaskSummary,
    TimelineOut,
    TokensOut,
    TopPairs,
    ValidationOut,
    VocabularyOut,
)

BUSY_POLL_S = 0.25  # first wait before a GET answered 429 (busy) is tried again; doubled each time
BUSY_POLL_MAX_S = 8.0  # the longest wait between two tries
ABLATION_TIMEOUT_S = 600.0  # measuring edges of a real model: loading it, then forward passes
VALIDATION_TIMEOUT_S = 3600.0  # ~40-100 pairs measured on two prompt sets: minutes on a real model
RECOVERY_TIMEOUT_S = 900.0  # a cold table computes CKA and Procrustes of one pairing: a minute or more
CIRCUIT_TIMEOUT_S = 3600.0  # a cold circuit: attribution, the faithfulness curve and patched edges
QueryValue = str | int | float | bool | list[str] | None  # one query parameter (None: left out)


class ApiError(Exception):
    """A non-2xx API answer (or no answer): HTTP status and the API's message."""

    def __init__(self, status: int, message: str, payload: object = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.payload = payload


def error_message(payload: object, fallback: str) -> str:
    """The human message of an API error body ({"error": {"message"}} or FastAPI's {"detail"})."""
    if isinstance(payload, dict):
        err = payload.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
        detail = payload.get("detail")
        if isinstance(detail, str):
            return detail
        if isinstance(detail, list) and detail:
            first = detail[0]
            if isinstance(first, dict):
                loc = ".".join(str(x) for x in first.get("loc", []) if x not in ("query", "body"))
                return f"{loc}: {first.get('msg', '')}".strip(": ")
        if payload.get("message"):
            return str(payload["message"])
    return fallback


def _retry_after(resp: httpx.Response) -> float | None:
    """Seconds of a ``Retry-After: <seconds>`` header (None when absent or a date)."""
    try:
        return max(0.0, float(resp.headers.get("retry-after", "")))
    except ValueError:
        return None


class ApiClient:
    """Typed wrappers over the JSON endpoints of one headgraph server (answers: api.answers)."""

    def __init__(self, base_url: str, *, token: str | None = None, timeout: float = 120.0,
                 http: httpx.Client | None = None, busy_wait_s: float = 60.0) -> None:
        """``http`` lets a caller supply the transport (e.g. an in-process test client)."""
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = http or httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout)
        self._user_headers: dict[str, str] = {}
        self.busy_wait_s = busy_wait_s

    def as_user(self, token: str | None, forwarded_for: str | None = None) -> ApiClient:
        """This client acting for one browser user: ``Authorization: Bearer <token>`` (their
        own credential) and ``X-Forwarded-For`` (their address, so the API's per-client limits
        count each browser, not the dashboard) on every request; the same connection pool."""
        headers = {}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if forwarded_for:
            headers["X-Forwarded-For"] = forwarded_for
        if not headers:
            return self
        other = copy.copy(self)
        other._user_headers = headers
        return other

    def close(self) -> None:
        self._http.close()

    # -- transport ----------------------------------------------------------------------
    def request(self, method: str, path: str, *, params: Mapping[str, QueryValue] | None = None,
                **kwargs: Any) -> httpx.Response:
        """Send a request; raise ApiError with the API's message on any non-2xx or transport error."""
        clean = {k: v for k, v in (params or {}).items() if v is not None and v != ""}
        if self._user_headers:
            kwargs["headers"] = {**kwargs.get("headers", {}), **self._user_headers}
        waited, pause = 0.0, BUSY_POLL_S
        while True:
            try:
                resp = self._http.request(method, path, params=clean, **kwargs)
            except httpx.HTTPError as err:
                raise ApiError(0, f"API unreachable at {self.base_url}: {err}") from err
            # 429: this browser's queue of cold computations is full; a GET tries again,
            # backing off exponentially (the server's Retry-After at most), instead of failing.
            if resp.status_code != 429 or method != "GET" or waited >= self.busy_wait_s:
                break
            time.sleep(pause)
            waited += pause
            pause = min(2 * pause, BUSY_POLL_MAX_S, _retry_after(resp) or BUSY_POLL_MAX_S)
        if resp.status_code >= 400:
            try:
                payload = resp.json()
            except ValueError:
                payload = None
            raise ApiError(resp.status_code, error_message(payload, f"HTTP {resp.status_code}"), payload)
        return resp

    def get(self, path: str, **params: QueryValue) -> Any:
        """The decoded JSON of a GET (the typed endpoints below say what it holds)."""
        return self.request("GET", path, params=params).json()

    # -- endpoints ----------------------------------------------------------------------
    def health(self) -> Health:
        return self.get("/api/health")

    def auth(self) -> AuthOut:
        return self.get("/api/auth")

    def vocabulary(self) -> VocabularyOut:
        return self.get("/api/vocabulary")

    def models(self) -> list[ModelSummary]:
        data = self.get("/api/models")
        return data.get("models", data) if isinstance(data, dict) else data

    def model_info(self, model: str) -> ModelInfoOut:
        return self.get("/api/models/info", model=model)

    def compute(self, model: str, pairings: list[str] | None = None) -> JobSubmitted:
        params = {"model": model, "pairings": ",".join(pairings) if pairings else None}
        return self.request("POST", "/api/models/compute", params=params).json()

    def job(self, job_id: str) -> Job:
        return self.get(f"/api/jobs/{job_id}")

    def latest_job(self, model: str, pairings: list[str]) -> Job | None:
        """The newest compute job of the model (running or finished); None when it has none."""
        try:
            return self.get("/api/jobs", model=model, pairings=",".join(pairings))
        except ApiError as err:
            if err.status == 404:
                return None
            raise

    def pk(self, model: str, pairing: str, metric: str = "raw", order: str = "forward") -> ScoreGrid:
        return self.get("/api/pk", model=model, pairing=pairing, metric=metric, order=order)

    def cs(self, model: str, mode: str) -> ScoreGrid:
        return self.get("/api/cs", model=model, mode=mode)

    def top(self, model: str, pairing: str, k: int = 20, metric: str = "pk") -> TopPairs:
        return self.get("/api/top", model=model, pairing=pairing, k=k, metric=metric)

    def pair(self, model: str, pairing: str, source: str, target: str,
             labels: str | None = None, partial: bool = False) -> PairOut:
        """``partial``: while the model's job runs, what is cached ("pending" names the rest)."""
        return self.get("/api/pair", model=model, pairing=pairing, source=source, target=target,
                        labels=labels, partial="true" if partial else None)

    def head(self, model: str, head: str, labels: str | None = None, k: int = 5,
             partial: bool = False) -> HeadOut:
        """``partial``: while the model's job runs, what is cached ("pending" names the rest)."""
        return self.get("/api/head", model=model, head=head, labels=labels, k=k,
                        partial="true" if partial else None)

    def graph(self, model: str, pairings: list[str], *, k: int | None = 20,
              threshold: float | None = None, threshold_on: str = "pk",
              labels: str | None = None, granularity: str = "head") -> GraphOut:
        return self.get("/api/graph", model=model, pairings=",".join(pairings), k=k,
                        threshold=threshold, threshold_on=threshold_on,
                        labels=labels, granularity=granularity)

    def scatter(self, model: str, pairing: str, top_percent: float = 5.0) -> ScatterOut:
        return self.get("/api/scatter", model=model, pairing=pairing, top_percent=top_percent)

    def reference(self, model: str) -> ReferenceOut:
        return self.get("/api/reference", model=model)

    def tokens(self, model: str, role: str, k: int = 10, layer: int | None = None,
               head: int | None = None) -> TokensOut:
        return self.get("/api/tokens", model=model, role=role, k=k, layer=layer, head=head)

    def patterns(self, model: str) -> PatternsOut:
        return self.get("/api/patterns", model=model)

    def ablation(self, model: str, pairing: str, *, top: int | None = None, edge: str | None = None,
                 cached: bool = False, timeout: float = ABLATION_TIMEOUT_S) -> AblationOut:
        """GET /api/ablation: path-ablation effects and verdicts of the ``top`` PK edges of
        ``pairing`` or of one ``edge`` ("L0H0,L1H3"); ``cached``: read only (never computes:
        unmeasured edges say "not measured"), else measured (cold work: needs the token in lab
        mode; the model's first ablation loads and runs it, so the wait is longer)."""
        params = {"model": model, "pairing": pairing, "top": top, "edge": edge,
                  "cached": "true" if cached else None}
        extra = {} if cached else {"timeout": timeout}  # a cached read is as quick as any other
        return self.request("GET", "/api/ablation", params=params, **extra).json()

    def validation(self, model: str, pairing: str, *, cached: bool = False, **sample: int) -> ValidationOut:
        """GET /api/validation: PK, CS and data-weighted PK against path-ablation effects, with
        bootstrap CIs; ``sample``: n, k, seed (the API's defaults when omitted). ``cached``: read
        only (``computed`` false while not cached), else computed (cold work: needs the token in
        lab mode; minutes on a real model)."""
        params = {"model": model, "pairing": pairing, **sample, "cached": "true" if cached else None}
        extra = {} if cached else {"timeout": VALIDATION_TIMEOUT_S}
        return self.request("GET", "/api/validation", params=params, **extra).json()

    def recovery(self, model: str, pairing: str, labels: str, k: int = 20) -> RecoveryOut:
        """GET /api/recovery: every metric's recovery of the label set ``labels``'s heads on
        ``pairing`` (endpoint share, precision@k, ROC-AUC with bootstrap intervals and paired
        differences vs PK). Cold work (CKA, Procrustes): needs the token in lab mode."""
        params = {"model": model, "pairing": pairing, "labels": labels, "k": k}
        return self.request("GET", "/api/recovery", params=params, timeout=RECOVERY_TIMEOUT_S).json()

    def tasks(self) -> list[TaskSummary]:
        """GET /api/tasks: the bundled and uploaded tasks ({"name", "bundled", "description",
        "n_rows", "content"})."""
        return self.get("/api/tasks")["tasks"]

    def circuit(self, model: str, task: str, method: str = "eap-ig", steps: int = 5,
                top: int = 20, edges: list[str] | None = None, pairs: int | None = None) -> CircuitOut:
        """GET /api/circuit: the task's metric, its top edges by attribution, the circuit, the
        faithfulness curve and the EAP vs patching check (computed on request when cold);
        ``edges`` ("WRITER>READER") looked up with their rank among all edges (``lookup``);
        ``pairs``: a bundled task's first n prompt pairs (None: the API's default, all 32)."""
        params = {"model": model, "task": task, "method": method, "steps": steps, "top": top,
                  "edge": list(edges) if edges else None, "pairs": pairs}
        return self.request("GET", "/api/circuit", params=params, timeout=CIRCUIT_TIMEOUT_S).json()

    def circuit_progress(self, model: str, task: str, method: str = "eap-ig", steps: int = 5,
                         pairs: int | None = None) -> CircuitProgressOut:
        """GET /api/circuit/progress: "cached", "running" (stage, fraction, message,
        elapsed_s) or "idle"; never computes."""
        return self.get("/api/circuit/progress", model=model, task=task, method=method, steps=steps, pairs=pairs)

    def upload_task(self, content: bytes, name: str, model: str | None = None,
                    replace: bool = True) -> TaskSummary:
        """POST /api/tasks: store a JSONL task as ``name`` (with ``model``, each row checked in
        its tokens too); a bad row is an ApiError naming its line, and nothing is stored."""
        params = {"name": name, "model": model, "replace": "true" if replace else None}
        return self.request("POST", "/api/tasks", params=params, content=content,
                            headers={"content-type": "application/x-ndjson"}).json()

    def subgraph(self, model: str, *, heads: list[str] | None = None, head: str | None = None,
                 depth: int | None = None, k: int | None = None, layers: str | None = None,
                 pairings: list[str] | None = None, rank_on: str = "pk", cap: int | None = None) -> SubgraphOut:
        """GET /api/subgraph: the edges among ``heads``, the neighbourhood of ``head`` (``depth``,
        ``k``) or a layer range's top-``k`` edges, at most ``cap``, saying how many it left out."""
        return self.get("/api/subgraph", model=model, heads=",".join(heads) if heads else None, head=head,
                        depth=depth, k=k, layers=layers, pairings=",".join(pairings) if pairings else None,
                        rank_on=rank_on, cap=cap)

    def compare(self, a: str, b: str, pairing: str, k: int) -> CompareOut:
        """GET /api/compare: model ``a`` against model ``b`` on ``pairing`` (grids, top-``k`` edges, hubs)."""
        return self.get("/api/compare", a=a, b=b, pairing=pairing, k=k)

    def series(self) -> SeriesOut:
        """GET /api/series: the checkpoint series the server knows."""
        return self.get("/api/series")

    def timeline(self, series: str, pairing: str, k: int) -> TimelineOut:
        """GET /api/timeline: the top-``k`` edges' PK over a series' checkpoints."""
        return self.get("/api/timeline", series=series, pairing=pairing, k=k)

    def queue(self) -> Queue:
        """GET /api/queue: this client's running and waiting cold computations."""
        return self.get("/api/queue")

    def labels(self) -> list[LabelSetSummary]:
        data = self.get("/api/labels")
        return data.get("label_sets", data.get("labels", data)) if isinstance(data, dict) else data

    def label_set(self, name: str, model: str | None = None) -> LabelSetOut:
        """GET /api/labels/{name}; ``model``: a per-model set (``patterns``) computed for it."""
        return self.get(f"/api/labels/{name}", model=model)

    def upload_labels(self, content: bytes, filename: str, model: str | None = None,
                      name: str | None = None) -> LabelSetOut:
        files = {"file": (filename, content)}
        return self.request("POST", "/api/labels", params={"model": model, "name": name},
                            files=files).json()

    def download(self, what: str, **params: QueryValue) -> tuple[bytes, str]:
        """Bytes and suggested file name of GET /api/download/{what} (pk, cs, top, graph;
        Content-Disposition)."""
        resp = self.request("GET", f"/api/download/{what}", params=params)
        cd = resp.headers.get("content-disposition", "")
        name = cd.split("filename=")[-1].strip('"; ') if "filename=" in cd else "download"
        return resp.content, name


class ClientPool:
    """One ApiClient per base URL, shared by the callbacks of one Dash app (thread-safe)."""

    def __init__(self, token: str | None = None) -> None:
        self.token = token  # only for a separate API the user points the dashboard at
        self._clients: dict[str, ApiClient] = {}
        self._lock = threading.Lock()

    def get(self, base_url: str) -> ApiClient:
        with self._lock:
            client = self._clients.get(base_url)
            if client is None:
                client = self._clients[base_url] = ApiClient(base_url, token=self.token)
            return client
