"""The recovery view on the demo through the real in-process API: its URL state, its controls,
the table and figure carrying GET /api/recovery's numbers (checked again against core's
head_recovery on the same reference), the CSV, and the clear messages of a label set that names
no head of the model or no edge of the pairing, of no label set and of a pairing without a
recovery table."""

from __future__ import annotations

import pytest

from frontend_support import READY, find
from headgraph.server.http.routers.vocabulary import served_vocabulary as vocabulary
from headgraph.frontend.api.client import ApiClient
from headgraph.frontend.api.names import Vocabulary
from headgraph.frontend.callbacks.recovery import recovery_view
from headgraph.frontend.figures.recovery import (DIFFS, STATS, estimate_text, recovery_csv,
                                                 recovery_figure, recovery_words)
from headgraph.frontend.layout.controls import control_groups
from headgraph.frontend.state.readiness import needed_stages, view_params
from headgraph.frontend.state.transitions import next_state
from headgraph.frontend.state.url import parse_query, to_query

VOCAB = Vocabulary.from_json(vocabulary())
SEARCH = "?model=demo&view=recovery&pairing=OK&overlay=patterns&k=10"


def test_the_url_holds_the_pairing_label_set_and_k() -> None:
    state = parse_query(SEARCH, VOCAB)
    assert (state.view, state.pairing, state.overlay, state.k) == ("recovery", "OK", "patterns", 10)
    assert parse_query(to_query(state), VOCAB) == state  # a copied link reopens the same table
    params = view_params(state, "recovery", READY)
    assert params == {"model": "demo", "pairing": "OK", "overlay": "patterns", "k": 10, "ready": "t1"}
    assert view_params(state.with_(view="graph"), "recovery", READY) is None  # another tab
    assert view_params(state, "recovery", None) is None  # waits for the model's PK and CS
    assert needed_stages(state, "recovery") == ("pk", "pk ", "cs ", "patterns")
    # A link without an overlay opens the model's default label set (the demo: its patterns).
    assert parse_query("?model=demo&view=recovery", VOCAB).overlay == "patterns"
    # The view's top-k box writes k, the reference box the label set.
    assert next_state(state, "recovery-k-input", 25, VOCAB).k == 25
    assert next_state(state, "overlay-select", "ioi_gpt2_small", VOCAB).overlay == "ioi_gpt2_small"


def test_the_controls_of_the_recovery_tab() -> None:
    groups = {g.id: g for g in control_groups(parse_query(SEARCH, VOCAB), VOCAB, [])}
    shown = {gid for gid, g in groups.items() if g.style != {"display": "none"}}
    assert shown == {"ctl-pairing", "ctl-overlay", "ctl-recovery"}
    assert groups["ctl-overlay"].children[0].children == "reference"
    k_box = find(groups["ctl-recovery"], "recovery-k-input")
    assert k_box.value == 10 and k_box.max == VOCAB.limits.recovery_k_max == 200  # the API's bound


def test_the_table_and_figure_carry_the_apis_numbers(in_app: None, api: ApiClient, computed: list[str]) -> None:
    from headgraph.core.models.loading import load_model
    from headgraph.core.stats.recovery import head_recovery

    params = view_params(parse_query(SEARCH, VOCAB), "recovery", READY)
    fig, chips, body = recovery_view(params)
    data = api.recovery("demo", "OK", "patterns", 10)  # what the view read (cached now)
    assert data["n_valid"] == 64 and 0 < data["n_reference"] < 64
    table = find(body, "recovery-table")
    for row in data["rows"]:
        for key, _ in (*STATS, *DIFFS):
            cell = find(table, f"recovery-{row['metric']}-{key}")
            est = row[key]
            if est is None:  # PK's own paired differences
                assert row["metric"] == "pk" and cell.children == "(baseline)"
                continue
            for end in ("value", "low", "high"):
                assert getattr(cell, f"data-{end}") == ("" if est[end] is None else repr(est[end]))
            assert cell.children == estimate_text(est, signed=key in dict(DIFFS))
    # The figure: ROC-AUC per metric with its interval, in the table's order.
    (trace,) = fig.data
    assert [cd[0] for cd in trace.customdata] == [r["metric"] for r in data["rows"]]
    for cd, x, minus, plus, row in zip(trace.customdata, trace.x, trace.error_x.arrayminus, trace.error_x.array,
                                       data["rows"]):
        auc = row["auc"]
        assert list(cd[1:]) == [auc["value"], auc["low"], auc["high"]] and x == auc["value"]
        assert x - minus == pytest.approx(auc["low"]) and x + plus == pytest.approx(auc["high"])
    assert fig.to_dict() == recovery_figure(data).to_dict()
    assert getattr(find(chips, "stat-rec-reference"), "data-value") == str(data["n_reference"])
    assert [find(body, f"recovery-words-{i}").children for i in range(3)] == recovery_words(data)
    # Independent of the server: core's head_recovery on the same heads gives the same PK row.
    core = head_recovery(load_model("demo", device="cpu").heads, "OK", data["reference_heads"], k=10,
                         n_resamples=data["n_resamples"], seed=0)
    pk = core.row("pk").to_dict()
    assert float(getattr(find(table, "recovery-pk-auc"), "data-value")) == pytest.approx(pk["auc"]["value"])
    assert float(getattr(find(table, "recovery-cs-precision"), "data-value")) == pytest.approx(
        core.row("cs").to_dict()["precision"]["value"])
    csv_rows = recovery_csv(data).splitlines()
    assert len(csv_rows) == 1 + sum(1 for r in data["rows"] for key, _ in (*STATS, *DIFFS) if r[key] is not None)


def test_a_label_set_with_nothing_to_recover_says_so(in_app: None, api: ApiClient, computed: list[str]) -> None:
    base = view_params(parse_query(SEARCH, VOCAB), "recovery", READY)
    # A set naming only heads the demo (2 layers of 8 heads) does not have.
    api.upload_labels(b"head,class\nL9H9,A\nL5H0,B\n", "far.csv", name="far-heads")
    fig, _chips, body = recovery_view({**base, "overlay": "far-heads"})
    note = find(body, "recovery-no-edge").children
    assert "names no head of demo" in note and find(body, "recovery-table") is None
    # GPT-2 small's IOI set names one demo head (L0H1): a reference head, but no edge of its own.
    _fig, _chips, body = recovery_view({**base, "overlay": "ioi_gpt2_small"})
    assert "names no edge of the model" in find(body, "recovery-no-edge").children
    # Heads of the demo, but all in its last layer: no OK pair (source layer 0) joins two of them.
    api.upload_labels(b"head,class\nL1H0,A\nL1H3,B\n", "last-layer.csv", name="last-layer")
    fig, chips, body = recovery_view({**base, "overlay": "last-layer"})
    note = find(body, "recovery-no-edge").children
    assert "names no edge of the model" in note and "no valid OK pair" in note
    assert getattr(find(chips, "stat-rec-reference"), "data-value") == "0"
    assert "no edge" in fig.layout.annotations[0].text
    # No label set, or a pairing recovery tables do not rank.
    assert "pick a label set" in find(recovery_view({**base, "overlay": ""})[2], "recovery-no-edge").children
    _fig, chips, body = recovery_view({**base, "pairing": "QK"})
    assert "OQ, OK, OV" in str(chips) and body == []
