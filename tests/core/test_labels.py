"""Head-class label sets: built-ins, parsing (good and bad files), discovered sets, overlays."""

from __future__ import annotations

import json

import networkx as nx
import pytest
import torch

from headgraph.core.errors import InvalidInput
from headgraph.core.graphs.labels import (
    LabelSet,
    LabelSetError,
    builtin_label_sets,
    class_counts,
    class_recovery,
    label_set_from_scores,
    parse_head,
    parse_head_ref,
    parse_label_set,
)
from headgraph.core.types import ModelInfo
from headgraph.core.names import HeadRef

GPT2 = ModelInfo(name="gpt2", architecture="GPT2LMHeadModel", n_layers=12, n_heads=12,
                 n_kv_heads=12, d_model=768, d_head=64, d_vocab=50257, dtype="float32",
                 layer_indices=tuple(range(12)), processing="bridge", source="hub")

IOI_TEXT = {
    "Name Mover": "9.6 9.9 10.0",
    "Backup Name Mover": "9.0 9.7 10.1 10.2 10.6 10.10 11.2 11.9",
    "Negative Name Mover": "10.7 11.10",
    "S-Inhibition": "7.3 7.9 8.6 8.10",
    "Induction": "5.5 5.8 5.9 6.9",
    "Duplicate Token": "0.1 0.10 3.0",
    "Previous Token": "2.2 4.11",
}


def test_builtin_sets_match_the_published_circuit():
    sets = builtin_label_sets()
    ioi = sets["ioi_gpt2_small"]
    assert ioi.description == "IOI circuit (Wang et al. 2023), GPT-2 small"
    expected = {f"L{h.split('.')[0]}H{h.split('.')[1]}": cls
                for cls, heads in IOI_TEXT.items() for h in heads.split()}
    assert ioi.classes == expected
    assert ioi.model == "gpt2"
    ident = sets["identity_gpt2_small"]
    assert ident.classes == {"L1H11": "Identity", "L4H7": "Identity"}
    both = sets["ioi_identity_gpt2_small"]
    assert both.classes == {**expected, **ident.classes}
    # every built-in head exists in GPT-2 small (the parser re-checks them against its shape)
    for ls in sets.values():
        again = parse_label_set(json.dumps(ls.to_dict()), "json", name=None, info=GPT2)
        assert again == ls


def test_parse_head_spellings():
    assert parse_head("L9H6") == (9, 6)
    assert parse_head("l10h10") == (10, 10)
    assert parse_head("9.6") == (9, 6)
    assert parse_head(" L3.H0 ") == (3, 0)
    for bad in ("9", "L9", "H6", "9-6", "L9H", ""):
        with pytest.raises(InvalidInput):
            parse_head(bad)
    with pytest.raises(InvalidInput, match="key/value head"):
        parse_head("L6KV1")  # label sets name query heads
    assert parse_head_ref("L6KV1") == HeadRef(6, 1, kv=True)
    assert parse_head_ref("9.6").label == "L9H6"


def test_parse_json_forms_agree():
    want = {"L9H6": "Name Mover", "L4H7": "Identity"}
    as_dict = json.dumps({"name": "mine", "description": "d", "classes": {"L9H6": "Name Mover",
                                                                           "4.7": "Identity"}})
    as_list = json.dumps({"classes": [{"head": "9.6", "class": "Name Mover"},
                                      {"head": "L4H7", "class": "Identity"}]})
    bare_list = json.dumps([{"head": "L9H6", "class": "Name Mover"},
                            {"head": "4.7", "class": "Identity"}])
    a = parse_label_set(as_dict, "json", name=None, info=GPT2)
    assert a.name == "mine" and a.description == "d" and a.classes == want
    b = parse_label_set(as_list, "json", name="up", info=GPT2)
    c = parse_label_set(bare_list, "json", name="up2")
    assert b.classes == want and c.classes == want and b.name == "up"
    assert a.class_of("9.6") == "Name Mover" and a.class_of("L0H0") is None
    assert a.class_names == ["Name Mover", "Identity"]


def test_parse_csv_good():
    text = "head,class\n# comment\nL9H6,Name Mover\n\n4.7, Identity\n"
    ls = parse_label_set(text, "csv", name="c", info=GPT2)
    assert ls.classes == {"L9H6": "Name Mover", "L4H7": "Identity"}
    assert ls.name == "c"


def test_layer_checks_use_original_block_numbers():
    # a model keeping only blocks 0, 2, 5 (e.g. attention in some blocks only)
    info = ModelInfo(name="m", architecture="x", n_layers=3, n_heads=4, n_kv_heads=4,
                     d_model=16, d_head=4, d_vocab=None, dtype="float32",
                     layer_indices=(0, 2, 5), processing="raw", source="config")
    ok = parse_label_set("head,class\nL5H3,A\nL2H0,B\n", "csv", name="x", info=info)
    assert ok.classes == {"L5H3": "A", "L2H0": "B"}
    with pytest.raises(LabelSetError) as e:
        parse_label_set("head,class\nL2H0,B\nL1H0,A\n", "csv", name="x", info=info)
    assert e.value.line == 3 and "line 3" in str(e.value) and "layer 1" in str(e.value)


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("head,class\nL9H6,Name Mover\nL12H0,X\n", 3, "unknown head"),  # layer out of range
        ("head,class\nL9H6,Name Mover\nL0H12,X\n", 3, "unknown head"),  # head out of range
        ("head,class\nL9H6,A\nL1H1,B\n9.6,C\n", 4, "duplicate head"),
        ("head,kind\nL9H6,A\n", 1, "header"),
        ("head,class\nL9H6,A\nL1H1,B,extra\n", 3, "2 columns"),
        ("head,class\nL9H6,A\nnine.six,B\n", 3, "not a head name"),
        ("head,class\nL9H6,\n", 2, "empty class"),
        ("head,class\n\n", 1, "no head labels"),
        ("", 1, "empty file"),
    ],
)
def test_csv_errors_name_the_line(text, line, words):
    with pytest.raises(LabelSetError) as e:
        parse_label_set(text, "csv", name="bad", info=GPT2)
    assert e.value.line == line
    assert f"line {line}" in str(e.value)
    assert words in str(e.value)
    assert isinstance(e.value, InvalidInput)


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ('{"classes": {"L9H6": "A", "L99H0": "B"}}', 1, "unknown head"),
        ('{"classes": {"L9H6": "A", "L1H1": "B", "L9H6": "C"}}', 2, "duplicate head"),
        ('{"classes": {"L9H6": "A", "9.6": "C"}}', 1, "duplicate head"),
        ('[{"head": "L9H6", "class": "A"}, {"head": "L1H1"}]', 1, "each entry"),
        ('{"classes": {"L9H6": ["A"]}}', 0, "must be a string"),
        ('{"classes": {}}', 0, "no head labels"),
        ('{"name": "x"}', 0, "no \"classes\""),
        ("42", 0, "expected"),
    ],
)
def test_json_entry_errors_name_the_entry(text, line, words):
    with pytest.raises(LabelSetError) as e:
        parse_label_set(text, "json", name="bad", info=GPT2)
    assert e.value.line == line
    assert f"entry {line}" in str(e.value)
    assert words in str(e.value)


@pytest.mark.parametrize("ending", ["\r", "\r\n", "\n"])
def test_csv_any_line_ending(ending):
    text = ending.join(["head,class", "L9H6,Name Mover", "", "# note", "L1H1,B", ""])
    assert parse_label_set(text, "csv", name="x").classes == {"L9H6": "Name Mover", "L1H1": "B"}
    with pytest.raises(LabelSetError) as e:
        parse_label_set(ending.join(["head,class", "L9H6,A", "bad,B"]), "csv", name="x")
    assert e.value.line == 3


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("head,class\nL9H6,A\x00B\n", 2, "control characters"),
        ("head,class\nL9H6,A\nL1\x00H1,B\n", 3, "not a head name"),
        ("head,class\nL9H6," + "x" * 200_000 + "\n", 2, "unreadable CSV"),
        ("head,class\nL9H6," + "x" * 1000 + "\n", 2, "longer than"),
        ('head,class\nL9H6,"A\nB"\nL1H1,C,D\n', 2, "control characters"),
        ('head,class\r"L9H6","A, B"\r\rL1H1,C,D\r', 4, "2 columns"),
        ("x" * 300_000, 1, "unreadable CSV"),
    ],
)
def test_csv_odd_content_names_the_line(text, line, words):
    with pytest.raises(LabelSetError) as e:
        parse_label_set(text, "csv", name="x")
    assert e.value.line == line and f"line {line}" in str(e.value) and words in str(e.value)
    assert len(str(e.value)) < 300


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ('{"a":' * 100_000 + "1" + "}" * 100_000, "nested too deeply"),
        ('{"classes": {"L9H6": 5}}', "must be a string"),
        ('{"classes": {"L9H6": false}}', "must be a string"),
        ('{"classes": [{"head": 9.6, "class": "A"}]}', "must be a string"),
        ('{"classes": {"L9H6": "A"}, "model": 3}', "must be a string"),
        ('{"classes": {"L9H6": "A"}, "n": ' + "9" * 5000 + "}", "bad JSON"),
        ('"text"', "expected"),
        ("null", "expected"),
    ],
)
def test_json_odd_content_is_a_label_set_error(text, words):
    with pytest.raises(LabelSetError) as e:
        parse_label_set(text, "json", name="x")
    assert words in str(e.value)


def test_json_syntax_error_names_the_line():
    text = '{\n  "classes": {\n    "L9H6": "A",\n  }\n}'
    with pytest.raises(LabelSetError) as e:
        parse_label_set(text, "json", name="bad")
    assert e.value.line == 4
    assert "line 4" in str(e.value)


def test_unknown_format():
    with pytest.raises(InvalidInput):
        parse_label_set("x", "yaml", name="x")


def test_label_set_from_scores_matches_a_per_head_reference():
    g = torch.Generator().manual_seed(3)
    L, H = 3, 5
    grids = {k: torch.rand(L, H, generator=g) for k in
             ("previous_token", "induction", "identity", "duplicate_token", "first_token")}
    thresholds = {"previous_token": 0.5, "induction": 0.6, "identity": 0.7,
                  "duplicate_token": 0.4, "first_token": 0.9}
    names = {"previous_token": "Previous Token", "induction": "Induction",
             "identity": "Identity", "duplicate_token": "Duplicate Token",
             "first_token": "First Token"}
    layers = (0, 3, 7)
    ls = label_set_from_scores(grids, layers, thresholds)
    want = {}
    for li in range(L):
        for h in range(H):
            best, best_s = None, None
            for key, grid in grids.items():
                s = float(grid[li, h])
                if s > thresholds[key] and (best_s is None or s > best_s):
                    best, best_s = names[key], s
            if best is not None:
                want[f"L{layers[li]}H{h}"] = best
    assert want and ls.classes == want
    # one threshold for all; class names used as given when not a known score name
    one = label_set_from_scores({"Induction": grids["induction"], "my class": grids["identity"]},
                                layers, 0.5)
    assert set(one.classes.values()) <= {"Induction", "my class"}
    with pytest.raises(InvalidInput):
        label_set_from_scores({"induction": torch.rand(2, H)}, layers, 0.5)


def test_label_set_from_scores_ties_go_to_the_earlier_key():
    a = torch.tensor([[0.8, 0.2]])
    ls = label_set_from_scores({"induction": a, "identity": a.clone()}, [4], 0.5)
    assert ls.classes == {"L4H0": "Induction"}


def _toy_graph() -> nx.MultiDiGraph:
    g = nx.MultiDiGraph()
    for name in ("L9H6", "L10H0", "L1H1", "L4H7"):
        g.add_node(name, head_name=name, heads=name)
    g.add_edge("L9H6", "L10H0", key="OQ", pairing="OQ")  # both IOI
    g.add_edge("L1H1", "L9H6", key="OQ", pairing="OQ")  # one end out
    g.add_edge("L4H7", "L10H0", key="OK", pairing="OK")  # L4H7 not IOI
    g.add_edge("L9H6", "L10H0", key="OK", pairing="OK")  # both IOI
    return g


def test_class_counts_and_recovery():
    ioi = builtin_label_sets()["ioi_gpt2_small"]
    g = _toy_graph()
    assert class_counts(g, ioi) == {"in_class": 2, "out_of_class": 2}
    assert class_recovery(g, ioi) == {"OQ": 0.5, "OK": 0.5}
    both = builtin_label_sets()["ioi_identity_gpt2_small"]
    assert class_counts(g, both) == {"in_class": 3, "out_of_class": 1}
    assert class_recovery(g, both) == {"OQ": 0.5, "OK": 1.0}


def test_class_counts_role_nodes_count_each_head_once():
    g = nx.MultiDiGraph()
    g.add_node("L9H6 O", head_name="L9H6", heads="L9H6")
    g.add_node("L9H6 Q", head_name="L9H6", heads="L9H6")
    g.add_node("L5KV1 K", head_name="L5KV1", heads="L5H2,L5H3")
    g.add_node("L0H0 O", head_name="L0H0", heads="L0H0")
    ls = LabelSet(name="t", description="t", classes={"L9H6": "A", "L5H3": "B"})
    assert class_counts(g, ls) == {"in_class": 2, "out_of_class": 1}
