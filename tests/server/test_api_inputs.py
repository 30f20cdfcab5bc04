"""HTTP API, inputs: patterns, label sets and uploads, downloads, a local GQA model under the
model root, and bad input (4xx with a message) against a real uvicorn subprocess on loopback.
Shared fixtures and the reference: tests/server/conftest.py; helpers: tests/api_support.py.
"""

from __future__ import annotations

import csv
import io
import json

import httpx
import networkx as nx
import numpy as np
import pytest
from jsonschema import Draft202012Validator

from api_support import H, L, err, ok


@pytest.mark.slow  # on this module's real server (a uvicorn start and cold computes, ~15 s a module)
def test_patterns(api):
    p = ok(api.get("/api/patterns", params={"model": "demo"}))
    assert set(p["kinds"]) == set(p["scores"]) >= {"identity", "previous_token", "induction"}
    for grid in p["scores"].values():
        arr = np.array(grid, dtype=float)
        assert arr.shape == (L, H) and np.all((arr >= 0) & (arr <= 1 + 1e-6))


# -- labels ---------------------------------------------------------------------------------------

@pytest.mark.slow  # on this module's real server (a uvicorn start and cold computes, ~15 s a module)
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


@pytest.mark.slow  # on this module's real server (a uvicorn start and cold computes, ~15 s a module)
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
    gml = api.get("/api/download/graph", params={"format": "graphml", "labels": "patterns"})
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
                                      headers={"content-type": "text/csv"}), 409)


@pytest.mark.slow  # on this module's real server (a uvicorn start and cold computes, ~15 s a module)
def test_malformed_label_uploads_name_the_line(api):
    bad = "head,class\nL0H1,Previous Token\nnot-a-head,Induction\n"
    msg = err(api.post("/api/labels", params={"name": "bad1"}, content=bad,
                       headers={"content-type": "text/csv"}), 422)
    assert "line 3" in msg
    msg = err(api.post("/api/labels", params={"name": "bad2", "model": "demo"},
                       content="head,class\nL0H1,A\nL7H1,B\n", headers={"content-type": "text/csv"}), 404)
    assert "line 3" in msg and "L7H1" in msg  # a head the model lacks is not found
    msg = err(api.post("/api/labels", params={"name": "bad3"}, content='{"classes": {"L0H1": }',
                       headers={"content-type": "application/json"}), 422)
    assert "line 1" in msg
    assert "built-in" in err(api.post("/api/labels", params={"name": "ioi_gpt2_small"},
                                      content="head,class\nL0H1,A\n",
                                      headers={"content-type": "text/csv"}), 409)
    assert api.get("/api/labels/bad1").status_code == 404


# -- downloads --------------------------------------------------------------------------------------

@pytest.mark.slow  # on this module's real server (a uvicorn start and cold computes, ~15 s a module)
def test_downloads(api, ref):
    r = api.get("/api/download/pk", params={"format": "csv", "pairing": "OK"})
    assert r.status_code == 200 and "attachment" in r.headers["content-disposition"]
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert len(rows) == int(ref["forward"].sum())
    row = next(x for x in rows if x["source"] == "L0H3" and x["target"] == "L1H5")
    assert float(row["raw"]) == pytest.approx(float(ref["pk"]["OK"][0, 3, 1, 5]), abs=1e-4)

    r = api.get("/api/download/pk", params={"format": "npy", "pairing": "OV"})
    arr = np.load(io.BytesIO(r.content))
    assert arr.shape == (L, H, L, H)
    assert np.allclose(arr[ref["forward"].numpy()], ref["pk"]["OV"][ref["forward"]].numpy(), atol=1e-4)

    r = api.get("/api/download/graph", params={"format": "graphml", "k": 6})
    assert r.headers["content-disposition"].endswith('.graphml"')
    g = nx.read_graphml(io.BytesIO(r.content), force_multigraph=True)
    assert g.number_of_edges() == 18

    r = api.get("/api/download/top", params={"format": "csv", "k": 7})
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert len(rows) == 7 and list(rows[0])[:5] == ["source", "target", "pk", "normalized", "cs"]
    r = api.get("/api/download/cs", params={"format": "json", "mode": "Q"})
    assert r.json()["kind"] == "cs"
    msg = err(api.get("/api/download/top", params={"format": "npy"}), 422)
    assert "csv" in msg  # the formats each download offers are in its schema
    msg = err(api.get("/api/download/pk", params={"metric": "cs"}), 422)
    assert "raw" in msg
    # A pairing and metric valid one by one, not together: no such result (404), never a 422
    # for a request its schema accepts.
    msg = err(api.get("/api/top", params={"metric": "cs", "pairing": "QO"}), 404)
    assert "CS exists for OQ, OK and OV" in msg


# -- grouped-query local model --------------------------------------------------------------------

@pytest.mark.slow  # on this module's real server (a uvicorn start and cold computes, ~15 s a module)
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
    # One point per KV score: 3 forward layer pairs x 4 query heads x 2 KV groups, CS the mean
    # over each group's query heads (what /api/pair gives a KV target).
    assert len(sc["points"]["pk"]) == 3 * 4 * 2 == sc["comparison"]["n_valid"]
    assert sc["points"]["target"][0] == "L1KV0" and "mean" in sc["cs_of"]
    i = next(n for n, (s, t) in enumerate(zip(sc["points"]["source"], sc["points"]["target"]))
             if (s, t) == ("L0H1", "L2KV1"))
    kv_pair = ok(api.get("/api/pair", params={"model": "local:qwen2-tiny", "pairing": "OK",
                                              "source": "L0H1", "target": "L2KV1"}))
    assert kv_pair["cs"] == pytest.approx(sc["points"]["cs"][i], rel=1e-6)
    assert kv_pair["cs_of"] == "mean over L2H2, L2H3"
    kv = ok(api.get("/api/head", params={"model": "local:qwen2-tiny", "head": "L2KV1", "k": 2}))
    assert (kv["head"], kv["kind"], kv["heads"]) == ("L2KV1", "kv_group", ["L2H2", "L2H3"])
    assert kv["partners"]["OK"]["in"][0]["pk"] == pytest.approx(
        max(g["grid"][sl][sh][2][1] for sl in range(2) for sh in range(4)), rel=1e-6)
    assert err(api.get("/api/head", params={"model": "local:qwen2-tiny", "head": "L2KV2"}), 404)
    top = ok(api.get("/api/top", params={"model": "local:qwen2-tiny", "pairing": "OK", "k": 3}))
    assert all("KV" in p["target"] for p in top["pairs"])
    top_cs = ok(api.get("/api/top", params={"model": "local:qwen2-tiny", "pairing": "OK", "k": 3,
                                            "metric": "cs"}))
    cs_vals = [p["cs"] for p in top_cs["pairs"]]
    # ranked by the KV-level CS (the scatter's): rows stay the pairing's own KV pairs
    assert cs_vals == sorted(cs_vals, reverse=True) and "KV" in top_cs["pairs"][0]["target"]
    assert all(p["cs_of"].startswith("mean over ") for p in top["pairs"] + top_cs["pairs"])


# -- bad input ------------------------------------------------------------------------------------

@pytest.mark.slow  # on this module's real server (a uvicorn start and cold computes, ~15 s a module)
def test_bad_inputs_are_4xx_with_messages(api, tmp_path):
    msg = err(api.get("/api/pk", params={"model": "nope"}), 404)
    assert "unknown model 'nope'" in msg and "demo" in msg
    msg = err(api.get("/api/pk", params={"pairing": "XY"}), 422)
    assert "OK" in msg and "pairing" in msg
    msg = err(api.get("/api/pair", params={"source": "L9H0", "target": "L1H0"}), 404)
    assert "layer 9" in msg
    msg = err(api.get("/api/pair", params={"source": "head3", "target": "L1H0"}), 422)
    assert "not a head name" in msg
    assert ok(api.get("/api/pair", params={"source": " l0h0 ", "target": "L1H0"}))["source"] == "L0H0"
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
    assert api.get("/").headers["content-type"].startswith("text/html")  # the dashboard is on "/"
    for path in ("/api", "/api/"):  # the API's root, with or without its slash: JSON, not the page
        resp = api.get(path)
        assert resp.headers["content-type"] == "application/json", (path, resp.text[:200])
        assert "no API endpoint" in err(resp, 404)
    assert api.post("/api/pk").status_code in (404, 405)


@pytest.mark.slow  # on this module's real server (a uvicorn start and cold computes, ~15 s a module)
def test_the_schema_states_what_the_server_enforces(api):
    """Requests the OpenAPI schema allows are accepted, and those it refuses are 422s: the
    subgraph's exactly-one selection, the circuit's edge pattern, a task upload's JSONL rows
    and a label class (judged by jsonschema, whose regexes are Python's: no value here ends in
    a line break, where Python's $ and the schema's ECMA $ differ)."""
    spec = ok(api.get("/openapi.json"))["paths"]

    params = {p["name"]: p for p in spec["/api/subgraph"]["get"]["parameters"]}
    assert not {"heads", "head", "layers"} & set(params)  # documented as the one selection
    selection = params["selection"]
    assert selection["in"] == "query" and selection["style"] == "form" and selection["explode"]
    allows = Draft202012Validator(selection["schema"]).is_valid
    for query in ({"heads": "L0H1,L1H3"}, {"head": "L1H3"}, {"layers": "0-1"}, {},
                  {"heads": "L0H1", "head": "L1H3"}, {"head": "L1H3", "layers": "0-1"},
                  {"heads": "L0H1", "head": "L1H3", "layers": "0-1"}, {"heads": ""}):
        status = api.get("/api/subgraph", params={"model": "demo", **query}).status_code
        assert (len(query) == 1 and "" not in query.values()) == allows(query), query
        assert status == (200 if allows(query) else 422), (query, status)

    params = {p["name"]: p for p in spec["/api/circuit"]["get"]["parameters"]}
    allows = Draft202012Validator(params["edge"]["schema"]).is_valid
    for edges in (["L0H0>L1H3.K"], ["embed>logits", "L1MLP>L0H0.V"], ["L0H0"], ["L0H0>"],
                  ["L0H0 > L1H3.K"], ["L0H0>L1H3.K>logits"], ["L0H0>L1H3.K", "x"]):
        # an unknown task: a 404 once the parameters are valid, before any computation
        status = api.get("/api/circuit", params={"task": "no-such-task", "edge": edges}).status_code
        assert status == (404 if allows(edges) else 422), (edges, status)
    assert err(api.get("/api/circuit", params={"task": "no-such-task", "edge": "L0H0>L1H3.K\n"}),
               422).startswith("edge.0: not an edge")  # $ ends the text, as in the schema

    body = spec["/api/tasks"]["post"]["requestBody"]["content"]
    assert list(body) == ["application/x-ndjson"]
    allows = Draft202012Validator(body["application/x-ndjson"]["schema"]).is_valid
    row = {"clean": "a b c", "corrupt": "d e f", "answer": "g", "distractor": "h"}
    cases = {"ok": [row, {**row, "answer": "x"}], "extra-key": [{**row, "note": "x"}],
             "missing-key": [{k: v for k, v in row.items() if k != "answer"}],
             "empty": [{**row, "clean": ""}], "nul": [{**row, "corrupt": "d\x00e"}],
             "number": [{**row, "distractor": 7}], "no-rows": [], "list-row": [list(row.values())],
             "too-many": [row] * 513}
    for name, rows in cases.items():
        jsonl = "".join(json.dumps(r) + "\n" for r in rows)
        resp = api.post("/api/tasks", params={"name": f"schema-{name}"}, content=jsonl,
                        headers={"content-type": "application/x-ndjson"})
        assert resp.status_code == (201 if allows(rows) else 422), (name, resp.text[:300])
    assert allows(cases["ok"]) and allows([row] * 512)

    body = spec["/api/labels"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    allows = Draft202012Validator(body).is_valid
    for i, cls in enumerate(("Name Mover", "Ünïcode ☃", "A\u202eB", "\u202aA", "A\u200e",
                             "\u200fA", "A\u2066B", "A\u2069", " A", "A\tB", "x" * 65)):
        labels = {"name": f"schema-class-{i}", "classes": {"L0H1": cls}}
        status = api.post("/api/labels", json=labels).status_code
        assert status == (201 if allows(labels) else 422), (cls, status)
        assert allows(labels) == (i < 2), cls


def test_error_mapping_caller_faults_are_4xx_bugs_are_a_generic_500(caplog):
    """http.handlers.install_handlers on an app of its own: core's HeadgraphError family is the
    caller's fault (4xx, its message, the allowed values); a bare ValueError is a bug (500,
    generic message, traceback only in the log, never a path in the body)."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from headgraph.core.errors import InvalidInput, PathNotAllowed
    from headgraph.core.names import check_pairing
    from headgraph.server.http.handlers import install_handlers

    app = FastAPI()
    install_handlers(app)

    @app.get("/invalid")
    def invalid() -> None:
        check_pairing("XY")

    @app.get("/path")
    def path() -> None:
        raise PathNotAllowed("/models/x is outside the model root")

    @app.get("/bug")
    def bug() -> None:
        raise ValueError("/home/someone/secret.py: shape mismatch")

    with TestClient(app, raise_server_exceptions=False) as client:
        body = client.get("/invalid").json()["error"]
        assert body["status"] == 422 and "XY" in body["message"]
        assert body["type"] == InvalidInput.__name__ and "OK" in body["allowed"]
        assert client.get("/path").status_code == 403
        with caplog.at_level("ERROR", logger="headgraph.errors"):
            resp = client.get("/bug")
        assert resp.status_code == 500
        assert resp.json() == {"error": {"status": 500, "message": "internal error; see the server log"}}
        assert "secret" not in resp.text and "Traceback" not in resp.text
        logged = [r for r in caplog.records if r.levelname == "ERROR"]
        assert logged and logged[-1].exc_info is not None  # the traceback is in the log


@pytest.mark.slow  # its own server and a random model: ~15 s
def test_a_listed_random_model_is_available_offline_and_served(launch_server, tmp_path):
    """``random:`` specs in HEADGRAPH_MODELS build weights here: listed as available even with
    the hub offline (not as a hub id to download), and served like any other model."""
    import headgraph.core as hg

    env = {"HEADGRAPH_MODELS": "demo,random:gpt2-tiny,gpt2", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "HEADGRAPH_DEVICE": "cpu"}
    with launch_server(tmp_path / "cache", workers=1, env=env) as srv, \
            httpx.Client(base_url=srv.url, timeout=300) as client:
        listed = {m["id"]: m for m in ok(client.get("/api/models"))["models"]}
        assert listed["random:gpt2-tiny"]["status"] == "available"
        assert listed["random:gpt2-tiny"]["kind"] == "random"
        assert listed["gpt2"]["status"] == "not available offline"  # a hub id stays one
        grid = ok(client.get("/api/pk", params={"model": "random:gpt2-tiny", "pairing": "OK"}))
        errors = srv.server_errors()
    assert not errors, errors
    local = hg.projection_kernel(hg.load_heads("random:gpt2-tiny"), "OK")
    assert np.asarray(grid["grid"]).shape == tuple(local.scores.shape) == (2, 4, 2, 4)
    got = np.asarray([[v if v is not None else np.nan for v in row]
                      for row in np.asarray(grid["grid"], dtype=object).reshape(8, 8)], dtype=float)
    want = local.scores.reshape(8, 8).double().numpy()
    valid = local.valid.reshape(8, 8).numpy()
    assert np.allclose(got[valid], want[valid], atol=1e-5)
