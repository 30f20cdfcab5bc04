"""Two uvicorn worker processes on one cache: single flight, jobs, auth, restart from cache."""

from __future__ import annotations

import threading
import time
from urllib.parse import parse_qs

import httpx
import pytest

# serial (run alone, after the parallel part): request latency while a job runs
pytestmark = pytest.mark.serial


TOKEN = "s3cret-token-for-the-jobs-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ALL_PAIRINGS = ",".join(a + b for a in "QKVO" for b in "QKVO")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("jobs") / "cache"


@pytest.fixture(scope="module")
def server(launch_server, cache_dir):
    env = {"HEADGRAPH_API_TOKEN": TOKEN, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HEADGRAPH_DEVICE": "cpu", "HEADGRAPH_WORKERS": "2",
           "HEADGRAPH_COLD_PER_CLIENT": "32"}  # the token holders are one client: 16 at once
    with launch_server(cache_dir, workers=2, env=env, check_errors=True) as srv:  # no 5xx when it stops
        yield srv


class HealthProbe:
    """Polls /api/health every 20 ms in a thread and records when each answer began and ended."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.spans: list[tuple[float, float]] = []
        self.failures: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=60) as c:
            while not self._stop.is_set():
                t0 = time.perf_counter()
                status = c.get(self.url + "/api/health").status_code
                self.spans.append((t0, time.perf_counter()))
                if status != 200:
                    self.failures.append(status)
                time.sleep(0.02)

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(60)


def assert_answered_during(probe: HealthProbe, start: float, end: float) -> None:
    """/api/health kept answering while the computation ran: several probes both began and
    were answered between ``start`` and ``end`` (the computation's span).

    An event loop blocked by the computation would hold every probe sent meanwhile until
    the computation ended, so none would complete inside the span. This orders events on
    one clock; it bounds no latency.
    """
    assert not probe.failures, probe.failures
    inside = [s for s in probe.spans if start <= s[0] and s[1] <= end]
    assert len(inside) >= 3, (len(probe.spans), end - start)


def stats(url: str) -> dict:
    r = httpx.get(url + "/api/cache/stats", timeout=30)
    assert r.status_code == 200
    return r.json()


@pytest.mark.slow  # on this module's two-worker server, restarted once (~25 s in all)
def test_cold_key_hit_by_16_clients_is_computed_once(server):
    barrier = threading.Barrier(16)
    answers: list[httpx.Response] = []
    lock = threading.Lock()

    answered: list[float] = []

    def client():
        with httpx.Client(timeout=300) as c:
            barrier.wait()
            r = c.get(server.url + "/api/reference", params={"model": "demo"}, headers=AUTH)
            with lock:
                answered.append(time.perf_counter())
                answers.append(r)

    with HealthProbe(server.url) as probe:
        time.sleep(0.2)
        started = time.perf_counter()
        threads = [threading.Thread(target=client) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
    assert len(answers) == 16 and all(r.status_code == 200 for r in answers), answers[0].text
    assert len({r.text for r in answers}) == 1  # identical bodies from both workers
    assert len({r.headers.get("content-length") for r in answers}) == 1
    counts = stats(server.url)["counts"]
    ref_keys = [k for k in counts if "/reference?" in k]
    null_keys = [k for k in counts if "/null?" in k]
    assert len(ref_keys) == 1 and len(null_keys) == 3
    assert all(v == 1 for v in counts.values()), counts  # nothing computed twice
    assert_answered_during(probe, started, min(answered))


@pytest.mark.slow  # on this module's two-worker server, restarted once (~25 s in all)
def test_compute_needs_the_token(server):
    url = server.url + "/api/models/compute"
    r = httpx.post(url, params={"model": "demo"})
    assert r.status_code == 401 and "Bearer" in r.json()["error"]["message"]
    r = httpx.post(url, params={"model": "demo"}, headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401
    r = httpx.post(server.url + "/api/labels", content="head,class\nL0H0,A\n",
                   headers={"content-type": "text/csv"})
    assert r.status_code == 401
    tokens = server.url + "/api/tokens"
    params = {"model": "demo", "role": "V", "k": 7}  # cold: nothing else asks for k=7
    cold = httpx.get(tokens, params=params)  # lab mode: computing needs the token
    assert cold.status_code == 401 and "Bearer" in cold.json()["error"]["message"]
    assert httpx.get(tokens, params=params, headers=AUTH, timeout=120).status_code == 200
    assert httpx.get(tokens, params=params).status_code == 200  # cached: anyone reads it
    spec = httpx.get(server.url + "/openapi.json").json()
    assert spec["paths"]["/api/models/compute"]["post"]["security"] == [{"bearer": []}]
    assert spec["paths"]["/api/labels"]["post"]["security"] == [{"bearer": []}]
    assert spec["paths"]["/api/pk"]["get"]["security"] == [{}, {"bearer": []}]  # optional
    assert spec["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"


def _finished(url: str, job_id: str) -> dict:
    """Poll a job until it is done or failed (30 s at most); its last state."""
    for _ in range(600):
        state = httpx.get(url + f"/api/jobs/{job_id}", timeout=30).json()
        if state["state"] in ("done", "failed"):
            break
        time.sleep(0.05)
    return state


@pytest.mark.slow  # on this module's two-worker server, restarted once (~25 s in all)
def test_compute_job_progress_idempotency_and_cached_listing(server):
    url = server.url + "/api/models/compute"
    with HealthProbe(server.url) as probe:
        time.sleep(0.2)
        started = time.perf_counter()
        first = httpx.post(url, params={"model": "demo", "pairings": ALL_PAIRINGS}, headers=AUTH, timeout=30)
        assert first.status_code == 202, first.text
        job = first.json()["job"]
        assert first.json()["created"] is True and first.json()["status_url"] == f"/api/jobs/{job['id']}"
        again = httpx.post(url, params={"model": "demo", "pairings": ALL_PAIRINGS}, headers=AUTH, timeout=30)
        assert again.status_code == 202
        assert again.json()["job"]["id"] == job["id"] and again.json()["created"] is False
        fractions, stages = [], set()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            state = httpx.get(server.url + f"/api/jobs/{job['id']}", timeout=30).json()
            fractions.append(state["fraction"])
            stages.add(state["stage"])
            if state["state"] in ("done", "failed"):
                break
            time.sleep(0.05)
        finished = time.perf_counter()
    assert state["state"] == "done", state
    assert state["fraction"] == 1.0 and fractions == sorted(fractions)
    assert len(stages) >= 2
    assert {"pk QK", "pk OO", "cs Q", "cs K", "cs V", "reference", "patterns"} <= set(state["computed"])
    assert_answered_during(probe, started, finished)
    # every stage's wall time, summing to at most the job's; nothing left at the end
    assert set(state["seconds"]) == set(state["plan"]) and min(state["seconds"].values()) >= 0
    assert sum(state["seconds"].values()) <= finished - started and state["remaining_s"] == 0
    # the access log says how many bytes each answer sent
    body = httpx.get(server.url + f"/api/jobs/{job['id']}", timeout=30).content
    deadline = time.monotonic() + 10
    while not (logged := [r for r in server.records() if r.get("logger") == "headgraph.access"
                          and r.get("path") == f"/api/jobs/{job['id']}"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert logged and logged[-1]["bytes"] == len(body)

    models = {m["id"]: m for m in httpx.get(server.url + "/api/models", timeout=30).json()["models"]}
    cached = models["demo"]["cached"]
    assert "pk?order=forward&pairing=QK" in cached and "tokens?baseline=haar-40-q95&k=50&role=O" in cached
    assert models["demo"]["fingerprint"] and models["demo"]["info"]["n_heads"] == 8
    # Data-weighted PK is a job stage too (last): every O -> Q/K/V pairing on both prompt sets
    # cached, so a pair read shows it without computing.
    assert {"datapk text", "datapk random"} <= set(state["computed"])
    data_pk = {(q["pairing"][0], q["prompts"][0]) for c in cached if c.startswith("data_pk?")
               for q in [parse_qs(c.split("?", 1)[1])]}
    assert data_pk == {(p, s) for p in ("OQ", "OK", "OV") for s in ("text", "random")}
    pair = httpx.get(server.url + "/api/pair", params={"model": "demo", "pairing": "OK", "source": "L0H0",
                                                       "target": "L1H3"}, headers=AUTH, timeout=30).json()
    assert set(pair["data_pk"]) == {"text", "random"}

    before = stats(server.url)["computations"]
    redo = httpx.post(url, params={"model": "demo", "pairings": ALL_PAIRINGS}, headers=AUTH, timeout=30).json()
    assert redo["created"] is True and redo["job"]["attempt"] == 2
    state = _finished(server.url, redo["job"]["id"])
    assert state["state"] == "done"
    assert stats(server.url)["computations"] == before  # everything came from the cache


@pytest.mark.slow  # on this module's two-worker server, restarted once (~25 s in all)
def test_failed_job_keeps_a_one_line_error_and_can_be_retried(server):
    url = server.url + "/api/models/compute"
    first = httpx.post(url, params={"model": "gpt2"}, headers=AUTH, timeout=30).json()["job"]
    state = _finished(server.url, first["id"])
    assert state["state"] == "failed"
    assert "HF_HUB_OFFLINE" in state["error"] and "\n" not in state["error"]
    retry = httpx.post(url, params={"model": "gpt2"}, headers=AUTH, timeout=30).json()
    assert retry["created"] is True and retry["job"]["id"] != first["id"]
    assert retry["job"]["attempt"] == 2
    bad = httpx.post(url, params={"model": "demo", "pairings": "OK,XX"}, headers=AUTH)
    assert bad.status_code == 422 and "XX" in bad.json()["error"]["message"]


@pytest.mark.slow  # on this module's two-worker server, restarted once (~25 s in all)
def test_restart_serves_from_cache(launch_server, server, cache_dir):
    urls = [("/api/reference", {"model": "demo"}), ("/api/pk", {"model": "demo", "pairing": "OV"}),
            ("/api/top", {"model": "demo", "pairing": "OK", "k": 20}),
            ("/api/tokens", {"model": "demo", "role": "O", "k": 5})]
    before = {u: httpx.get(server.url + u, params=p, timeout=120).json() for u, p in urls}
    total = stats(server.url)["computations"]
    server.stop()
    env = {"HF_HUB_OFFLINE": "1", "HEADGRAPH_DEVICE": "cpu"}
    with launch_server(cache_dir, workers=1, env=env) as again:
        after = {u: httpx.get(again.url + u, params=p, timeout=120).json() for u, p in urls}
        assert after == before
        assert stats(again.url)["computations"] == total  # nothing recomputed
        demo = next(m for m in httpx.get(again.url + "/api/models").json()["models"] if m["id"] == "demo")
        assert demo["fingerprint"] and demo["cached"]
        log = again.log()
    assert "computed v" not in log  # the store logs every real computation


# -- job records: owners and their bound (in-process, no server) --------------------------------

class _NoModels:
    """A catalog whose every model fails to load at once (a job then fails quickly)."""

    def identity(self, ref):
        from headgraph.core.errors import ModelUnavailable

        raise ModelUnavailable(f"{ref.id}: not here")


@pytest.fixture()
def manager(tmp_path):
    from headgraph.server.services.jobs import JobManager
    from headgraph.server.cache.store import Store

    store = Store(tmp_path / "cache")
    jobs = JobManager(scores=None, catalog=_NoModels(), store=store)  # type: ignore[arg-type]
    yield jobs
    jobs.shutdown()
    store.close()


def _record(manager, owner, *, heartbeat=None, job_id="j1", model="m"):
    from headgraph.server.services.jobs import JobState, job_index_key

    job = JobState(id=job_id, model=model, params={"pairings": ["OK"]}, state="running",
                   stage="pk", owner=owner)
    if heartbeat is not None:
        job.heartbeat = heartbeat
    manager.meta.set("job:" + job_id, job.to_dict())
    manager.meta.set(job_index_key(model, ["OK"]), job_id)
    return job


def _ended_process() -> dict:
    """An owner record of a process of this host that has exited."""
    import subprocess

    import psutil

    from headgraph.server.services.jobs import this_process

    proc = subprocess.Popen(["sleep", "30"])
    owner = {**this_process(), "pid": proc.pid, "started": psutil.Process(proc.pid).create_time()}
    proc.kill()
    proc.wait(10)
    return owner


def _settled(manager, job_id):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        job = manager.get(job_id)
        if job is not None and job.state in ("done", "failed"):
            return job
        time.sleep(0.02)
    return manager.get(job_id)


def test_a_job_whose_owner_process_ended_reads_failed_at_once_and_a_submit_retries(manager):
    from headgraph.server.services.jobs import STOPPED, this_process
    from headgraph.server.models.offered import ModelRef

    _record(manager, this_process())  # this process: alive
    assert manager.get("j1").state == "running"
    _record(manager, _ended_process())  # fresh heartbeat, but its process is gone
    job = manager.get("j1")
    assert job.state == "failed" and job.error == job.message == STOPPED
    reused = {**this_process(), "started": this_process()["started"] - 3600}  # pid reused
    _record(manager, reused)
    assert manager.get("j1").state == "failed"
    retry, created = manager.submit(ModelRef("m", "m", "hub"), ["OK"])
    assert created and retry.attempt == 2 and retry.id != "j1"
    assert retry.owner == this_process()
    assert _settled(manager, retry.id).state == "failed"  # (this catalog loads nothing)


def test_an_owner_elsewhere_is_judged_by_its_heartbeat(manager):
    from headgraph.server.services.jobs import STALE_S, this_process

    elsewhere = {**this_process(), "host": "some-other-host", "pid": 1}
    _record(manager, elsewhere)
    assert manager.get("j1").state == "running"
    _record(manager, elsewhere, heartbeat=time.time() - STALE_S - 1)
    assert manager.get("j1").state == "failed"
    _record(manager, None)  # a record from before owners were kept
    assert manager.get("j1").state == "running"


def test_only_the_newest_finished_job_records_are_kept(manager, monkeypatch):
    import headgraph.server.services.jobs as jobs_module
    from headgraph.server.services.jobs import JOB_INDEX, job_index_key
    from headgraph.server.models.offered import ModelRef

    monkeypatch.setattr(jobs_module, "MAX_FINISHED", 3)
    _record(manager, None, job_id="old", model="m0",  # before the index (found once); stale
            heartbeat=time.time() - jobs_module.STALE_S - 1)
    _record(manager, jobs_module.this_process(), job_id="live", model="m1")  # running here
    ids = []
    for i in range(6):
        job, created = manager.submit(ModelRef(f"n{i}", f"n{i}", "hub"), ["OK"])
        assert created
        assert _settled(manager, job.id).state == "failed"
        ids.append(job.id)
    index = manager.meta.get(JOB_INDEX)
    assert index == ["live", *ids[-3:]]  # the live job stays; 3 newest finished ones
    assert manager.get("old") is None and manager.get(ids[0]) is None
    assert manager.get("live").state == "running" and manager.get(ids[-1]) is not None
    assert manager.meta.get(job_index_key("n0", ["OK"])) is None  # its index went with it
    assert manager.meta.get(job_index_key(f"n{5}", ["OK"])) == ids[-1]
