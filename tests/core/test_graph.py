"""Head graphs: edge selection rules, attributes, GQA nodes, labels and exports that round-trip."""

from __future__ import annotations

import io
import itertools
import json

import networkx as nx
import pytest
import torch

from headgraph.core.errors import InvalidInput
from headgraph.core.graphs.build import build_graph
from headgraph.core.graphs.head_graph import HeadGraph, read_export
from headgraph.core.graphs.labels import LabelSet
from headgraph.core.types import HeadWeights, ModelInfo, PairScores

torch.set_num_threads(1)


def make_heads(L=4, H=4, d=32, dh=6, Hkv=None, seed=0, layer_indices=None) -> HeadWeights:
    """Random per-head weights (float32) with ModelInfo; K/V keep ``Hkv`` heads."""
    g = torch.Generator().manual_seed(seed)
    Hkv = H if Hkv is None else Hkv
    layers = tuple(range(L)) if layer_indices is None else tuple(layer_indices)
    info = ModelInfo(name=f"rand{seed}", architecture="test", n_layers=L, n_heads=H,
                     n_kv_heads=Hkv, d_model=d, d_head=dh, d_vocab=None, dtype="float32",
                     layer_indices=layers, processing="raw", source="config")
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return HeadWeights(info=info, W_Q=r(L, H, d, dh), W_K=r(L, Hkv, d, dh), W_V=r(L, Hkv, d, dh),
                       W_O=r(L, H, dh, d), W_U=None, fingerprint=f"f{seed}")


def pk64(heads: HeadWeights, pairing: str) -> PairScores:
    """Float64 reference PK (own QR bases), forward layer order: source layer < target layer."""
    def basis(role):
        w = heads.role(role).double()
        return torch.linalg.qr(w.reshape(-1, *w.shape[2:]))[0].reshape(w.shape)

    A, B = basis(pairing[0]), basis(pairing[1])
    S = torch.einsum("ahdr,bgds->ahbgrs", A, B).square().sum((-1, -2))
    L = S.shape[0]
    lay = torch.arange(L)
    valid = (lay[:, None] < lay[None, :])[:, None, :, None].expand(S.shape).clone()
    S = torch.where(valid, S, torch.zeros_like(S))
    r = heads.info.d_head
    ranks_s = torch.full(S.shape[:2], r)
    ranks_t = torch.full((S.shape[2], S.shape[3]), r)
    return PairScores(kind="pk", pairing=pairing, source_role=pairing[0], target_role=pairing[1],
                      scores=S, normalized=S / r, valid=valid,
                      layer_indices=heads.info.layer_indices, order="forward",
                      source_ranks=ranks_s, target_ranks=ranks_t, source_rank=r, target_rank=r)


def results_for(heads, pairings=("OQ", "OK", "OV")):
    return {p: pk64(heads, p) for p in pairings}


def edge_cells(hg: HeadGraph, pairing: str) -> set[tuple[str, str]]:
    return {(u, v) for u, v, key in hg.graph.edges(keys=True) if key == pairing}


def ref_topk(ps: PairScores, k: int) -> set[tuple[str, str]]:
    """Top-k valid cells by score, by plain Python sorting over all cells."""
    cells = []
    Ls, Hs, Lt, Ht = ps.scores.shape
    for a, b, c, e in itertools.product(range(Ls), range(Hs), range(Lt), range(Ht)):
        if ps.valid[a, b, c, e]:
            cells.append((-float(ps.scores[a, b, c, e]),
                          (f"L{ps.layer_indices[a]}H{b}", f"L{ps.layer_indices[c]}H{e}")))
    cells.sort(key=lambda x: x[0])
    return {cell for _, cell in cells[:k]}


def test_topk_exactly_k_edges_per_pairing_and_the_right_ones():
    heads = make_heads(layer_indices=(0, 2, 3, 7))
    res = results_for(heads)
    hg = build_graph(res, k=7, info=heads.info)
    assert hg.rule == "top-7 per pairing by raw PK"
    assert hg.edge_counts == {"OQ": 7, "OK": 7, "OV": 7}
    for p, ps in res.items():
        cells = edge_cells(hg, p)
        assert len(cells) == 7
        assert cells == ref_topk(ps, 7)
    # node names use original block numbers and carry layer/head attributes
    for n, data in hg.graph.nodes(data=True):
        assert n == f"L{data['layer']}H{data['head']}" and data["layer"] in (0, 2, 3, 7)


def test_edge_scores_and_opacity():
    heads = make_heads(seed=1)
    res = results_for(heads)
    hg = build_graph(res, k=10)
    for p, _ps in res.items():
        edges = [d for _, _, k, d in hg.graph.edges(keys=True, data=True) if k == p]
        ops = torch.tensor([d["opacity"] for d in edges])
        assert bool(((ops > 0) & (ops <= 1)).all())
        assert max(ops.tolist()) == 1.0
        top = max(d["score"] for d in edges)
        for d in edges:
            assert d["pairing"] == p
            assert d["opacity"] == pytest.approx(d["score"] / top, rel=1e-12)
            assert d["normalized"] == pytest.approx(d["score"] / heads.info.d_head, rel=1e-6)
        ranks = sorted(d["rank"] for d in edges)
        assert ranks == list(range(1, 11))
        by_rank = sorted(edges, key=lambda d: d["rank"])
        assert all(a["score"] >= b["score"] for a, b in zip(by_rank, by_rank[1:]))


def test_scores_on_edges_are_the_grid_cells():
    heads = make_heads(seed=2)
    res = results_for(heads, ("OK",))
    hg = build_graph(res, k=5)
    ps = res["OK"]
    for u, v, d in hg.graph.edges(data=True):
        a, b = hg.graph.nodes[u], hg.graph.nodes[v]
        assert d["score"] == pytest.approx(float(ps.scores[a["layer"], a["head"], b["layer"], b["head"]]))
        assert a["layer"] < b["layer"]


def test_threshold_mode_is_monotone_and_exact():
    heads = make_heads(seed=3)
    res = results_for(heads)
    sets = []
    for t in (0.5, 0.8, 1.1, 1.4):
        hg = build_graph(res, k=None, threshold=t)
        assert hg.rule == f"raw PK >= {t:g}"
        for p, ps in res.items():
            want = int((ps.valid & (ps.scores >= t)).sum())
            assert hg.edge_counts[p] == want == len(edge_cells(hg, p))
            assert all(d["score"] >= t for _, _, k, d in hg.graph.edges(keys=True, data=True) if k == p)
        sets.append(set(hg.graph.edges(keys=True)))
    assert all(b <= a for a, b in zip(sets, sets[1:]))
    assert len(sets[0]) > len(sets[-1])
    empty = build_graph(res, k=None, threshold=1e9)
    assert empty.graph.number_of_nodes() == 0 and empty.hubs.top_hub is None
    assert empty.edge_counts == {"OQ": 0, "OK": 0, "OV": 0}
    assert json.loads(json.dumps(empty.to_dict()))["graph"]["edges"] == []


def test_max_edges_keeps_the_best_edges_and_says_how_many_passed():
    heads = make_heads(seed=3)
    res = results_for(heads)
    full = build_graph(res, k=None, threshold=0.5)
    capped = build_graph(res, k=None, threshold=0.5, max_edges=5)
    for p, ps in res.items():
        passed = int((ps.valid & (ps.scores >= 0.5)).sum())
        assert passed > 5 and capped.capped[p] == passed and capped.edge_counts[p] == 5
        best = sorted((d["score"] for _, _, k, d in full.graph.edges(keys=True, data=True) if k == p),
                      reverse=True)[:5]
        kept = sorted((d["score"] for _, _, k, d in capped.graph.edges(keys=True, data=True) if k == p),
                      reverse=True)
        assert kept == best
    assert full.capped == {} and build_graph(res, k=None, threshold=0.5, max_edges=10**6).capped == {}
    assert capped.to_dict()["capped"] == capped.capped
    with pytest.raises(InvalidInput):
        build_graph(res, k=None, threshold=0.5, max_edges=0)


def test_threshold_on_normalized_z_and_fdr():
    heads = make_heads(seed=4)
    res = results_for(heads, ("OQ", "OV"))
    hgn = build_graph(res, k=None, threshold=0.15, threshold_on="normalized")
    for p, ps in res.items():
        assert hgn.edge_counts[p] == int((ps.valid & (ps.normalized >= 0.15)).sum())
    z = {}
    for p, ps in res.items():
        v = ps.scores[ps.valid]
        z[p] = torch.where(ps.valid, (ps.scores - v.mean()) / v.std(), torch.full_like(ps.scores, torch.nan))
    hgz = build_graph(res, k=None, threshold=1.0, threshold_on="z", values=z)
    assert hgz.rule == "z-score >= 1"
    for p in res:
        assert hgz.edge_counts[p] == int((z[p] >= 1.0).sum())
        assert all(d["z"] >= 1.0 for _, _, k, d in hgz.graph.edges(keys=True, data=True) if k == p)
    # top-k by z is top-k by score here (z is monotone in score)
    assert set(build_graph(res, k=6, threshold_on="z", values=z).graph.edges(keys=True)) == \
        set(build_graph(res, k=6).graph.edges(keys=True))
    g = torch.Generator().manual_seed(0)
    mask = {p: torch.rand(ps.scores.shape, generator=g) < 0.2 for p, ps in res.items()}
    hgf = build_graph(res, k=None, threshold=0.05, threshold_on="fdr", values=mask)
    for p, ps in res.items():
        assert hgf.edge_counts[p] == int((mask[p] & ps.valid).sum())
    # a bool mask needs no threshold
    hgm = build_graph(res, k=None, threshold=None, threshold_on="fdr", values=mask)
    assert set(hgm.graph.edges(keys=True)) == set(hgf.graph.edges(keys=True))
    assert hgm.rule == "FDR-significant pairs (Benjamini-Hochberg)"
    q = {p: torch.rand(ps.scores.shape, generator=g) for p, ps in res.items()}
    hgq = build_graph(res, k=None, threshold=0.1, threshold_on="fdr", values=q)
    for p, ps in res.items():
        assert hgq.edge_counts[p] == int(((q[p] <= 0.1) & ps.valid).sum())
        es = sorted((d for _, _, k, d in hgq.graph.edges(keys=True, data=True) if k == p),
                    key=lambda d: d["rank"])
        assert [d["q"] for d in es] == sorted(d["q"] for d in es)  # rank 1 = smallest q
    with pytest.raises(InvalidInput, match="exactly one"):
        build_graph(res, k=None, threshold=None, threshold_on="fdr", values=q)


def test_never_an_edge_on_an_invalid_cell():
    heads = make_heads(L=3, H=3, seed=5)
    ps = pk64(heads, "OK")
    # poison invalid cells with huge scores: they must still never be selected
    huge = torch.full_like(ps.scores, 1e6)
    poisoned = PairScores(**{**ps.__dict__, "scores": torch.where(ps.valid, ps.scores, huge),
                             "normalized": torch.where(ps.valid, ps.normalized, huge)})
    n_valid = int(ps.valid.sum())
    hg = build_graph({"OK": poisoned}, k=1000)
    assert hg.edge_counts["OK"] == n_valid == hg.graph.number_of_edges()
    for u, v in hg.graph.edges():
        assert hg.graph.nodes[u]["layer"] < hg.graph.nodes[v]["layer"]
    hg2 = build_graph({"OK": poisoned}, k=None, threshold=0.0)
    assert hg2.graph.number_of_edges() == n_valid


def test_role_granularity():
    heads = make_heads(seed=6)
    res = results_for(heads)
    hh = build_graph(res, k=8)
    hr = build_graph(res, k=8, granularity="role")
    assert hr.graph.number_of_edges() == 24
    for u, v, key, _d in hr.graph.edges(keys=True, data=True):
        assert u.endswith(" O") and v.endswith(" " + key[1])
        assert hr.graph.nodes[u]["role"] == "O" and hr.graph.nodes[v]["role"] == key[1]
    # collapsing role nodes to heads gives the head graph's edges
    collapsed = {(u.split()[0], v.split()[0], k) for u, v, k in hr.graph.edges(keys=True)}
    assert collapsed == set(hh.graph.edges(keys=True))


def test_cs_attached_from_the_matching_mode():
    heads = make_heads(seed=7)
    res = results_for(heads)
    g = torch.Generator().manual_seed(1)
    cs = {}
    for mode in "QKV":
        ps = res["O" + mode]
        vals = torch.rand(ps.scores.shape, generator=g, dtype=torch.float64)
        cs[mode] = PairScores(**{**ps.__dict__, "kind": "cs", "pairing": mode, "scores": vals,
                                 "normalized": vals})
    hg = build_graph(res, k=6, cs=cs)
    for u, v, key, d in hg.graph.edges(keys=True, data=True):
        a, b = hg.graph.nodes[u], hg.graph.nodes[v]
        assert d["cs"] == float(cs[key[1]].scores[a["layer"], a["head"], b["layer"], b["head"]])


def test_gqa_group_nodes_and_query_expansion():
    heads = make_heads(L=3, H=4, Hkv=2, seed=8)
    res = results_for(heads)
    assert res["OK"].scores.shape == (3, 4, 3, 2)
    hg = build_graph(res, k=5, info=heads.info)
    assert hg.edge_counts == {"OQ": 5, "OK": 5, "OV": 5}
    for _u, v, key in hg.graph.edges(keys=True):
        nv = hg.graph.nodes[v]
        if key in ("OK", "OV"):
            assert nv["kind"] == "kv_group" and v == f"L{nv['layer']}KV{nv['head']}"
            g = nv["head"]
            assert nv["heads"] == f"L{nv['layer']}H{2 * g},L{nv['layer']}H{2 * g + 1}"
        else:
            assert nv["kind"] == "head"
    # query mode: the KV cell is copied to both query heads sharing it, before selection
    hq = build_graph(res, k=6, info=heads.info, kv_nodes="query")
    assert all(n["kind"] == "head" for _, n in hq.graph.nodes(data=True))
    ok = res["OK"]
    for u, v, key, d in hq.graph.edges(keys=True, data=True):
        if key == "OK":
            a, b = hq.graph.nodes[u], hq.graph.nodes[v]
            cell = ok.scores[a["layer"], a["head"], b["layer"], b["head"] // 2]
            assert d["score"] == pytest.approx(float(cell))
    # without info the query-head count comes from the O/Q sides
    assert set(build_graph(res, k=5).graph.edges(keys=True)) == set(hg.graph.edges(keys=True))
    # a CS grid per query head is averaged over the KV group
    g = torch.Generator().manual_seed(2)
    csv = torch.rand(3, 4, 3, 4, generator=g, dtype=torch.float64)
    valid_q = res["OQ"].valid
    cs = PairScores(**{**res["OQ"].__dict__, "kind": "cs", "pairing": "K", "target_role": "K",
                       "scores": csv, "normalized": csv, "valid": valid_q})
    hc = build_graph(res, k=5, info=heads.info, cs={"K": cs})
    for u, v, key, d in hc.graph.edges(keys=True, data=True):
        if key == "OK":
            a, b = hc.graph.nodes[u], hc.graph.nodes[v]
            want = csv[a["layer"], a["head"], b["layer"], 2 * b["head"]: 2 * b["head"] + 2].mean()
            assert d["cs"] == pytest.approx(float(want))


def test_labels_overlay():
    heads = make_heads(seed=9)
    res = results_for(heads)
    hg0 = build_graph(res, k=10)
    some = sorted(hg0.graph.nodes)[:3]
    labels = LabelSet(name="t", description="t", classes={some[0]: "A", some[1]: "B", "L0H0": "C"})
    hg = build_graph(res, k=10, labels=labels)
    n_nodes = hg.graph.number_of_nodes()
    labelled = {n for n in hg.graph.nodes if n in labels.classes}
    assert hg.class_counts == {"in_class": len(labelled), "out_of_class": n_nodes - len(labelled)}
    for n, d in hg.graph.nodes(data=True):
        assert d["in_class"] == (n in labels.classes)
        assert d.get("head_class") == labels.classes.get(n)
    for u, v, d in hg.graph.edges(data=True):
        assert d.get("source_class") == labels.classes.get(u)
        assert d.get("target_class") == labels.classes.get(v)
    for p in res:
        es = [(u, v) for u, v, k in hg.graph.edges(keys=True) if k == p]
        want = sum(u in labels.classes and v in labels.classes for u, v in es) / len(es)
        assert hg.recovery[p] == pytest.approx(want)


def test_hub_attributes_on_nodes():
    heads = make_heads(seed=10)
    hg = build_graph(results_for(heads), k=12)
    deg = dict(hg.graph.degree())
    for n, d in hg.graph.nodes(data=True):
        assert d["degree"] == deg[n] == d["in_degree"] + d["out_degree"]
        assert d["hub_rank"] == hg.hubs.row(n).rank
    assert hg.graph.nodes[hg.hubs.top_hub]["is_hub"] is True


def _key_view(g):
    """Nodes and edges with their key attributes; edges keyed by the "pairing" attribute."""
    nodes = {n: (d["layer"], d["head"], d["degree"], d.get("head_class")) for n, d in g.nodes(data=True)}
    edges = {(u, v, d["pairing"]): (d["score"], d["opacity"], d["rank"], d.get("cs"))
             for u, v, d in g.edges(data=True)}
    return nodes, edges


def _same(a: nx.MultiDiGraph, b: nx.MultiDiGraph) -> bool:
    return (dict(a.nodes(data=True)) == dict(b.nodes(data=True))
            and sorted(map(repr, a.edges(keys=True, data=True)))
            == sorted(map(repr, b.edges(keys=True, data=True))))


def test_exports_round_trip():
    heads = make_heads(seed=11)
    res = results_for(heads)
    labels = LabelSet(name="t", description="t", classes={"L1H0": "A", "L2H3": "B"})
    cs = {m: PairScores(**{**res["O" + m].__dict__, "kind": "cs", "pairing": m}) for m in "QKV"}
    for gran in ("head", "role"):
        hg = build_graph(res, k=9, labels=labels, cs=cs, granularity=gran, info=heads.info)
        want = _key_view(hg.graph)
        assert len(want[1]) == 27
        # plain NetworkX readers
        data = hg.to_node_link()
        assert nx.utils.graphs_equal(nx.node_link_graph(data, edges="edges"), hg.graph)
        g2 = nx.read_graphml(io.BytesIO(hg.to_graphml().encode()), edge_key_type=str)
        assert _key_view(g2) == want and g2.graph["rule"] == "top-9 per pairing by raw PK"
        g3 = nx.read_gexf(io.BytesIO(hg.to_gexf().encode()))
        assert g3.is_directed() and _key_view(g3) == want
        # read_export gives back the very same MultiDiGraph (keys = pairings, all attributes)
        assert nx.utils.graphs_equal(read_export(json.dumps(data), "node-link"), hg.graph)
        back = read_export(hg.to_graphml(), "graphml")
        assert nx.utils.graphs_equal(back, hg.graph) and _same(back, hg.graph)
        assert _same(read_export(hg.to_gexf(), "gexf"), hg.graph)
        assert hg.to_dict()["graph"] == data


def test_argument_errors():
    heads = make_heads(seed=12)
    res = results_for(heads, ("OK",))
    with pytest.raises(InvalidInput, match="exactly one"):
        build_graph(res, k=5, threshold=1.0)
    with pytest.raises(InvalidInput, match="exactly one"):
        build_graph(res, k=None)
    with pytest.raises(InvalidInput, match="holds pairing"):
        build_graph({"OQ": res["OK"]}, k=5)
    with pytest.raises(InvalidInput, match="needs values"):
        build_graph(res, k=None, threshold=1.0, threshold_on="z")
    with pytest.raises(InvalidInput, match="cannot rank"):
        build_graph(res, k=5, threshold_on="fdr", values={"OK": res["OK"].valid})
    with pytest.raises(InvalidInput, match="granularity"):
        build_graph(res, k=5, granularity="layer")
    with pytest.raises(InvalidInput, match="positive"):
        build_graph(res, k=0)


def test_graph_from_the_real_projection_kernel_matches_the_float64_reference():
    from headgraph.core.scores.pk import projection_kernel

    heads = make_heads(L=4, H=3, d=24, dh=4, seed=13, layer_indices=(1, 3, 4, 8))
    real = {p: projection_kernel(heads, p) for p in ("OQ", "OK", "OV")}
    ref = results_for(heads)
    hg_real = build_graph(real, k=10, info=heads.info)
    hg_ref = build_graph(ref, k=10, info=heads.info)
    assert set(hg_real.graph.edges(keys=True)) == set(hg_ref.graph.edges(keys=True))
    for u, v, key, d in hg_real.graph.edges(keys=True, data=True):
        assert d["score"] == pytest.approx(hg_ref.graph.edges[u, v, key]["score"], abs=1e-5)
    assert hg_real.hubs.top_hub == hg_ref.hubs.top_hub


def test_real_composition_scores_on_edges():
    from headgraph.core.scores.composition_score import composition_score
    from headgraph.core.scores.pk import projection_kernel

    heads = make_heads(L=3, H=4, Hkv=2, d=24, dh=4, seed=14)
    res = {p: projection_kernel(heads, p) for p in ("OQ", "OK", "OV")}
    cs = {m: composition_score(heads, m) for m in "QKV"}
    hg = build_graph(res, k=8, cs=cs, info=heads.info)
    for u, v, key, d in hg.graph.edges(keys=True, data=True):
        a, b = hg.graph.nodes[u], hg.graph.nodes[v]
        grid = cs[key[1]].scores
        if b["kind"] == "kv_group":  # CS per query head, averaged over the KV group
            want = grid[a["layer"], a["head"], b["layer"], 2 * b["head"]: 2 * b["head"] + 2].mean()
        else:
            want = grid[a["layer"], a["head"], b["layer"], b["head"]]
        assert d["cs"] == pytest.approx(float(want), rel=1e-6)
