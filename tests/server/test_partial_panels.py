"""Panels while a model's job runs (GET /api/head and /api/pair with partial=true): with PK
and CS cached they answer at once, reading tokens, pattern scores, z and p-values only when
cached and naming the rest in "pending", computing none of them; without partial they
compute everything and nothing is pending."""

from __future__ import annotations

import httpx
import pytest

PAIR = {"model": "demo", "pairing": "OK", "source": "L0H0", "target": "L1H3"}


@pytest.fixture(scope="module")
def api(launch_server, tmp_path_factory):
    with launch_server(tmp_path_factory.mktemp("partial") / "cache", check_errors=True) as srv, \
            httpx.Client(base_url=srv.url, timeout=300) as client:
        yield client


def ok(r: httpx.Response) -> dict:
    assert r.status_code == 200, r.text
    return r.json()


def test_a_partial_panel_reads_what_is_cached_and_names_the_rest(api):
    for pairing in ("OQ", "OK", "OV"):  # what the job caches first
        ok(api.get("/api/pk", params={"model": "demo", "pairing": pairing}))
    ok(api.get("/api/cs", params={"model": "demo", "mode": "K"}))
    head = ok(api.get("/api/head", params={"model": "demo", "head": "L1H3", "partial": "true"}))
    assert sorted(head["pending"]) == ["patterns", "tokens K", "tokens O", "tokens Q", "tokens V"]
    assert all(t is None for t in head["tokens"].values()) and head["patterns"] is None
    assert head["partners"]["OK"]["in"]  # PK partners are there
    pair = ok(api.get("/api/pair", params={**PAIR, "partial": "true"}))
    assert sorted(pair["pending"]) == ["null OK", "tokens K", "tokens O", "z OK"]
    assert pair["z"] is None and pair["p_haar"] is None and pair["cs"] is not None
    again = ok(api.get("/api/head", params={"model": "demo", "head": "L1H3", "partial": "true"}))
    assert again["pending"] == head["pending"]  # the partial answers computed none of them
    full = ok(api.get("/api/head", params={"model": "demo", "head": "L1H3"}))
    assert full["pending"] == [] and full["tokens"]["O"] and full["patterns"] is not None
    full_pair = ok(api.get("/api/pair", params=PAIR))
    assert full_pair["pending"] == [] and full_pair["z"] is not None and full_pair["p_haar"] is not None
    now = ok(api.get("/api/pair", params={**PAIR, "partial": "true"}))
    assert now["pending"] == [] and now["z"] == full_pair["z"] and now["source_tokens"] == full_pair["source_tokens"]
