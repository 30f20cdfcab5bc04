"""Data-weighted PK through the server (core's side is tests/core/test_data_pk.py): the
registered computation, GET /api/datapk against core's data_pk, the pair answer once cached,
and `headgraph datapk`, on a real uvicorn subprocess on loopback (tests/server/conftest.py's
``server`` and ``api``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headgraph.core.activations.data_pk import data_pk
from headgraph.core.models.loading import load_model

from api_support import err, ok

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one torch thread


@pytest.fixture(scope="module")
def demo():
    return load_model("demo", device="cpu")


@pytest.fixture(scope="module")
def demo_text(demo):
    return data_pk(demo, prompt_set="text")


def _grid(values):
    return np.array([[[[np.nan if v is None else v for v in row] for row in b] for b in a]
                     for a in values], dtype=np.float64)


@pytest.mark.slow  # on this module's real server (a uvicorn start and cold computes, ~15 s a module)
def test_api_grids_equal_core_and_the_pair_answer_shows_them_once_cached(api, demo_text):
    pair = {"model": "demo", "pairing": "OK", "source": "L0H0", "target": "L1H3"}
    assert ok(api.get("/api/pair", params=pair))["data_pk"] is None  # not computed by a pair read
    cached = ok(api.get("/api/models/info", params={"model": "demo"}))["cached"]
    assert not any("data_pk" in c for c in cached)
    body = ok(api.get("/api/datapk", params={"model": "demo", "pairing": "OK", "k": 5}))
    core = demo_text["OK"]
    assert body["shape"] == [2, 8, 2, 8] and body["prompts"] == "text"
    assert body["n_positions"] == core.n_positions and body["n_prompts"] == 20
    assert body["valid"] == core.valid.tolist()
    for name in ("out_share", "in_share"):
        want = torch.where(core.valid, getattr(core, name), torch.nan).numpy()
        np.testing.assert_allclose(_grid(body[name]), want, rtol=1e-12, equal_nan=True)
    assert body["source_labels"][:2] == ["L0H0", "L0H1"] and body["target_labels"][8] == "L1H0"
    top = body["top"]
    assert [r["rank"] for r in top] == [1, 2, 3, 4, 5]
    assert [r["out_share"] for r in top] == sorted((r["out_share"] for r in top), reverse=True)
    assert top[0]["out_share"] == pytest.approx(float(core.out_share.max()), rel=1e-12)
    pk = {(p["source"], p["target"]): p for p in ok(api.get(
        "/api/top", params={"model": "demo", "pairing": "OK", "k": 64}))["pairs"]}
    for r in top:
        assert r["pk"] == pytest.approx(pk[(r["source"], r["target"])]["pk"])
        assert r["cs"] == pytest.approx(pk[(r["source"], r["target"])]["cs"])
        assert r["out_share_baseline"] == pytest.approx(16 / 128)
    by_in = ok(api.get("/api/datapk", params={"model": "demo", "pairing": "OK", "k": 3,
                                              "rank_on": "in_share"}))["top"]
    assert by_in[0]["in_share"] == pytest.approx(float(core.in_share.max()), rel=1e-12)
    shown = ok(api.get("/api/pair", params=pair))["data_pk"]
    assert set(shown) == {"text"}  # only the cached prompt set
    assert shown["text"]["out_share"] == pytest.approx(float(core.out_share[0, 0, 1, 3]))
    assert shown["text"]["in_share"] == pytest.approx(float(core.in_share[0, 0, 1, 3]))
    backwards = ok(api.get("/api/pair", params={**pair, "source": "L1H3", "target": "L0H0"}))
    assert backwards["data_pk"]["text"]["out_share"] is None  # not a forward pair


@pytest.mark.slow  # on this module's real server (a uvicorn start and cold computes, ~15 s a module)
def test_api_gqa_shapes(api):
    body = ok(api.get("/api/datapk", params={"model": "local:qwen2-tiny", "pairing": "OV",
                                             "prompts": "random", "k": 3}))
    assert body["shape"] == [3, 4, 3, 2] and body["prompts"] == "random"
    assert all("KV" in r["target"] for r in body["top"]) and len(body["top"]) == 3
    assert body["target_labels"][:2] == ["L0KV0", "L0KV1"]
    grid = _grid(body["out_share"])
    assert np.nanmin(grid) >= 0 and np.nanmax(grid) <= 1
    assert np.isnan(grid[2]).all()  # the last layer is no source of a forward pair


@pytest.mark.parametrize(("params", "status", "text"), [
    ({"pairing": "QK"}, 422, "pairing"),
    ({"pairing": "OO"}, 422, "pairing"),
    ({"prompts": "nope"}, 422, "prompts"),
    ({"k": 0}, 422, "k"),
    ({"rank_on": "pk"}, 422, "rank_on"),
    ({"model": "nope"}, 404, "nope"),
])
@pytest.mark.slow  # on this module's real server (a uvicorn start and cold computes, ~15 s a module)
def test_api_bad_input_is_a_4xx_with_a_message(api, params, status, text):
    message = err(api.get("/api/datapk", params={"model": "demo", **params}), status)
    assert text in message


def test_unrunnable_model_is_a_clear_422():
    from types import SimpleNamespace

    from headgraph.core.errors import UnsupportedModel
    from headgraph.server.computations.data_pk import data_pk as computation

    src = SimpleNamespace(patterns=None, info=SimpleNamespace(name="streamed-model"))
    with pytest.raises(UnsupportedModel, match="streamed-model cannot be run here"):
        computation(src, pairing="OK", prompts="text")  # type: ignore[arg-type]


def test_cli_datapk_prints_a_table(tmp_path, capsys):
    import json

    from headgraph.server.cli.main import main

    assert main(["datapk", "demo", "--pairing", "OK", "--top", "3",
                 "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "out_share" in out and "in_share" in out and "r/d = 0.1250" in out
    rows = [line.split() for line in out.splitlines() if line.strip().startswith(("1 ", "2 ", "3 "))]
    assert len(rows) == 3 and all(r[1] == "L0H0" and r[2].startswith("L1H") for r in rows)
    assert main(["datapk", "demo", "--rank-on", "in_share", "--top", "2", "--json",
                 "--cache-dir", str(tmp_path)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["rank_on"] == "in_share" and len(report["top"]) == 2
    assert set(report["top"][0]) >= {"source", "target", "pk", "cs", "out_share", "in_share"}
    assert main(["datapk", "demo", "--top", "0", "--cache-dir", str(tmp_path)]) == 2
