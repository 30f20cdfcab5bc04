"""Bounded subgraph queries (core.graphs.subgraph) against brute force over networkx graphs of
the demo model's real PK / CS cells, and on a grouped-query model against the head graph's
KV-group node names."""

from __future__ import annotations

import itertools

import networkx as nx
import pytest
import torch

from headgraph.core.errors import InvalidInput
from headgraph.core.graphs.build import build_graph
from headgraph.core.graphs.subgraph import (
    edge_table,
    edges_among,
    layer_range,
    neighbourhood,
)
from headgraph.core.models.demo import load_demo_model
from headgraph.core.scores.composition_score import composition_scores
from headgraph.core.scores.pk import projection_kernel
from headgraph.core.types import HeadWeights, ModelInfo

torch.set_num_threads(1)
PAIRINGS = ("OQ", "OK", "OV")


@pytest.fixture(scope="module")
def demo():
    heads = load_demo_model().head_weights()
    results = {p: projection_kernel(heads, p, order="forward") for p in PAIRINGS}
    cs = composition_scores(heads, ["Q", "K", "V"], order="forward")
    return heads, results, cs


def brute_graph(results, cs, value: str) -> nx.MultiDiGraph:
    """Every valid cell as an edge (plain Python loops, float64), keyed by pairing, with the
    ranked value and the cell's order (pairing, sl, sh, tl, th) for ties."""
    g = nx.MultiDiGraph()
    for pi, (p, ps) in enumerate(results.items()):
        L, Hs, _, Ht = ps.scores.shape
        for sl, sh, tl, th in itertools.product(range(L), range(Hs), range(L), range(Ht)):
            if not bool(ps.valid[sl, sh, tl, th]):
                continue
            s, t = f"L{ps.layer_indices[sl]}H{sh}", f"L{ps.layer_indices[tl]}H{th}"
            pk = float(ps.scores[sl, sh, tl, th].double())
            c = float(cs[p[1]].scores[sl, sh, tl, th].double())
            v = {"pk": pk, "normalized": float(ps.normalized[sl, sh, tl, th].double()), "cs": c}[value]
            g.add_edge(s, t, key=p, value=v, score=pk, cs=c, order=(pi, sl, sh, tl, th))
    return g


def ranked(g: nx.MultiDiGraph, edges) -> list[tuple[str, str, str]]:
    """(source, target, pairing) of ``edges`` best first, ties in cell order."""
    return [(u, v, k) for u, v, k in sorted(edges, key=lambda e: (-g.edges[e]["value"], g.edges[e]["order"]))]


def as_triples(sub) -> list[tuple[str, str, str]]:
    return [(e.source, e.target, e.pairing) for e in sub.edges]


@pytest.mark.parametrize("rank_on", ["pk", "cs"])
def test_edges_among_match_networkx_subgraph(demo, rank_on):
    heads, results, cs = demo
    g = brute_graph(results, cs, rank_on)
    table = edge_table(results, rank_on=rank_on, cs=cs, info=heads.info)
    assert table.n_edges == g.number_of_edges()
    pins = ["L0H1", "L0H4", "L1H0", "L1H6", "L1H2"]
    sub = edges_among(table, pins)
    want = ranked(g, g.subgraph(pins).edges(keys=True))
    assert as_triples(sub) == want and sub.total == len(want) and sub.left_out == 0 and sub.hint is None
    for e in sub.edges:
        ref = g.edges[e.source, e.target, e.pairing]
        assert e.score == pytest.approx(ref["score"], rel=1e-12)
        assert e.cs == pytest.approx(ref["cs"], rel=1e-12)
        assert e.value == pytest.approx(ref["value"], rel=1e-12)
    assert {n.name for n in sub.nodes} == set(pins)
    capped = edges_among(table, pins, cap=4)
    assert as_triples(capped) == want[:4] and capped.left_out == len(want) - 4
    assert f"cap={len(want)}" in (capped.hint or "")


def brute_neighbourhood(g: nx.MultiDiGraph, head: str, depth: int, k: int) -> set[tuple[str, str, str]]:
    picked: set[tuple[str, str, str]] = set()
    seen, frontier = {head}, [head]
    for _ in range(depth):
        nxt = []
        for n in frontier:
            incident = set(g.out_edges(n, keys=True)) | set(g.in_edges(n, keys=True))
            for u, v, p in ranked(g, incident)[:k]:
                picked.add((u, v, p))
                for other in (u, v):
                    if other not in seen:
                        seen.add(other)
                        nxt.append(other)
        frontier = nxt
    return picked


def test_neighbourhood_and_layer_range_match_brute_force(demo):
    heads, results, cs = demo
    g = brute_graph(results, cs, "normalized")
    table = edge_table(results, rank_on="normalized", cs=cs, info=heads.info)
    for head, depth, k in (("L1H3", 1, 4), ("L0H2", 2, 3), ("L1H0", 3, 2)):
        sub = neighbourhood(table, head, depth=depth, k=k)
        want = brute_neighbourhood(g, head, depth, k)
        assert as_triples(sub) == ranked(g, want), (head, depth, k)
        assert head in {n.name for n in sub.nodes}
    for lo, hi, k in ((0, 1, 5), (1, 1, 3)):
        sub = layer_range(table, lo, hi, k=k, cap=1000)
        want = set()
        for p in PAIRINGS:
            cells = [(u, v, kk) for u, v, kk in g.edges(keys=True) if kk == p
                     and all(lo <= int(x[1:].split("H")[0]) <= hi for x in (u, v))]
            want |= set(ranked(g, cells)[:k])
        assert as_triples(sub) == ranked(g, want)
    small = layer_range(table, 0, 1, k=20, cap=7)
    assert len(small.edges) == 7 and small.total == 60 and small.left_out == 53 and "cap=60" in small.hint


def test_bad_queries_raise_invalid_input(demo):
    heads, results, cs = demo
    table = edge_table(results, cs=cs, info=heads.info)
    for call in (lambda: edges_among(table, ["L9H9"]), lambda: edges_among(table, []),
                 lambda: edges_among(table, ["L0H1"], cap=0), lambda: neighbourhood(table, "L0H1", depth=9),
                 lambda: neighbourhood(table, "L0H1", k=0), lambda: layer_range(table, 5, 9),
                 lambda: edge_table(results, rank_on="cka"), lambda: edge_table(results, rank_on="z")):
        with pytest.raises(InvalidInput):
            call()


def test_grouped_kv_sides_are_the_head_graphs_kv_nodes():
    g = torch.Generator().manual_seed(3)
    L, H, Hkv, d, dh = 3, 4, 2, 24, 4
    info = ModelInfo(name="gqa", architecture="test", n_layers=L, n_heads=H, n_kv_heads=Hkv, d_model=d,
                     d_head=dh, d_vocab=None, dtype="float32", layer_indices=(0, 2, 5), processing="raw",
                     source="config")
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    heads = HeadWeights(info=info, W_Q=r(L, H, d, dh), W_K=r(L, Hkv, d, dh), W_V=r(L, Hkv, d, dh),
                        W_O=r(L, H, dh, d), W_U=None, fingerprint="gqa")
    results = {p: projection_kernel(heads, p, order="forward") for p in PAIRINGS}
    table = edge_table(results, info=info)
    graph = build_graph(results, k=1000, info=info).graph  # every valid cell, KV groups as nodes
    assert {(u, v, k) for u, v, k in graph.edges(keys=True)} == set(
        as_triples(layer_range(table, 0, 5, k=1000, cap=1000)))
    kv = edges_among(table, ["L0H1", "L2KV0", "L5KV1", "L5H3"])
    assert {e.target for e in kv.edges if e.pairing in ("OK", "OV")} <= {"L2KV0", "L5KV1"}
    assert {n.name: n.heads for n in kv.nodes}["L2KV0"] == ("L2H0", "L2H1")
