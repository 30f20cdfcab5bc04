"""Every endpoint against a real uvicorn subprocess on loopback, demo model + a local GQA model.

Numbers are checked against independent float64 computations from the demo's safetensors
(SVD bases, explicit W_OV / W_QK products, scipy's Spearman), not against headgraph code.
"""

from __future__ import annotations

import csv
import io
import json
import math

import httpx
import networkx as nx
import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from scipy.stats import spearmanr

from headgraph.core.demo_model import DEMO_DIR
from headgraph.server.launch import ServerProcess

torch.set_num_threads(1)
L, H, D, DH = 2, 8, 128, 16


# -- fixtures ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def model_root(tmp_path_factory):
    """A model root holding a tiny grouped-query (Qwen2) checkpoint without a tokenizer."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    root = tmp_path_factory.mktemp("models")
    cfg = Qwen2Config(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                      hidden_size=32, intermediate_size=64, vocab_size=300,
                      max_position_embeddings=64, tie_word_embeddings=False)
    torch.manual_seed(3)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(root / "qwen2-tiny")
    return root


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_root):
    cache = tmp_path_factory.mktemp("api") / "cache"
    env = {"HEADGRAPH_MODEL_ROOT": str(model_root), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "HEADGRAPH_DEVICE": "cpu"}
    with ServerProcess(cache, workers=1, env=env) as srv:
        yield srv
        errors = srv.server_errors()
    assert not errors, errors


@pytest.fixture(scope="module")
def api(server):
    with httpx.Client(base_url=server.url, timeout=120) as client:
        yield client


def ok(resp: httpx.Response) -> dict:
    assert resp.status_code == 200, resp.text[:1000]
    return resp.json()


def err(resp: httpx.Response, status: int) -> str:
    assert resp.status_code == status, resp.text[:1000]
    body = resp.json()
    assert body["error"]["status"] == status
    return body["error"]["message"]


# -- independent float64 reference of the demo model ---------------------------------------

@pytest.fixture(scope="module")
def ref():
    sd = {k: v.double() for k, v in load_file(str(DEMO_DIR / "model.safetensors")).items()}

    def basis(m):
        return torch.linalg.svd(m, full_matrices=False).U

    U = {"Q": basis(sd["W_Q"]), "K": basis(sd["W_K"]), "V": basis(sd["W_V"]),
         "O": basis(sd["W_O"].transpose(-2, -1))}
    pk = {p: torch.einsum("abdi,cedj->abceij", U[p[0]], U[p[1]]).square().sum((-2, -1))
          for p in ("OQ", "OK", "OV")}
    forward = torch.zeros(L, H, L, H, dtype=torch.bool)
    forward[0, :, 1, :] = True
    left = sd["W_V"] @ sd["W_O"]  # W_OV [L, H, d, d]
    right_k = sd["W_K"] @ sd["W_Q"].transpose(-2, -1)  # W_QK^T
    prod = torch.einsum("abij,cejk->abceik", left, right_k)
    cs_k = torch.linalg.matrix_norm(prod) / (
        torch.linalg.matrix_norm(left)[:, :, None, None] * torch.linalg.matrix_norm(right_k)[None, None])
    return {"sd": sd, "U": U, "pk": pk, "forward": forward, "cs_K": cs_k}


def haar(m: float, n: float, d: float = D) -> tuple[float, float]:
    mean = m * n / d
    var = 2 * m * n * (d - m) * (d - n) / (d * d * (d - 1) * (d + 2))
    return mean, math.sqrt(var)


def top_cells(grid: torch.Tensor, valid: torch.Tensor, k: int) -> list[tuple[str, str]]:
    flat = torch.where(valid, grid, -torch.inf).flatten()
    idx = torch.argsort(flat, descending=True, stable=True)[:k]
    out = []
    for i in idx.tolist():
        a, b, c, e = np.unravel_index(i, grid.shape)
        out.append((f"L{a}H{b}", f"L{c}H{e}"))
    return out


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
              "/api/labels", "/api/labels/{name}", "/api/download", "/api/cache/stats"):
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
    assert len(d["source_tokens"]) == 5 and len(d["target_tokens"]) == 5
    assert d["source"] == "L0H3" and d["target"] == "L1H5" and d["forward"] is True
    back = ok(api.get("/api/pair", params={"pairing": "OK", "source": "L1H5", "target": "L0H3"}))
    assert back["forward"] is False and back["valid"] is False and back["p_anisotropic"] is None


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


def test_patterns(api):
    p = ok(api.get("/api/patterns", params={"model": "demo"}))
    assert set(p["kinds"]) == set(p["scores"]) >= {"identity", "previous_token", "induction"}
    for grid in p["scores"].values():
        arr = np.array(grid, dtype=float)
        assert arr.shape == (L, H) and np.all((arr >= 0) & (arr <= 1 + 1e-6))


# -- labels ---------------------------------------------------------------------------------------

def test_labels_list_get_and_upload(api):
    sets = {s["name"]: s for s in ok(api.get("/api/labels"))["label_sets"]}
    assert sets["ioi_gpt2_small"]["builtin"] and sets["ioi_gpt2_small"]["n_heads"] > 10
    full = ok(api.get("/api/labels/ioi_gpt2_small"))
    assert full["classes"]["L9H6"] == "Name Mover"

    body = json.dumps({"description": "mine", "classes": {"L0H0": "A", "1.2": "B"}})
    resp = api.post("/api/labels", params={"model": "demo"},
                    files={"file": ("mine.json", body.encode(), "application/json")})
    assert resp.status_code == 201, resp.text
    assert ok(api.get("/api/labels/mine"))["classes"] == {"L0H0": "A", "L1H2": "B"}
    assert "mine" in {s["name"] for s in ok(api.get("/api/labels"))["label_sets"]}


PATTERN_CLASS_NAMES = {"previous_token": "Previous Token", "induction": "Induction",
                       "duplicate_token": "Duplicate Token"}


def test_per_model_pattern_labels_follow_pattern_scores(api):
    """labels=patterns: each model's heads classed from its own /api/patterns scores."""
    listed = {s["name"]: s for s in ok(api.get("/api/labels"))["label_sets"]}
    assert listed["patterns"]["per_model"] and listed["patterns"]["n_heads"] is None
    assert not listed["ioi_gpt2_small"]["per_model"]
    ls = ok(api.get("/api/labels/patterns", params={"model": "demo"}))
    assert ls["per_model"] and ls["model"] == "demo"
    thr = ls["thresholds"]
    assert set(thr) <= set(PATTERN_CLASS_NAMES) and all(0 < t < 1 for t in thr.values())

    # Independent classing in numpy: highest score among the kinds above their threshold.
    p = ok(api.get("/api/patterns", params={"model": "demo"}))
    kinds = list(thr)
    scores = np.stack([np.array(p["scores"][k], dtype=float) for k in kinds])  # [C, L, H]
    above = scores > np.array([thr[k] for k in kinds])[:, None, None]
    best = np.where(above, scores, -np.inf).argmax(axis=0)
    expected = {f"L{layer}H{h}": PATTERN_CLASS_NAMES[kinds[best[i, h]]]
                for i, layer in enumerate(p["layer_indices"]) for h in range(H) if above[:, i, h].any()}
    assert ls["classes"] == expected
    prev = np.array(p["scores"]["previous_token"])
    i, h = np.unravel_index(prev.argmax(), prev.shape)
    prev_head = f"L{p['layer_indices'][i]}H{h}"  # the demo's previous-token head (L0H0)
    assert prev[i, h] > thr["previous_token"] and expected[prev_head] == "Previous Token"
    induction_l1 = [f"L1H{h}" for h in range(H) if expected.get(f"L1H{h}") == "Induction"]
    assert induction_l1
    assert all(p["scores"]["induction"][1][int(n[3:])] > thr["induction"] for n in induction_l1)

    g = ok(api.get("/api/graph", params={"model": "demo", "pairings": "OQ,OK,OV", "k": 20,
                                         "labels": "patterns"}))
    assert g["labels"] == "patterns" and g["class_counts"]["in_class"] > 0
    nodes = {n["id"]: n for n in g["graph"]["nodes"]}
    assert g["class_counts"]["in_class"] == len(set(nodes) & set(expected))
    assert sum(g["class_counts"].values()) == len(nodes)
    assert all(n.get("head_class") == expected.get(name) for name, n in nodes.items())
    assert "Previous Token" in {n.get("head_class") for n in nodes.values()}
    assert "Induction" in {n.get("head_class") for n in nodes.values()}

    head = ok(api.get("/api/head", params={"model": "demo", "head": prev_head, "labels": "patterns"}))
    assert head["class"] == "Previous Token" and head["labels"] == "patterns"
    pair = ok(api.get("/api/pair", params={"model": "demo", "pairing": "OK", "source": prev_head,
                                           "target": induction_l1[0], "labels": "patterns"}))
    assert (pair["source_class"], pair["target_class"]) == ("Previous Token", "Induction")
    gml = api.get("/api/download", params={"what": "graph", "format": "graphml", "labels": "patterns"})
    assert gml.status_code == 200
    classes = nx.get_node_attributes(nx.parse_graphml(gml.text, force_multigraph=True), "head_class")
    assert classes and all(expected[n] == c for n, c in classes.items())

    # Per model: the same name gives the local GQA model its own classes, from its own scores.
    assert "model=" in err(api.get("/api/labels/patterns"), 422)
    q_ls = ok(api.get("/api/labels/patterns", params={"model": "local:qwen2-tiny"}))
    q_p = ok(api.get("/api/patterns", params={"model": "local:qwen2-tiny"}))
    assert q_ls["model"] == "local:qwen2-tiny"
    for name, cls in q_ls["classes"].items():
        layer, head_i = (int(x) for x in name[1:].split("H"))
        kind = next(k for k, v in PATTERN_CLASS_NAMES.items() if v == cls)
        assert q_p["scores"][kind][q_p["layer_indices"].index(layer)][head_i] > thr[kind]
    qg = ok(api.get("/api/graph", params={"model": "local:qwen2-tiny", "labels": "patterns",
                                          "k": 5, "pairings": "OQ"}))
    assert qg["class_counts"]["in_class"] == len({n["id"] for n in qg["graph"]["nodes"]}
                                                 & set(q_ls["classes"]))
    assert "patterns" in err(api.post("/api/labels", params={"name": "patterns"}, content="head,class\nL0H0,A\n",
                                      headers={"content-type": "text/csv"}), 422)


def test_malformed_label_uploads_name_the_line(api):
    bad = "head,class\nL0H1,Previous Token\nnot-a-head,Induction\n"
    msg = err(api.post("/api/labels", params={"name": "bad1"}, content=bad,
                       headers={"content-type": "text/csv"}), 422)
    assert "line 3" in msg
    msg = err(api.post("/api/labels", params={"name": "bad2", "model": "demo"},
                       content="head,class\nL0H1,A\nL7H1,B\n", headers={"content-type": "text/csv"}), 422)
    assert "line 3" in msg and "L7H1" in msg
    msg = err(api.post("/api/labels", params={"name": "bad3"}, content='{"classes": {"L0H1": }',
                       headers={"content-type": "application/json"}), 422)
    assert "line 1" in msg
    assert err(api.post("/api/labels", params={"name": "ioi_gpt2_small"},
                        content="head,class\nL0H1,A\n", headers={"content-type": "text/csv"}), 422)
    assert api.get("/api/labels/bad1").status_code == 404


# -- downloads --------------------------------------------------------------------------------------

def test_downloads(api, ref):
    r = api.get("/api/download", params={"what": "pk", "format": "csv", "pairing": "OK"})
    assert r.status_code == 200 and "attachment" in r.headers["content-disposition"]
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert len(rows) == int(ref["forward"].sum())
    row = next(x for x in rows if x["source"] == "L0H3" and x["target"] == "L1H5")
    assert float(row["raw"]) == pytest.approx(float(ref["pk"]["OK"][0, 3, 1, 5]), abs=1e-4)

    r = api.get("/api/download", params={"what": "pk", "format": "npy", "pairing": "OV"})
    arr = np.load(io.BytesIO(r.content))
    assert arr.shape == (L, H, L, H)
    assert np.allclose(arr[ref["forward"].numpy()], ref["pk"]["OV"][ref["forward"]].numpy(), atol=1e-4)

    r = api.get("/api/download", params={"what": "graph", "format": "graphml", "k": 6})
    assert r.headers["content-disposition"].endswith('.graphml"')
    g = nx.read_graphml(io.BytesIO(r.content), force_multigraph=True)
    assert g.number_of_edges() == 18

    r = api.get("/api/download", params={"what": "top", "format": "csv", "k": 7})
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert len(rows) == 7 and list(rows[0])[:5] == ["source", "target", "pk", "normalized", "cs"]
    r = api.get("/api/download", params={"what": "cs", "format": "json", "mode": "Q"})
    assert r.json()["kind"] == "cs"
    msg = err(api.get("/api/download", params={"what": "top", "format": "npy"}), 422)
    assert "csv" in msg


# -- grouped-query local model --------------------------------------------------------------------

def test_local_gqa_model_under_the_root(api, model_root):
    g = ok(api.get("/api/pk", params={"model": "local:qwen2-tiny", "pairing": "OK"}))
    assert g["shape"] == [3, 4, 3, 2]
    assert g["target_labels"][:2] == ["L0KV0", "L0KV1"] and g["source_labels"][0] == "L0H0"
    d = ok(api.get("/api/pair", params={"model": "local:qwen2-tiny", "pairing": "OK",
                                        "source": "L0H1", "target": "L2H3"}))
    assert d["target"] == "L2KV1"  # query head 3 reads KV head 1
    assert d["pk"] == pytest.approx(g["grid"][0][1][2][1], abs=1e-5)
    by_path = ok(api.get("/api/models/info", params={"model": str(model_root / "qwen2-tiny")}))
    assert by_path["info"]["n_kv_heads"] == 2
    head = ok(api.get("/api/head", params={"model": "local:qwen2-tiny", "head": "L1H3", "k": 2}))
    assert [p["head"] for p in head["partners"]["OK"]["out"]][0].startswith("L2KV")
    assert all(p["head"].startswith("L0H") for p in head["partners"]["OK"]["in"])
    sc = ok(api.get("/api/scatter", params={"model": "local:qwen2-tiny", "pairing": "OK"}))
    assert len(sc["points"]["pk"]) == 3 * 4 * 4  # 3 forward layer pairs x 4 x 4 query heads
    assert sc["points"]["target"][0].startswith("L1H")  # CS axes are query heads
    top = ok(api.get("/api/top", params={"model": "local:qwen2-tiny", "pairing": "OK", "k": 3}))
    assert all("KV" in p["target"] for p in top["pairs"])
    top_cs = ok(api.get("/api/top", params={"model": "local:qwen2-tiny", "pairing": "OK", "k": 3,
                                            "metric": "cs"}))
    cs_vals = [p["cs"] for p in top_cs["pairs"]]
    assert cs_vals == sorted(cs_vals, reverse=True) and "KV" not in top_cs["pairs"][0]["target"]


# -- bad input ------------------------------------------------------------------------------------

def test_bad_inputs_are_4xx_with_messages(api, tmp_path):
    msg = err(api.get("/api/pk", params={"model": "nope"}), 404)
    assert "unknown model 'nope'" in msg and "demo" in msg
    msg = err(api.get("/api/pk", params={"pairing": "XY"}), 422)
    assert "OK" in msg and "pairing" in msg
    msg = err(api.get("/api/pair", params={"source": "L9H0", "target": "L1H0"}), 404)
    assert "layer 9" in msg
    msg = err(api.get("/api/pair", params={"source": "head3", "target": "L1H0"}), 404)
    assert "bad head name" in msg
    msg = err(api.get("/api/pair", params={"source": "L0H8", "target": "L1H0"}), 404)
    assert "out of range" in msg
    assert "k" in err(api.get("/api/top", params={"k": 0}), 422)
    assert "k" in err(api.get("/api/top", params={"k": 10**9}), 422)
    assert "k" in err(api.get("/api/graph", params={"k": 0}), 422)
    both = ok(api.get("/api/graph", params={"pairings": "OK", "k": 5, "threshold": 6.0}))
    assert both["rule"] == "raw PK >= 6" and both["edge_counts"]["OK"] != 5  # threshold wins
    err(api.get("/api/graph", params={"pairings": "OK,XY"}), 422)
    err(api.get("/api/tokens", params={"role": "X"}), 422)
    err(api.get("/api/cs", params={"mode": "O"}), 422)
    err(api.get("/api/pk", params={"metric": "bogus"}), 422)
    err(api.get("/api/labels/nope"), 404)
    err(api.get("/api/jobs/doesnotexist"), 404)
    err(api.get("/api/graph", params={"labels": "nope"}), 404)
    msg = err(api.get("/api/models/info", params={"model": str(tmp_path)}), 403)
    assert "outside the model root" in msg
    msg = err(api.get("/api/models/info", params={"model": "/etc/../etc"}), 403)
    assert "outside the model root" in msg
    msg = err(api.get("/api/no/such/endpoint"), 404)
    assert "no API endpoint" in msg
    assert api.post("/api/pk").status_code in (404, 405)
