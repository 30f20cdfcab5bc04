"""Path ablation through the server (core's side is tests/core/test_ablation.py): the registered
computation, GET /api/ablation against core's path_ablation, GET /api/validation against
core.validation, and `headgraph verify`, on a real uvicorn subprocess on loopback
(tests/server/conftest.py's ``server`` and ``api``).
"""

from __future__ import annotations

import pytest

from headgraph.core.activations.ablation import path_ablation, top_edges
from headgraph.core.errors import UnsupportedModel
from headgraph.core.models.loading import load_model
from headgraph.core.scores.pk import projection_kernel

from api_support import err, ok

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one torch thread


@pytest.fixture(scope="module")
def demo():
    return load_model("demo", device="cpu")


@pytest.mark.slow  # on this module's real server (a uvicorn start and cold computes, ~15 s a module)
def test_api_top_edges_match_top_and_core(api, demo):
    body = ok(api.get("/api/ablation", params={"model": "demo", "pairing": "OK", "top": 4}))
    assert body["selection"] == "top 4 by PK" and body["n_prompts"] == {"text": 20, "random": 20}
    top = ok(api.get("/api/top", params={"model": "demo", "pairing": "OK", "k": 4}))["pairs"]
    assert [(e["source"], e["target"]) for e in body["edges"]] == \
        [(p["source"], p["target"]) for p in top]
    edges = top_edges(projection_kernel(demo.heads, "OK"), 4)
    direct = path_ablation(demo, edges)
    for row, p, e in zip(body["edges"], top, direct.effects, strict=True):
        assert row["pairing"] == "OK" and row["path"] == "K" and row["measure"] == "tvd"
        assert row["pk"] == pytest.approx(p["pk"]) and row["cs"] == pytest.approx(p["cs"])
        assert row["effect_text"] == pytest.approx(e.effects["text"], rel=1e-6)
        assert row["effect_random"] == pytest.approx(e.effects["random"], rel=1e-6)
    for rel in body["reliability"].values():
        assert rel["n_edges"] == 4
        assert rel["reliability"] is None or -1 <= rel["reliability"] <= 1
    again = api.get("/api/ablation", params={"model": "demo", "pairing": "OK", "top": 4})
    assert again.json() == body  # cached


@pytest.mark.slow  # on this module's real server (a uvicorn start and cold computes, ~15 s a module)
def test_api_one_edge_and_gqa(api):
    body = ok(api.get("/api/ablation", params={"model": "demo", "pairing": "OV",
                                               "edge": "l0h0, L1H3"}))
    (edge,) = body["edges"]
    assert (edge["source"], edge["target"], edge["measure"]) == ("L0H0", "L1H3",
                                                                 "relative_output")
    assert edge["effect_text"] > 0 and body["reliability"]["text"]["reliability"] is None
    gqa = ok(api.get("/api/ablation", params={"model": "local:qwen2-tiny", "pairing": "OK",
                                              "top": 3}))
    assert all("KV" in e["target"] for e in gqa["edges"]) and len(gqa["edges"]) == 3
    assert all(e["effect_random"] >= 0 for e in gqa["edges"])


@pytest.mark.parametrize(("params", "status", "text"), [
    ({"pairing": "QK"}, 422, "pairing"),
    ({"top": 0}, 422, "top"),
    ({"top": 51}, 422, "top"),
    ({"edge": "L0H0"}, 422, "edge"),
    ({"edge": "L1H0,L1H3"}, 404, "earlier layer"),
    ({"edge": "L0H9,L1H3"}, 404, "L0H9"),
    ({"edge": "L0H0,L1KV3"}, 404, "L1KV3"),
    ({"edge": "head0,L1H3"}, 422, "edge"),
    ({"model": "nope"}, 404, "nope"),
])
@pytest.mark.slow  # on this module's real server (a uvicorn start and cold computes, ~15 s a module)
def test_api_bad_input_is_a_4xx_with_a_message(api, params, status, text):
    message = err(api.get("/api/ablation", params={"model": "demo", **params}), status)
    assert text in message


def test_unrunnable_model_is_a_clear_422():
    from types import SimpleNamespace

    from headgraph.server.computations.ablation import ablation

    src = SimpleNamespace(patterns=None, info=SimpleNamespace(name="streamed-model"))
    with pytest.raises(UnsupportedModel, match="streamed-model cannot be run here"):
        ablation(src, pairing="OK", edges=((0, 0, 1, 0),))  # type: ignore[arg-type]


def test_cli_verify_prints_a_table(tmp_path, capsys):
    from headgraph.server.cli.main import main

    assert main(["verify", "demo", "--pairing", "OK", "--top", "3",
                 "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "split-half reliability" in out and "effect random" in out
    rows = [line.split() for line in out.splitlines() if line.startswith("L0H0")]
    assert len(rows) == 3 and all(r[1].startswith("L1H") for r in rows)
    assert main(["verify", "demo", "--top", "0", "--cache-dir", str(tmp_path)]) == 2
    assert main(["verify", "demo", "--source", "L1H0", "--target", "L1H2",
                 "--cache-dir", str(tmp_path)]) == 2
    assert "earlier layer" in capsys.readouterr().err
    assert main(["verify", "demo", "--source", "L0H0", "--cache-dir", str(tmp_path)]) == 2
    assert "both --source and --target" in capsys.readouterr().err


# -- GET /api/validation: the metrics against the effects (core.validation) -------------------

@pytest.mark.slow  # on this module's real server (a uvicorn start and cold computes, ~15 s a module)
def test_api_validation_summarises_the_measured_pairs(api):
    import numpy as np
    from scipy.stats import spearmanr

    from headgraph.core.stats.verdicts import paired_spearman_difference, spearman_power

    # 100 asked for, the demo has 64 forward OK pairs: all of them are drawn, and the answer says so
    body = ok(api.get("/api/validation", params={"model": "demo", "pairing": "OK", "n": 100, "k": 5}))
    assert body["metrics"][:4] == ["PK", "CS", "CKA", "Procrustes"] and body["n_sample"] == 64
    for kind, name in (("cka", "CKA"), ("procrustes", "Procrustes")):  # the cached similarity grids
        rows = ok(api.get("/api/top", params={"model": "demo", "pairing": "OK", "k": 64, "metric": kind}))["pairs"]
        grid = {(r["source"], r["target"]): r[kind] for r in rows}
        assert all(e[name] == pytest.approx(grid[e["source"], e["target"]], rel=1e-6)
                   for e in body["edges"] if e["in_sample"])
    assert body["baselines"] == ["layer gap", "source variance"] == body["metrics"][-2:]
    power = body["power"]
    assert (power["requested"], power["n"], power["available"], power["rho"]) == (100, 64, 64, 0.3)
    assert power["power"] == pytest.approx(spearman_power(64, 0.3)) and power["n_for_80"] == 90
    edges = body["edges"]
    sample = [e for e in edges if e["in_sample"]]
    assert len(sample) == 64
    assert not any(e["top_of"] and set(e["top_of"]) & set(body["baselines"]) for e in edges)  # no top-k
    # The decision rule: PK minus each other metric on the same random pairs (paired bootstrap).
    for prompts in ("text", "random"):
        paired = {d["metric_b"]: d for d in body["paired"][prompts]}
        assert set(paired) == set(body["metrics"]) - {"PK"}
        eff = [e[f"effect_{prompts}"] for e in sample]
        for other in ("CS", "CKA", "Procrustes"):  # PK - CS, PK - CKA, PK - Procrustes
            want = paired_spearman_difference([e["PK"] for e in sample], [e[other] for e in sample], eff,
                                              names=("PK", other), seed=0)
            assert paired[other] == pytest.approx(want.to_dict())
        cs = paired["CS"]
        assert cs["difference"] == pytest.approx(spearmanr([e["PK"] for e in sample], eff).statistic
                                                 - spearmanr([e["CS"] for e in sample], eff).statistic)
        assert paired["layer gap"]["verdict"] is None  # the demo's pairs are all one layer apart
        assert all(e["layer gap"] == -1.0 for e in sample)
        share = paired["source variance"]
        assert share["rho_b"] == pytest.approx(spearmanr([e["source variance"] for e in sample], eff).statistic)
    top = ok(api.get("/api/top", params={"model": "demo", "pairing": "OK", "k": 5}))["pairs"]
    assert {(e["source"], e["target"]) for e in edges if "PK" in e["top_of"]} == \
        {(p["source"], p["target"]) for p in top}
    for e in edges:  # every pair's effect is the ablation endpoint's for that edge
        if e["source"] == top[0]["source"] and e["target"] == top[0]["target"]:
            one = ok(api.get("/api/ablation", params={"model": "demo", "pairing": "OK",
                                                      "edge": f"{e['source']},{e['target']}"}))
            assert e["effect_text"] == pytest.approx(one["edges"][0]["effect_text"], rel=1e-6)
    pk = {m["metric"]: m for m in body["summary"]["text"]}["PK"]
    rho = spearmanr([e["PK"] for e in sample], [e["effect_text"] for e in sample]).statistic
    assert pk["random_rho"]["value"] == pytest.approx(rho)
    assert pk["random_rho"]["low"] <= pk["random_rho"]["value"] <= pk["random_rho"]["high"]
    top_effects = [e["effect_text"] for e in edges if "PK" in e["top_of"]]
    assert pk["top_mean_effect"]["value"] == pytest.approx(np.mean(top_effects))
    # The demo's PK top-5 (L0H0 -> induction keys) move more attention than a random pair does.
    assert pk["top_mean_effect"]["value"] > np.mean([e["effect_text"] for e in sample])
    # Precision of each top-k against held-out random pairs: the sample without the top-k split in
    # seeded halves, thresholds from one half (the verdict's rule), the other half and the top-k
    # judged by them, scipy's Fisher test. The demo's 59 null pairs give 30 to calibrate, too few
    # for q = 0.995 (200 empirically, 90 for a tail fit): every row is unresolved, no verdict.
    from scipy.stats import fisher_exact

    from headgraph.core.stats.calibration import split_null, tail_threshold

    for row in body["precision"]:
        top_k = [e for e in edges if row["metric"] in e["top_of"]]
        null = [e for e in sample if row["metric"] not in e["top_of"]]
        cal_i, held_i = split_null(len(null), 0)
        cal, held = [null[i] for i in cal_i], [null[i] for i in held_i]
        q = 1 - 0.05 / (len(top_k) * 2)
        assert row["quantile"] == pytest.approx(q) and len(null) == 64 - 5
        assert (row["n_calibration"], row["n_null"]) == (len(cal), len(held)) == (30, 29)
        thresholds = {s: tail_threshold([e[f"statistic_{s}"] for e in cal if e[f"statistic_{s}"] is not None], q)[0]
                      for s in ("text", "random")}
        assert row["thresholds"] == thresholds
        if not row["resolved"]:
            assert row["verified"] is None and row["p_value"] is None and row["achieved_fwer"] is None
            continue
        live = {s: t for s, t in thresholds.items() if t is not None}

        def verified(rows, thresholds=live):
            return sum(any((e[f"statistic_{s}"] or -np.inf) > thresholds[s] for s in thresholds) for e in rows)
        assert (row["verified"], row["null_verified"]) == (verified(top_k), verified(held))
        p = fisher_exact([[verified(top_k), 5 - verified(top_k)], [verified(held), len(held) - verified(held)]],
                         alternative="greater").pvalue
        assert row["p_value"] == pytest.approx(p)
    assert {r["metric"] for r in body["precision"]} == set(body["metrics"]) - set(body["baselines"])
    assert not any(r["resolved"] for r in body["precision"])
    # Association beyond the trivial baselines: each metric's partial Spearman given them.
    assoc = {r["metric"]: r for r in body["association"]["text"]}
    assert assoc["PK"]["partial"]["given"] == ["layer gap", "source variance"] and assoc["PK"]["partial"]["n"] == 64
    assert assoc["PK"]["spearman"] == pytest.approx(spearmanr([e["PK"] for e in sample],
                                                              [e["effect_text"] for e in sample]).statistic)
    # Held out: data-PK refit on the even text prompts against the effects on the odd ones.
    held = body["held_out"]
    assert held["set"] == "text (held-out)" and held["metrics"] == ["data-PK out", "data-PK in", "source variance"]
    rows = {m["metric"]: m for m in body["summary"][held["set"]]}
    odd = [e["effect_text_odd"] for e in sample]
    for metric in held["metrics"]:
        fit = [e[f"{metric} (held-out)"] for e in sample]
        assert rows[metric]["random_rho"]["value"] == pytest.approx(spearmanr(fit, odd).statistic)
        assert fit != [e[metric] for e in sample]  # refit on half the prompts
    assert rows["PK"]["random_rho"]["value"] == pytest.approx(spearmanr([e["PK"] for e in sample], odd).statistic)
    assert {d["metric_b"] for d in body["paired"][held["set"]]} == set(body["metrics"]) - {"PK"}
    from headgraph.server.cli.validate import validation_text  # the CLI prints both

    text = validation_text(body)
    assert "text (held-out) prompts" in text
    for r in body["precision"]:
        assert (f"{r['metric']}: unresolved (q = {r['quantile']:.4g}: {r['n_calibration']} calibration pairs"
                if r["verified"] is None else
                f"{r['metric']}: {r['verified']} of {r['k']} verified vs {r['null_verified']} of {r['n_null']}") in text


@pytest.mark.parametrize(("params", "status", "text"), [
    ({"pairing": "QK"}, 422, "pairing"), ({"n": 0}, 422, "n"), ({"n": 1001}, 422, "n"), ({"k": 21}, 422, "k"),
    ({"model": "nope"}, 404, "nope"),
])
@pytest.mark.slow  # on this module's real server (a uvicorn start and cold computes, ~15 s a module)
def test_api_validation_bad_input_is_a_4xx(api, params, status, text):
    assert text in err(api.get("/api/validation", params={"model": "demo", **params}), status)
