"""HTTP API, scores: every score endpoint against a real uvicorn subprocess on loopback.

Numbers are checked against independent float64 computations from the demo's safetensors
(SVD bases, explicit W_OV / W_QK products, scipy's Spearman), not against headgraph code.
Shared fixtures and the reference: tests/server/conftest.py; helpers: tests/api_support.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from api_support import DH, D, H, L, err, haar, ok, top_cells


# -- health, models ---------------------------------------------------------------------------

def test_health_docs_and_openapi(api):
    h = ok(api.get("/api/health"))
    assert h["status"] == "ok" and h["device"] == "cpu"
    assert api.get("/docs").status_code == 200
    spec = ok(api.get("/openapi.json"))
    paths = spec["paths"]
    assert "security" not in paths["/api/models/compute"]["post"]  # no token configured
    assert "x-headgraph-token" not in json.dumps(spec)
    for p in ("/api/health", "/api/models", "/api/models/info", "/api/models/compute",
              "/api/jobs/{job_id}", "/api/pk", "/api/cs", "/api/top", "/api/pair", "/api/head",
              "/api/graph", "/api/scatter", "/api/reference", "/api/tokens", "/api/patterns",
              "/api/labels", "/api/labels/{name}", "/api/download/pk", "/api/download/cs",
              "/api/download/top", "/api/download/graph", "/api/cache/stats"):
        assert p in paths, p


def test_models_list_and_info(api):
    models = {m["id"]: m for m in ok(api.get("/api/models"))["models"]}
    assert models["demo"]["status"] == "available" and models["demo"]["kind"] == "builtin"
    assert models["gpt2"]["status"] == "not available offline"
    assert "huggingface-cli download gpt2" in models["gpt2"]["message"]
    assert models["local:qwen2-tiny"]["kind"] == "local"
    info = ok(api.get("/api/models/info", params={"model": "demo"}))
    assert info["info"]["n_layers"] == L and info["info"]["n_heads"] == H
    assert info["info"]["d_model"] == D and info["info"]["d_head"] == DH
    assert len(info["fingerprint"]) == 16


def test_unavailable_hub_model_is_a_clear_404(api):
    msg = err(api.get("/api/pk", params={"model": "gpt2"}), 404)
    assert "HF_HUB_OFFLINE" in msg and "gpt2" in msg


# -- score grids --------------------------------------------------------------------------------

def test_pk_grid_matches_float64_reference(api, ref):
    g = ok(api.get("/api/pk", params={"model": "demo", "pairing": "OK"}))
    grid, valid = torch.tensor(g["grid"], dtype=torch.float64), torch.tensor(g["valid"])
    assert g["shape"] == [L, H, L, H] and g["layer_indices"] == [0, 1]
    assert torch.equal(valid, ref["forward"])  # forward-only
    assert float(grid.min()) >= 0.0 and float(grid.max()) <= DH
    assert torch.allclose(grid[valid], ref["pk"]["OK"][valid], atol=1e-4)
    assert float(grid[~valid].abs().max()) == 0.0
    assert g["source_labels"][:2] == ["L0H0", "L0H1"] and g["target_labels"][-1] == "L1H7"
    assert g["max"] == pytest.approx(float(grid[valid].max()))

    norm = torch.tensor(ok(api.get("/api/pk", params={"pairing": "OK", "metric": "normalized"}))["grid"],
                        dtype=torch.float64)
    assert torch.allclose(norm[valid], ref["pk"]["OK"][valid] / DH, atol=1e-5)

    zg = ok(api.get("/api/pk", params={"pairing": "OK", "metric": "z"}))
    mean, std = haar(DH, DH)
    z = np.array(zg["grid"], dtype=object)
    for a, b, c, e in torch.nonzero(ref["forward"]).tolist()[:10]:
        assert z[a, b, c, e] == pytest.approx((float(ref["pk"]["OK"][a, b, c, e]) - mean) / std, abs=1e-3)
    assert z[1, 0, 0, 0] is None  # invalid cells are null

    allg = ok(api.get("/api/pk", params={"pairing": "OQ", "order": "all"}))
    assert all(all(all(all(row) for row in a) for a in b) for b in allg["valid"])
    assert torch.allclose(torch.tensor(allg["grid"], dtype=torch.float64), ref["pk"]["OQ"], atol=1e-4)


def test_cs_grid_matches_float64_reference(api, ref):
    g = ok(api.get("/api/cs", params={"model": "demo", "mode": "K"}))
    grid, valid = torch.tensor(g["grid"], dtype=torch.float64), torch.tensor(g["valid"])
    assert g["kind"] == "cs" and torch.equal(valid, ref["forward"])
    assert torch.allclose(grid[valid], ref["cs_K"][valid], rtol=1e-4, atol=1e-6)


def test_top_pairs_are_sorted_and_match_reference(api, ref):
    t = ok(api.get("/api/top", params={"model": "demo", "pairing": "OK", "k": 20}))
    pairs = t["pairs"]
    assert len(pairs) == 20
    assert [p["pk"] for p in pairs] == sorted((p["pk"] for p in pairs), reverse=True)
    assert [(p["source"], p["target"]) for p in pairs] == top_cells(ref["pk"]["OK"], ref["forward"], 20)
    for p in pairs:
        assert p["normalized"] == pytest.approx(p["pk"] / DH, abs=1e-5)
        assert p["cs"] is not None
    by_cs = ok(api.get("/api/top", params={"pairing": "OK", "k": 5, "metric": "cs"}))["pairs"]
    assert [(p["source"], p["target"]) for p in by_cs] == top_cells(ref["cs_K"], ref["forward"], 5)
    by_z = ok(api.get("/api/top", params={"pairing": "OK", "k": 5, "metric": "z"}))["pairs"]
    assert [p["z"] for p in by_z] == sorted((p["z"] for p in by_z), reverse=True)
    many = ok(api.get("/api/top", params={"pairing": "OK", "k": 1000}))["pairs"]
    assert len(many) == int(ref["forward"].sum())  # capped at the valid pairs


def test_pair_detail(api, ref):
    d = ok(api.get("/api/pair", params={"model": "demo", "pairing": "OK", "source": "L0H3",
                                        "target": "L1H5"}))
    pk = float(ref["pk"]["OK"][0, 3, 1, 5])
    assert d["pk"] == pytest.approx(pk, abs=1e-4)
    assert d["normalized"] == pytest.approx(pk / DH, abs=1e-5)
    cos = np.array(d["cosines"])
    assert len(cos) == DH and np.all(np.diff(cos) <= 1e-9) and np.all((cos >= 0) & (cos <= 1))
    assert float((cos ** 2).sum()) == pytest.approx(pk, abs=1e-4)
    assert np.allclose(np.cos(d["angles"]), cos, atol=1e-6)
    s = torch.linalg.svdvals(ref["U"]["O"][0, 3].T @ ref["U"]["K"][1, 5])
    assert np.allclose(cos, s.numpy(), atol=1e-5)
    assert d["cs"] == pytest.approx(float(ref["cs_K"][0, 3, 1, 5]), rel=1e-4)
    mean, std = haar(DH, DH)
    assert d["z"] == pytest.approx((pk - mean) / std, abs=1e-3)
    assert 0.0 <= d["p_haar"] <= 1.0 and 0.0 <= d["p_anisotropic"] <= 1.0
    assert d["null_samples"] > 0 and d["p_floor"] == pytest.approx(1 / (d["null_samples"] + 1))
    assert min(d["p_haar"], d["p_anisotropic"]) >= d["p_floor"] * (1 - 1e-9)  # (k + 1) / (n + 1)
    assert len(d["source_tokens"]) == 5 and len(d["target_tokens"]) == 5
    assert d["source"] == "L0H3" and d["target"] == "L1H5" and d["forward"] is True
    # Against the layer order (and in one layer): the pair's own CS and z, equal to the
    # float64 definition's cells; no all-pairs grid is computed for them.
    before = ok(api.get("/api/cache/stats"))["counts"]
    back = ok(api.get("/api/pair", params={"pairing": "OK", "source": "L1H5", "target": "L0H3"}))
    assert back["forward"] is False and back["valid"] is False and back["p_anisotropic"] is None
    for (sl, sh, tl, th), pair in ((((1, 5, 0, 3)), back), ((1, 2, 1, 6), None)):
        d = pair or ok(api.get("/api/pair", params={"pairing": "OK", "source": f"L{sl}H{sh}",
                                                    "target": f"L{tl}H{th}"}))
        pk = float(ref["pk"]["OK"][sl, sh, tl, th])
        assert d["pk"] == pytest.approx(pk, abs=1e-4)
        assert d["cs"] == pytest.approx(float(ref["cs_K"][sl, sh, tl, th]), rel=1e-6)
        assert d["z"] == pytest.approx((pk - mean) / std, abs=1e-3)
    new = set(ok(api.get("/api/cache/stats"))["counts"]) - set(before)
    assert any("/pair?" in k for k in new) and not any("order=all" in k for k in new), new


def test_head_panel(api, ref):
    h = ok(api.get("/api/head", params={"model": "demo", "head": "L0H2", "k": 3}))
    assert h["head"] == "L0H2" and set(h["tokens"]) == {"Q", "K", "V", "O"}
    assert all(len(v) == 3 for v in h["tokens"].values())
    out = h["partners"]["OK"]["out"]
    assert len(out) == 3 and out[0]["pk"] == pytest.approx(float(ref["pk"]["OK"][0, 2, 1].max()), abs=1e-4)
    assert h["partners"]["OK"]["in"] == []  # nothing precedes layer 0
    assert set(h["patterns"]) >= {"previous_token", "induction"}


# -- graph, scatter, reference ------------------------------------------------------------------

@pytest.mark.parametrize("k", [5, 20])
def test_graph_has_three_k_edges(api, ref, k):
    g = ok(api.get("/api/graph", params={"model": "demo", "pairings": "OQ,OK,OV", "k": k}))
    edges = g["graph"]["edges"]
    assert len(edges) == 3 * k and g["edge_counts"] == {"OQ": k, "OK": k, "OV": k}
    ok_edges = {(e["source"], e["target"]) for e in edges if e["pairing"] == "OK"}
    assert ok_edges == set(top_cells(ref["pk"]["OK"], ref["forward"], k))
    assert g["hubs"]["hubs"] and g["hubs"]["rows"][0]["rank"] == 1
    assert all("cs" in e for e in edges)


def test_graph_threshold_role_granularity_and_labels(api, ref):
    g = ok(api.get("/api/graph", params={"pairings": "OK", "threshold": 5.0}))
    n_expected = int(((ref["pk"]["OK"] >= 5.0) & ref["forward"]).sum())
    assert len(g["graph"]["edges"]) == n_expected
    r = ok(api.get("/api/graph", params={"pairings": "OK", "k": 4, "granularity": "role"}))
    assert all(n["id"].endswith((" O", " K")) for n in r["graph"]["nodes"])
    csv_text = "head,class\nL0H1,Previous Token\nL1H3,Induction\n"
    assert api.post("/api/labels", params={"name": "demo-classes", "model": "demo"},
                    content=csv_text, headers={"content-type": "text/csv"}).status_code == 201
    lg = ok(api.get("/api/graph", params={"pairings": "OQ,OK,OV", "k": 20, "labels": "demo-classes"}))
    nodes = {n["id"] for n in lg["graph"]["nodes"]}
    assert lg["class_counts"]["in_class"] == len(nodes & {"L0H1", "L1H3"})
    assert sum(lg["class_counts"].values()) == len(nodes)


def test_subgraph_queries_are_bounded_and_match_reference(api, ref):
    pins = ["L0H1", "L0H4", "L1H0", "L1H3"]
    s = ok(api.get("/api/subgraph", params={"model": "demo", "heads": ",".join(pins).lower(), "cap": 5}))
    cells = {(f"L{a}H{b}", f"L{c}H{e}", p): float(ref["pk"][p][a, b, c, e])
             for p in ("OQ", "OK", "OV") for a, b, c, e in ref["forward"].nonzero().tolist()}
    among = sorted(((v, key) for key, v in cells.items() if key[0] in pins and key[1] in pins), reverse=True)
    assert s["total"] == len(among) == 12 and len(s["edges"]) == 5 and s["left_out"] == 7
    assert "cap=12" in s["hint"] and {n["name"] for n in s["nodes"]} == set(pins)
    assert [(e["source"], e["target"], e["pairing"]) for e in s["edges"]] == [key for _, key in among[:5]]
    assert [e["score"] for e in s["edges"]] == pytest.approx([v for v, _ in among[:5]], rel=1e-4)
    ks = [e for e in s["edges"] if e["pairing"] == "OK"]
    assert [e["cs"] for e in ks] == pytest.approx(
        [float(ref["cs_K"][int(e["source"][1]), int(e["source"][3]), int(e["target"][1]), int(e["target"][3])])
         for e in ks], rel=1e-4)
    lay = ok(api.get("/api/subgraph", params={"layers": "0-1", "k": 3, "pairings": "OK"}))
    assert [(e["source"], e["target"]) for e in lay["edges"]] == top_cells(ref["pk"]["OK"], ref["forward"], 3)
    hood = ok(api.get("/api/subgraph", params={"head": "L1H3", "depth": 1, "k": 4}))
    assert len(hood["edges"]) == 4 and all("L1H3" in (e["source"], e["target"]) for e in hood["edges"])
    for params in ({"heads": "L9H9"}, {"head": "L1H3", "layers": "0-1"}, {}, {"heads": "L0H1", "cap": 0},
                   {"head": "L1H3", "depth": 9}, {"layers": "5-9"}, {"heads": "L0H1", "pairings": "QK",
                                                                       "rank_on": "cs"}, {"heads": "x;y"}):
        assert api.get("/api/subgraph", params=params).status_code == 422, params


def test_fdr_graph_keeps_the_pairs_whose_bh_q_value_is_within_the_level(api):
    """threshold_on=fdr: edges are the pairs whose BH-adjusted p-value (against the
    anisotropic null, scipy's false_discovery_control as the reference) is <= q."""
    from scipy.stats import false_discovery_control

    pair = ok(api.get("/api/pair", params={"model": "demo", "pairing": "OK", "source": "L0H0",
                                           "target": "L1H0"}))
    assert pair["p_floor"] > 0
    counts = []
    for q in (0.001, 0.05, 0.2):
        g = ok(api.get("/api/graph", params={"model": "demo", "pairings": "OK", "threshold_on": "fdr",
                                             "threshold": q}))
        assert g["rule"] == f"FDR q <= {q:g}"
        counts.append(g["edge_counts"]["OK"])
        assert all(e["q"] <= q for e in g["graph"]["edges"])
    assert counts == sorted(counts)  # a looser level never keeps fewer pairs
    # The same count from the p-values of every forward pair (GET /api/pair per pair is slow;
    # the scatter's pairs are the forward pairs, each with its p from /api/pair's null).
    top = ok(api.get("/api/top", params={"model": "demo", "pairing": "OK", "k": 1000}))["pairs"]
    ps = [ok(api.get("/api/pair", params={"model": "demo", "pairing": "OK", "source": t["source"],
                                          "target": t["target"]}))["p_anisotropic"] for t in top]
    qs = false_discovery_control(ps, method="bh")
    assert counts[1] == int((qs <= 0.05).sum())


def test_scatter_matches_scipy_spearman(api, ref):
    s = ok(api.get("/api/scatter", params={"model": "demo", "pairing": "OK", "top_percent": 10}))
    pts = s["points"]
    assert len(pts["pk"]) == int(ref["forward"].sum()) == len(pts["cs"])
    rho = spearmanr(pts["pk"], pts["cs"]).statistic
    comparison = json.dumps(s["comparison"])
    assert s["mode"] == "K"
    assert any(abs(v - rho) < 1e-6 for v in _floats(s["comparison"])), comparison


def _floats(obj):
    if isinstance(obj, float):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _floats(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _floats(v)


def test_reference_distributions(api):
    r = ok(api.get("/api/reference", params={"model": "demo"}))
    kl = r["kl"]["kl"]
    assert len(kl) == 4 and all(len(row) == 4 for row in kl)
    assert all(v is None or v >= 0 for row in kl for v in row)
    mean, std = haar(DH, DH)
    assert r["haar_moments"]["mean"] == pytest.approx(mean)
    assert r["haar_moments"]["std"] == pytest.approx(std)
    assert set(r["nulls"]) == {"OQ", "OK", "OV"}
    assert "OK" in r["kl"]["histograms"]


# -- tokens, patterns ---------------------------------------------------------------------------

def test_tokens_match_float64_scores(api, ref):
    t = ok(api.get("/api/tokens", params={"model": "demo", "role": "O", "k": 4}))
    assert len(t["heads"]) == L * H and all(len(h["tokens"]) == 4 for h in t["heads"])
    W_U = ref["sd"]["W_U"]
    centred = W_U - W_U.mean(dim=1, keepdim=True)
    for h in t["heads"][:3]:
        U = ref["U"]["O"][h["layer"], h["head"]]
        score = torch.linalg.norm(U.T @ centred, dim=0) / torch.linalg.norm(centred, dim=0)
        best = torch.argsort(score, descending=True)[:4]
        assert [x["id"] for x in h["tokens"]] == best.tolist()
        assert [x["score"] for x in h["tokens"]] == pytest.approx(score[best].tolist(), abs=1e-5)
    one = ok(api.get("/api/tokens", params={"role": "K", "k": 2, "layer": 1, "head": 4}))
    assert [(h["layer"], h["head"]) for h in one["heads"]] == [(1, 4)]
