"""The KL grid of a model with many heads reads the PKs among a seeded sample of each layer's
heads: the sampled pairs are exactly the full grid's pairs among those heads, and the grid
says how many heads per layer it read."""

from __future__ import annotations

import pytest
import torch

from headgraph.core.errors import InvalidInput
from headgraph.core.scores.pk import projection_kernel
from headgraph.core.stats.reference import kl_grid, sampled_heads


def test_sampled_heads_are_a_subset_with_the_full_pk(make_heads):
    g = torch.Generator().manual_seed(4)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    heads = make_heads(r(4, 8, 24, 3), r(4, 2, 24, 3), r(4, 2, 24, 3), r(4, 8, 3, 24))
    same, none = sampled_heads(heads, 6 * 8 * 8)  # 6 forward layer pairs x 8 x 8 fit
    assert same is heads and none == {}
    sub, counts = sampled_heads(heads, 6 * 9, seed=1)  # k = 3 heads per layer
    assert counts == {"Q": 3, "K": 2, "V": 2, "O": 3}
    assert sub.W_Q.shape == (4, 3, 24, 3) and sub.W_K.shape == (4, 2, 24, 3)
    full = projection_kernel(heads, "OQ").scores
    part = projection_kernel(sub, "OQ").scores
    # map each sampled head back to its original index by its weights
    idx_o = [[next(h for h in range(8) if torch.equal(heads.W_O[layer, h], sub.W_O[layer, j]))
              for j in range(3)] for layer in range(4)]
    idx_q = [[next(h for h in range(8) if torch.equal(heads.W_Q[layer, h], sub.W_Q[layer, j]))
              for j in range(3)] for layer in range(4)]
    for sl in range(4):
        for tl in range(sl + 1, 4):
            for a in range(3):
                for b in range(3):
                    want = full[sl, idx_o[sl][a], tl, idx_q[tl][b]]
                    assert float(part[sl, a, tl, b]) == pytest.approx(float(want), abs=1e-5)
    grid = kl_grid(heads, samples=500, max_pairs=6 * 9)
    assert grid.sampled and grid.heads_per_layer == counts
    assert grid.histograms["OQ"].n_pairs == 6 * 9
    assert grid.to_dict()["heads_per_layer"] == counts
    assert not kl_grid(heads, samples=500).sampled
    with pytest.raises(InvalidInput):
        sampled_heads(heads, 0)
