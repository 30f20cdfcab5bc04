"""Flags in core (core.activations.flags): attention-sink heads and edges against a numpy
threshold, KV-group sinks, and bad inputs. The same flags over HTTP (token baselines, sinks,
hub descriptions, the random-initialization null) are in tests/server/test_flags_api.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

torch.set_num_threads(1)


# -- sinks and descriptions in core -----------------------------------------------------------

def _pattern_scores(first, **others):
    from headgraph.core.activations.patterns import PATTERN_KINDS, PatternScores

    first = torch.as_tensor(first, dtype=torch.float64)
    grids = {k: others.get(k, torch.zeros_like(first)) for k in PATTERN_KINDS}
    grids["first_token"] = first
    return PatternScores(**grids, layer_indices=tuple(range(first.shape[0])), n_prompts=1,
                         induction_length=2, seed=0)


def test_sink_flags_match_a_numpy_threshold_and_mark_graph_edges():
    from headgraph.core.activations.flags import head_flags, with_null_flags
    from headgraph.core.graphs.build import build_graph
    from headgraph.core.scores.pk import projection_kernel
    from test_hubs import make_heads

    heads = make_heads(L=3, H=4, d=24, dh=4, seed=2)
    first = np.random.default_rng(0).uniform(0, 1, size=(3, 4))
    first[0, 1], first[1, 2], first[2, 0] = 0.99, 0.9, 0.8999
    flags = head_flags(_pattern_scores(first))
    assert np.array_equal(flags.sink.numpy(), first >= 0.9)
    res = {p: projection_kernel(heads, p) for p in ("OQ", "OK", "OV")}
    g = build_graph(res, k=10, info=heads.info, flags=flags)
    d = g.to_dict()
    sinks = {f"L{a}H{b}" for a, b in zip(*np.nonzero(first >= 0.9))}
    assert set(d["flags"]["sinks"]) == sinks and d["flags"]["measured"] is True
    for node in d["graph"]["nodes"]:
        assert node["sink"] is (node["id"] in sinks)
        assert node["first_token"] == pytest.approx(first[node["layer"], node["head"]])
    n_sink_edges = {p: 0 for p in res}
    for e in d["graph"]["edges"]:
        assert e["source_sink"] is (e["source"] in sinks)
        assert e["target_sink"] is (e["target"] in sinks)
        n_sink_edges[e["pairing"]] += e["source"] in sinks or e["target"] in sinks
    assert d["flags"]["sink_edges"] == n_sink_edges and sum(n_sink_edges.values()) > 0
    g.to_graphml()  # flags are plain bools / strings / floats
    # not measured: null everywhere, never False
    none = build_graph(res, k=10, info=heads.info).to_dict()
    assert none["flags"]["measured"] is False and none["flags"]["sinks"] is None
    none["graph"] = with_null_flags(none["graph"])
    assert all(n["sink"] is None and n["description"] is None for n in none["graph"]["nodes"])
    assert all(e["source_sink"] is None and e["target_sink"] is None
               for e in none["graph"]["edges"])
    assert all(r["description"] is None and r["sink"] is None for r in none["hubs"]["rows"])


def test_kv_group_sink_needs_every_query_head():
    from headgraph.core.activations.flags import head_flags

    flags = head_flags(_pattern_scores([[0.95, 0.97, 0.99, 0.5]]))
    assert flags.is_sink("L0KV0", ["L0H0", "L0H1"]) is True
    assert flags.is_sink("L0KV1", ["L0H2", "L0H3"]) is False
    assert flags.sink_heads("L0KV1", ["L0H2", "L0H3"]) == ["L0H2"]
    assert flags.first_token_of("L0KV1", ["L0H2", "L0H3"]) == pytest.approx(0.745)


def test_bad_flag_inputs():
    from headgraph.core.errors import InvalidInput
    from headgraph.core.activations.flags import head_flags, pattern_scores_from_dict

    with pytest.raises(InvalidInput):
        head_flags({"first_token": [[1.0]]})  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="sink_threshold"):
        head_flags(_pattern_scores([[0.5]]), sink_threshold=0.0)
    with pytest.raises(InvalidInput, match="unknown pattern kinds"):
        head_flags(_pattern_scores([[0.5]]), thresholds={"attention": 0.5})
    with pytest.raises(InvalidInput, match="pattern-scores payload"):
        pattern_scores_from_dict({"scores": {}})
    with pytest.raises(InvalidInput, match="no pattern scores"):
        head_flags(_pattern_scores([[0.5]])).is_sink("L3H0")

