"""Half-open connections cannot hold the server: a connection that does not finish its request
headers in time is closed, and the API answers meanwhile (a real server on loopback).
"""

from __future__ import annotations

import socket
import time
from urllib.parse import urlparse

import httpx
import pytest

HELD = 40  # connections that send part of their headers, then nothing


@pytest.fixture(scope="module")
def url(launch_server, tmp_path_factory):
    env = {"HEADGRAPH_HEADER_TIMEOUT_S": "1.5"}
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
