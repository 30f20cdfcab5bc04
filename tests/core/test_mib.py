"""MIB scores and files (core.circuits.mib): CPR / CMD against numpy's trapezoid, a demo
circuit written and read back, a hand-written grouped-query file, bad files named."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from headgraph.core.circuits.attribution import attribute
from headgraph.core.circuits.faithfulness import faithfulness
from headgraph.core.circuits.mib import (
    MIB_FRACTIONS,
    cpr_cmd,
    curve_scores,
    from_mib,
    mib_sizes,
    to_mib,
)
from headgraph.core.circuits.tasks import induction
from headgraph.core.errors import InvalidInput
from headgraph.core.models.demo import load_demo_model


@pytest.mark.parametrize("f", [
    [0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0, 1.0, 1.0, 1.0],
    [-0.4, -0.1, 0.2, 0.9, 1.3, 1.6, 1.2, 0.95, 1.0, 1.0],  # below 0 and above 1
    [0.5, -2.0, 3.0, 0.0, 1.0, 1.0, 0.2, -0.3, 1.7, 1.0],
])
def test_cpr_cmd_is_the_trapezoid_area(f):
    x = np.array(MIB_FRACTIONS)
    r = cpr_cmd(MIB_FRACTIONS, f)
    assert r.cpr == pytest.approx(float(np.trapezoid(f, x)), rel=1e-12, abs=1e-15)
    assert r.cmd == pytest.approx(float(np.trapezoid(np.abs(1 - np.array(f)), x)),
                                  rel=1e-12, abs=1e-15)
    assert r.fractions == MIB_FRACTIONS and r.faithfulness == tuple(f)


def test_cpr_cmd_refuses_bad_curves():
    with pytest.raises(InvalidInput, match="as many"):
        cpr_cmd(MIB_FRACTIONS, [1.0] * 9)
    with pytest.raises(InvalidInput, match="increasing"):
        cpr_cmd([0.5, 0.2], [1.0, 1.0])
    with pytest.raises(InvalidInput, match="finite"):
        cpr_cmd([0.1, 0.2], [1.0, float("nan")])


def test_mib_sizes_floor_like_mib():
    assert mib_sizes(1000) == (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
    assert mib_sizes(257) == tuple(int(p * 257) for p in MIB_FRACTIONS)


@pytest.fixture(scope="module")
def demo_eap():
    demo = load_demo_model()
    task = induction(demo, n=4)
    return demo, task, attribute(demo, task, method="eap")


def test_demo_curve_on_mibs_grid(demo_eap):
    demo, task, att = demo_eap
    grid = mib_sizes(att.n_edges)
    curve = faithfulness(demo, task, att, extra=grid)
    assert set(grid) <= set(curve.sizes)
    r = curve_scores(curve.sizes, curve.metrics, curve.clean, curve.total_edges)
    assert r is not None
    at = dict(zip(curve.sizes, curve.metrics, strict=True))
    f = np.array([(at[n] - at[0]) / (curve.clean - at[0]) for n in grid])
    assert f[-1] == pytest.approx(1, abs=1e-6)  # every edge kept: the clean run
    assert r.cpr == pytest.approx(float(np.trapezoid(f, MIB_FRACTIONS)), rel=1e-12)
    assert r.cmd == pytest.approx(float(np.trapezoid(np.abs(1 - f), MIB_FRACTIONS)), rel=1e-12)
    assert 0 < r.cpr < 1


def test_demo_circuit_round_trip(demo_eap):
    _, _, att = demo_eap
    edges = att.edge_dicts(att.order())
    d = to_mib(edges, n_layers=2, n_heads=8, n_kv_heads=8, size=20)
    d = json.loads(json.dumps(d))  # through a file's text
    assert d["cfg"]["n_layers"] == 2 and len(d["edges"]) == att.n_edges  # no GQA: one to one
    assert sum(e["in_graph"] for e in d["edges"].values()) == 20
    back = from_mib(d, layer_indices=att.layer_indices)
    got = {(e.writer, e.reader): (e.score, e.in_graph) for e in back.edges}
    want = {(e["writer"], e["reader"]): (e["score"], e["rank"] <= 20) for e in edges}
    assert got == want
    def node(name: str) -> str:  # demo: blocks are layer positions
        m = re.match(r"L(\d+)H(\d+)", name)
        return "input" if name == "embed" else "logits" if name == "logits" else \
            f"a{m.group(1)}.h{m.group(2)}" if m else name
    ends = {node(x) for e in back.circuit for x in (e.writer, e.reader)}
    assert {n for n, v in d["nodes"].items() if v["in_graph"]} == ends


def gqa_edges():
    """Model: 2 layers, 4 query heads, 2 KV heads (query heads 0, 1 read KV 0; 2, 3 read
    KV 1), no MLP."""
    def e(wk, wl, wh, path, rl, rh, score):
        return {"writer_kind": wk, "writer_layer": wl, "writer_head": wh, "path": path,
                "reader_layer": rl, "reader_head": rh, "score": score}
    return [e("head", 0, 3, "K", 1, 1, 0.8),  # strongest: in the circuit of 2
            e("embed", None, None, "V", 0, 0, -0.6),
            e("head", 0, 1, "Q", 1, 2, 0.3),
            e("head", 0, 2, "logits", None, None, 0.1)]


def test_gqa_split_by_hand():
    d = to_mib(gqa_edges(), n_layers=2, n_heads=4, n_kv_heads=2, size=2)
    assert d["edges"] == {
        "a0.h3->a1.h2<k>": {"score": 0.4, "in_graph": True},
        "a0.h3->a1.h3<k>": {"score": 0.4, "in_graph": True},
        "input->a0.h0<v>": {"score": -0.3, "in_graph": True},
        "input->a0.h1<v>": {"score": -0.3, "in_graph": True},
        "a0.h1->a1.h2<q>": {"score": 0.3, "in_graph": False},
        "a0.h2->logits": {"score": 0.1, "in_graph": False},
    }
    kept = {n for n, v in d["nodes"].items() if v["in_graph"]}
    assert kept == {"input", "a0.h0", "a0.h1", "a0.h3", "a1.h2", "a1.h3"}
    assert d["cfg"]["n_key_value_heads"] == 2


HAND = """{"cfg": {"n_layers": 2, "n_heads": 4, "parallel_attn_mlp": false, "d_model": 8},
 "nodes": {"input": {"in_graph": true}, "a0.h0": {"in_graph": true},
           "m0": {"in_graph": false}, "a1.h1": {"in_graph": true}, "logits": {"in_graph": true}},
 "edges": {"input->a0.h0<q>": {"score": 1.5, "in_graph": true},
           "a0.h0->a1.h0<k>": {"score": 0.25, "in_graph": false},
           "a0.h0->a1.h1<k>": {"score": 0.5, "in_graph": true},
           "a0.h0->m0": {"score": -2, "in_graph": false},
           "m0->a1.h3<v>": {"score": 0.125, "in_graph": false},
           "a1.h1->logits": {"score": 0.75, "in_graph": true}}}"""


def test_hand_written_file_regroups_kv():
    c = from_mib(json.loads(HAND), n_kv_heads=2, layer_indices=(0, 3))
    got = {(e.writer, e.reader): (e.path, e.score, e.in_graph) for e in c.edges}
    assert got == {
        ("embed", "L0H0.Q"): ("Q", 1.5, True),
        ("L0H0", "L3KV0.K"): ("K", 0.75, True),  # 0.25 + 0.5; in because one half is
        ("L0H0", "L0MLP"): ("MLP", -2.0, False),
        ("L0MLP", "L3KV1.V"): ("V", 0.125, False),
        ("L3H1", "logits"): ("logits", 0.75, True),
    }
    ungrouped = from_mib(json.loads(HAND))  # n_kv_heads defaults to n_heads
    assert ungrouped.n_kv_heads == 4 and len(ungrouped.edges) == 6


@pytest.mark.parametrize("data, message", [
    ([], "cfg, nodes and edges"),
    ({"cfg": {"n_layers": 0, "n_heads": 2}, "nodes": {}, "edges": {}}, "n_layers"),
    ({"cfg": {"n_layers": 1, "n_heads": 2}, "nodes": {"a0.h5": {"in_graph": True}},
      "edges": {}}, "unknown node"),
    ({"cfg": {"n_layers": 1, "n_heads": 2}, "nodes": {}, "edges": {"a0.h0->a0.h1": {}}},
     "bad edge name"),
    ({"cfg": {"n_layers": 2, "n_heads": 2}, "nodes": {},
      "edges": {"a1.h0->a0.h1<q>": {"score": 1.0, "in_graph": True}}}, "does not run forward"),
    ({"cfg": {"n_layers": 2, "n_heads": 2}, "nodes": {},
      "edges": {"a0.h0->a1.h1<q>": {"score": "x", "in_graph": True}}}, "score must be"),
    ({"cfg": {"n_layers": 2, "n_heads": 2}, "nodes": {},
      "edges": {"a0.h0->a1.h1<q>": {"score": 1.0}}}, "in_graph"),
    ({"cfg": {"n_layers": 2, "n_heads": 3, "n_key_value_heads": 2}, "nodes": {}, "edges": {}},
     "multiple"),
    ({"cfg": {"n_layers": 2, "n_heads": 2}, "nodes": {},
      "edges": {"a0.h0->a5.h1<q>": {"score": 1.0, "in_graph": True}}}, "out of range"),
])
def test_bad_files_are_named(data, message):
    with pytest.raises(InvalidInput, match=message):
        from_mib(data)
