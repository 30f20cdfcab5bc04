"""Fault injection, part 1-2 of the lab deployment: auth that holds, bounded work and bodies.

Real servers on loopback (``ServerProcess``), real sockets for slow and oversized bodies, the
real dashboard endpoint (``/_dash-update-component``). Each test is an attack from issue 14
that used to work.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

import httpx
import psutil
import pytest

from headgraph.core.names import THRESHOLD_EDGES_MAX
from headgraph.server.http.launch import ServerProcess

# serial (run alone, after the parallel part): slow-body answers within 10 s
# its lab server (a 144-head model, cold graphs) and servers that must refuse to start: ~40 s
pytestmark = [pytest.mark.slow, pytest.mark.serial]

TOKEN = "lab-token-for-the-fault-tests-0123"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BASE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HEADGRAPH_DEVICE": "cpu"}
BIG = "random:gpt2-small@0"


@pytest.fixture(scope="module")
def lab(launch_server, tmp_path_factory):
    """A lab-mode server (token set) with a short body timeout and a 144-head random model."""
    env = {**BASE_ENV, "HEADGRAPH_API_TOKEN": TOKEN, "HEADGRAPH_BODY_TIMEOUT_S": "2",
           "HEADGRAPH_MODELS": f"demo,{BIG}"}
    with launch_server(tmp_path_factory.mktemp("lab") / "cache", env=env) as srv:
        yield srv


def dash_callback(srv: ServerProcess, output_prop: str, values: dict[str, object],
                  cookies: dict | None = None) -> httpx.Response:
    """POST the Dash callback writing ``output_prop`` the way the page does (the attack surface
    of the dashboard), with ``values`` ("id.property" -> value) for its inputs and states."""
    spec = next(d for d in httpx.get(srv.url + "/_dash-dependencies").json()
                if output_prop in d["output"])
    out = spec["output"]
    outputs = [dict(zip(("id", "property"), o.rsplit(".", 1)))
               for o in out.strip(".").split("...")]
    fill = lambda items: [{**i, "value": values.get(f"{i['id']}.{i['property']}")}  # noqa: E731
                          for i in items]
    body = {"output": out, "outputs": outputs if out.startswith("..") else outputs[0],
            "inputs": fill(spec["inputs"]), "state": fill(spec.get("state", [])),
            "changedPropIds": [next(iter(values))]}
    return httpx.post(srv.url + "/_dash-update-component", json=body, cookies=cookies,
                      timeout=60)


# -- 1. auth -----------------------------------------------------------------------------------

def test_a_blank_or_short_token_refuses_to_start(tmp_path):
    for bad in ("   ", "short-token"):
        env = {**BASE_ENV, "HEADGRAPH_API_TOKEN": bad, "HEADGRAPH_CACHE_DIR": str(tmp_path)}
        proc = subprocess.run([sys.executable, "-m", "headgraph.server.cli.main", "serve", "--port", "1"],
                              env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode != 0
        assert "token" in proc.stderr and "Traceback" not in proc.stderr


def test_anonymous_reads_only_the_cache_and_writes_need_the_token(lab):
    anon = httpx.get(lab.url + "/api/auth").json()
    assert anon == {"mode": "token", "authorized": False, "can": ["read-cached"]}
    assert httpx.get(lab.url + "/api/auth", headers=AUTH).json()["authorized"] is True
    for bad in ("Bearer", "Bearer wrong-token-wrong-token", "Basic " + TOKEN, TOKEN):
        assert httpx.get(lab.url + "/api/auth", headers={"Authorization": bad}
                         ).json()["authorized"] is False
    # Compute jobs and uploads: 401 without the token, whatever the path taken.
    r = httpx.post(lab.url + "/api/models/compute", params={"model": "demo"})
    assert r.status_code == 401 and "token" in r.json()["error"]["message"].lower()
    r = httpx.post(lab.url + "/api/labels", params={"name": "anon"}, content="head,class\nL0H0,A\n",
                   headers={"content-type": "text/csv"})
    assert r.status_code == 401
    # A cold read is refused without the token, computed with it, then open to everyone.
    params = {"model": "demo", "pairing": "QK", "metric": "normalized"}
    r = httpx.get(lab.url + "/api/pk", params=params, timeout=120)
    assert r.status_code == 401 and "not cached" in r.json()["error"]["message"]
    with_token = httpx.get(lab.url + "/api/pk", params=params, headers=AUTH, timeout=120)
    assert with_token.status_code == 200
    again = httpx.get(lab.url + "/api/pk", params=params, timeout=120)
    assert again.status_code == 200 and again.json() == with_token.json()


def test_the_dashboard_never_computes_or_uploads_for_an_anonymous_browser(lab):
    """Issue 14's bypass: the page used to carry the server's token, so anyone reaching the
    port started jobs and overwrote label sets through /_dash-update-component."""
    page = httpx.get(lab.url + "/").text
    assert TOKEN not in page
    click = {"compute-btn.n_clicks": 1, "url.search": "?model=demo", "job-poll.n_intervals": 0}
    r = dash_callback(lab, "compute-btn.disabled", click)
    assert r.status_code == 200, r.text
    assert "token" in r.text.lower()  # the page shows the API's 401 message
    assert not r.json()["response"].get("job-store", {}).get("data")  # no job was started
    upload = {"overlay-upload.contents": "data:text/csv;base64,aGVhZCxjbGFzcwpMMEgwLEEK",
              "overlay-upload.filename": "anon.csv", "url.search": "?model=demo"}
    r = dash_callback(lab, "upload-error.children", upload)
    assert r.status_code == 200 and "token" in r.text.lower()
    assert httpx.get(lab.url + "/api/labels/anon").status_code == 404  # nothing was stored
    # The same click from a signed-in browser (its own cookie) starts the job.
    r = dash_callback(lab, "compute-btn.disabled", click, cookies={"headgraph_token": TOKEN})
    assert r.status_code == 200 and '"job-store"' in r.text, r.text
    assert r.json()["response"]["job-store"]["data"]


def test_label_sets_are_never_overwritten_silently(lab):
    first = "head,class\nL0H0,Original\n"
    r = httpx.post(lab.url + "/api/labels", params={"name": "mine"}, content=first,
                   headers={**AUTH, "content-type": "text/csv"})
    assert r.status_code == 201, r.text
    r = httpx.post(lab.url + "/api/labels", params={"name": "mine"},
                   content="head,class\nL0H0,Replaced\n", headers={**AUTH, "content-type": "text/csv"})
    assert r.status_code == 409 and "replace=true" in r.json()["error"]["message"]
    assert httpx.get(lab.url + "/api/labels/mine").json()["classes"] == {"L0H0": "Original"}
    r = httpx.post(lab.url + "/api/labels", params={"name": "mine", "replace": "true"},
                   content="head,class\nL0H0,Replaced\n", headers={**AUTH, "content-type": "text/csv"})
    assert r.status_code == 201
    assert httpx.get(lab.url + "/api/labels/mine").json()["classes"] == {"L0H0": "Replaced"}


# -- 2. bounded key space and bodies ------------------------------------------------------------

def test_thresholds_map_onto_a_finite_grid_and_graphs_are_capped(lab):
    stats = lambda: httpx.get(lab.url + "/api/cache/stats").json()["counts"]  # noqa: E731
    graphs = lambda: sum(n for k, n in stats().items() if "/graph?" in k)  # noqa: E731
    # The demo's job first: it caches the default graphs and the pattern scores that a graph's
    # sink flags read, so nothing but the requests below can add a graph meanwhile.
    job = httpx.post(lab.url + "/api/models/compute", params={"model": "demo"}, headers=AUTH,
                     timeout=60).json()["job"]
    deadline = time.monotonic() + 300
    while httpx.get(lab.url + f"/api/jobs/{job['id']}", timeout=30).json()["state"] in ("queued", "running"):
        assert time.monotonic() < deadline, "the demo's job did not end"
        time.sleep(0.2)
    a = httpx.get(lab.url + "/api/graph", params={"model": "demo", "threshold": 0.123412},
                  headers=AUTH, timeout=300)
    assert a.status_code == 200
    n = graphs()
    for t in (0.123449, 0.12339, 0.1234):  # the same 3 significant digits: the same result
        b = httpx.get(lab.url + "/api/graph", params={"model": "demo", "threshold": t}, timeout=60)
        assert b.status_code == 200 and b.json() == a.json()
    assert graphs() == n, stats()
    assert a.json()["rule"].endswith(">= 0.123")
    # A threshold that passes every cell of a 144-head model keeps the best THRESHOLD_EDGES_MAX per pairing.
    g = httpx.get(lab.url + "/api/graph", params={"model": BIG, "threshold": -1000},
                  headers=AUTH, timeout=600).json()
    assert g["capped"] and all(g["capped"][p] > THRESHOLD_EDGES_MAX for p in g["capped"])
    assert all(g["edge_counts"][p] == THRESHOLD_EDGES_MAX for p in g["capped"])
    ok = [e for e in g["graph"]["edges"] if e["pairing"] == "OK"]
    assert sorted(e["rank"] for e in ok) == list(range(1, THRESHOLD_EDGES_MAX + 1))
    assert min(e["score"] for e in ok) == ok[[e["rank"] for e in ok].index(THRESHOLD_EDGES_MAX)]["score"]
    s1 = httpx.get(lab.url + "/api/scatter", params={"model": "demo", "top_percent": 4.96},
                   headers=AUTH, timeout=120).json()
    assert s1["top_percent"] == 5.0


def raw_request(srv: ServerProcess, head: bytes, body: bytes = b"", *, wait: float = 10.0) -> bytes:
    with socket.create_connection((srv.host, srv.port), timeout=wait) as sock:
        sock.sendall(head + body)
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except TimeoutError:
            pass
    return b"".join(chunks)


def test_oversized_bodies_are_refused_before_they_are_buffered(lab):
    server = psutil.Process(lab.proc.pid)
    rss = server.memory_info().rss
    for path in ("/_dash-update-component", "/api/labels?name=big"):
        head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {100 << 20}\r\n\r\n").encode()
        answer = raw_request(lab, head, b"{" * 4096)  # announces 100 MB, sends 4 KB
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    # Without a Content-Length: the stream is cut at the cap, not read to its end.
    def chunks():
        for _ in range(64):
            yield b"x" * (1 << 20)
    r = httpx.post(lab.url + "/_dash-update-component", content=chunks(), timeout=60)
    assert r.status_code == 413
    assert server.memory_info().rss - rss < 64 << 20
    # Deep JSON and non-callback bodies to the dashboard: 400 with a message, not a 500.
    r = httpx.post(lab.url + "/_dash-update-component", content=b"[" * 100_000,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and "nested" in r.json()["error"]["message"]
    r = httpx.post(lab.url + "/_dash-update-component", json=[1, 2])
    assert r.status_code == 400
    assert not lab.server_errors()


def test_slow_bodies_never_freeze_the_page(lab):
    """16 slow senders used to hold all of the dashboard's WSGI threads."""
    socks = []
    head = (b"POST /_dash-update-component HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
    for _ in range(24):
        s = socket.create_connection((lab.host, lab.port), timeout=30)
        s.sendall(head)
        socks.append(s)
    stop = threading.Event()

    def drip() -> None:
        while not stop.wait(0.5):
            for s in socks:
                try:
                    s.sendall(b" ")
                except OSError:
                    pass

    t = threading.Thread(target=drip, daemon=True)
    t.start()
    try:
        started = time.monotonic()
        page = httpx.get(lab.url + "/", timeout=10)
        assert page.status_code == 200
        deps = httpx.get(lab.url + "/_dash-dependencies", timeout=10)
        assert deps.status_code == 200
        assert time.monotonic() - started < 10
        # The slow senders are cut off after the body timeout (2 s here) with a 408.
        answers = []
        for s in socks[:4]:
            s.settimeout(15)
            answers.append(s.recv(200))
        assert all(a.startswith(b"HTTP/1.1 408") for a in answers), answers
    finally:
        stop.set()
        for s in socks:
            s.close()
