"""Lab mode: anonymous requests stay cheap. They never load a model (not even to learn its
identity), and unknown names are answered from names alone (a real server on loopback).
"""

from __future__ import annotations

import time

import httpx
import pytest

# serial (run alone, after the parallel part): anonymous answers within 5 s
# a real lab server, cold loads of a random model: ~15 s
pytestmark = [pytest.mark.slow, pytest.mark.serial]

TOKEN = "anonymous-test-token-0123456789"
RANDOM = "random:gpt2-tiny"


@pytest.fixture(scope="module")
def url(launch_server, tmp_path_factory):
    env = {"HEADGRAPH_API_TOKEN": TOKEN, "HEADGRAPH_MODELS": f"demo,{RANDOM}"}
    with launch_server(tmp_path_factory.mktemp("cache"), env=env, check_errors=True) as srv:
        yield srv.url


def _info(http: httpx.Client, model: str) -> object:
    return next(m for m in http.get("/api/models").json()["models"] if m["id"] == model)["info"]


def test_an_anonymous_cold_graph_loads_nothing(url):
    with httpx.Client(base_url=url, timeout=60) as http:
        assert _info(http, RANDOM) is None
        for _ in range(2):
            r = http.get("/api/graph", params={"model": RANDOM})
            assert r.status_code == 401, r.text
        r = http.get("/api/subgraph", params={"model": RANDOM, "heads": "L0H0,L1H1"})
        assert r.status_code == 401, r.text  # a subgraph of cold scores: cache-only, no load
        # the model's identity is learnt only by loading it: still unknown
        assert _info(http, RANDOM) is None
        signed = {"Authorization": f"Bearer {TOKEN}"}
        # building and fingerprinting the random model: a wait, not a speed target (a loaded box)
        loaded = http.get("/api/models/info", params={"model": RANDOM}, headers=signed, timeout=300)
        assert loaded.status_code == 200, loaded.text
        assert _info(http, RANDOM) is not None  # a token holder's read did load it


def test_a_random_model_keeps_its_identity(url):
    """A random model's identity is remembered like a file's (its spec, core and the library
    versions), so a reader after it never loads it again."""
    with httpx.Client(base_url=url, timeout=60) as http:
        signed = {"Authorization": f"Bearer {TOKEN}"}
        first = http.get("/api/models/info", params={"model": RANDOM}, headers=signed, timeout=300).json()
        t0 = time.perf_counter()
        again = http.get("/api/models/info", params={"model": RANDOM}).json()  # anonymous
        assert again["fingerprint"] == first["fingerprint"], again
        assert time.perf_counter() - t0 < 5


def test_unknown_names_are_answered_from_names(url):
    with httpx.Client(base_url=url, timeout=60) as http:
        r = http.get("/api/labels/nope")
        assert r.status_code == 404
        assert "patterns" in r.json()["error"]["allowed"]
        r = http.get("/api/graph", params={"model": "demo", "labels": "nope"})
        assert r.status_code in (401, 404), r.text
        r = http.get("/api/pk", params={"model": "no-such-model", "pairing": "OK"})
        assert r.status_code == 404 and "demo" in r.json()["error"]["allowed"]


def test_after_a_job_anonymous_readers_get_every_default_view_without_computing(url):
    """A token holder's job renders what the dashboard shows first: the default graphs, each
    pairing's scatter and the pair panels of the default graph's edges. Anonymous readers
    then get all of it (200) and nothing is computed for them; a pair outside the default
    graph still needs the token."""
    signed = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=url, timeout=120) as http:
        job = http.post("/api/models/compute", params={"model": "demo"}, headers=signed).json()["job"]
        while (state := http.get(f"/api/jobs/{job['id']}").json())["state"] in ("queued", "running"):
            time.sleep(0.3)
        assert state["state"] == "done", state
        assert {"graph", "scatter OK", "pairs"} <= set(state["computed"]), state
        before = http.get("/api/cache/stats", headers=signed).json()["computations"]
        for params in ({}, {"labels": "patterns"}):
            r = http.get("/api/graph", params={"model": "demo", **params})
            assert r.status_code == 200, r.text
        edges = r.json()["graph"]["edges"]
        assert edges
        for pairing in ("OQ", "OK", "OV"):
            r = http.get("/api/scatter", params={"model": "demo", "pairing": pairing})
            assert r.status_code == 200, r.text
        for edge in edges:
            r = http.get("/api/pair", params={"model": "demo", "pairing": edge["pairing"],
                                              "source": edge["source"], "target": edge["target"]})
            assert r.status_code == 200, (edge, r.text[:300])
        r = http.get("/api/subgraph", params={"model": "demo", "heads": "L0H1,L1H3", "rank_on": "cs"})
        assert r.status_code == 200 and r.json()["edges"], r.text  # read from the job's PK and CS
        assert http.get("/api/cache/stats", headers=signed).json()["computations"] == before
        shown = {(e["pairing"], e["source"], e["target"]) for e in edges}
        other = next(("OK", f"L0H{s}", f"L1H{t}") for s in range(8) for t in range(8)
                     if ("OK", f"L0H{s}", f"L1H{t}") not in shown)
        r = http.get("/api/pair", params=dict(zip(("pairing", "source", "target"), other),
                                              model="demo"))
        assert r.status_code == 401, r.text
