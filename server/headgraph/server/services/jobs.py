"""Background compute jobs with progress, persisted in the store so any worker can report them.

A job precomputes everything the dashboard reads for one model (PK per pairing, CS per mode,
z-scores, references, anisotropic nulls, token tables, pattern scores, data-weighted PK) and,
given the view services (``Shown``), what its default views render: the default head graphs,
each pairing's scatter and the pair panels of the default graph's edges. All through the same
single-flight cache keys the GET endpoints use, so a finished job means warm reads, also for
a lab's anonymous readers, who may read but never compute. A job is
driven by a thread of this process, each step computed in a compute process
(server.compute.pool), so the event loop keeps answering.

Job records live in the store's never-evicted ``meta`` cache under ``job:{id}``, each naming
its owner (host, pid and start time of the process running it). A queued or running job
whose owner is on this host and gone (or whose pid now belongs to another process) reads as
failed at once; for an owner on another host, its heartbeat (refreshed every HEARTBEAT_S)
going stale does. Either way a new POST starts a fresh attempt. The newest MAX_FINISHED
finished records are kept (an index of job ids, in submission order, bounds them cheaply).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from headgraph.core.errors import HeadgraphError
from headgraph.core.names import DEFAULT_K
from headgraph.server.cache.cold_miss import CACHE_ONLY, ColdMiss
from headgraph.server.cache.locks import DiskLock
from headgraph.server.cache.store import Store
from headgraph.server.computations.data_pk import DATA_PK_PROMPTS
from headgraph.server.compute.lanes import background
from headgraph.server.compute.estimate import ESTIMATING, JobEstimate, format_eta, machine_rate
from headgraph.server.compute.pool import process_alive, process_started
from headgraph.server.errors import ApiError, one_line
from headgraph.server.models.catalog import ModelCatalog
from headgraph.server.models.offered import ModelRef
from headgraph.server.services.details import DetailService
from headgraph.server.services.graphs import GraphService
from headgraph.server.services.scores import ScoresService
from headgraph.server.services.views import ViewService

log = logging.getLogger("headgraph.jobs")

Progress = Callable[[str, float, str], None]


@dataclass(frozen=True)
class Timing:
    """A job's finished stages' seconds and its estimated seconds left (None: not yet known)."""

    seconds: dict[str, float]
    remaining_s: float | None


ACTIVE = ("queued", "running")
JOB_THREADS = 4  # jobs run at once per process (they wait on the compute processes)
HEARTBEAT_S = 5.0
STALE_S = 30.0
MAX_FINISHED = 500  # finished job records kept (older ones, and their jobkey: index, dropped)
JOB_INDEX = "jobs:index"  # meta key: ids of the kept jobs, oldest first
STOPPED = "the server running this job stopped; POST again to retry"


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")  # pids of two containers on one host differ
    except OSError:
        return ""


def this_process() -> dict[str, Any]:
    """Owner of the jobs this process runs: host, pid namespace, pid and start time."""
    pid = os.getpid()
    return {"host": socket.gethostname(), "pidns": _pid_namespace(), "pid": pid,
            "started": process_started(pid)}


def owner_gone(owner: dict[str, Any] | None) -> bool | None:
    """True/False when ``owner`` runs on this host (and pid namespace) and is gone/alive;
    None when that cannot be told from here (another host, or an older record)."""
    if not isinstance(owner, dict) or not isinstance(owner.get("pid"), int):
        return None
    if owner.get("host") != socket.gethostname() or owner.get("pidns", "") != _pid_namespace():
        return None
    started = owner.get("started")
    return not process_alive(owner["pid"], float(started) if isinstance(started, (int, float))
                             else None)


@dataclass
class JobState:
    """What GET /api/jobs/{id} reports: state, stage, fraction in [0, 1], message."""

    id: str
    model: str
    params: dict[str, Any]
    state: str = "queued"  # queued | running | done | failed
    stage: str = "queued"
    fraction: float = 0.0
    message: str = ""
    attempt: int = 1
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    heartbeat: float = field(default_factory=time.time)
    error: str | None = None
    computed: list[str] = field(default_factory=list)
    plan: list[str] = field(default_factory=list)
    unavailable: dict[str, str] = field(default_factory=dict)  # stage -> why it cannot run
    seconds: dict[str, float] = field(default_factory=dict)  # finished stage -> seconds it took
    remaining_s: float | None = None  # estimated seconds left (server.compute.estimate)
    finish_by: float | None = None  # when (epoch s) the job should be done, by that estimate
    owner: dict[str, Any] | None = None  # this_process() of the process running it (not in the API)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> JobState:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in names})

    @property
    def index_key(self) -> str:
        """The meta key naming the latest job of the same (model, pairings)."""
        return job_index_key(self.model, list(self.params.get("pairings", [])))


def job_index_key(model: str, pairings: list[str]) -> str:
    return f"jobkey:{model}|{','.join(pairings)}"


# The scatter's default share of top pairs (the dashboard's and the API's default).
DEFAULT_TOP_PERCENT = 5.0


@dataclass(frozen=True)
class Shown:
    """The services whose default answers a job renders besides the scores (graph, scatter,
    pair panels), so they are cached before anyone who may not compute asks."""

    graphs: GraphService
    details: DetailService
    views: ViewService


def _graph_stages(scores: ScoresService, shown: Shown, ref: ModelRef, pairings: list[str]
                  ) -> list[tuple[str, Callable[[], Any]]]:
    from headgraph.server.services.labels import PATTERN_LABELS

    def graphs() -> None:
        runnable = scores.patterns_or_none(ref) is not None
        # The API's default graph (flags once patterns exist) and the dashboard's default
        # view of it, overlaid with the model's own "patterns" classes.
        for labels in (None, PATTERN_LABELS) if runnable else (None,):
            shown.graphs.graph(ref, pairings=pairings, granularity="head", k=DEFAULT_K,
                               threshold=None, threshold_on="pk", labels=labels, flags=runnable)

    stages: list[tuple[str, Callable[[], Any]]] = [("graph", graphs)]
    for p in pairings:
        stages.append((f"scatter {p}", lambda p=p: shown.views.scatter(ref, p, DEFAULT_TOP_PERCENT)))
    return stages


def _pair_stage(shown: Shown, ref: ModelRef, pairings: list[str]
                ) -> tuple[str, Callable[[], Any]]:
    def pairs() -> None:
        for p in pairings:  # the default graph's edges: PK's top DEFAULT_K of each pairing
            for row in shown.views.top(ref, p, DEFAULT_K, "pk"):
                shown.details.pair(ref, p, row["source"], row["target"], labels=None)

    return ("pairs", pairs)


def compute_plan(scores: ScoresService, catalog: ModelCatalog, ref: ModelRef, pairings: list[str],
                 shown: Shown | None = None) -> list[tuple[str, Callable[[], Any]]]:
    """Ordered (stage name, thunk) list of what a full compute of one model caches; with
    ``shown``, the default views' answers too (graph and scatter once their inputs exist,
    the pair panels of the default graph's edges last)."""
    info = catalog.info(ref)
    plan: list[tuple[str, Callable[[], Any]]] = [
        ("pk", lambda: scores.pk_together(ref, pairings, "forward"))]
    for p in pairings:
        plan.append((f"pk {p}", lambda p=p: scores.pk(ref, p, "forward")))
    # What the graph, heatmaps and scatter need comes first (CS and the default "patterns"
    # overlay), so those views fill while the slow reference, nulls and tokens still compute.
    for mode in scores.cs_modes_for(pairings):
        plan.append((f"cs {mode}", lambda m=mode: scores.cs(ref, m, "forward")))
    plan.append(("patterns", lambda: scores.patterns(ref)))  # unavailable, with why, if it cannot run
    for p in pairings:
        plan.append((f"z {p}", lambda p=p: scores.zscores(ref, p, "forward")))
    if shown is not None:
        plan.extend(_graph_stages(scores, shown, ref, pairings))
    plan.append(("reference", lambda: scores.reference(ref)))
    plan.append(("null", lambda: scores.null_together(ref, pairings)))
    for p in pairings:
        plan.append((f"null {p}", lambda p=p: scores.null(ref, p)))
    if info.get("d_vocab"):
        for role in ("O", "V", "Q", "K"):
            plan.append((f"tokens {role}", lambda r=role: scores.tokens(ref, r)))
    # Last: data-weighted PK (a forward pass per prompt set; a no-op for a model that cannot
    # run), so the pair panel shows it beside PK and CS without a request computing it.
    for prompts in DATA_PK_PROMPTS:
        plan.append((f"datapk {prompts}", lambda p=prompts: scores.data_pk_all(ref, p)))
    if shown is not None:
        plan.append(_pair_stage(shown, ref, pairings))
    return plan


def run_compute(scores: ScoresService, catalog: ModelCatalog, ref: ModelRef, pairings: list[str],
                progress: Progress,
                finished: Callable[[list[str], list[str], dict[str, str], Timing], None] | None = None,
                shown: Shown | None = None) -> tuple[list[str], dict[str, str]]:
    """Load the model and compute the plan, reporting (stage, fraction, message) before each
    stage and ``finished(done stages, planned stages, unavailable stages, timing)`` after each,
    so clients can show each result as soon as it exists. The fraction is the finished share of
    the plan's estimated cost and the message says the time left once the job's own speed
    gives one (server.compute.estimate); ``timing`` holds each finished stage's seconds and
    that estimate. A stage the model cannot give (a HeadgraphError or API error: a GGUF that
    cannot run has no attention patterns) is recorded as unavailable with the reason and the
    rest still run, so it never blanks the others. A model that cannot be loaded, or a failure
    of this server's (a compute process that died, a bug), fails the whole job, which a new
    job retries. Returns (done, unavailable)."""
    progress("load", 0.0, f"loading {ref.id}")
    catalog.identity(ref)  # loads the model (in a compute process for the API) when unknown
    scores.cache.forget_failures(ref)  # asked again: what failed before is tried again
    plan = compute_plan(scores, catalog, ref, pairings, shown)
    planned = [stage for stage, _ in plan]
    estimate = JobEstimate(planned, catalog.info(ref), prior_rate=machine_rate())
    done: list[str] = []
    unavailable: dict[str, str] = {}
    if finished is not None:
        finished([], planned, {}, Timing({}, None))
    for stage, thunk in plan:
        left = format_eta(estimate.remaining_s()) or ESTIMATING
        progress(stage, estimate.fraction(), f"computing {stage}; {left}")
        if finished is not None:  # the time left as of this stage's start
            finished(list(done), planned, dict(unavailable),
                     Timing(dict(estimate.seconds), estimate.remaining_s()))
        started = time.perf_counter()
        try:
            with background(cost=estimate.costs.get(stage, 0.0), small=estimate.small):
                # a stage already cached says nothing of this machine's speed: it leaves the
                # estimate's total (its reads are not work) instead of making the rest look fast
                worked = not cached(thunk) and thunk() is not False
        except (HeadgraphError, ApiError) as err:
            log.warning("%s: stage %s unavailable: %s: %s", ref.id, stage, type(err).__name__, one_line(err))
            unavailable[stage] = one_line(err, 300) or type(err).__name__
            estimate.finished(stage, time.perf_counter() - started, worked=False)
        else:
            done.append(stage)
            estimate.finished(stage, time.perf_counter() - started, worked=worked)
        if finished is not None:
            finished(list(done), planned, dict(unavailable),
                     Timing(dict(estimate.seconds), estimate.remaining_s()))
    progress("done", 1.0, done_message(done, unavailable))
    return done, unavailable


def cached(thunk: Callable[[], Any]) -> bool:
    """Whether ``thunk`` (a job stage) finds everything it reads cached: run in cache-only
    mode, it either completes from the cache (True) or meets a cold result (False)."""
    token = CACHE_ONLY.set(True)
    try:
        thunk()
    except ColdMiss:
        return False
    finally:
        CACHE_ONLY.reset(token)
    return True


def done_message(done: list[str], unavailable: dict[str, str]) -> str:
    """What a finished job says: how many results it cached and how many stages could not run."""
    cached = f"{len(done)} computations cached"
    if not unavailable:
        return f"done: {cached}"
    return f"done with {len(unavailable)} stages unavailable ({', '.join(unavailable)}): {cached}"


class JobManager:
    """Submit, run and report compute jobs (one per process; records shared via the store)."""

    def __init__(self, scores: ScoresService, catalog: ModelCatalog, store: Store,
                 workers: int = 1, shown: Shown | None = None) -> None:
        self.scores = scores
        self.catalog = catalog
        self.shown = shown
        self.meta = store.meta
        # jobs of several models run at once: their stages queue in the background lane by
        # cost (compute.lanes), so a small model's job never waits for a big one's to end
        self.workers = max(JOB_THREADS, workers)
        self._pool: ThreadPoolExecutor | None = None
        self._guard = threading.Lock()
        self._active: set[str] = set()
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        self._owner = this_process()

    # -- records ------------------------------------------------------------------------
    def get(self, job_id: str) -> JobState | None:
        """The job's record; a queued/running one whose process is gone reads failed."""
        raw = self.meta.get("job:" + job_id, retry=True)
        if not isinstance(raw, dict):
            return None
        job = JobState.from_dict(raw)
        if job.state in ACTIVE:
            gone = owner_gone(job.owner)
            if gone is None:  # owner elsewhere (or unrecorded): trust its heartbeat
                gone = time.time() - job.heartbeat > STALE_S
            if gone:
                job.state, job.error, job.message = "failed", STOPPED, STOPPED
        return job

    def _save(self, job: JobState) -> None:
        job.updated = time.time()
        self.meta.set("job:" + job.id, job.to_dict(), retry=True)

    def _update(self, job_id: str, **changes: Any) -> None:
        with self._guard:
            raw = self.meta.get("job:" + job_id, retry=True)
            if not isinstance(raw, dict):
                return
            raw.update(changes)
            raw["heartbeat"] = time.time()
            job = JobState.from_dict(raw)
            self._save(job)

    # -- submitting ---------------------------------------------------------------------
    def latest(self, ref: ModelRef, pairings: list[str]) -> JobState | None:
        """The newest job of (model, pairings), running or finished; None when there is none."""
        job_id = self.meta.get(job_index_key(ref.id, list(pairings)), retry=True)
        return self.get(job_id) if isinstance(job_id, str) else None

    def submit(self, ref: ModelRef, pairings: list[str]) -> tuple[JobState, bool]:
        """Start a job for (model, pairings), or return the one already running; (job, created).
        A new job is the user asking again: it forgets the model's remembered failures."""
        params = {"pairings": list(pairings)}
        index = job_index_key(ref.id, list(pairings))
        with DiskLock(self.meta, "lock:" + index, 10.0):
            previous_id = self.meta.get(index, retry=True)
            previous = self.get(previous_id) if isinstance(previous_id, str) else None
            if previous is not None and previous.state in ACTIVE:
                return previous, False
            attempt = previous.attempt + 1 if previous is not None else 1
            job = JobState(id=uuid.uuid4().hex[:16], model=ref.id, params=params, attempt=attempt,
                           message="waiting for a compute thread", owner=dict(self._owner))
            self._save(job)
            self.meta.set(index, job.id, retry=True)
            self._keep(job.id)
        with self._guard:
            self._active.add(job.id)
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="headgraph-job")
            if self._beat is None:
                self._beat = threading.Thread(target=self._heartbeat, name="headgraph-job-beat",
                                              daemon=True)
                self._beat.start()
            pool = self._pool
        pool.submit(self._run, job.id, ref, list(pairings))
        return job, True

    def _keep(self, job_id: str) -> None:
        """Add ``job_id`` to the index and drop the oldest finished records beyond
        MAX_FINISHED (with their jobkey: entry where it still names them): a few reads per
        new job, never a scan (but once, for a store from before the index)."""
        with self.meta.transact(retry=True):
            ids = self.meta.get(JOB_INDEX, retry=True)
            if not isinstance(ids, list):
                ids = self._indexed_jobs()
            ids = [i for i in ids if i != job_id] + [job_id]
            # records beyond MAX_FINISHED; each live one read keeps its place (and counts)
            excess = len(ids) - MAX_FINISHED
            kept: list[str] = []
            for i, old in enumerate(ids):
                if excess <= 0:
                    kept.extend(ids[i:])
                    break
                excess -= 1
                job = self.get(old)
                if job is not None and job.state in ACTIVE:
                    kept.append(old)  # never drop a live job
                else:
                    self._drop(old, job)
            self.meta.set(JOB_INDEX, kept, retry=True)

    def _indexed_jobs(self) -> list[str]:
        """Ids of every job record in the store, oldest first (for a store with no index)."""
        found: list[tuple[float, str]] = []
        for key in self.meta.iterkeys():
            if isinstance(key, str) and key.startswith("job:"):
                raw = self.meta.get(key, retry=True)
                created = raw.get("created", 0.0) if isinstance(raw, dict) else 0.0
                found.append((float(created), key[len("job:"):]))
        return [job_id for _, job_id in sorted(found)]

    def _drop(self, job_id: str, job: JobState | None) -> None:
        self.meta.delete("job:" + job_id, retry=True)
        if job is not None and self.meta.get(job.index_key, retry=True) == job_id:
            self.meta.delete(job.index_key, retry=True)

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            with self._guard:
                active = list(self._active)
            for job_id in active:
                self._update(job_id)

    def _run(self, job_id: str, ref: ModelRef, pairings: list[str]) -> None:
        started = time.perf_counter()

        def progress(stage: str, fraction: float, message: str) -> None:
            self._update(job_id, state="running", stage=stage,
                         fraction=round(min(max(fraction, 0.0), 1.0), 4), message=message)

        def finished(done: list[str], planned: list[str], unavailable: dict[str, str],
                     timing: Timing) -> None:
            self._update(job_id, computed=done, plan=planned, unavailable=unavailable,
                         seconds={k: round(v, 3) for k, v in timing.seconds.items()},
                         remaining_s=None if timing.remaining_s is None else round(timing.remaining_s, 1),
                         finish_by=None if timing.remaining_s is None
                         else round(time.time() + timing.remaining_s, 1))

        try:
            with background():  # its tasks go to the background lane (compute.lanes)
                done, unavailable = run_compute(self.scores, self.catalog, ref, pairings, progress,
                                                finished, self.shown)
        except Exception as err:
            msg = one_line(err) or type(err).__name__
            expected = isinstance(err, (HeadgraphError, ApiError))
            log.error("job %s (%s) failed: %s: %s", job_id, ref.id, type(err).__name__, msg,
                      exc_info=None if expected else err)  # tracebacks only for the unexpected
            self._update(job_id, state="failed", error=msg, message=msg)
        else:
            log.info("job %s (%s) done in %.1f s", job_id, ref.id, time.perf_counter() - started)
            self._update(job_id, state="done", stage="done", fraction=1.0, computed=done,
                         unavailable=unavailable, remaining_s=0.0, finish_by=round(time.time(), 1),
                         message=done_message(done, unavailable))
        finally:
            with self._guard:
                self._active.discard(job_id)

    def shutdown(self) -> None:
        self._stop.set()
        with self._guard:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
