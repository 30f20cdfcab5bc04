"""Baselines and flags over HTTP (a real uvicorn subprocess, tests/server/conftest.py): token lists
against the random-subspace baseline, attention-sink heads and edges, hub descriptions, and the
random-initialization null, each compared with core computed here or an independent reference.
Flags in core alone are in tests/core/test_flags.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from api_support import err, ok
from headgraph.core.models.demo import load_demo_model
from headgraph.core.readout.tokens import top_tokens

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def demo_heads():
    return load_demo_model().head_weights()


# -- token baselines --------------------------------------------------------------------------

@pytest.mark.slow  # on this module's real server (a uvicorn start and cold computes, ~15 s a module)
def test_tokens_carry_the_baseline_and_flags(api, demo_heads):
    t = ok(api.get("/api/tokens", params={"model": "demo", "role": "O", "k": 10}))
    core = top_tokens(demo_heads, "O", k=10)
    assert t["k"] == 10 and t["baseline"]["samples"] == 40 and t["baseline"]["quantile"] == 0.95
    assert "0.95-quantile" in t["baseline"]["rule"]
    b = t["baseline"]["by_rank"]["16"]
    assert len(b["rank_threshold"]) == 10 and len(b["mean_topk_threshold"]) == 10
    np.testing.assert_allclose(b["mean_topk_threshold"],
                               core.baseline_of(16).mean_topk_threshold.numpy(), atol=1e-6)
    flags = {h["name"]: h["above_baseline"] for h in t["heads"]}
    expect = {core.names[i][j]: bool(core.above_baseline[i, j])
              for i in range(2) for j in range(8)}
    assert flags == expect and t["n_above_baseline"] == sum(expect.values())
    assert all(flags[f"L1H{h}"] for h in range(8))
    one = t["heads"][8]
    assert one["rank"] == 16 and one["baseline_threshold"] == pytest.approx(
        b["mean_topk_threshold"][-1])
    assert [x["above_baseline"] for x in one["tokens"]] == core.token_above[1, 0].tolist()
    head = ok(api.get("/api/tokens", params={"model": "demo", "role": "O", "k": 3,
                                             "layer": 1, "head": 2}))
    assert head["n_above_baseline"] == 1 and len(head["heads"][0]["tokens"]) == 3
    err(api.get("/api/tokens", params={"model": "demo", "role": "O", "k": 0}), 422)


# -- over HTTP --------------------------------------------------------------------------------

@pytest.mark.slow  # on this module's real server (a uvicorn start and cold computes, ~15 s a module)
def test_graph_and_head_carry_flags_from_the_demo_patterns(api):
    from headgraph.core.activations.patterns import pattern_scores

    demo = load_demo_model()
    first = pattern_scores(demo).first_token.double().numpy()  # independent of the server
    # The same graph query read before and after the patterns: the server's rendered-response
    # cache must not keep serving the first (unflagged) answer.
    for _ in range(2):  # the second is kept (the first learns the weights' fingerprint)
        early = ok(api.get("/api/graph", params={"model": "demo", "k": 20}))
        assert early["flags"]["measured"] is False
    ok(api.get("/api/patterns", params={"model": "demo"}))
    g = ok(api.get("/api/graph", params={"model": "demo", "k": 20}))
    assert g["flags"]["measured"] is True and g["flags"]["threshold"] == 0.9
    assert g["flags"]["sinks"] == []  # no BOS, attention spread: no sink in the demo
    assert g["flags"]["sink_edges"] == {"OQ": 0, "OK": 0, "OV": 0}
    for n in g["graph"]["nodes"]:
        assert n["sink"] is False
        assert n["first_token"] == pytest.approx(first[n["layer"], n["head"]], abs=1e-5)
    assert all(e["source_sink"] is False and e["target_sink"] is False
               for e in g["graph"]["edges"])
    rows = {r["name"]: r for r in g["hubs"]["rows"]}
    assert rows["L0H0"]["description"] == "previous-token" and rows["L0H0"]["rank"] == 1
    assert all(rows[f"L1H{h}"]["description"] == "induction" for h in range(8) if f"L1H{h}" in rows)
    assert g["hubs"]["top_tie"] == ["L0H0"]
    h = ok(api.get("/api/head", params={"model": "demo", "head": "L0H0"}))
    assert h["flags"]["sink"] is False and h["flags"]["description"] == "previous-token"
    assert h["flags"]["first_token"] == pytest.approx(first[0, 0], abs=1e-5)
    err(api.get("/api/head", params={"model": "demo", "head": "L0X0"}), 422)


@pytest.mark.slow  # on this module's real server (a uvicorn start and cold computes, ~15 s a module)
def test_flags_on_a_local_gqa_model_follow_its_patterns(api):
    params = {"model": "local:qwen2-tiny"}
    # Before its pattern scores exist the graph does not wait for them: its flags read null
    # ("not measured"), never False; once they are cached the same graph carries them.
    early = ok(api.get("/api/graph", params={**params, "k": 5}))
    assert early["flags"]["measured"] is False
    assert all(n["sink"] is None and n["description"] is None for n in early["graph"]["nodes"])
    pats = ok(api.get("/api/patterns", params=params))
    g = ok(api.get("/api/graph", params={**params, "k": 5}))
    assert g["flags"]["measured"] is True
    assert [(e["source"], e["target"]) for e in g["graph"]["edges"]] == [
        (e["source"], e["target"]) for e in early["graph"]["edges"]]
    kv = [n for n in g["graph"]["nodes"] if n["kind"] == "kv_group"]
    assert kv
    first = np.asarray(pats["scores"]["first_token"], dtype=float)
    layers = pats["layer_indices"]
    for n in kv:
        members = [(layers.index(int(m[1:].split("H")[0])), int(m.split("H")[1]))
                   for m in n["heads"].split(",")]
        assert n["sink"] is all(first[a, b] >= 0.9 for a, b in members)
        assert n["first_token"] == pytest.approx(np.mean([first[a, b] for a, b in members]))
    h = ok(api.get("/api/head", params={**params, "head": kv[0]["id"]}))
    assert h["flags"]["sink"] == kv[0]["sink"]


def test_head_flags_without_patterns_are_null():
    from headgraph.server.services.details import _flags

    out = _flags(None, "L0H0", None)
    assert out["threshold"] == 0.9
    assert all(out[k] is None for k in ("sink", "sink_heads", "first_token", "description"))



@pytest.mark.slow  # on this module's real server (a uvicorn start and cold computes, ~15 s a module)
def test_reference_serves_the_random_init_null_beside_the_others(api, demo_heads):
    from headgraph.core.stats.nulls import random_init_null
    from headgraph.core.scores.pk import projection_kernel

    r = ok(api.get("/api/reference", params={"model": "demo"}))
    for pairing in ("OQ", "OK", "OV"):
        n = r["nulls"][pairing]
        init = n["summary_random_init"]
        assert init["kind"] == "random_init" and init["n_samples"] == 256
        core = random_init_null(demo_heads, pairing)
        assert init["mean"] == pytest.approx(core.mean) and init["std"] == pytest.approx(core.std)
        assert n["summary"]["kind"] == "anisotropic" and n["summary_haar"]["kind"] == "haar"
        pk = projection_kernel(demo_heads, pairing)
        q95 = float(torch.quantile(core.samples, 0.95))
        assert n["valid_pairs"] == 64
        assert n["above_random_init_q95"] == int((pk.scores[pk.valid].double() > q95).sum())
