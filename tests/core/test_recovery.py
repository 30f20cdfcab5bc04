"""Recovery tables (the paper's Tables 1 and 2): ROC-AUC against scipy's Mann-Whitney U,
precision@k and endpoint shares by direct counting, a planted OK relation on a random local
checkpoint, and the demo's table with its induction circuit as the reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.stats
import torch

from model_support import save_random_model
from headgraph.core.errors import InvalidInput
from headgraph.core.models.loading import load_model
from headgraph.core.stats.recovery import (
    METRICS,
    _Ranked,
    cluster_weights,
    head_recovery,
    metric_grids,
    recovery_table,
    reference_from_edges,
    reference_from_heads,
    roc_auc,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def test_auc_equals_mann_whitney_with_ties():
    rng = np.random.default_rng(0)
    s = np.round(rng.normal(size=300), 1)  # many ties
    y = rng.random(300) < 0.2
    u = scipy.stats.mannwhitneyu(s[y], s[~y]).statistic
    assert roc_auc(s, y) == pytest.approx(u / (y.sum() * (~y).sum()), abs=1e-12)
    assert np.isnan(roc_auc(s, np.zeros(300, dtype=bool)))


def test_table_counts_top_k_and_auc_directly():
    g = torch.Generator().manual_seed(1)
    shape = (3, 2, 3, 2)
    valid = torch.zeros(shape, dtype=torch.bool)
    for sl in range(3):
        for tl in range(sl + 1, 3):
            valid[sl, :, tl, :] = True
    a = torch.rand(shape, generator=g, dtype=torch.float64)
    b = torch.rand(shape, generator=g, dtype=torch.float64)
    b[0, 0, 1, 0] = torch.nan  # undefined for metric b: excluded from its statistics
    ref = torch.zeros(shape, dtype=torch.bool)
    ref[0, 1, 2, 0] = ref[1, 0, 2, 1] = ref[0, 0, 1, 1] = True
    tab = recovery_table({"a": a, "b": b}, valid, ref, k=4, n_resamples=200, seed=3)
    cells = [tuple(c) for c in torch.nonzero(valid).tolist()]
    assert tab.n_valid == len(cells) == 12 and tab.n_reference == 3
    for name, grid in (("a", a), ("b", b)):
        vals = np.array([grid[c].item() for c in cells])
        fin = np.isfinite(vals)
        order = sorted((i for i in range(len(cells)) if fin[i]), key=lambda i: (-vals[i], i))[:4]
        top = [cells[i] for i in order]
        row = tab.row(name)
        assert row.top == top
        assert row.precision.value == pytest.approx(sum(bool(ref[c]) for c in top) / 4)
        s_ref, t_ref = ref.any(dim=(2, 3)), ref.any(dim=(0, 1))
        share = sum(int(s_ref[c[0], c[1]]) + int(t_ref[c[2], c[3]]) for c in top) / 8
        assert row.endpoint_share.value == pytest.approx(share)
        y = np.array([bool(ref[c]) for c in cells])
        assert row.auc.value == pytest.approx(roc_auc(vals[fin], y[fin]))
        assert row.auc.low <= row.auc.value <= row.auc.high
    diff = tab.row("b").auc_diff
    assert diff is not None and diff.value == pytest.approx(tab.row("b").auc.value - tab.row("a").auc.value)
    assert tab.row("a").auc_diff is None
    d = tab.to_dict()
    assert d["rows"][0]["top"][0].startswith("L") and d["base_rate"] == pytest.approx(3 / 12)
    with pytest.raises(InvalidInput):
        recovery_table({"a": a}, valid, ref, k=0)
    with pytest.raises(InvalidInput):
        recovery_table({"a": a}, valid, ref, baseline="zz")


def test_nan_scores_are_excluded_not_ranked_last():
    """A metric's undefined pairs leave its statistics: the table equals the table of the defined
    pairs alone (top-k, precision, AUC), whereas ranking them last would pull the AUC (half the
    reference pairs undefined here, all with the lowest rank)."""
    shape = (2, 4, 2, 4)
    valid = torch.zeros(shape, dtype=torch.bool)
    valid[0, :, 1, :] = True
    g = torch.Generator().manual_seed(5)
    m = torch.rand(shape, generator=g, dtype=torch.float64)
    ref = torch.zeros(shape, dtype=torch.bool)
    ref[0, 0, 1, :2] = ref[0, 1, 1, :2] = True
    m[0, 0, 1, :2] = torch.nan  # two of the four reference pairs undefined
    m[0, 1, 1, :2] = 2.0  # the defined ones rank first
    tab = recovery_table({"m": m}, valid, ref, k=2, n_resamples=50, unit="edges")
    cells = [tuple(c) for c in torch.nonzero(valid).tolist()]
    vals = np.array([m[c].item() for c in cells])
    y = np.array([bool(ref[c]) for c in cells])
    fin = np.isfinite(vals)
    assert tab.row("m").auc.value == pytest.approx(roc_auc(vals[fin], y[fin])) == pytest.approx(1.0)
    assert roc_auc(np.where(fin, vals, -np.inf), y) < 0.9  # what "ranked last" gave
    assert all(np.isfinite(m[c].item()) for c in tab.row("m").top)
    assert tab.row("m").precision.value == 1.0


def test_cluster_weights_are_the_product_of_head_draws_and_match_a_hand_count():
    """Tiny case: pairs (s, t) over 2 source and 2 target heads; a resample's weight of a pair
    is (draws of s) x (draws of t), and its weighted AUC is the AUC of the pairs listed that
    many times (scipy's Mann-Whitney U)."""
    src = np.array([0, 0, 1, 1])
    tgt = np.array([0, 1, 0, 1])
    rng = np.random.default_rng(0)
    w, cs, ct = cluster_weights(src, tgt, [np.array([0, 1])], [np.array([0, 1])], rng, 200)
    assert np.array_equal(w, cs[:, src] * ct[:, tgt])
    assert np.all(cs.sum(axis=1) == 2) and np.all(ct.sum(axis=1) == 2)
    # by hand: source 0 drawn twice, target 0 and 1 once each -> pairs (0,0), (0,1) twice each
    row = next(i for i in range(200) if cs[i, 0] == 2 and ct[i, 0] == 1)
    assert list(w[row]) == [2.0, 2.0, 0.0, 0.0]
    values = np.array([0.9, 0.1, 0.5, 0.3])
    labels = np.array([True, False, False, True])
    for i in range(20):
        rep = np.repeat(np.arange(4), w[i].astype(int))
        y = labels[rep]
        if y.all() or not y.any():
            continue
        want = scipy.stats.mannwhitneyu(values[rep][y], values[rep][~y]).statistic / (y.sum() * (~y).sum())
        assert _Ranked(values).auc(w[i:i + 1], labels)[0] == pytest.approx(want)


def test_head_bootstrap_is_wider_than_the_edge_bootstrap_with_per_head_labels():
    """Labels carried by heads: a reference edge is one between two reference heads, and a
    metric that is noisy per head (a head-level random offset shared by all its pairs) ranks
    pairs in head blocks. Resampling heads varies what the table is made of; resampling edges
    pretends the 12 x 12 pairs are independent, so its AUC interval is narrower."""
    rng = np.random.default_rng(7)
    H = 12
    shape = (2, H, 2, H)
    valid = torch.zeros(shape, dtype=torch.bool)
    valid[0, :, 1, :] = True
    ref_heads_s = rng.random(H) < 0.4
    ref_heads_t = rng.random(H) < 0.4
    ref = torch.zeros(shape, dtype=torch.bool)
    ref[0, :, 1, :] = torch.from_numpy(ref_heads_s[:, None] & ref_heads_t[None, :])
    score = np.zeros(shape)
    score[0, :, 1, :] = (rng.normal(size=H)[:, None] + rng.normal(size=H)[None, :]
                         + 0.8 * (ref_heads_s[:, None] & ref_heads_t[None, :]) + 0.1 * rng.normal(size=(H, H)))
    grids = {"m": torch.from_numpy(score)}
    heads = recovery_table(grids, valid, ref, k=10, n_resamples=400, seed=1, unit="heads")
    edges = recovery_table(grids, valid, ref, k=10, n_resamples=400, seed=1, unit="edges")
    assert heads.row("m").auc.value == edges.row("m").auc.value  # the same point
    width = {t.unit: t.row("m").auc.high - t.row("m").auc.low for t in (heads, edges)}
    assert width["heads"] > 1.5 * width["edges"]
    assert heads.to_dict()["bootstrap"].startswith("head-cluster")
    with pytest.raises(InvalidInput):
        recovery_table(grids, valid, ref, unit="pairs")


def test_reference_masks_group_kv_targets():
    ref, s, t = reference_from_heads(["L0H1", "L2H3"], (0, 2), 4, 2, 4)
    assert ref.shape == (2, 4, 2, 2)
    assert s.tolist() == [[False, True, False, False], [False, False, False, True]]
    assert t.tolist() == [[True, False], [False, True]]  # L0H1 in group 0, L2H3 in group 1
    assert bool(ref[0, 1, 1, 1]) and int(ref.sum()) == 4  # both heads are sources and targets
    e, es, et = reference_from_edges([(0, 1, 1, 0)], (2, 4, 2, 2))
    assert int(e.sum()) == 1 and bool(es[0, 1]) and bool(et[1, 0])
    with pytest.raises(InvalidInput):
        reference_from_edges([(5, 0, 0, 0)], (2, 4, 2, 2))


@pytest.fixture(scope="module")
def planted_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random Qwen2-shaped GQA checkpoint whose layer-2 KV group 1 key span is planted equal to
    the write span of layer-0 head 1 (W_K = W_O^T A, A invertible)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                      hidden_size=64, intermediate_size=128, max_position_embeddings=64)
    folder = save_random_model(tmp_path_factory.mktemp("planted"), cfg, Qwen2ForCausalLM, seed=5)
    model = Qwen2ForCausalLM.from_pretrained(folder)
    dh = 16
    g = torch.Generator().manual_seed(6)
    a = torch.randn(dh, dh, generator=g) + 3 * torch.eye(dh)
    with torch.no_grad():
        w_o_t = model.model.layers[0].self_attn.o_proj.weight[:, 1 * dh:2 * dh]  # [d, dh] = W_O^T of head 1
        model.model.layers[2].self_attn.k_proj.weight[1 * dh:2 * dh] = (w_o_t @ a).T
    model.save_pretrained(folder)
    return folder


def test_planted_ok_relation_ranks_first_with_auc_one(planted_dir):
    heads = load_model(str(planted_dir), device="cpu").heads
    tab = recovery_table(*_planted(heads), k=5, pairing="OK", n_resamples=200)
    pk = tab.row("pk")
    assert pk.top[0] == (0, 1, 2, 1)
    assert pk.auc.value is not None and pk.auc.value >= 0.99
    assert pk.precision.value == pytest.approx(1 / 5)
    assert tab.row("random").auc.value < 0.99 or tab.row("random").top[0] != (0, 1, 2, 1)


def _planted(heads):
    grids, valid = metric_grids(heads, "OK")
    ref, _, _ = reference_from_edges([(0, 1, 2, 1)], tuple(valid.shape))
    return grids, valid, ref


def test_demo_recovery_table_with_the_induction_circuit():
    """The demo's induction circuit as the reference: its previous-token heads (layer 0) and
    induction heads (layer 1) from attention-pattern scores; every metric gets a row with
    intervals, and PK's paired differences."""
    from headgraph.core.activations.patterns import pattern_scores
    from headgraph.core.graphs.labels import label_set_from_scores

    lm = load_model("demo", device="cpu")
    ps = pattern_scores(lm.patterns)
    labels = label_set_from_scores({"previous_token": ps.previous_token, "induction": ps.induction},
                                   ps.layer_indices, 0.4)
    assert "Induction" in labels.class_names and "Previous Token" in labels.class_names
    tab = head_recovery(lm.heads, "OK", labels.classes, k=10, n_resamples=300)
    assert [r.metric for r in tab.rows] == list(METRICS)
    assert tab.n_reference > 0 and tab.n_valid == 8 * 8
    for row in tab.rows:
        for est in (row.endpoint_share, row.precision, row.auc):
            assert est.value is not None and est.low is not None and est.low <= est.value <= est.high
    assert tab.row("pk").auc.value > 0.5  # PK finds the previous-token -> induction K edges
    assert tab.row("cka").auc_diff is not None
