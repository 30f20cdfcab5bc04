"""Data-weighted PK (core.data_pk): the share of a source head's output variance that falls in
a target's read subspace, and of the target's input variance the source contributes.

Checked against a direct float64 computation on the demo (activations captured through the
model's own z hook, the residual stream rebuilt from them by hand, explicit covariance
matrices, projectors U U^T from an SVD of the weights), for basis independence, for the
demo's induction circuit (the previous-token head's output is what the induction heads'
keys read, with heads found from attention patterns), on the real SmolLM2 GGUF (GQA shapes),
and through the API (a real uvicorn on loopback) and the CLI.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headgraph.core.activations.ablation import prompt_sets
from headgraph.core.activations.data_pk import (DATA_PK_PAIRINGS, activation_covariances, counted_positions,
                                    data_pk, data_weighted_pk)
from headgraph.core.errors import InvalidInput
from headgraph.core.models.loading import load_model
from headgraph.core.scores.subspaces import role_bases
from headgraph.core.types import RoleBases


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: threads only contend on a shared machine
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def demo():
    return load_model("demo", device="cpu")


@pytest.fixture(scope="module")
def demo_text(demo):
    return data_pk(demo, prompt_set="text")


@pytest.fixture(scope="module")
def demo_random(demo):
    return data_pk(demo, prompt_set="random")


def direct_demo(model, prompt_set):
    """out_share and in_share [L, H, L, H] per pairing, by hand in float64."""
    net = model.patterns  # the DemoModel
    sets, _ = prompt_sets(net)
    ids, mask = sets[prompt_set]
    zs = {}

    def hook(name, layer, t):
        if name == "z":
            zs[layer] = t.detach().transpose(1, 2).double()  # [B, T, H, dh]

    with torch.no_grad():
        net(ids, hook=hook)
    W_O = net.W_O.detach().double()
    L, H = W_O.shape[:2]
    keep = (mask & (mask.long().cumsum(-1) > 1)).numpy()  # real positions but the first
    outs = [torch.einsum("bthe,hed->bthd", zs[a], W_O[a]) for a in range(L)]  # [B, T, H, d]
    resid = [net.W_E.detach().double()[ids]]
    resid.append(resid[0] + outs[0].sum(2) + net.b_O.detach().double()[0])
    covs_o = [[np.cov(outs[a][..., h, :].numpy()[keep], rowvar=False, bias=True)
               for h in range(H)] for a in range(L)]
    covs_x = [np.cov(resid[b].numpy()[keep], rowvar=False, bias=True) for b in range(L)]
    out = {}
    for pairing in DATA_PK_PAIRINGS:
        W = {"Q": net.W_Q, "K": net.W_K, "V": net.W_V}[pairing[1]].detach().double()
        U = torch.linalg.svd(W, full_matrices=False).U.numpy()  # [L, H, d, dh]
        o_sh = np.zeros((L, H, L, H))
        i_sh = np.zeros((L, H, L, H))
        for a in range(L):
            for b in range(a + 1, L):
                for h in range(H):
                    for t in range(H):
                        P = U[b, t] @ U[b, t].T
                        num = np.trace(P @ covs_o[a][h])
                        o_sh[a, h, b, t] = num / np.trace(covs_o[a][h])
                        i_sh[a, h, b, t] = num / np.trace(P @ covs_x[b])
        out[pairing] = (o_sh, i_sh)
    return out, int(keep.sum())


@pytest.mark.parametrize("prompt_set", ["text", "random"])
def test_matches_a_direct_float64_computation(demo, demo_text, demo_random, prompt_set):
    ours = demo_text if prompt_set == "text" else demo_random
    ref, n = direct_demo(demo, prompt_set)
    for pairing, (o_sh, i_sh) in ref.items():
        r = ours[pairing]
        assert r.n_positions == n and r.prompt_set == prompt_set
        assert r.out_share.shape == r.in_share.shape == (2, 8, 2, 8)
        assert r.valid[0, :, 1].all() and not r.valid[1].any() and not r.valid[:, :, 0].any()
        np.testing.assert_allclose(r.out_share.numpy(), o_sh, rtol=1e-5, atol=1e-9)
        np.testing.assert_allclose(r.in_share.numpy(), i_sh, rtol=1e-5, atol=1e-9)
        assert torch.all(r.out_share_baseline == 16 / 128)


def test_basis_independent(demo):
    cov = activation_covariances(demo.patterns, prompt_set="text")
    W_O = demo.heads.W_O
    gen = torch.Generator().manual_seed(0)
    for pairing in DATA_PK_PAIRINGS:
        bases = role_bases(demo.heads, pairing[1])
        q, _ = torch.linalg.qr(torch.randn(*bases.U.shape[:2], bases.rank, bases.rank,
                                           generator=gen, dtype=torch.float64))
        rotated = RoleBases(role=bases.role, U=bases.U.double() @ q, ranks=bases.ranks,
                            rank=bases.rank, rtol=bases.rtol)
        a, b = (data_weighted_pk(cov, W_O, x, pairing) for x in (bases, rotated))
        torch.testing.assert_close(a.out_share, b.out_share, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(a.in_share, b.in_share, rtol=1e-9, atol=1e-12)


def test_previous_token_head_is_what_the_induction_keys_read(demo, demo_random):
    """The demo's circuit seen in the data: heads identified from attention patterns, the
    expectation stated relative to the other sources, paths and random baselines."""
    from headgraph.core.activations.patterns import pattern_scores

    scores = pattern_scores(demo.patterns)
    prev = int(scores.previous_token[0].argmax())  # layer 0's previous-token head
    induction = torch.nonzero(scores.induction[1] > 0.4).flatten().tolist()
    assert induction, scores.induction[1]
    k, q, v = demo_random["OK"], demo_random["OQ"], demo_random["OV"]
    for t in induction:
        shares = k.in_share[0, :, 1, t]
        others = torch.cat([shares[:prev], shares[prev + 1:]])
        assert int(shares.argmax()) == prev, shares
        assert float(shares[prev]) > 2 * float(others.max())  # the source the keys read most
        assert float(shares[prev]) > float(k.in_share_baseline[0, prev, 1])  # above random
        # the keys read the previous-token head's output more than queries and values do
        assert float(shares[prev]) > float(q.in_share[0, prev, 1, t])
        assert float(shares[prev]) > float(v.in_share[0, prev, 1, t])
        assert float(k.out_share[0, prev, 1, t]) > 2 * float(k.out_share_baseline[1, t])


def test_ranges_and_bad_input(demo, demo_text):
    for r in demo_text.values():
        assert float(r.out_share.min()) >= 0 and float(r.out_share.max()) <= 1
        assert torch.isfinite(r.in_share).all() and float(r.in_share.min()) >= 0
    d = demo_text["OK"].to_dict()
    assert set(d) >= {"out_share", "in_share", "valid", "out_share_baseline", "method"}
    with pytest.raises(InvalidInput, match="O->Q/K/V"):
        data_pk(demo, ["QK"])
    with pytest.raises(InvalidInput, match="prompt set"):
        data_pk(demo, prompt_set="nope")
    assert counted_positions(torch.tensor([[0, 1, 1, 0]], dtype=torch.bool)).tolist() == \
        [[False, False, True, False]]


# -- server: the registered computation, GET /api/datapk, the pair answer, `headgraph datapk` --

from api_support import api, err, model_root, ok, server  # noqa: E402,F401  (fixtures by name)


def _grid(values):
    return np.array([[[[np.nan if v is None else v for v in row] for row in b] for b in a]
                     for a in values], dtype=np.float64)


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
