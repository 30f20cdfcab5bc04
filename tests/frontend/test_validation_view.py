"""The validation API's cache-only read, the pair panel's data-weighted PK and the validation
view, on the demo through the real in-process API: ``/api/validation?cached=true`` never
computes (``computed`` false until the validation is computed, then the same numbers as the
computing read); the pair panel shows "not computed" until /api/pair carries data_pk, then the
API's own values; the view's figures carry the API's numbers, opening it only reads, and its
run button shows the API's refusal in a lab without the token."""

from __future__ import annotations

import math

import pytest

from frontend_support import find, lab_dashboard
from headgraph.server.http.routers.vocabulary import served_vocabulary as vocabulary
from headgraph.frontend.api.client import ApiClient
from headgraph.frontend.callbacks.panels import pair_body
from headgraph.frontend.callbacks.validation import HIDE, SHOW, run_validation, validation_view
from headgraph.frontend.figures.validation import (comparison, validation_figure, validation_scatter_figure,
                                                   validation_words)
from headgraph.frontend.state.url import default_state, parse_query
from headgraph.frontend.state.readiness import view_params
from headgraph.frontend.api.names import Vocabulary

VOCAB = Vocabulary.from_json(vocabulary())
PARAMS = {"model": "demo", "pairing": "OK", "n": 8, "k": 2, "seed": 1}


def cell_value(body: list, cid: str) -> str:
    cell = find(body, cid)
    assert cell is not None, cid
    return cell.children.to_plotly_json()["props"]["data-value"]


def test_cached_validation_reads_only_then_equals_the_computed_answer(api: ApiClient, computed: list[str]) -> None:
    before = api.get("/api/validation", **PARAMS, cached="true")
    assert before["computed"] is False and before["cached_only"] is True and before["summary"] == {}
    assert not any(c.startswith("validation?") for c in api.model_info("demo")["cached"])  # nothing computed
    # The pair panel of an answer without data-weighted PK (before the job's 'datapk' stages
    # cached it; the job above has): "not computed".
    pair = {**api.pair("demo", "OK", "L0H0", "L1H3"), "data_pk": None}
    body = pair_body(pair, default_state(VOCAB, pair=("L0H0", "L1H3")))
    assert cell_value(body, "pair-datapk-out-text") == ""
    assert "not computed" in str(find(body, "pair-datapk-in-text").children.children)

    full = api.get("/api/validation", **PARAMS)  # computes (the demo runs here)
    after = api.get("/api/validation", **PARAMS, cached="true")
    assert full["computed"] is True and after["computed"] is True and after["cached_only"] is True
    assert after["summary"] == full["summary"] and after["edges"] == full["edges"]

    # The job (and validation) computed the data-weighted PK: the pair panel shows the API's values.
    pair = api.pair("demo", "OK", "L0H0", "L1H3")
    text = pair["data_pk"]["text"]
    body = pair_body(pair, default_state(VOCAB, pair=("L0H0", "L1H3")))
    assert float(cell_value(body, "pair-datapk-out-text")) == text["out_share"]
    assert float(cell_value(body, "pair-datapk-in-text")) == text["in_share"]
    if "random" not in pair["data_pk"]:
        assert cell_value(body, "pair-datapk-out-random") == ""


# -- the validation view ------------------------------------------------------------------------

def test_the_forest_plot_and_scatter_carry_the_apis_numbers(api: ApiClient) -> None:
    data = api.get("/api/validation", **PARAMS)  # cached by the test above (computed when run alone)
    fig = validation_figure(data)
    drawn = {(t.meta["prompts"], t.meta["stat"]): t for t in fig.data}
    assert set(data["summary"]) == {"text", "random", "text (held-out)"}  # data-PK fit on even, tested on odd
    assert set(drawn) == {(p, s) for p in data["summary"] for s in ("random_rho", "top_mean_effect")}
    for (prompts, stat), trace in drawn.items():
        rows = {r["metric"]: r[stat] for r in data["summary"][prompts]}
        assert list(trace.y) == data["metrics"] == list(rows)
        for m, x, cd, minus, plus in zip(trace.y, trace.x, trace.customdata, trace.error_x.arrayminus,
                                         trace.error_x.array):
            iv = rows[m]
            assert list(cd) == [m, iv["value"], iv["low"], iv["high"], iv["n"]]
            assert x == iv["value"]  # None (undefined) stays None: no point drawn
            if x is not None and iv["low"] is not None:
                assert x - minus == pytest.approx(iv["low"]) and x + plus == pytest.approx(iv["high"])
    scatter = validation_scatter_figure(data)
    held = data["held_out"]
    for trace in scatter.data:
        prompts, metric, pairs = trace.meta["prompts"], trace.meta["metric"], trace.meta["pairs"]
        # The held-out row: the refit data-weighted metrics against the odd text prompts' effect.
        value = f"{metric} (held-out)" if prompts == held["set"] and metric in held["metrics"] else metric
        effect = "effect_text_odd" if prompts == held["set"] else f"effect_{prompts}"
        want = [e for e in data["edges"] if (e["in_sample"] if pairs == "sample" else metric in e["top_of"])
                and e[value] is not None and math.isfinite(e[value])]
        assert [list(cd) for cd in trace.customdata] == [[e["source"], e["target"]] for e in want]
        assert list(trace.x) == [e[value] for e in want]
        assert list(trace.y) == [e[effect] for e in want]
    assert sum(len(t.x) for t in scatter.data if t.meta["pairs"] == "sample") == 3 * len(data["metrics"]) * sum(
        e["in_sample"] for e in data["edges"] if all(e[m] is not None for m in data["metrics"]))
    from headgraph.frontend.figures import export as exports  # the CSV buttons under the two figures

    assert len(exports.validation_csv(data).splitlines()) == 1 + 3 * sum(map(len, data["summary"].values()))
    assert len(exports.validation_edges_csv(data).splitlines()) == 1 + len(data["edges"])
    words = validation_words(data)
    assert f"{data['n_sample']} forward pairs" in words[0] and f"top-{data['k']}" in words[0]
    power = data["power"]
    assert f"8 random pairs of the 8 asked for: power {power['power']:.2f} to detect ρ = 0.3" in words[1]
    for prompts, line in zip(("text", "random"), words[2:]):
        rho = {r["metric"]: r["random_rho"] for r in data["summary"][prompts]}
        best = max((m for m in rho if rho[m]["value"] is not None), key=lambda m: rho[m]["value"])
        assert f"Spearman with the effect highest for {best} ({rho[best]['value']:.2f}" in line
        pk_cs = next(d for d in data["paired"][prompts] if d["metric_b"] == "CS")
        want = {"A": "PK better", "B": "CS better", "tie": "no difference", None: "undefined"}[pk_cs["verdict"]]
        assert f"on the same {pk_cs['n']} pairs (paired bootstrap): {want}" in line


@pytest.mark.slow  # the default validation measures all 64 of the demo's OK pairs (~30 s)
def test_the_view_shows_the_paired_verdicts_and_the_power(in_app: None, api: ApiClient) -> None:
    """The computed view (the API's default sample: 200 asked for, the demo's 64 OK pairs
    drawn) says how many pairs it drew of how many, their power, and every paired verdict."""
    from headgraph.core.stats.verdicts import spearman_power

    params = view_params(parse_query("?model=demo&view=validation&pairing=OK", VOCAB), "validation", None)
    before = validation_view(params)  # not computed yet: the planned sample's power
    planned = find(before[3], "validation-power").children
    assert f"200 random pairs asked for: power {spearman_power(200):.2f} to detect ρ = 0.3" in planned
    assert float(getattr(find(before[2], "stat-val-power"), "data-value")) == pytest.approx(spearman_power(200))
    data = api.validation("demo", "OK")  # computes the default validation (~40 s on two shared cores)
    assert (data["n_sample"], data["power"]["requested"], data["power"]["available"]) == (64, 200, 64)
    _fig, _scatter, chips_, words, run_box, _box = validation_view(params)
    assert run_box == HIDE
    assert getattr(find(chips_, "stat-val-n"), "data-value") == "64"
    assert getattr(find(chips_, "stat-val-requested"), "data-value") == "200"
    assert float(getattr(find(chips_, "stat-val-power"), "data-value")) == data["power"]["power"]
    assert "(all the model's 64 valid forward pairs)" in find(words, "validation-power").children
    table = find(words, "validation-paired")
    for prompts in ("text", "random"):
        for d in data["paired"][prompts]:
            row = find(table, f"paired-{prompts}-{d['metric_b'].replace(' ', '-')}")
            assert getattr(row, "data-verdict") == (d["verdict"] or "")
            assert getattr(row, "data-difference") == ("" if d["difference"] is None else repr(d["difference"]))
    assert "(baseline)" in str(find(table, "paired-text-source-variance").children[1].children)
    # Calibrated precision: each metric's top-k verified share against held-out null pairs, with its
    # exact test, which scipy's one-sided Fisher test on the same counts reproduces; refused
    # ("unresolved") where the calibration half is too small for the quantile.
    from scipy.stats import fisher_exact

    precision = find(words, "validation-precision")
    assert data["precision"] and {r["metric"] for r in data["precision"]} >= {"PK", "CS"}
    for r in data["precision"]:
        row = find(precision, "precision-" + r["metric"].replace(" ", "-"))
        if r["verified"] is None:  # the demo: 64 pairs less the top-k, halved, cannot resolve q = 0.9975
            assert not r["resolved"] and r["n_calibration"] < 90 and r["p_value"] is None
            assert getattr(row, "data-verified") == "" and "unresolved" in str(row.children[1].children)
            continue
        assert (getattr(row, "data-verified"), getattr(row, "data-k")) == (str(r["verified"]), str(r["k"]))
        assert getattr(row, "data-p") == repr(r["p_value"])
        table_2x2 = [[r["verified"], r["k"] - r["verified"]], [r["null_verified"], r["n_null"] - r["null_verified"]]]
        assert r["p_value"] == pytest.approx(fisher_exact(table_2x2, alternative="greater").pvalue, rel=1e-9)


def test_the_comparison_names_the_intervals_that_lie_below_the_best() -> None:
    iv = lambda v, lo, hi: {"value": v, "low": lo, "high": hi, "n": 40}  # noqa: E731
    stats = {"PK": iv(0.3, -0.05, 0.6), "CS": iv(0.28, -0.08, 0.59), "data-PK in": iv(0.69, 0.39, 0.89),
             "data-PK out": iv(0.24, -0.15, 0.58)}
    assert comparison(stats) == ("data-PK in", [])  # every other interval reaches above 0.39
    stats["CS"] = iv(0.1, -0.2, 0.35)
    assert comparison(stats) == ("data-PK in", ["CS"])
    assert comparison({"PK": iv(None, None, None)}) == (None, [])


def test_opening_the_view_only_reads_and_offers_the_run_button(in_app: None, api: ApiClient) -> None:
    state = parse_query("?model=demo&view=validation&pairing=OV", VOCAB)
    params = view_params(state, "validation", None)  # no job record needed: it reads its own cache
    assert params == {"model": "demo", "pairing": "OV", "ready": None}
    assert view_params(state.with_(view="graph"), "validation", None) is None  # another tab: not shown
    fig, _scatter, chips, note, run_box, scatter_box = validation_view(params)
    assert getattr(find(chips, "validation-state"), "data-computed") == "false"
    assert "not computed" in find(note, "validation-not-computed").children
    assert run_box == SHOW and scatter_box == HIDE and "not computed" in fig.layout.annotations[0].text
    assert not any(c.startswith("validation?") and "OV" in c for c in api.model_info("demo")["cached"])
    other = validation_view({**params, "pairing": "QK"})  # path ablation measures O -> Q/K/V only
    assert other[4] == HIDE and "QK" in str(other[2])


def test_running_it_without_the_lab_token_shows_the_apis_refusal(tmp_path) -> None:
    from dash import no_update

    with lab_dashboard(tmp_path, "validate-lab-token-0123456789") as http:
        refused = http.get("/api/validation", params={"model": "demo", "pairing": "OK"})
        assert refused.status_code == 401
        search = "?model=demo&view=validation&pairing=OK"
        # Reading needs no token: "not computed" and the button ...
        shown = validation_view(view_params(parse_query(search, VOCAB), "validation", None))
        assert getattr(find(shown[2], "validation-state"), "data-computed") == "false" and shown[4] == SHOW
        # ... which, without it, shows the API's own refusal.
        token, note = run_validation(1, search)
        assert token is no_update and note.children == refused.json()["error"]["message"]
