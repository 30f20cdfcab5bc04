"""`headgraph report MODEL`: the findings page end to end on the demo, its claim rules at their
boundaries on real demo API answers, and the CLI's plugin loader.

One report run (it starts its own server on loopback, on a fresh cache), then the API
in-process on that warm cache for independent reads.
"""

from __future__ import annotations

import copy
import re
import socket
import struct
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from headgraph.frontend.report import claims
from headgraph.frontend.report.claims import FAILS, HOLDS, NA, PARTLY, all_verdicts
from headgraph.frontend.report.numbers import GRAPH_PAIRINGS, ApiFailure, collect
from headgraph.frontend.report.markdown import MARK, fmt, summary_section

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """`headgraph report demo` as a user runs it (it starts its own server), into a tmp folder."""
    tmp = tmp_path_factory.mktemp("report")
    cmd = [sys.executable, "-m", "headgraph.server.cli.main", "report", "demo", "--out", str(tmp / "docs"),
           "--cache-dir", str(tmp / "cache")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)  # with three task circuits
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"tmp": tmp, "stdout": proc.stdout, "stderr": proc.stderr,
            "page": tmp / "docs" / "findings" / "demo.md"}


@pytest.fixture(scope="module")
def api(run: dict[str, Any]) -> Iterator[httpx.Client]:
    """The API in-process on the report's (now warm) cache: reads independent of the report."""
    from fastapi.testclient import TestClient

    from headgraph.server.http.app import create_app
    from headgraph.server.settings import Settings

    with TestClient(create_app(Settings(cache_dir=run["tmp"] / "cache", compute_processes=0))) as http:
        yield http


@pytest.fixture(scope="module")
def numbers(api: httpx.Client) -> dict[str, Any]:
    return collect(api, "demo")


def row_of(page: str, first_cell: str) -> list[str]:
    """The cells of the markdown table row whose first cell is ``first_cell``."""
    for line in page.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first_cell:
            return cells
    raise AssertionError(f"no table row {first_cell!r}")


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and data[12:16] == b"IHDR", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


# -- the command, end to end -------------------------------------------------------------------

@pytest.mark.slow  # needs the report run (`headgraph report demo`, ~25 s)
def test_page_names_every_claim_with_the_verdict_the_rules_give(run: dict[str, Any], api: httpx.Client,
                                                                 numbers: dict[str, Any]) -> None:
    page = run["page"].read_text(encoding="utf-8")
    verdicts = all_verdicts(numbers)
    tasks = [t["name"] for t in api.get("/api/tasks").json()["tasks"] if t["bundled"]]
    assert {v.key for v in verdicts} == {"kl", "hub", "tokens", "pk_vs_cs", "induction",
                                          *(f"circuit_{t}" for t in tasks)}
    assert {"ioi", "induction"} <= set(tasks)  # every bundled task, at least these two
    for v in verdicts:
        assert v.claim in page and v.rule[1:] in page
        cells = row_of(page, v.claim)
        assert cells[1] == MARK[v.verdict] and cells[2] == v.because
        assert f"{v.key}: {v.verdict} ({v.because})" in run["stdout"]
    # The demo's known picture, measured: far from random; the induction edge is there but its
    # null (64 forward pairs) is too small to verify it at q = 0.9975, so only in part.
    by = {v.key: v.verdict for v in verdicts}
    assert by["induction"] == PARTLY and by["kl"] == HOLDS
    index = (run["page"].parent / "README.md").read_text(encoding="utf-8")
    assert "[demo](demo.md)" in index


@pytest.mark.slow  # needs the report run (`headgraph report demo`, ~25 s)
def test_printed_numbers_are_the_apis(run: dict[str, Any], api: httpx.Client) -> None:
    page = run["page"].read_text(encoding="utf-8")
    ref = api.get("/api/reference", params={"model": "demo"}).json()
    roles = ref["kl"]["roles"]
    for p in GRAPH_PAIRINGS:
        cells = row_of(page, p)
        kl = ref["kl"]["kl"][roles.index(p[0])][roles.index(p[1])]
        assert cells[1] == fmt(kl)
        assert cells[2] == fmt(ref["kl"]["histograms"][p]["model_mean"])
        assert cells[6] == f"{ref['nulls'][p]['significant_haar']} / {ref['nulls'][p]['valid_pairs']}"
    ab = api.get("/api/ablation", params={"model": "demo", "pairing": "OK", "top": 10}).json()
    for i, e in enumerate(ab["edges"]):
        cells = row_of(page, str(i + 1))
        assert [cells[1], cells[3], cells[5]] == [e["source"], e["target"], fmt(e["pk"])]
        assert cells[6:9] == [fmt(e["effect_text"]), fmt(e["effect_random"]), e["verdict"]]
    assert ab["verdict_rule"]["summary"] in page  # the null's quantile and thresholds, as the API states them
    val = api.get("/api/validation", params={"model": "demo", "pairing": "OK"}).json()
    for r in val["precision"]:  # each metric's top-k precision against the held-out random pairs
        cells = row_of(page, r["metric"])
        if r["verified"] is None:  # a null too small to resolve the quantile: no verdict printed
            assert cells[1:3] == ["unresolved", "–"]
        else:
            assert cells[1:3] == [f"{r['verified']} / {r['k']}", f"{r['null_verified']} / {r['n_null']}"]


@pytest.mark.slow  # needs the report run (`headgraph report demo`, ~25 s)
def test_the_recovery_section_prints_the_apis_tables(run: dict[str, Any], api: httpx.Client) -> None:
    from headgraph.frontend.report.markdown import fmt_ci

    page = run["page"].read_text(encoding="utf-8")
    section = page[page.index("## 6. Recovery"):]
    assert "label set `patterns`" in section  # the demo's own set (no built-in one names it)
    for p in GRAPH_PAIRINGS:
        rec = api.get("/api/recovery", params={"model": "demo", "pairing": p, "labels": "patterns",
                                               "k": 20}).json()
        part = section[section.index(f"**{p}**"):]
        assert f"{rec['n_reference']} of {rec['n_valid']} valid pairs" in part.splitlines()[0]
        for r in rec["rows"]:
            cells = row_of(part, r["metric"])  # the first such row after the pairing's heading
            assert cells[1:4] == [fmt_ci(r["endpoint_share"]), fmt_ci(r["precision"]), fmt_ci(r["auc"])]


@pytest.mark.slow  # needs the report run (`headgraph report demo`, ~25 s)
def test_the_subspaces_section_prints_the_apis_comparison(run: dict[str, Any], api: httpx.Client) -> None:
    from headgraph.frontend.report.markdown import fmt_ci

    page = run["page"].read_text(encoding="utf-8")
    section = page[page.index("## 7. Raw vs norm-aware subspaces"):]
    assert "`demo@norm`" in section and "label set `patterns`" in section and "lies above 0" in section
    words = {"norm": "norm-aware", "raw": "raw", "tie": "no difference", None: "undefined"}
    for p in GRAPH_PAIRINGS:
        sub = api.get("/api/subspaces", params={"model": "demo", "pairing": p, "labels": "patterns",
                                                "k": 20}).json()
        assert sub["norm"] == "demo@norm" and sub["norm_gains"] in section
        rows = {r["metric"]: r for r in sub["recovery"]["rows"]}
        d = sub["auc_difference"]
        cells = row_of(section, p)
        assert cells[1:6] == [fmt(sub["spearman"], 4), f"{sub['n_shared']} / 20", fmt_ci(rows["raw"]["auc"]),
                              fmt_ci(rows["norm"]["auc"]),
                              f"{d['value']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"]
        # the stated rule, applied to the printed interval
        want = "norm" if d["low"] > 0 else "raw" if d["high"] < 0 else "tie"
        assert sub["verdict"] == want and cells[6] == words[want]


def _signed3(est: dict[str, Any] | None) -> str:
    return "—" if est is None else f"{est['value']:+.3f} [{est['low']:+.3f}, {est['high']:+.3f}]"


def _rule(answers: dict[str, httpx.Response]) -> str:
    """The task-circuit rule, applied here to the API's answers: ROC-AUC(CS) − PK's paired interval per
    pairing, then the layer gap and random where PK won."""
    def side(d: dict[str, Any]) -> str:
        return "A" if d["high"] < 0 else "B" if d["low"] > 0 else "tie"
    tables = {p: {r["metric"]: r for r in a.json()["rows"]} for p, a in answers.items()
              if a.status_code == 200 and a.json()["n_reference"]}
    cs = {p: side(t["cs"]["auc_diff"]) for p, t in tables.items()}
    if not cs:
        return NA
    wins = [p for p, v in cs.items() if v == "A"]
    if "B" in cs.values() or not wins:
        return FAILS
    if any(side(tables[p][b]["auc_diff"]) != "A" for p in wins for b in ("layer_gap", "random")):
        return claims.BASELINE_BEATS
    return HOLDS if len(wins) == len(cs) else PARTLY


@pytest.mark.slow  # needs the report run (`headgraph report demo` with its task circuits, ~2 min)
def test_the_task_circuit_section_prints_the_apis_tables(run: dict[str, Any], api: httpx.Client) -> None:
    from headgraph.frontend.report.markdown import fmt_ci

    page = run["page"].read_text(encoding="utf-8")
    section = page[page.index("## 8. Recovery of task circuits"):]
    tasks = [t["name"] for t in api.get("/api/tasks").json()["tasks"] if t["bundled"]]
    able = {}
    for task in tasks:
        part = section[section.index(f"### Task `{task}`"):]
        part = part[:part.find("### Task", 4)] if "### Task" in part[4:] else part
        circuit = api.get("/api/circuit", params={"model": "demo", "task": task, "top": 1}).json()
        metrics = circuit["metrics"]
        able[task] = metrics["able"]
        claim = next(line for line in page.splitlines() if line.startswith(f"| PK recovers the {task} circuit"))
        if not metrics["able"]:  # one sentence, no table, and the claim not applicable
            assert "does not do this task" in part and f"clean accuracy {metrics['clean_accuracy']:.0%}" in part
            assert "| metric |" not in part and MARK[NA] in claim
            continue
        answers = {p: api.get("/api/recovery", params={"model": "demo", "task": task, "pairing": p, "k": 20})
                   for p in GRAPH_PAIRINGS}
        for p, a in answers.items():
            if a.status_code != 200:  # the API's refusal is what the page says
                message = a.json()["error"]["message"]
                assert a.status_code == 422 and f"has no {p} head -> head edge" in message
                assert message.split(f" {p} ", 1)[1] in part
                continue
            rec = a.json()  # the default size: the circuit's own (the smallest reaching 0.8 of the gap)
            assert rec["circuit"]["size"] == circuit["circuit_size"] and rec["circuit"]["recovered"] >= 0.8
            block = part[part.index(f"**{p}**"):]
            assert f"{rec['n_reference']} of {rec['n_valid']} valid pairs" in block.splitlines()[0]
            for r in rec["rows"]:
                cells = row_of(block, r["metric"])
                assert cells[1:6] == [fmt_ci(r["endpoint_share"]), fmt_ci(r["precision"]), fmt_ci(r["auc"]),
                                      _signed3(r["precision_diff"]), _signed3(r["auc_diff"])]
        assert MARK[_rule(answers)] in claim, (task, claim)
    assert able["induction"]  # the demo is an induction model; the rule ran on its circuit's tables


@pytest.mark.slow  # needs the report run (`headgraph report demo`, ~2 min)
def test_task_circuit_rule_boundaries(numbers: dict[str, Any]) -> None:
    from headgraph.frontend.report import recovery
    from headgraph.frontend.report.claims import BASELINE_BEATS
    from headgraph.frontend.report.markdown import render

    def rows(n: dict[str, Any]) -> list[dict[str, Any]]:
        """Every decided pairing's metric rows of the induction circuit."""
        return [d["rows"] for d in n["tasks"]["tasks"]["induction"]["pairings"].values()
                if "rows" in d and d["n_reference"]]

    def put(table: list[dict[str, Any]], metric: str, low: float, high: float) -> None:
        row = next(r for r in table if r["metric"] == metric)
        row["auc_diff"] = {"value": (low + high) / 2, "low": low, "high": high}

    def verdict(n: dict[str, Any]) -> str:
        return next(v for v in recovery.task_verdicts(n) if v.key == "circuit_induction").verdict

    n = copy.deepcopy(numbers)
    assert rows(n), "the demo's induction circuit has a decided pairing"
    for t in rows(n):
        for m in ("cs", "layer_gap", "random"):
            put(t, m, -0.2, -0.01)  # interval below 0: PK better
    assert verdict(n) == HOLDS
    put(rows(n)[0], "random", -0.2, 0.0)  # an interval reaching 0 is no difference: a baseline not beaten
    v = next(v for v in recovery.task_verdicts(n) if v.key == "circuit_induction")
    assert v.verdict == BASELINE_BEATS and "random on" in v.because
    put(rows(n)[0], "random", -0.2, -0.01)
    put(rows(n)[0], "cs", -0.1, 0.1)
    assert verdict(n) == (PARTLY if len(rows(n)) > 1 else FAILS)  # PK better on none: does not hold
    put(rows(n)[0], "cs", 0.01, 0.1)  # CS better somewhere
    assert verdict(n) == FAILS
    n["tasks"]["tasks"]["induction"]["circuit"]["metrics"]["able"] = False
    v = next(v for v in recovery.task_verdicts(n) if v.key == "circuit_induction")
    assert v.verdict == NA and v.because.startswith("the model does not do the task")
    n["tasks"]["tasks"]["induction"]["circuit"]["metrics"]["able"] = None  # the sign tests' third state
    v = next(v for v in recovery.task_verdicts(n) if v.key == "circuit_induction")
    p = n["tasks"]["tasks"]["induction"]["circuit"]["metrics"]["ability"]["follows"]["p"]
    assert v.verdict == NA and v.because.startswith("too few prompt pairs to tell whether the model does the task")
    assert f"clean above corrupt p = {p:.2g}" in v.because
    # A stage that could not run: the section says why, every other section still renders.
    n = copy.deepcopy(numbers)
    n["tasks"] = {"unavailable": "GET /api/tasks -> 503: overloaded", "failure": True}
    page = render(n, all_verdicts(n), [], "demo")
    assert "## 8. Recovery of task circuits\n\nNot available: GET /api/tasks -> 503: overloaded." in page
    assert "## 7. Raw vs norm-aware subspaces" in page and "## 5. The induction circuit" in page
    assert [line for line in page.splitlines() if line.startswith("| PK recovers")] == [
        f"| {recovery.CLAIM} | {MARK[NA]} | GET /api/tasks -> 503: overloaded |"]
    n = copy.deepcopy(numbers)
    n["tasks"]["tasks"]["induction"]["pairings"]["OK"] = {"unavailable": "GET /api/recovery -> 500: boom",
                                                          "failure": True}
    page = render(n, all_verdicts(n), [], "demo")
    assert "**OK**: not available: GET /api/recovery -> 500: boom." in page


def test_a_task_stage_without_a_server_is_a_reason_not_a_crash() -> None:
    """The task stage on a dead server: an ``unavailable`` marker with the error, not an exception."""
    from headgraph.frontend.report.numbers import task_recovery

    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    with httpx.Client(base_url=url, timeout=5) as client:
        answer = task_recovery(client, "demo")
    assert answer["failure"] is True and answer["unavailable"].startswith("GET /api/tasks: ")


@pytest.mark.slow  # needs the report run (`headgraph report demo`, ~25 s)
def test_figures_are_linked_pngs(run: dict[str, Any]) -> None:
    page = run["page"].read_text(encoding="utf-8")
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", page)
    names = {Path(link).name for link in links}
    assert {"graph.png", "kl.png", "reference-OK.png", "ablation.png", "validation.png"} <= names
    total = 0
    for link in links:
        path = run["page"].parent / link
        width, height = png_size(path)
        assert width >= 400 and height >= 250
        total += path.stat().st_size
    assert total < 1_000_000  # small enough to commit
    assert sorted(p.name for p in (run["page"].parent / "demo").iterdir()) == sorted(names)


@pytest.mark.slow  # needs the report run (`headgraph report demo`, ~25 s)
def test_bad_model_or_server_is_one_line_and_exit_2(api: httpx.Client, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ApiFailure, match="no-such-model"):
        collect(api, "no-such-model")  # the API's own 404 message, named
    from headgraph.server.cli import main as cli

    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    assert cli.main(["report", "no-such-model", "--url", url, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("headgraph: error: GET /api/health")
    assert not (tmp_path / "findings").exists()


# -- the rules at their boundaries, on the demo's real answers ---------------------------------

def _kl_set(n: dict[str, Any], pairing: str, kl: float | None = None, shift: float | None = None) -> None:
    ref = n["reference"]
    roles = ref["kl"]["roles"]
    if kl is not None:
        ref["kl"]["kl"][roles.index(pairing[0])][roles.index(pairing[1])] = kl
    if shift is not None:
        haar = ref["nulls"][pairing]["summary_haar"]
        ref["kl"]["histograms"][pairing]["model_mean"] = haar["mean"] + shift * haar["std"]


@pytest.mark.slow  # needs the report run (`headgraph report demo`, ~25 s)
def test_kl_rule_boundaries(numbers: dict[str, Any]) -> None:
    assert claims.claim_far_from_random(numbers).verdict == HOLDS
    n = copy.deepcopy(numbers)
    _kl_set(n, "OK", kl=claims.KL_MIN)  # >= KL_MIN is far
    assert claims.claim_far_from_random(n).verdict == HOLDS
    _kl_set(n, "OK", kl=claims.KL_MIN * (1 - 1e-9))
    assert claims.claim_far_from_random(n).verdict == PARTLY
    n = copy.deepcopy(numbers)  # the mean shift is reported beside KL, never folded into the rule
    for p in GRAPH_PAIRINGS:
        _kl_set(n, p, shift=0.0)
    v = claims.claim_far_from_random(n)
    assert v.verdict == HOLDS and all(r["shift_std"] == pytest.approx(0.0) for r in v.evidence["pairings"])
    for p in GRAPH_PAIRINGS:
        _kl_set(n, p, kl=0.0)
    assert claims.claim_far_from_random(n).verdict == FAILS


def _set_pattern(n: dict[str, Any], head: str, **scores: float) -> None:
    layer, index = (int(x) for x in head[1:].split("H"))
    row = n["patterns"]["layer_indices"].index(layer)
    for kind in n["patterns"]["kinds"]:
        n["patterns"]["scores"][kind][row][index] = scores.get(kind, 0.0)


@pytest.mark.slow  # needs the report run (`headgraph report demo`, ~25 s)
def test_hub_rule_boundaries(numbers: dict[str, Any]) -> None:
    v = claims.claim_identity_hub(numbers)
    top = next(r for r in numbers["graph"]["hubs"]["rows"] if r["is_hub"] and "KV" not in r["name"])
    p = numbers["patterns"]
    row = p["layer_indices"].index(int(top["name"][1:].split("H")[0]))
    kinds = [k for k in p["kinds"] if p["scores"][k][row][int(top["name"].split("H")[1])] >= claims.PATTERN_MIN]
    assert v.verdict == (HOLDS if kinds == ["identity"] else PARTLY if "identity" in kinds else FAILS)
    assert top["name"] in v.because
    for scores, verdict in (({"identity": 0.9}, HOLDS), ({"identity": 0.9, "induction": 0.5}, PARTLY),
                            ({"induction": 0.9}, FAILS)):
        n = copy.deepcopy(numbers)
        _set_pattern(n, top["name"], **scores)
        assert claims.claim_identity_hub(n).verdict == verdict, scores
    n = copy.deepcopy(numbers)
    n["patterns"] = {"unavailable": "no pattern scores"}
    assert claims.claim_identity_hub(n).verdict == NA
    n = copy.deepcopy(numbers)
    for row in n["graph"]["hubs"]["rows"]:
        row["is_hub"] = False
    assert claims.claim_identity_hub(n).verdict == NA


@pytest.mark.slow  # needs the report run (`headgraph report demo`, ~25 s)
def test_tokens_rule_boundaries(numbers: dict[str, Any]) -> None:
    from scipy.stats import binomtest

    v = claims.claim_tokens(numbers)
    answers = [numbers["tokens"][r] for r in claims.ROLES]
    assert v.evidence["above"] == sum(sum(t["anisotropic"]["above"].values()) for t in answers)
    assert v.evidence["above_haar"] == sum(sum(h["above_baseline"] for h in t["heads"]) for t in answers)
    total = sum(len(t["heads"]) for t in answers)
    assert v.evidence["chance"] == pytest.approx(0.05) and answers[0]["anisotropic"]["samples"] == 200
    assert v.evidence["p_value"] == pytest.approx(binomtest(v.evidence["above"], total, 0.05,
                                                            alternative="greater").pvalue)
    assert v.verdict == (HOLDS if v.evidence["p_value"] < claims.TOKENS_ALPHA else FAILS)
    # The boundary: the smallest count whose binomial tail is below alpha (scipy), and one less.
    need = next(c for c in range(total + 1)
                if binomtest(c, total, 0.05, alternative="greater").pvalue < claims.TOKENS_ALPHA)
    n = copy.deepcopy(numbers)
    for role in claims.ROLES:
        n["tokens"][role]["anisotropic"]["n_above"] = 0
    n["tokens"]["O"]["anisotropic"]["n_above"] = need
    assert claims.claim_tokens(n).verdict == HOLDS
    n["tokens"]["O"]["anisotropic"]["n_above"] = need - 1
    assert claims.claim_tokens(n).verdict == FAILS
    for role in claims.ROLES:
        n["tokens"][role] = {"unavailable": "GET /api/tokens -> 422: no unembedding"}
    assert claims.claim_tokens(n).verdict == NA


def _paired(n: dict[str, Any], prompts: str) -> dict[str, Any]:
    return next(d for d in n["validation"]["paired"][prompts] if d["metric_b"] == "CS")


def _set_baseline(n: dict[str, Any], prompts: str, baseline: str, verdict: str) -> None:
    """Set (or add) the paired PK - ``baseline`` row's verdict on ``prompts``."""
    rows = n["validation"]["paired"][prompts]
    row = next((d for d in rows if d["metric_b"] == baseline), None)
    if row is None:
        row = dict(next(d for d in rows if d["metric_b"] == "CS"), metric_b=baseline)
        rows.append(row)
    row.update(verdict=verdict, difference={"A": 0.2, "B": -0.2, "tie": 0.0}[verdict],
               low={"A": 0.1, "B": -0.3, "tie": -0.1}[verdict], high={"A": 0.3, "B": -0.1, "tie": 0.1}[verdict])


@pytest.mark.slow  # needs the report run (`headgraph report demo`, ~25 s)
def test_pk_vs_cs_rule_is_the_paired_difference(numbers: dict[str, Any]) -> None:
    from headgraph.core.stats.verdicts import paired_spearman_difference

    v = claims.claim_pk_beats_cs(numbers)
    val = numbers["validation"]
    sample = [e for e in val["edges"] if e["in_sample"]]
    for prompts in ("text", "random"):  # the evidence is the API's paired bootstrap, recomputed here
        eff = [e[f"effect_{prompts}"] for e in sample]
        want = paired_spearman_difference([e["PK"] for e in sample], [e["CS"] for e in sample], eff,
                                          names=("PK", "CS"), seed=val["seed"])
        assert v.evidence["paired"][prompts] == pytest.approx(want.to_dict())
    verdicts = {d["verdict"] for d in v.evidence["paired"].values()}
    assert v.verdict == (FAILS if "B" in verdicts or "A" not in verdicts else HOLDS if verdicts == {"A"} else PARTLY)
    n = copy.deepcopy(numbers)
    for prompts in ("text", "random"):
        _paired(n, prompts).update(verdict="A", low=0.01)
        _set_baseline(n, prompts, "layer gap", "A")
        _set_baseline(n, prompts, "source variance", "A")
    assert claims.claim_pk_beats_cs(n).verdict == HOLDS
    # A loud-source ranking beats PK where PK beats CS: the claim is not marked as holding.
    loud = copy.deepcopy(n)
    _set_baseline(loud, "text", "source variance", "B")
    v = claims.claim_pk_beats_cs(loud)
    assert v.verdict == claims.BASELINE_BEATS and v.verdict != HOLDS
    assert v.evidence["baselines_not_beaten"] == {"source variance": {"text": "source variance better"}}
    assert "PK beats CS, but" in v.because and "not supported over the trivial baselines" in v.because
    page = summary_section([v])
    assert "⚠️ not supported over the trivial baselines" in page and "✅" not in page
    tie = copy.deepcopy(n)
    _set_baseline(tie, "random", "layer gap", "tie")  # a tie with a trivial baseline does not support it either
    assert claims.claim_pk_beats_cs(tie).verdict == claims.BASELINE_BEATS
    _paired(n, "random").update(verdict="tie", low=-0.01)
    v = claims.claim_pk_beats_cs(n)
    assert v.verdict == PARTLY and v.evidence["pk_better_on"] == ["text"]
    _paired(n, "random").update(verdict="B", high=-0.01)
    v = claims.claim_pk_beats_cs(n)
    assert v.verdict == FAILS and v.evidence["cs_better_on"] == ["random"] and "CS better" in v.because
    # Non-overlapping marginal intervals decide nothing any more: only the paired interval does.
    n = copy.deepcopy(numbers)
    for prompts in ("text", "random"):
        _paired(n, prompts).update(verdict="tie")
        rows = {r["metric"]: r for r in n["validation"]["summary"][prompts]}
        rows["PK"]["random_rho"]["low"] = rows["CS"]["random_rho"]["high"] + 0.1
    assert claims.claim_pk_beats_cs(n).verdict == FAILS
    n["validation"].pop("paired")  # an answer cached before the paired rule: not decided
    assert claims.claim_pk_beats_cs(n).verdict == NA
    n["validation"] = {"unavailable": "x: this GGUF cannot be run here"}
    v = claims.claim_pk_beats_cs(n)
    assert v.verdict == NA and v.because == "this model could not be run: x: this GGUF cannot be run here"


@pytest.mark.slow  # needs the report run (`headgraph report demo`, ~25 s)
def test_induction_rule_boundaries(numbers: dict[str, Any]) -> None:
    v = claims.induction_check(numbers)
    # The demo's null (its 64 forward OK pairs, halved) cannot resolve q = 0.9975: no verdict, so the
    # circuit is there but not verified (the rule refuses rather than judging against the null's maximum).
    assert v.verdict == PARTLY and v.evidence["verified"] == 0 and len(v.evidence["edges"]) == 10
    assert "without a verdict" in v.because
    n = copy.deepcopy(numbers)
    for e in n["ablation"]["edges"]:
        if e["source"] == "L0H0":
            e["verdict"] = "verified"
    v = claims.induction_check(n)
    assert v.verdict == HOLDS and v.evidence["verified"] >= 1
    n = copy.deepcopy(numbers)
    for e in n["ablation"]["edges"]:
        e["verdict"] = "no effect"
    assert claims.induction_check(n).verdict == PARTLY  # the circuit is there, none verified
    n = copy.deepcopy(numbers)
    for source in {e["source"] for e in n["ablation"]["edges"]}:
        _set_pattern(n, source, identity=0.9)  # no source is a previous-token head any more
    assert claims.induction_check(n).verdict == FAILS
    n = copy.deepcopy(numbers)
    n["ablation"] = {"unavailable": "x: this GGUF cannot be run here"}
    v = claims.induction_check(n)
    assert v.verdict == NA and v.because.startswith("this model could not be run: x: this GGUF")


def test_kv_groups_neither_decide_the_hub_nor_inherit_a_members_kind() -> None:
    """On a grouped-query graph: a KV-group hub is listed apart; a KV-group target is induction only
    when every query head of the group is."""
    patterns = {"layer_indices": [0, 1], "kinds": ["identity", "previous_token", "induction"],
                "scores": {"identity": [[0.9, 0.0], [0.0, 0.0]], "previous_token": [[0.0, 0.8], [0.0, 0.0]],
                           "induction": [[0.0, 0.0], [0.9, 0.1]]}}
    nodes = [{"id": "L0H0"}, {"id": "L0H1"}, {"id": "L1KV0", "heads": "L1H0,L1H1"}]
    rows = [{"name": "L1KV0", "is_hub": True, "degree": 5, "in_degree": 5, "out_degree": 0},
            {"name": "L0H0", "is_hub": True, "degree": 3, "in_degree": 0, "out_degree": 3}]
    numbers = {"patterns": patterns, "graph": {"graph": {"nodes": nodes, "edges": []}, "hubs": {"rows": rows}}}
    v = claims.claim_identity_hub(numbers)
    assert v.verdict == HOLDS and "L0H0" in v.because  # the query head decides, the KV group is apart
    assert [h["name"] for h in v.evidence["kv_hubs"]] == ["L1KV0"]
    edge = {"source": "L0H1", "target": "L1KV0", "pk": 0.9, "cs": 0.1, "effect_text": 0.3, "effect_random": 0.3,
            "verdict": "verified"}
    numbers["ablation"] = {"edges": [edge], "verdict_rule": {"rule": "", "summary": ""}}
    v = claims.induction_check(numbers)
    assert v.verdict == FAILS and v.evidence["edges"][0]["target_kinds"] == {"L1H0": ["induction"], "L1H1": []}
    patterns["scores"]["induction"][1][1] = 0.5  # now every member of the group is an induction head
    assert claims.induction_check(numbers).verdict == HOLDS


# -- the plugin loader --------------------------------------------------------------------------

def test_plugins_broken_and_shadowing_are_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A real distribution on sys.path: a working plugin, a broken one, one named 'models'."""
    (tmp_path / "hgplug_demo.py").write_text(textwrap.dedent("""
        def add_parser(sub, cache_opt):
            p = sub.add_parser("zzhello", help="test plugin")
            cache_opt(p)
            p.set_defaults(func=lambda args: print("hello from a plugin") or 0)

        def shadow(sub, cache_opt):
            raise AssertionError("a plugin named like a built-in must not be loaded")
    """))
    info = tmp_path / "hgplug_demo-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hgplug-demo\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[headgraph.commands]\nzzhello = hgplug_demo:add_parser\n"
                                           "broken = hgplug_demo:does_not_exist\nmodels = hgplug_demo:shadow\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "hgplug_demo", raising=False)
    from headgraph.server.cli import main as cli
    from headgraph.server.cli import models

    parser = cli.build_parser()
    assert parser.parse_args(["models"]).func is models.run  # the built-in, not the shadowing plugin
    assert parser.parse_args(["report", "demo"]).model == "demo"  # the installed frontend's plugin
    assert cli.main(["zzhello"]) == 0
    assert "hello from a plugin" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        parser.parse_args(["broken"])
    assert cli.main(["cache", "info", "--cache-dir", str(tmp_path / "cache")]) == 0


def test_the_index_counts_every_verdict_kind(tmp_path) -> None:
    """The findings index counts each verdict of a page's table, "not supported over the
    trivial baselines" included (it was left out of the count)."""
    from headgraph.frontend.report.markdown import MARK, index_page

    rows = [f"| claim {i} | {mark} | evidence |" for i, mark in enumerate(MARK.values())]
    (tmp_path / "m.md").write_text("\n".join(["| claim | verdict | evidence |", "|---|---|---|", *rows, ""]))
    line = index_page(tmp_path).strip().splitlines()[-1]
    assert line == ("- [m](m.md): 1 holds, 1 partly holds, 1 does not hold, 1 not applicable here, "
                    "1 not supported over the trivial baselines")
