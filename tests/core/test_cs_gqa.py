"""Composition Scores of grouped-query (GQA) OK / OV pairs in core: a KV pair's CS is the mean
over the valid query heads the target KV group serves (core.ranking.kv_level_cs), checked by
hand on random weights. That every export and view carries it (API, CLI, the local Qwen2
folder and the real SmolLM2 GGUF against a float64 reference) is tests/server/test_cs_gqa_api.py.
"""

from __future__ import annotations

import pytest
import torch

from headgraph.core.scores.composition_score import composition_score
from headgraph.core.errors import InvalidInput
from headgraph.core.scores.ranking import kv_level_cs


def test_kv_level_cs_is_the_mean_over_valid_served_query_heads(make_heads):
    g = torch.Generator().manual_seed(11)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    W_O = r(3, 4, 4, 24)
    W_O[2, 3] = 0.0  # target query head L2H3 writes nothing: its V-composition CS is invalid
    heads = make_heads(r(3, 4, 24, 4), r(3, 2, 24, 4), r(3, 2, 24, 4), W_O)
    cs = composition_score(heads, "V")
    kv = kv_level_cs(cs, 2)
    assert kv.grouped and kv.group == 2 and kv.scores.shape == (3, 4, 3, 2)
    assert kv.scores.dtype == torch.float64
    for sl, sh, tl, th in [(0, 1, 2, 1), (1, 0, 2, 0), (0, 2, 1, 1)]:
        members = [q for q in (2 * th, 2 * th + 1) if bool(cs.valid[sl, sh, tl, q])]
        want = sum(float(cs.scores[sl, sh, tl, q]) for q in members) / len(members)
        assert float(kv.scores[sl, sh, tl, th]) == pytest.approx(want, rel=1e-12)
        assert kv.members(sl, sh, tl, th) == members
        assert kv.cs_of(sl, sh, tl, th) == "mean over " + ", ".join(f"L{tl}H{q}" for q in members)
    assert kv.cs_of(0, 1, 2, 1) == "mean over L2H2"  # L2H3 is invalid, so not averaged
    assert int(kv.count[0, 1, 2, 1]) == 1 and int(kv.count[0, 1, 2, 0]) == 2
    # backward cells: no valid member, NaN, not valid, no cs_of
    assert not bool(kv.valid[2, 0, 0, 0]) and torch.isnan(kv.scores[2, 0, 0, 0])
    assert kv.cs_of(2, 0, 0, 0) is None
    vals, ofs = kv.cells(torch.tensor([0, 2]), torch.tensor([1, 0]), torch.tensor([2, 0]),
                         torch.tensor([1, 0]))
    assert vals[1] is None and ofs == ["mean over L2H2", None]
    assert vals[0] == pytest.approx(float(cs.scores[0, 1, 2, 2]), rel=1e-12)
    # no grouping: the CS itself, no cs_of
    same = kv_level_cs(cs, 4)
    assert not same.grouped and same.cs_of(0, 1, 2, 1) is None
    assert torch.equal(same.valid, cs.valid)
    assert torch.equal(same.scores[cs.valid], cs.scores[cs.valid].double())
    with pytest.raises(InvalidInput):
        kv_level_cs(cs, 3)

