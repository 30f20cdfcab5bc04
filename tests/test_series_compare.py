"""Checkpoint series, per-edge trajectories and model comparison (issue 16): core, API, CLI.

The bundled demo series (core/data/demo_series, scripts/train_demo.py --checkpoints) must show
the induction edge L0H0 -> layer 1 forming. Every number is checked against an independent
float64 PK computed here from the checkpoint files (QR bases of W_O^T and W_K), and the API's
and CLI's answers against core's.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from safetensors.torch import load_file

from headgraph.core.models.demo import DemoConfig, DemoModel, save_demo_model
from headgraph.core.graphs.hubs import hub_table
from headgraph.core.models.loading import load_heads
from headgraph.core.graphs.diff import compare_scores
from headgraph.core.scores.pk import projection_kernel
from headgraph.core.models.series import DEMO_SERIES, demo_series
from headgraph.core.graphs.timeline import edge_trajectories
from headgraph.server.http.app import create_app
from headgraph.server.cli.main import main as cli_main
from headgraph.server.settings import Settings

SERIES = demo_series()
H = 8


def ok_reference(folder: Path) -> np.ndarray:
    """Float64 PK of every layer-0 O -> layer-1 K pair [H, H], from the safetensors file."""
    w = load_file(str(folder / "model.safetensors"))
    o = w["W_O"][0].double().transpose(-2, -1)  # [H, d_model, d_head]
    k = w["W_K"][1].double()
    uo, uk = torch.linalg.qr(o).Q, torch.linalg.qr(k).Q
    return (torch.einsum("adi,bdj->abij", uo, uk) ** 2).sum(dim=(-2, -1)).numpy()


@pytest.fixture(scope="module")
def refs() -> dict[str, np.ndarray]:
    return {c.model_id: ok_reference(c.folder) for c in SERIES}


@pytest.fixture(scope="module")
def pks() -> dict[str, object]:
    return {c.model_id: projection_kernel(load_heads(c.model_id, device="cpu"), "OK") for c in SERIES}


def test_bundled_series_is_small_and_loads() -> None:
    steps = [c.step for c in SERIES]
    assert 6 <= len(SERIES) <= 8 and steps == sorted(steps) and steps[-1] == 3000
    size = sum(f.stat().st_size for c in SERIES for f in c.folder.iterdir())
    assert size < 6_000_000
    heads = load_heads(SERIES[0].model_id, device="cpu")
    assert heads.info.name == SERIES[0].model_id and heads.W_K.shape == (2, H, 128, 16)


def test_induction_edge_forms_over_the_series(refs: dict[str, np.ndarray]) -> None:
    """L0H0 -> layer-1 OK PK grows from the first checkpoint to the last (float64 reference),
    and at the end L0H0 is every layer-1 head's strongest source."""
    first, last = refs[SERIES[0].model_id], refs[SERIES[-1].model_id]
    mean = [refs[c.model_id][0].mean() for c in SERIES]
    assert last[0].mean() > 2 * first[0].mean(), mean
    assert (last[0] > first[0]).all()
    assert (last.argmax(axis=0) == 0).all()
    assert not (first.argmax(axis=0) == 0).all()  # not formed at the first checkpoint
    low = int(np.argmin(mean))  # before it forms: no different from the other layer-0 heads
    assert low < len(mean) - 2 and all(b > a for a, b in zip(mean[low:], mean[low + 1:])), mean


def test_core_trajectories_equal_the_reference(pks: dict, refs: dict[str, np.ndarray]) -> None:
    ids = [c.model_id for c in SERIES]
    tl = edge_trajectories([pks[m] for m in ids], [c.step for c in SERIES], ids, k=8)
    last = refs[ids[-1]]
    order = np.argsort(-last.ravel(), kind="stable")[:8]  # brute-force top-8 of the last checkpoint
    assert [(0, int(i // H), 1, int(i % H)) for i in order] == list(tl.edges)
    for e, row in zip(tl.edges, tl.pk.numpy()):
        want = [refs[m][e[1], e[3]] for m in ids]
        np.testing.assert_allclose(row, want, rtol=1e-4, atol=1e-4)
    assert all(s == "L0H0" for s in tl.sources) and (tl.pk[:, -1] > tl.pk[:, 0]).all()


def test_core_compare_equals_brute_force(pks: dict, refs: dict[str, np.ndarray]) -> None:
    a_id, b_id, k = SERIES[0].model_id, SERIES[-1].model_id, 12
    d = compare_scores(pks[a_id], pks[b_id], k=k, names=(a_id, b_id))
    ra, rb = refs[a_id], refs[b_id]
    np.testing.assert_allclose(d.diff[0, :, 1, :].numpy(), rb - ra, atol=1e-4)
    assert not d.valid[1].any() and not d.valid[:, :, 0].any()

    def top(g: np.ndarray) -> list[tuple[str, str]]:
        return [(f"L0H{i // H}", f"L1H{i % H}") for i in np.argsort(-g.ravel(), kind="stable")[:k]]

    ta, tb = top(ra), top(rb)
    assert [(c.source, c.target) for c in d.gained] == [e for e in tb if e not in ta]
    assert [(c.source, c.target) for c in d.lost] == [e for e in ta if e not in tb]
    assert {(c.source, c.target) for c in d.changed} == set(ta) & set(tb)
    for c in d.gained + d.lost + d.changed:
        s, t = int(c.source[3:]), int(c.target[3:])
        assert c.delta == pytest.approx(rb[s, t] - ra[s, t], abs=1e-4)
    # hubs: degree within each top-k edge set, counted here by hand
    for edges, table in ((ta, d.hubs_a), (tb, d.hubs_b)):
        deg: dict[str, int] = {}
        for s, t in edges:
            deg[s] = deg.get(s, 0) + 1
            deg[t] = deg.get(t, 0) + 1
        assert {r.name: r.degree for r in table.rows} == deg
    hubs_b = {r.name for r in d.hubs_b.rows if r.is_hub}
    assert "L0H0" in hubs_b and any(m.name == "L0H0" for m in d.hub_moves)
    assert hub_table  # core.hubs is what compare_scores uses


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("series-models")
    save_demo_model(DemoModel(DemoConfig(n_heads=4), seed=1), root / "demo-4heads")
    app = create_app(Settings(cache_dir=tmp_path_factory.mktemp("series-cache"), model_root=root))
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
    ("/api/compare", {"a": "demo", "b": "local:demo-4heads"}, 422, "head layout"),
    ("/api/compare", {"a": "demo", "b": "demo@step-7"}, 404, "demo checkpoint"),
    ("/api/timeline", {"series": "no-such-series"}, 404, "unknown series"),
    ("/api/timeline", {"series": "demo,local:demo-4heads"}, 422, "head layout"),
    ("/api/timeline", {"series": DEMO_SERIES, "edge": "L0H0"}, 422, "source,target"),
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
