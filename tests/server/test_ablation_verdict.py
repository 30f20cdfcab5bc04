"""The ablation verdict (one rule for the API, the CLI and the dashboard) and cache-only reads
of GET /api/ablation (``cached=true``: never computes, so a lab's anonymous reader sees what
is measured and gets "not measured" for the rest, never a 401).

In-process API (FastAPI's TestClient on the real app, compute in threads) in lab mode on the
demo; every expected value comes from the API's own computed answer.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from headgraph.server.computations.ablation import (NO_EFFECT, NOT_MEASURED, VERIFIED,
                                                    VERIFY_MIN_EFFECT, edge_verdict)
from headgraph.server.http.app import create_app
from headgraph.server.cli.verify import verify_text
from headgraph.server.settings import Settings

TOKEN = "verdict-lab-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_verdict_needs_both_halves_of_one_prompt_set() -> None:
    t = VERIFY_MIN_EFFECT
    assert edge_verdict({"text": [t, t * 1.5], "random": [0.0, 0.0]}) == VERIFIED
    assert edge_verdict({"text": [t * 2, t * 0.99], "random": [t * 0.5, t * 3]}) == NO_EFFECT
    assert edge_verdict({"text": [0.0, 0.0], "random": [t * 4, t * 4]}) == VERIFIED
    assert edge_verdict({"text": [math.nan, t * 2], "random": [None, t * 2]}) == NO_EFFECT
    assert edge_verdict({}) == edge_verdict(None) == NOT_MEASURED


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    settings = Settings(cache_dir=tmp_path_factory.mktemp("verdict"), api_token=TOKEN,
                        compute_processes=0)
    with TestClient(create_app(settings)) as client:
        yield client


def get(client: TestClient, headers: dict[str, str] | None = None, **params: object) -> dict:
    resp = client.get("/api/ablation", params={"model": "demo", **params}, headers=headers or {})
    assert resp.status_code == 200, resp.text[:500]
    return resp.json()


def test_cached_reads_never_compute_and_share_measurements(lab: TestClient) -> None:
    # Nothing cached: an anonymous cached read is an empty answer, a computing one a 401.
    cold = get(lab, pairing="OK", top=4, cached="true")
    assert cold["cached_only"] is True and cold["edges"] == []
    assert lab.get("/api/ablation", params={"model": "demo", "top": 4}).status_code == 401
    pk = lab.get("/api/top", params={"model": "demo", "pairing": "OK", "k": 6}, headers=AUTH)
    assert pk.status_code == 200  # the PK is cached now, the ablation is not
    unmeasured = get(lab, pairing="OK", top=6, cached="true")
    top = pk.json()["pairs"]
    assert [(e["source"], e["target"]) for e in unmeasured["edges"]] == \
        [(p["source"], p["target"]) for p in top]
    assert {e["verdict"] for e in unmeasured["edges"]} == {NOT_MEASURED}
    assert all(e["effect_text"] is None and e["pk"] == pytest.approx(p["pk"])
               for e, p in zip(unmeasured["edges"], top, strict=True))

    measured = get(lab, AUTH, pairing="OK", top=6)  # the token holder computes
    assert measured["cached_only"] is False
    assert measured["verdict_rule"]["min_effect"] == VERIFY_MIN_EFFECT
    for e in measured["edges"]:
        assert e["verdict"] == edge_verdict(e["halves"])
    # The demo's induction circuit: L0H0's OK edges into layer 1 are verified.
    assert {e["verdict"] for e in measured["edges"] if e["source"] == "L0H0"} == {VERIFIED}
    by_edge = {(e["source"], e["target"]): e for e in measured["edges"]}

    # Cached reads of another selection reuse those measurements (anonymous, no 401).
    fewer = get(lab, pairing="OK", top=3, cached="true")
    assert fewer["reliability"] == {}  # not exactly this edge set
    assert fewer["n_prompts"] == measured["n_prompts"]
    for e in fewer["edges"]:
        assert e == {**by_edge[(e["source"], e["target"])]}
    (source, target), row = next(iter(by_edge.items()))
    one = get(lab, pairing="OK", edge=f"{source},{target}", cached="true")
    assert one["edges"][0] == row and one["selection"] == "edge"
    exact = get(lab, pairing="OK", top=6, cached="true")
    assert exact["edges"] == measured["edges"] and exact["reliability"] == measured["reliability"]
    # An edge no ablation measured, and another pairing, stay "not measured".
    s, t = next((f"L0H{s}", f"L1H{t}") for s in range(8) for t in range(8)
                if (f"L0H{s}", f"L1H{t}") not in by_edge)
    other = get(lab, pairing="OK", edge=f"{s},{t}", cached="true")["edges"][0]
    assert other["verdict"] == NOT_MEASURED and other["halves"] == {} and other["pk"] is not None
    assert {e["verdict"] for e in get(lab, pairing="OQ", top=3, cached="true")["edges"]} <= {NOT_MEASURED}

    # The CLI's table prints each edge's verdict and the rule.
    text = verify_text(measured)
    assert measured["verdict_rule"]["rule"] in text
    for e in measured["edges"]:
        line = next(ln for ln in text.splitlines() if ln.startswith(f"{e['source']}  ") and e["target"] in ln)
        assert line.rstrip().endswith(e["verdict"])
