"""Recovery tables through the server (core's side is tests/core/test_recovery.py): GET
/api/recovery on the demo against core's recovery_table on the same reference, an uploaded
label set on a local grouped-query model, the errors, and `headgraph recovery`, on a real
uvicorn subprocess on loopback (tests/server/conftest.py's ``server`` and ``api``)."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest
import torch

from headgraph.core.models.loading import load_model
from headgraph.core.stats.recovery import METRICS, head_recovery

from api_support import err, ok

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]  # a module server (~15 s)


def test_recovery_on_the_demo_equals_core(api):
    body = ok(api.get("/api/recovery", params={"model": "demo", "pairing": "OK", "labels": "patterns",
                                                "k": 10}))
    assert body["labels"] == "patterns" and body["pairing"] == "OK" and body["k"] == 10
    assert [r["metric"] for r in body["rows"]] == list(METRICS)
    assert body["n_valid"] == 64 and 0 < body["n_reference"] <= 64 and body["unknown_heads"] == []
    core = head_recovery(load_model("demo", device="cpu").heads, "OK", body["reference_heads"], k=10,
                         n_resamples=body["n_resamples"], seed=0)
    assert body["n_reference"] == core.n_reference
    for row in body["rows"]:
        want = core.row(row["metric"]).to_dict(core.layer_indices)
        for field in ("endpoint_share", "precision", "auc"):
            for end in ("value", "low", "high"):
                assert row[field][end] == pytest.approx(want[field][end], abs=1e-9), (row["metric"], field)
        assert row["top"] == want["top"]
        if row["metric"] == "pk":
            assert row["auc_diff"] is None
        else:
            assert row["auc_diff"]["value"] == pytest.approx(want["auc_diff"]["value"], abs=1e-9)
    again = ok(api.get("/api/recovery", params={"model": "demo", "pairing": "OK", "labels": "patterns",
                                                 "k": 10}))
    assert again == body


def test_recovery_of_an_uploaded_set_on_a_gqa_model_and_errors(api):
    csv_text = "head,class\nL0H1,A\nL2H3,B\nL1H0,A\n"
    assert api.post("/api/labels", params={"name": "qwen-circuit"}, content=csv_text,
                    headers={"content-type": "text/csv"}).status_code == 201
    body = ok(api.get("/api/recovery", params={"model": "local:qwen2-tiny", "pairing": "OV",
                                                "labels": "qwen-circuit", "k": 5}))
    # 3 layers x 4 query heads -> 2 KV groups: forward pairs 4 * 2 * 3 layer pairs
    assert body["n_valid"] == 24
    # sources L0H1, L1H0; targets: the KV groups serving L1H0 (L1KV0) and L2H3 (L2KV1)
    assert body["n_reference"] == 3  # L0H1->L1KV0, L0H1->L2KV1, L1H0->L2KV1
    assert {r["metric"] for r in body["rows"]} == set(METRICS)
    assert "unknown" in err(api.get("/api/recovery", params={"model": "demo", "labels": "no-such-set"}), 404)
    assert api.post("/api/labels", params={"name": "far-heads"}, content="head,class\nL9H9,X\n",
                    headers={"content-type": "text/csv"}).status_code == 201
    msg = err(api.get("/api/recovery", params={"model": "demo", "labels": "far-heads"}), 422)
    assert "names no head" in msg
    assert api.get("/api/recovery", params={"model": "demo", "labels": "patterns", "k": 0}).status_code == 422
    assert api.get("/api/recovery", params={"model": "demo", "labels": "patterns",
                                            "pairing": "QK"}).status_code == 422


def test_cli_recovery_json_and_text(tmp_path, capsys):
    from headgraph.server.cli.main import main

    assert main(["recovery", "demo", "--labels", "patterns", "--k", "5", "--json",
                 "--cache-dir", str(tmp_path)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["k"] == 5 and [r["metric"] for r in report["rows"]] == list(METRICS)
    assert main(["recovery", "demo", "--labels", "patterns", "--k", "5", "--cache-dir", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "precision@5" in text and "ROC-AUC" in text and "procrustes" in text
    assert main(["recovery", "demo", "--labels", "no-such-set", "--cache-dir", str(tmp_path)]) != 0


def _served(body: dict) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor(body["grid"], dtype=torch.float64), torch.tensor(body["valid"])


def test_cka_and_procrustes_grids_and_rankings_equal_core(api, model_root):
    """/api/pk?metric=cka|procrustes is core's similarity grid (the recovery tables' cached
    one); /api/top ranks by it, its rows carry both beside PK and CS, the pair and the
    downloads read the same values; a grouped-query OV target is its KV head, as PK's."""
    from headgraph.core.scores.similarity import similarity

    cases = {"demo": ("OK", load_model("demo", device="cpu").heads),
             "local:qwen2-tiny": ("OV", load_model(str(model_root / "qwen2-tiny"), device="cpu").heads)}
    for model, (pairing, heads) in cases.items():
        pk = ok(api.get("/api/pk", params={"model": model, "pairing": pairing}))
        pk_grid, _ = _served(pk)
        grids = {}
        for kind in ("cka", "procrustes"):
            body = ok(api.get("/api/pk", params={"model": model, "pairing": pairing, "metric": kind}))
            core = similarity(heads, kind, pairing)
            grid, valid = _served(body)
            assert body["kind"] == body["metric"] == kind and grid.shape == core.scores.shape == pk_grid.shape
            assert body["target_labels"] == pk["target_labels"]  # KV heads on a GQA K/V axis, as PK
            assert torch.equal(valid, core.valid) and valid.any()
            assert torch.allclose(grid[valid], core.scores.double()[valid], atol=1e-6)
            grids[kind] = grid, valid
        if model != "demo":
            assert pk["target_labels"][:2] == ["L0KV0", "L0KV1"] and pk_grid.shape[3] == 2
        for kind in ("cka", "procrustes"):
            top = ok(api.get("/api/top", params={"model": model, "pairing": pairing, "k": 10,
                                                 "metric": kind}))["pairs"]
            values = [p[kind] for p in top]
            grid, valid = grids[kind]
            assert len(top) == 10 and values == sorted(values, reverse=True)
            assert values[0] == float(grid[valid].max())
            for p in top:  # layer positions are block numbers on both models
                pos = (p["source_layer"], p["source_head"], p["target_layer"], p["target_head"])
                assert p["target"] == pk["target_labels"][pos[2] * pk_grid.shape[3] + pos[3]]
                assert p["pk"] == float(pk_grid[pos])
                for other in ("cka", "procrustes"):  # both cached: every row carries both
                    assert p[other] == float(grids[other][0][pos])
    # The pair panel's values and the downloads are the same numbers (the last ranking: OV of
    # the grouped-query model by Procrustes).
    row = top[0]
    pair = ok(api.get("/api/pair", params={"model": "local:qwen2-tiny", "pairing": "OV",
                                           "source": row["source"], "target": row["target"]}))
    assert (pair["cka"], pair["procrustes"]) == (row["cka"], row["procrustes"])
    assert sorted(pair["similarity_cached"]) == ["cka", "procrustes"]
    resp = api.get("/api/download/top", params={"model": "local:qwen2-tiny", "pairing": "OV", "k": 10,
                                                "metric": "procrustes", "format": "csv"})
    assert resp.status_code == 200
    rows = list(csv.DictReader(io.StringIO(resp.text)))
    assert list(rows[0])[:8] == ["source", "target", "pk", "normalized", "cs", "cs_of", "cka", "procrustes"]
    assert [float(r["procrustes"]) for r in rows] == [p["procrustes"] for p in top]
    npy = api.get("/api/download/pk", params={"model": "demo", "pairing": "OK", "metric": "cka",
                                              "format": "npy"})
    assert npy.status_code == 200 and "demo_cka_OK_forward.npy" in npy.headers["content-disposition"]
    np.testing.assert_allclose(np.load(io.BytesIO(npy.content)),
                               similarity(cases["demo"][1], "cka", "OK").scores.numpy(), atol=1e-6)
