"""Hub tables: degrees as NetworkX counts them, ranking rule, PageRank vs a numpy power
iteration, the mean + 2 std hub rule, and the paper's hub check on a random model."""

from __future__ import annotations

import math

import networkx as nx
import numpy as np
import pytest
import torch

from headgraph.core.graph import build_graph, check_paper_hub
from headgraph.core.hubs import HUB_RULE, hub_table
from headgraph.core.pk import projection_kernel
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
