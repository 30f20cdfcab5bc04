"""Hub tables: degrees as NetworkX counts them, ranking rule, PageRank vs a numpy power
iteration, the mean + 2 std hub rule, and the paper's hub check on a random model."""

from __future__ import annotations

import math

import networkx as nx
import numpy as np
import pytest
import torch

from headgraph.core.graphs.build import build_graph, check_paper_hub
from headgraph.core.graphs.hubs import HUB_RULE, hub_table
from headgraph.core.scores.pk import projection_kernel
from headgraph.core.types import HeadWeights, ModelInfo

torch.set_num_threads(1)


def make_heads(L=4, H=4, d=32, dh=6, seed=0) -> HeadWeights:
    g = torch.Generator().manual_seed(seed)
    info = ModelInfo(name="rand", architecture="test", n_layers=L, n_heads=H, n_kv_heads=H,
                     d_model=d, d_head=dh, d_vocab=None, dtype="float32",
                     layer_indices=tuple(range(L)), processing="raw", source="config")
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return HeadWeights(info=info, W_Q=r(L, H, d, dh), W_K=r(L, H, d, dh), W_V=r(L, H, d, dh),
                       W_O=r(L, H, dh, d), W_U=None, fingerprint=f"h{seed}")


def pk_graph(seed=0, k=15):
    heads = make_heads(seed=seed)
    res = {p: projection_kernel(heads, p) for p in ("OQ", "OK", "OV")}
    return build_graph(res, k=k, info=heads.info).graph


def numpy_pagerank(g: nx.MultiDiGraph, alpha=0.85, iters=500) -> dict[str, float]:
    """Weighted PageRank by plain power iteration (parallel edges add; dangling -> uniform)."""
    nodes = list(g.nodes)
    idx = {n: i for i, n in enumerate(nodes)}
    n = len(nodes)
    W = np.zeros((n, n))
    for u, v, d in g.edges(data=True):
        W[idx[u], idx[v]] += d["score"]
    out = W.sum(1)
    p = np.full(n, 1.0 / n)
    for _ in range(iters):
        spread = np.where(out > 0, p / np.where(out > 0, out, 1), 0) @ W
        p = alpha * (spread + p[out == 0].sum() / n) + (1 - alpha) / n
    return dict(zip(nodes, p))


def test_degrees_and_ranking_match_networkx():
    g = pk_graph()
    t = hub_table(g, top=5)
    assert len(t.rows) == g.number_of_nodes() and len(t.top) == 5
    deg, ind, outd = dict(g.degree()), dict(g.in_degree()), dict(g.out_degree())
    for row in t.rows:
        assert row.degree == deg[row.name] == row.in_degree + row.out_degree
        assert row.in_degree == ind[row.name] and row.out_degree == outd[row.name]
        w = sum(d["score"] for _, _, d in g.in_edges(row.name, data=True)) + \
            sum(d["score"] for _, _, d in g.out_edges(row.name, data=True))
        assert row.weighted_degree == pytest.approx(w, rel=1e-12)
    # ranked by total degree, then weighted degree, then name
    keys = [(-r.degree, -r.weighted_degree, r.name) for r in t.rows]
    assert keys == sorted(keys)
    assert [r.rank for r in t.rows] == list(range(1, len(t.rows) + 1))
    assert max(deg.values()) == t.rows[0].degree
    assert t.top_hub == t.rows[0].name and t.rows[0].is_hub
    assert t.to_dict()["rows"][0]["name"] == t.top_hub


def test_pagerank_and_betweenness():
    g = pk_graph(seed=1)
    t = hub_table(g)
    ref = numpy_pagerank(g)
    btw = nx.betweenness_centrality(g)
    for row in t.rows:
        assert row.pagerank == pytest.approx(ref[row.name], abs=1e-6)
        assert row.betweenness == pytest.approx(btw[row.name])
    assert sum(r.pagerank for r in t.rows) == pytest.approx(1.0)


def test_hub_rule_mean_plus_two_std():
    g = nx.MultiDiGraph()
    for i in range(10):
        g.add_edge("C", f"N{i}", key="OQ", score=1.0)
    g.add_edge("N0", "N1", key="OQ", score=1.0)
    t = hub_table(g)
    degs = np.array([d for _, d in g.degree()], dtype=float)
    assert t.threshold == pytest.approx(degs.mean() + 2 * degs.std())
    assert t.hubs == ["C"] and t.rule == HUB_RULE
    # a regular graph has no node above mean + 2 std: only the top-ranked node is called a hub
    ring = nx.MultiDiGraph()
    for i in range(6):
        ring.add_edge(f"R{i}", f"R{(i + 1) % 6}", key="OK", score=1.0 + i)
    tr = hub_table(ring)
    assert tr.hubs == [tr.top_hub]
    # equal degree: the higher weighted degree ranks first (R4/R5 carry the weights 5 and 6)
    assert tr.top_hub == "R5"


def test_ties_break_by_name():
    g = nx.MultiDiGraph()
    g.add_edge("b", "a", key="OQ", score=1.0)
    g.add_edge("c", "d", key="OQ", score=1.0)
    assert [r.name for r in hub_table(g).rows] == ["a", "b", "c", "d"]


def test_empty_graph():
    t = hub_table(nx.MultiDiGraph())
    assert t.rows == () and t.top_hub is None and t.hubs == [] and math.isnan(t.threshold)
    assert t.to_dict()["threshold"] is None


def test_check_paper_hub_on_a_random_model():
    heads = make_heads(L=5, H=4, d=24, dh=4, seed=3)
    top = check_paper_hub(heads)
    res = {p: projection_kernel(heads, p, order="forward") for p in ("OQ", "OK", "OV")}
    hg = build_graph(res, k=20)
    assert hg.graph.number_of_edges() == 60
    deg = dict(hg.graph.degree())
    assert top == hg.hubs.top_hub and deg[top] == max(deg.values())
    assert top.startswith("L") and "H" in top


# -- ties and descriptions (issue 15 item 5) --------------------------------------------------

def _flags_for(names_scores: dict[str, dict[str, float]], L: int = 2, H: int = 2):
    from headgraph.core.activations.flags import head_flags
    from headgraph.core.activations.patterns import PATTERN_KINDS, PatternScores

    grids = {k: torch.zeros(L, H, dtype=torch.float64) for k in PATTERN_KINDS}
    for name, scores in names_scores.items():
        layer, head = int(name[1]), int(name[3])
        for k, v in scores.items():
            grids[k][layer, head] = v
    return head_flags(PatternScores(**grids, layer_indices=tuple(range(L)), n_prompts=1,
                                    induction_length=2, seed=0))


def test_equal_degrees_are_ties_with_a_shared_degree_rank():
    g = nx.MultiDiGraph()
    for a, b in (("L0H0", "L1H0"), ("L0H0", "L1H1"), ("L0H1", "L1H0"), ("L0H1", "L1H1")):
        g.add_edge(a, b, key="OK", score=1.0)
    g.add_edge("L0H0", "L1H0", key="OV", score=2.0)  # L0H0: 3, L1H0: 3, L0H1: 2, L1H1: 2
    t = hub_table(g)
    by = {r.name: r for r in t.rows}
    # reference: competition ranking of the degrees counted by hand
    degree = {"L0H0": 3, "L1H0": 3, "L0H1": 2, "L1H1": 2}
    for n, d in degree.items():
        assert by[n].degree == d
        assert by[n].degree_rank == 1 + sum(v > d for v in degree.values())
        assert by[n].tie is (list(degree.values()).count(d) > 1)
    assert t.top_tie == ["L0H0", "L1H0"] or t.top_tie == ["L1H0", "L0H0"]
    assert [r.rank for r in t.rows] == [1, 2, 3, 4]  # the full order stays
    assert t.to_dict()["top_tie"] == t.top_tie and t.to_dict()["describe_rule"] is None
    assert all(r.description is None and r.sink is None for r in t.rows)  # not measured


def test_hub_rows_describe_their_heads():
    flags = _flags_for({"L0H0": {"first_token": 0.97, "previous_token": 0.5},
                        "L0H1": {"previous_token": 0.8, "induction": 0.45},
                        "L1H0": {"induction": 0.6, "duplicate_token": 0.7},
                        "L1H1": {"identity": 0.39, "first_token": 0.89}})
    g = nx.MultiDiGraph()
    g.add_edge("L0H0", "L1H0", key="OK", score=1.0, heads=None)
    g.add_edge("L0H1", "L1H1", key="OK", score=1.0)
    g.add_node("L1KV0", heads="L1H0,L1H1")
    g.add_edge("L0H0", "L1KV0", key="OV", score=1.0)
    t = hub_table(g, flags=flags)
    by = {r.name: r for r in t.rows}
    assert by["L0H0"].description == "sink" and by["L0H0"].sink is True
    assert by["L0H1"].description == "previous-token" and by["L0H1"].sink is False
    assert by["L1H0"].description == "duplicate"  # highest of the passing kinds
    assert by["L1H1"].description == "unclassified"  # 0.39 < 0.4 and 0.89 < 0.9
    assert by["L1KV0"].description == "duplicate / unclassified" and by["L1KV0"].sink is False
    assert t.to_dict()["describe_rule"].startswith("description = the pattern kind")
