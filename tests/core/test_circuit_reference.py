"""A circuit's head -> head edges as a recovery reference (core.circuits.reference): each edge
lands on the cell its names say (OQ on query heads, OK / OV on KV heads of a grouped-query
model), the other edges are left out, bad edges are named, and the size rule; then the table
against a demo circuit's edges equals an independent numpy computation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headgraph.core.circuits.reference import circuit_reference, circuit_size, describe
from headgraph.core.errors import InvalidInput
from headgraph.core.stats.recovery import metric_grids, recovery_table

# a grouped-query model of blocks 2, 5, 7: 4 query heads, 2 KV heads a layer
BLOCKS = (2, 5, 7)
EDGES = [("embed", "L2H0.Q"), ("L2H1", "L5H3.Q"), ("L2H1", "L5KV1.K"), ("L5H0", "L7KV0.V"),
         ("L2H3", "L7KV1.K"), ("L5MLP", "L7KV1.K"), ("L5H2", "L5MLP"), ("L5H2", "logits"),
         ("L2H1", "L5KV1.K")]  # the last repeats an edge


@pytest.mark.parametrize("pairing, cells, names, shown", [
    ("OQ", [(0, 1, 1, 3)], ["L2H1>L5H3.Q"], ["L2H1 -> L5H3"]),
    ("OK", [(0, 1, 1, 1), (0, 3, 2, 1)], ["L2H1>L5KV1.K", "L2H3>L7KV1.K"],
     ["L2H1 -> L5KV1", "L2H3 -> L7KV1"]),
    ("OV", [(1, 0, 2, 0)], ["L5H0>L7KV0.V"], ["L5H0 -> L7KV0"]),
])
def test_each_edge_lands_on_its_cell(pairing, cells, names, shown):
    ref = circuit_reference(EDGES, pairing, BLOCKS, n_heads=4, n_kv_heads=2)
    assert ref.shape == (3, 4, 3, 4 if pairing == "OQ" else 2)
    assert list(ref.positions) == cells and list(ref.names) == names
    assert ref.n_given == len(EDGES) and ref.n_head_edges == 5  # the repeat counts, embed / MLP ones not
    mask, src, tgt = ref.mask()
    want = torch.zeros(ref.shape, dtype=torch.bool)
    for c in cells:
        want[c] = True
    assert torch.equal(mask, want) and torch.equal(src, want.any(dim=(2, 3)))
    assert torch.equal(tgt, want.any(dim=(0, 1)))
    assert describe(ref, BLOCKS)["cells"] == shown


def test_an_ungrouped_model_names_k_readers_per_head():
    ref = circuit_reference([("L0H1", "L1H2.K"), ("L0H0", "L1H1.V")], "OK", (0, 1), 4, 4)
    assert ref.positions == ((0, 1, 1, 2),) and ref.shape == (2, 4, 2, 4)


@pytest.mark.parametrize("edge, words", [
    (("L2H4", "L5H0.Q"), "not a head"),
    (("L3H0", "L5H0.Q"), "not a head"),
    (("L2H0", "L5KV2.K"), "not a K reader"),
    (("L2H0", "L5H1.K"), "named like L5KV0.K"),  # per query head on a grouped-query model
    (("L2H0", "L5KV0.Q"), "named like L5H0.Q"),
    (("L5H0", "L2H1.Q"), "does not run forward"),
    (("L5H0", "L5H1.Q"), "does not run forward"),
    (("L2X0", "L5H1.Q"), "unknown writer"),
    (("L2H0", "L5H1.O"), "unknown reader"),
])
def test_bad_edges_are_named(edge, words):
    with pytest.raises(InvalidInput, match=words):
        circuit_reference([edge], "OQ", BLOCKS, 4, 2)


def test_only_o_to_qkv_pairings():
    with pytest.raises(InvalidInput, match="O -> Q / K / V"):
        circuit_reference(EDGES, "QK", BLOCKS, 4, 2)


def test_the_size_rule():
    assert circuit_size(257, curve_size=66, share=0.8)[0] == 66
    assert "reaching 80%" in circuit_size(257, curve_size=66, share=0.8)[1]
    n, rule = circuit_size(257, curve_size=66, share=0.8, edges=10)
    assert n == 10 and "top 10 of 257" in rule and "given" in rule
    for bad in (0, 258, True):
        with pytest.raises(InvalidInput, match=r"1\.\.257"):
            circuit_size(257, curve_size=66, share=0.8, edges=bad)
    with pytest.raises(InvalidInput, match="edges=N"):
        circuit_size(257, curve_size=None, share=0.8)


def _auc(scores: np.ndarray, pos: np.ndarray) -> float:
    """ROC-AUC by counting: P(score of a reference edge > another's) + half the ties."""
    p, n = scores[pos][:, None], scores[~pos][None, :]
    return float(((p > n) + 0.5 * (p == n)).mean())


def test_the_table_against_a_demo_circuit_equals_numpy():
    from headgraph.core.circuits.attribution import attribute
    from headgraph.core.circuits.tasks import induction
    from headgraph.core.models.demo import load_demo_model
    from headgraph.core.models.loading import load_model

    demo = load_demo_model()
    heads = load_model("demo", device="cpu").heads
    att = attribute(demo, induction(demo, n=4), method="eap")
    order = att.order()[:60]
    names = [(att.graph.writers[int(w)].name, att.graph.readers[int(r)].name)
             for w, r in zip(att.writer[order], att.reader[order])]
    info = heads.info
    ref = circuit_reference(names, "OK", info.layer_indices, info.n_heads, info.n_kv_heads)
    k_edges = {(w, r) for w, r in names if r.endswith(".K") and w.startswith("L")}
    assert len(ref.positions) == len(k_edges) > 0
    grids, valid = metric_grids(heads, "OK", metrics=("pk", "cs", "layer_gap"))
    mask, s_ref, t_ref = ref.mask()
    table = recovery_table(grids, valid, mask, source_ref=s_ref, target_ref=t_ref, k=5,
                           pairing="OK", n_resamples=200)
    v = valid.numpy()
    pos = np.zeros(v.shape, dtype=bool)
    for w, r in k_edges:  # names straight from the circuit: "L0H3" -> "L1H5.K"
        pos[int(w[1]), int(w.split("H")[1]), int(r[1]), int(r.split("H")[1].split(".")[0])] = True
    assert table.n_reference == int((pos & v).sum())
    for m in ("pk", "cs", "layer_gap"):
        g = grids[m].numpy()
        ok = v & np.isfinite(g)
        assert table.row(m).auc.value == pytest.approx(_auc(g[ok], pos[ok]), abs=1e-12)
        top = table.row(m).top
        scores = np.array([g[c] for c in top])
        assert (np.diff(scores) <= 0).all() and scores.min() >= np.sort(g[ok])[-5]  # really its top 5
        assert table.row(m).precision.value == pytest.approx(np.mean([pos[c] for c in top]))
        src, tgt = pos.any(axis=(2, 3)), pos.any(axis=(0, 1))
        share = np.mean([(int(src[a, b]) + int(tgt[c, d])) / 2 for a, b, c, d in top])
        assert table.row(m).endpoint_share.value == pytest.approx(share)
