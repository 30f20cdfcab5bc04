"""Checkpoint series and model comparison through the server (issue 16): GET /api/series,
/api/timeline (JSON and CSV) and /api/compare in process, and `headgraph timeline` / `compare`,
each against core's answer (core against a float64 reference is tests/core/test_series.py);
a model's norm-aware variant (``local:gemma3@norm`` on a tiny Gemma-3 with random norm gains)
against core's fold_norm_gains, and GET /api/subspaces comparing the two modes.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from headgraph.core.models.demo import DemoConfig, DemoModel, save_demo_model
from headgraph.core.models.loading import load_heads
from headgraph.core.graphs.diff import compare_scores
from headgraph.core.scores.pk import projection_kernel
from headgraph.core.models.series import DEMO_SERIES, demo_series
from headgraph.core.graphs.timeline import edge_trajectories
from headgraph.server.http.app import create_app
from headgraph.server.cli.main import main as cli_main
from headgraph.server.settings import Settings

from model_support import save_gemma3_random_norms

SERIES = demo_series()


@pytest.fixture(scope="module")
def pks() -> dict[str, object]:
    return {c.model_id: projection_kernel(load_heads(c.model_id, device="cpu"), "OK") for c in SERIES}


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("series-models")
    save_demo_model(DemoModel(DemoConfig(n_heads=4), seed=1), root / "demo-4heads")
    save_gemma3_random_norms(root / "gemma3", seed=7)
    # inline (no compute process): the models load once, in this process, beside the references
    app = create_app(Settings(cache_dir=tmp_path_factory.mktemp("series-cache"), model_root=root,
                              compute_processes=0))
    with TestClient(app) as c:
        yield c


def test_api_timeline_and_csv_equal_core(client: TestClient, pks: dict) -> None:
    listed = client.get("/api/series").json()["series"][DEMO_SERIES]
    assert [c["model"] for c in listed] == [c.model_id for c in SERIES]
    r = client.get("/api/timeline", params={"series": DEMO_SERIES, "pairing": "OK", "k": 8})
    assert r.status_code == 200, r.text
    body = r.json()
    ids = [c.model_id for c in SERIES]
    tl = edge_trajectories([pks[m] for m in ids], [c.step for c in SERIES], ids, k=8)
    assert body["steps"] == [c.step for c in SERIES] and body["models"] == ids
    assert [(e["source"], e["target"]) for e in body["edges"]] == list(zip(tl.sources, tl.targets))
    np.testing.assert_allclose([e["pk"] for e in body["edges"]], tl.pk.numpy(), atol=1e-6)
    one = client.get("/api/timeline", params={"series": DEMO_SERIES, "edge": ["L0H0,L1H3", "L0H5,L1H2"]})
    assert [(e["source"], e["target"]) for e in one.json()["edges"]] == [("L0H0", "L1H3"), ("L0H5", "L1H2")]
    c = client.get("/api/timeline", params={"series": DEMO_SERIES, "k": 8, "format": "csv"})
    assert c.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(c.text)))
    assert len(rows) == 8 * len(ids)
    got = {(r["source"], r["target"], int(r["step"])): float(r["pk"]) for r in rows}
    for e in body["edges"]:
        for step, v in zip(body["steps"], e["pk"]):
            assert got[(e["source"], e["target"], step)] == pytest.approx(v, abs=1e-9)


def test_api_compare_equals_core(client: TestClient, pks: dict) -> None:
    a, b = SERIES[0].model_id, "demo"
    r = client.get("/api/compare", params={"a": a, "b": b, "pairing": "OK", "k": 10})
    assert r.status_code == 200, r.text
    body = r.json()
    d = compare_scores(pks[a], projection_kernel(load_heads("demo", device="cpu"), "OK"), k=10)
    assert [(c["source"], c["target"]) for c in body["gained"]] == [(c.source, c.target) for c in d.gained]
    assert [(c["source"], c["target"]) for c in body["lost"]] == [(c.source, c.target) for c in d.lost]
    diff = np.array([[np.nan if v is None else v for v in row] for row in
                     np.array(body["diff"], dtype=object)[0, :, 1, :]], dtype=float)
    np.testing.assert_allclose(diff, d.diff[0, :, 1, :].numpy(), atol=1e-6)
    assert body["source_labels"][:2] == ["L0H0", "L0H1"] and body["summary"]["n_gained"] == len(d.gained)
    assert [m["name"] for m in body["hub_moves"]] == [m.name for m in d.hub_moves]


@pytest.mark.parametrize(("path", "params", "status", "words"), [
    ("/api/pk", {"model": "demo@foo"}, 404, "'demo@norm' (norm-aware subspaces)"),
    ("/api/pk", {"model": "local:demo-4heads@raw"}, 404, "unknown variant '@raw'"),
    ("/api/subspaces", {"model": "demo@norm@norm"}, 404, "appended once"),
    ("/api/models/info", {"model": "@norm"}, 404, "a model id before"),
    ("/api/compare", {"a": "demo", "b": "local:demo-4heads"}, 422, "head layout"),
    ("/api/compare", {"a": "demo", "b": "demo@step-7"}, 404, "demo checkpoint"),
    ("/api/timeline", {"series": "no-such-series"}, 404, "unknown series"),
    ("/api/timeline", {"series": "demo,"}, 404, "at least two non-empty ids"),
    ("/api/timeline", {"series": "demo,local:demo-4heads"}, 422, "head layout"),
    ("/api/timeline", {"series": DEMO_SERIES, "edge": "L0H0"}, 422, "should match pattern"),
    ("/api/timeline", {"series": DEMO_SERIES, "edge": "L0H0,L5H1"}, 422, "no attention layer"),
    ("/api/timeline", {"series": DEMO_SERIES, "k": 0}, 422, ""),
])
def test_bad_input_is_4xx_with_a_message(client: TestClient, path: str, params: dict, status: int,
                                         words: str) -> None:
    r = client.get(path, params=params)
    assert r.status_code == status, r.text
    assert words in json.dumps(r.json())


def test_cli_timeline_and_compare(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                  client: TestClient) -> None:
    cache = str(tmp_path / "cache")
    out_csv, out_json = tmp_path / "t.csv", tmp_path / "t.json"
    assert cli_main(["timeline", DEMO_SERIES, "--k", "3", "--csv", str(out_csv), "--json",
                     str(out_json), "--cache-dir", cache]) == 0
    text = capsys.readouterr().out
    assert "L0H0 -> L1H" in text and f"step {SERIES[-1].step}" in text
    api = client.get("/api/timeline", params={"series": DEMO_SERIES, "k": 3}).json()
    assert json.loads(out_json.read_text())["edges"] == api["edges"]
    assert len(list(csv.DictReader(out_csv.open()))) == 3 * len(SERIES)
    assert cli_main(["compare", SERIES[0].model_id, "demo", "--k", "10", "--json", "-",
                     "--cache-dir", cache]) == 0
    got = json.loads(capsys.readouterr().out)
    want = client.get("/api/compare", params={"a": SERIES[0].model_id, "b": "demo", "k": 10}).json()
    assert got["gained"] == want["gained"] and got["hub_moves"] == want["hub_moves"]
    assert cli_main(["compare", "demo", "demo@step-7", "--cache-dir", cache]) == 2
    assert "demo checkpoint" in capsys.readouterr().err


def _grid(body: dict) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in np.ravel(np.array(body["grid"], dtype=object))],
                    dtype=float).reshape(body["shape"])


def test_norm_aware_variant_is_its_own_model(client: TestClient) -> None:
    from scipy.stats import mannwhitneyu, spearmanr

    from headgraph.core.models.loading import load_model
    from headgraph.core.models.norm_fold import bridge_norm_gains, fold_norm_gains

    params = {"pairing": "OK"}
    raw = client.get("/api/pk", params={"model": "local:gemma3", **params}).json()
    r = client.get("/api/pk", params={"model": "local:gemma3@norm", **params})
    assert r.status_code == 200, r.text
    norm = r.json()
    assert norm["model"] == "local:gemma3@norm" and norm["target_labels"][:2] == ["L0KV0", "L0KV1"]
    # core's norm-aware PK, computed here from the same folder
    root = Path(client.app.state.settings.model_root)
    lm = load_model(str(root / "gemma3"), device="cpu")
    want = projection_kernel(fold_norm_gains(lm.heads, bridge_norm_gains(lm.bridge)), "OK")
    valid = np.array(norm["valid"], dtype=bool)
    assert (valid == want.valid.numpy()).all()
    np.testing.assert_allclose(_grid(norm)[valid], want.scores.numpy()[valid], rtol=1e-5, atol=1e-5)
    moved = np.abs(_grid(norm) - _grid(raw))[valid].max()
    assert moved > 1e-2  # the random gains change the graph
    info = {m: client.get("/api/models/info", params={"model": m}).json() for m in ("local:gemma3", "local:gemma3@norm")}
    assert info["local:gemma3"]["info"]["subspaces"] == "raw" and info["local:gemma3"]["info"]["norm_gains"] is None
    n = info["local:gemma3@norm"]["info"]
    assert n["subspaces"] == "norm" and "post-attention" in n["norm_gains"] and n["name"] == "local:gemma3"
    assert info["local:gemma3"]["fingerprint"] != info["local:gemma3@norm"]["fingerprint"]
    assert all("pk?order=forward&pairing=OK" in i["cached"] for i in info.values())  # both kept
    assert client.get("/api/pk", params={"model": "local:gemma3", **params}).json() == raw  # raw unchanged
    # raw vs norm-aware: Spearman and shared top-k against scipy / numpy on the two grids
    sub = client.get("/api/subspaces", params={"model": "local:gemma3@norm", "pairing": "OK", "k": 5}).json()
    both = valid & np.array(raw["valid"], dtype=bool)
    assert sub["n_valid"] == int(both.sum()) and sub["recovery"] is None and sub["verdict"] is None
    assert sub["spearman"] == pytest.approx(spearmanr(_grid(raw)[both], _grid(norm)[both]).statistic, abs=1e-9)

    def top(body: dict) -> set[str]:  # flat index i of [L, Hs, L, Ht]: source i // (L Ht), target i % (L Ht)
        g = np.where(np.array(body["valid"], dtype=bool), _grid(body), -np.inf).ravel()
        cols = body["shape"][2] * body["shape"][3]
        return {f"{body['source_labels'][i // cols]} -> {body['target_labels'][i % cols]}"
                for i in np.argsort(-g, kind="stable")[:5]}

    assert set(sub["top_raw"]) == top(raw) and set(sub["top_norm"]) == top(norm)
    assert set(sub["shared"]) == top(raw) & top(norm)
    # which recovers a label set better: each ROC-AUC against scipy's Mann-Whitney U on the grids
    assert client.post("/api/labels", params={"name": "gemma-circuit"}, content="head,class\nL0H1,A\nL1H2,A\nL2H0,B\n",
                       headers={"content-type": "text/csv"}).status_code == 201
    rec = client.get("/api/subspaces", params={"model": "local:gemma3", "pairing": "OK", "k": 5,
                                               "labels": "gemma-circuit"}).json()
    # reference edges: sources L0H1, L1H2; targets the KV groups serving L1H2 (L1KV1) and L2H0 (L2KV0)
    src = np.array([lab in ("L0H1", "L1H2") for lab in raw["source_labels"]])
    tgt = np.array([lab in ("L1KV1", "L2KV0") for lab in raw["target_labels"]])
    ref = (src[:, None] & tgt[None, :]).reshape(both.shape)
    assert rec["recovery"]["n_reference"] == int((ref & both).sum()) == 3
    for row, body in zip(rec["recovery"]["rows"], (raw, norm)):
        g = _grid(body)
        u = mannwhitneyu(g[both & ref], g[both & ~ref]).statistic
        assert row["auc"]["value"] == pytest.approx(u / ((both & ref).sum() * (both & ~ref).sum()), abs=1e-12)
    d = rec["auc_difference"]
    assert d["value"] == pytest.approx(rec["recovery"]["rows"][1]["auc"]["value"]
                                       - rec["recovery"]["rows"][0]["auc"]["value"], abs=1e-12)
    assert rec["verdict"] == ("norm" if d["low"] > 0 else "raw" if d["high"] < 0 else "tie")
