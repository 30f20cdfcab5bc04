"""Ranking: top pairs with deterministic ties, Spearman vs scipy, PK-vs-CS comparison."""

from __future__ import annotations

import math

import pytest
import scipy.stats
import torch

from headgraph.core.scores.composition_score import composition_score
from headgraph.core.errors import InvalidInput
from headgraph.core.scores.pk import projection_kernel
from headgraph.core.scores.ranking import compare_metrics, expand_heads, spearman, top_pairs
from headgraph.core.types import PairScores


def _grid(values: torch.Tensor, valid: torch.Tensor, layers=(0, 3, 5)) -> PairScores:
    L, Hs, _, Ht = values.shape
    return PairScores(
        kind="pk", pairing="OK", source_role="O", target_role="K",
        scores=torch.where(valid, values, 0.0), normalized=torch.where(valid, values / 4, 0.0), valid=valid,
        layer_indices=tuple(layers), order="forward",
        source_ranks=torch.full((L, Hs), 4), target_ranks=torch.full((L, Ht), 4), source_rank=4, target_rank=4,
    )


def _tied_grid() -> PairScores:
    g = torch.Generator().manual_seed(0)
    # few distinct values -> many ties, on purpose
    values = torch.randint(0, 5, (3, 4, 3, 2), generator=g).to(torch.float32)
    layer = torch.arange(3)
    valid = (layer[:, None] < layer[None, :])[:, None, :, None].expand(3, 4, 3, 2).clone()
    valid[0, 1, 2, 0] = False
    return _grid(values, valid)


def _brute_force(result: PairScores, values: torch.Tensor) -> list[tuple]:
    L, Hs, Lt, Ht = values.shape
    entries = [
        (-float(values[a, b, c, d]), a, b, c, d)
        for a in range(L) for b in range(Hs) for c in range(Lt) for d in range(Ht)
        if result.valid[a, b, c, d]
    ]
    return sorted(entries)


@pytest.mark.parametrize("k", [1, 7, 20])
def test_top_pairs_matches_brute_force_with_ties(k):
    res = _tied_grid()
    top = top_pairs(res, k)
    expected = _brute_force(res, res.scores)[:k]
    assert len(top) == k
    got = list(zip((-top.score).tolist(), top.source_layer.tolist(), top.source_head.tolist(),
                   top.target_layer.tolist(), top.target_head.tolist()))
    assert got == [(e[0], e[1], e[2], e[3], e[4]) for e in expected]
    # deterministic: same answer on a second call
    again = top_pairs(res, k)
    assert torch.equal(again.source_head, top.source_head) and torch.equal(again.target_layer, top.target_layer)


def test_top_pairs_k_larger_than_valid_metrics_and_records():
    res = _tied_grid()
    n_valid = int(res.valid.sum())
    allp = top_pairs(res, 10_000)
    assert len(allp) == n_valid
    assert bool(res.valid[allp.source_layer, allp.source_head, allp.target_layer, allp.target_head].all())
    norm = top_pairs(res, 5, metric="normalized")
    assert torch.allclose(norm.value, norm.score / 4)
    custom = -res.scores  # rank by an explicit tensor
    low = top_pairs(res, 6, values=custom)
    expected = _brute_force(res, custom)[:6]
    assert list(zip(low.source_layer.tolist(), low.source_head.tolist(), low.target_layer.tolist(),
                    low.target_head.tolist())) == [e[1:] for e in expected]
    recs = top_pairs(res, 3).to_records(extra={"z": res.scores * 10})
    first = recs[0]
    sl, sh, tl, th = expected_first = _brute_force(res, res.scores)[0][1:]
    assert first["source"] == f"L{(0, 3, 5)[sl]}H{sh}" and first["target"] == f"L{(0, 3, 5)[tl]}H{th}"
    assert first["pk"] == pytest.approx(float(res.scores[expected_first]))
    assert first["normalized"] == pytest.approx(float(res.scores[expected_first]) / 4)
    assert first["z"] == pytest.approx(10 * first["pk"])
    assert [r["rank"] for r in recs] == [1, 2, 3]
    with pytest.raises(InvalidInput):
        top_pairs(res, 3, metric="bogus")


def test_spearman_matches_scipy_with_ties():
    g = torch.Generator().manual_seed(1)
    a = torch.randint(0, 6, (4, 5, 4, 5), generator=g).double()
    b = a + torch.randn(a.shape, generator=g, dtype=torch.float64) * 2
    b[b > 3] = 3.0  # ties on the other side as well
    valid = torch.rand(a.shape, generator=g) < 0.6
    ref = scipy.stats.spearmanr(a[valid].numpy(), b[valid].numpy()).statistic
    assert spearman(a, b, valid) == pytest.approx(ref, abs=1e-12)
    assert math.isnan(spearman(a, b, torch.zeros_like(valid)))


def test_compare_metrics_against_scipy_and_brute_force(make_heads):
    g = torch.Generator().manual_seed(2)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    heads = make_heads(r(4, 4, 24, 6), r(4, 2, 24, 6), r(4, 2, 24, 6), r(4, 4, 6, 24))
    pk = projection_kernel(heads, "OK")
    cs = composition_score(heads, "K")
    assert pk.scores.shape == (4, 4, 4, 2) and cs.scores.shape == (4, 4, 4, 4)
    cmp = compare_metrics(pk, cs, top_percent=10.0)
    pk_q = pk.scores.repeat_interleave(2, dim=3)
    assert torch.equal(cmp.pk_values, pk_q)
    valid = cs.valid
    assert cmp.n_valid == int(valid.sum()) == 6 * 16
    ref_all = scipy.stats.spearmanr(pk_q[valid].numpy(), cs.scores[valid].numpy()).statistic
    assert cmp.rho_all == pytest.approx(ref_all, abs=1e-9)
    n_top = math.ceil(0.1 * cmp.n_valid)
    top_pk = {e[1:] for e in _brute_force(cs, pk_q)[:n_top]}
    top_cs = {e[1:] for e in _brute_force(cs, cs.scores)[:n_top]}
    for idx in torch.nonzero(valid).tolist():
        code = int(tuple(idx) in top_pk) + 2 * int(tuple(idx) in top_cs)
        assert int(cmp.quadrant[tuple(idx)]) == code
    union = torch.zeros_like(valid)
    for idx in top_pk | top_cs:
        union[idx] = True
    assert cmp.n_union == len(top_pk | top_cs)
    assert cmp.rho_top == pytest.approx(
        scipy.stats.spearmanr(pk_q[union].numpy(), cs.scores[union].numpy()).statistic, abs=1e-9)
    assert sum(cmp.counts.values()) == cmp.n_valid and cmp.counts["both"] + cmp.counts["pk_only"] == n_top
    assert cmp.to_dict()["top_percent"] == 10.0
    assert expand_heads(torch.zeros(2, 2, 2, 1), 4, 2).shape == (2, 4, 2, 2)


def test_compare_metrics_on_the_pk_grid_counts_each_kv_score_once(make_heads):
    g = torch.Generator().manual_seed(5)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    heads = make_heads(r(3, 6, 24, 4), r(3, 2, 24, 4), r(3, 2, 24, 4), r(3, 6, 4, 24))
    pk = projection_kernel(heads, "OV")
    cs = composition_score(heads, "V")
    cmp = compare_metrics(pk, cs, top_percent=20.0, on="pk")
    assert cmp.on == "pk" and cmp.to_dict()["on"] == "pk"
    assert torch.equal(cmp.pk_values, pk.scores) and torch.equal(cmp.valid, pk.valid)
    assert cmp.n_valid == int(pk.valid.sum()) == 3 * 6 * 2  # 3 forward layer pairs x 6 x 2 groups
    mean = cs.scores.double().reshape(3, 6, 3, 2, 3).mean(dim=-1)  # query heads 3g..3g+2 -> group g
    assert torch.allclose(cmp.cs_values[pk.valid], mean[pk.valid], atol=1e-12)
    ref = scipy.stats.spearmanr(pk.scores[pk.valid].numpy(), mean[pk.valid].numpy()).statistic
    assert cmp.rho_all == pytest.approx(ref, abs=1e-9)
    assert sum(cmp.counts.values()) == cmp.n_valid and cmp.n_top == math.ceil(0.2 * cmp.n_valid)
    same = compare_metrics(projection_kernel(heads, "OQ"), composition_score(heads, "Q"), on="pk")
    other = compare_metrics(projection_kernel(heads, "OQ"), composition_score(heads, "Q"), on="cs")
    assert same.rho_all == pytest.approx(other.rho_all) and same.counts == other.counts
    with pytest.raises(InvalidInput):
        compare_metrics(pk, cs, on="kv")
