"""Baselines and flags over HTTP (a real uvicorn subprocess, tests/api_support.py): token lists
against the random-subspace baseline, attention-sink heads and edges, hub descriptions, and the
random-initialization null, each compared with core computed here or an independent reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from api_support import (  # noqa: F401  (fixtures are found by name in the test module)
    api, err, model_root, ok, server,
)
from headgraph.core.demo_model import load_demo_model
from headgraph.core.tokens import top_tokens

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def demo_heads():
    return load_demo_model().head_weights()


# -- token baselines --------------------------------------------------------------------------

def test_tokens_carry_the_baseline_and_flags(api, demo_heads):
    t = ok(api.get("/api/tokens", params={"model": "demo", "role": "O", "k": 10}))
    core = top_tokens(demo_heads, "O", k=10)
    assert t["k"] == 10 and t["baseline"]["samples"] == 40 and t["baseline"]["quantile"] == 0.95
    assert "0.95-quantile" in t["baseline"]["rule"]
    b = t["baseline"]["by_rank"]["16"]
    assert len(b["rank_threshold"]) == 10 and len(b["mean_topk_threshold"]) == 10
    np.testing.assert_allclose(b["mean_topk_threshold"],
                               core.baseline_of(16).mean_topk_threshold.numpy(), atol=1e-6)
    flags = {h["name"]: h["above_baseline"] for h in t["heads"]}
    expect = {core.names[i][j]: bool(core.above_baseline[i, j])
              for i in range(2) for j in range(8)}
    assert flags == expect and t["n_above_baseline"] == sum(expect.values())
    assert all(flags[f"L1H{h}"] for h in range(8))
    one = t["heads"][8]
    assert one["rank"] == 16 and one["baseline_threshold"] == pytest.approx(
        b["mean_topk_threshold"][-1])
    assert [x["above_baseline"] for x in one["tokens"]] == core.token_above[1, 0].tolist()
    head = ok(api.get("/api/tokens", params={"model": "demo", "role": "O", "k": 3,
                                             "layer": 1, "head": 2}))
    assert head["n_above_baseline"] == 1 and len(head["heads"][0]["tokens"]) == 3
    err(api.get("/api/tokens", params={"model": "demo", "role": "O", "k": 0}), 422)
