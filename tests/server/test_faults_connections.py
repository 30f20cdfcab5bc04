"""Half-open connections cannot hold the server: a connection that does not finish its request
headers in time is closed, and the API answers meanwhile (a real server on loopback).
"""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from urllib.parse import urlparse

import httpx
import pytest

from headgraph.core.models.demo import ARCHITECTURE
from headgraph.server.settings import SERVE_CONNECTIONS, Settings

# serial (run alone, after the parallel part): connection time-outs within seconds
# two real servers and connections left to time out: ~15 s
pytestmark = [pytest.mark.slow, pytest.mark.serial]

HELD = 40  # connections that send part of their headers, then nothing


WIDE = {"architecture": ARCHITECTURE, "n_layers": 16, "n_heads": 32, "d_model": 256,
        "d_head": 8, "d_vocab": 64, "n_ctx": 64}


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> str:
    """A random model whose cold reference takes seconds (in the demo's format)."""
    folder = tmp_path_factory.mktemp("wide")
    (folder / "config.json").write_text(json.dumps(WIDE))
    return f"random:{folder / 'config.json'}"


@pytest.fixture(scope="module")
def url(launch_server, tmp_path_factory, big):
    env = {"HEADGRAPH_HEADER_TIMEOUT_S": "1.5", "HEADGRAPH_COLD_PER_CLIENT": "1",
           "HEADGRAPH_COLD_QUEUE_PER_CLIENT": "0",  # past the cap: refused, not queued
           "HEADGRAPH_MODELS": f"demo,{big}"}  # open mode: every read may compute
    with launch_server(tmp_path_factory.mktemp("cache"), env=env, check_errors=True) as srv:
        yield srv.url


def test_connections_with_unfinished_headers_are_closed(url):
    u = urlparse(url)
    socks = []
    try:
        for _ in range(HELD):
            s = socket.create_connection((u.hostname, u.port), timeout=10)
            s.sendall(b"GET /api/health HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # never finished
            socks.append(s)
        r = httpx.get(url + "/api/health", timeout=5)  # answered while they are held
        assert r.status_code == 200
        t0 = time.monotonic()
        for s in socks:  # each one is closed by the server (EOF), not by us
            s.settimeout(10)
            assert s.recv(1024) == b""
        assert time.monotonic() - t0 < 8
        # a well-behaved client on a kept-alive connection is not cut
        with httpx.Client(base_url=url, timeout=10) as http:
            assert http.get("/api/health").status_code == 200
            time.sleep(2.0)
            assert http.get("/api/health").status_code == 200
    finally:
        for s in socks:
            s.close()


def test_x_forwarded_for_names_no_other_client(url, big):
    """No proxy is trusted by default: a client on loopback sending X-Forwarded-For is still its
    connection's address, so a second cold computation while its first runs is a 429 however
    it names itself (HEADGRAPH_COLD_PER_CLIENT=1, no queue)."""
    first: dict[str, httpx.Response] = {}

    def cold() -> None:
        first["r"] = httpx.get(url + "/api/reference", params={"model": big},
                               headers={"X-Forwarded-For": "10.1.1.1"}, timeout=600)

    t = threading.Thread(target=cold)
    t.start()
    time.sleep(1.0)  # the first holds the slot from its arrival
    during = []
    with httpx.Client(base_url=url, timeout=120) as c:
        n = 0
        while t.is_alive():
            n += 1
            second = c.get("/api/pk", params={"model": big, "pairing": "VO", "metric": "z"},
                           headers={"X-Forwarded-For": f"10.2.{n % 250}.{n % 200}"})
            if t.is_alive():
                during.append(second)
            time.sleep(0.05)
    t.join()
    assert first["r"].status_code == 200, first["r"].text
    assert during and all(r.status_code == 429 for r in during), [r.status_code for r in during]


def test_one_address_cannot_hold_every_connection(launch_server, tmp_path):
    """The reported attack: more stalled connections than the server's whole limit
    (SERVE_CONNECTIONS), all from one address (127.0.0.2), held within the default header
    timeout. That address keeps its cap (HEADGRAPH_CONNECTIONS_PER_CLIENT) and the rest are
    refused at once; another client's /api/health answers 200 while they are held."""
    cap = Settings().connections_per_client
    attempts = SERVE_CONNECTIONS + 8
    with launch_server(tmp_path / "cache", env={"HEADGRAPH_HEADER_TIMEOUT_S": "30"}) as srv:
        u = urlparse(srv.url)
        socks: list[socket.socket] = []
        try:
            for _ in range(attempts):
                s = socket.create_connection((u.hostname, u.port), timeout=10, source_address=("127.0.0.2", 0))
                try:
                    s.sendall(b"GET /api/hea")  # stalls mid-request-line
                except OSError:
                    pass  # already refused and closed by the server
                socks.append(s)
            with httpx.Client(base_url=srv.url, timeout=5) as http:  # from 127.0.0.1
                assert http.get("/api/health").status_code == 200
            # the refused ones are answered (429) or closed at once; the capped ones stay open
            answered: list[socket.socket] = []
            deadline = time.monotonic() + 5
            while len(answered) < attempts - cap and time.monotonic() < deadline:
                ready, _, _ = select.select([s for s in socks if s not in answered], [], [], 0.5)
                answered += ready
            assert len(answered) == attempts - cap
            replies = []
            for s in answered:
                try:
                    replies.append(s.recv(4096))
                except OSError:
                    replies.append(b"")  # reset: the server closed with our bytes unread
            assert any(r.startswith(b"HTTP/1.1 429") and b"too many open connections" in r for r in replies)
            assert all(r == b"" or r.startswith(b"HTTP/1.1 429") for r in replies)
            assert not select.select([s for s in socks if s not in answered], [], [], 0.2)[0]  # still held
        finally:
            for s in socks:
                s.close()
