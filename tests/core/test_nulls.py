"""Nulls: covariance, anisotropic/Haar samples, empirical p-values and Benjamini-Hochberg."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from headgraph.core.errors import InvalidInput
from headgraph.core.stats.nulls import (
    anisotropic_null,
    anisotropic_pk_samples,
    benjamini_hochberg,
    haar_null,
    pair_pvalues,
    role_covariance,
)
from headgraph.core.scores.pk import projection_kernel
from headgraph.core.stats.reference import haar_moments


def _heads(make_heads, seed=0, L=3, H=3, d=32, dh=4, basis=None):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    if basis is None:
        return make_heads(r(L, H, d, dh), r(L, H, d, dh), r(L, H, d, dh), r(L, H, dh, d))
    k = basis.shape[1]
    return make_heads(*(basis @ r(L, H, k, dh) for _ in range(3)), (basis @ r(L, H, k, dh)).transpose(-2, -1))


def _bh_reference(p: np.ndarray, alpha: float) -> np.ndarray:
    """Textbook step-up procedure, written independently with Python loops in float64."""
    m = len(p)
    order = sorted(range(m), key=lambda i: p[i])
    k_max = 0
    for rank, i in enumerate(order, start=1):
        if p[i] <= rank * alpha / m:
            k_max = rank
    rejected = np.zeros(m, dtype=bool)
    for rank, i in enumerate(order, start=1):
        if rank <= k_max:
            rejected[i] = True
    return rejected


def test_role_covariance_is_mean_of_head_outer_products(make_heads):
    heads = _heads(make_heads, seed=1)
    for role in ("Q", "O"):
        w = heads.role(role)
        expected = sum(w[a, b] @ w[a, b].T for a in range(3) for b in range(3)) / (9 * 4)
        assert torch.allclose(role_covariance(heads, role), expected, atol=1e-12)


def test_isotropic_covariance_gives_the_haar_law():
    eye = torch.eye(30, dtype=torch.float64)
    samples = anisotropic_pk_samples(eye, eye, 5, 5, 6000, seed=0)
    mom = haar_moments(30, 5)
    assert abs(float(samples.mean()) - mom.mean) < 4 * math.sqrt(mom.variance / 6000)
    assert float(samples.var()) == pytest.approx(mom.variance, rel=0.12)


def test_anisotropic_null_reflects_where_weights_live(make_heads):
    basis = torch.linalg.qr(torch.randn(32, 8, generator=torch.Generator().manual_seed(2), dtype=torch.float64)).Q
    heads = _heads(make_heads, seed=3, basis=basis)
    null = anisotropic_null(heads, "OK", samples=1500, seed=0)
    # planes confined to one shared 8-dim subspace: expected PK = 4 * 4 / 8, not 4 * 4 / 32
    assert null.mean == pytest.approx(2.0, rel=0.05)
    assert null.samples.shape == (1500,) and torch.all(null.samples[1:] >= null.samples[:-1])
    again = anisotropic_null(heads, "OK", samples=1500, seed=0)
    assert torch.equal(null.samples, again.samples)
    assert null.to_dict()["kind"] == "anisotropic"
    # against this null the confined model's PKs are unremarkable; against Haar they are all extreme
    pk = projection_kernel(heads, "OK")
    p_aniso = pair_pvalues(pk, null)
    p_haar = pair_pvalues(pk, haar_null(32, 4, samples=1500, seed=0, pairing="OK"))
    assert float(p_aniso[pk.valid].median()) > 0.2
    assert float(p_haar[pk.valid].max()) < 0.01


def test_pvalues_match_a_brute_force_count(make_heads):
    heads = _heads(make_heads, seed=4)
    pk = projection_kernel(heads, "OV")
    null = anisotropic_null(heads, "OV", samples=500, seed=1)
    p = pair_pvalues(pk, null)
    samples = null.samples.numpy()
    for idx in torch.nonzero(pk.valid).tolist():
        obs = float(pk.scores[tuple(idx)])
        expected = (1 + np.sum(samples >= obs)) / (1 + samples.size)
        assert float(p[tuple(idx)]) == pytest.approx(expected, abs=1e-15)
    assert torch.all((p > 0) & (p <= 1))
    assert torch.all(p[~pk.valid] == 1)
    with pytest.raises(InvalidInput, match="pairing"):
        pair_pvalues(projection_kernel(heads, "OK"), null)


def test_benjamini_hochberg_matches_reference_and_is_monotone():
    rng = np.random.default_rng(0)
    p = np.concatenate([rng.uniform(0, 1, 300), rng.uniform(0, 0.002, 40)])
    p[5] = p[7] = p[300]  # ties
    grid = torch.tensor(p).reshape(2, 5, 2, 17)
    valid = torch.tensor(rng.uniform(size=grid.shape) < 0.8)
    previous = torch.zeros_like(valid)
    for alpha in (0.001, 0.01, 0.05, 0.1, 0.3, 1.0):
        got = benjamini_hochberg(grid, valid, alpha)
        ref = _bh_reference(grid[valid].numpy(), alpha)
        assert np.array_equal(got[valid].numpy(), ref), alpha
        assert not bool(got[~valid].any())
        assert bool((previous & ~got).sum() == 0)  # monotone: a larger alpha never rejects fewer
        previous = got
    assert int(benjamini_hochberg(grid, valid, 0.05).sum()) > 0
    high = torch.full((3,), 0.9, dtype=torch.float64)
    assert not bool(benjamini_hochberg(high, torch.ones(3, dtype=torch.bool)).any())


def test_bh_qvalues_match_scipy_and_the_step_up_masks():
    import numpy as np
    from scipy.stats import false_discovery_control

    from headgraph.core.stats.nulls import benjamini_hochberg, bh_qvalues

    gen = torch.Generator().manual_seed(7)
    p = torch.rand(3, 5, 3, 5, generator=gen, dtype=torch.float64) ** 3
    valid = torch.rand(3, 5, 3, 5, generator=gen) > 0.3
    q = bh_qvalues(p, valid)
    want = false_discovery_control(p[valid].numpy(), method="bh")
    assert np.allclose(q[valid].numpy(), want, rtol=0, atol=1e-12)
    assert torch.isnan(q[~valid]).all()
    for alpha in (0.001, 0.01, 0.05, 0.2, 0.5):
        assert torch.equal((q <= alpha) & valid, benjamini_hochberg(p, valid, alpha))


# -- random-initialization null (issue 15 item 5) ---------------------------------------------

def _hf_llama_heads(seed: int):
    """Head weights read by hand from transformers' own from_config init of a tiny Llama
    (q/k/v/o_proj, [out, in] rows per head), independent of headgraph's extraction."""
    from headgraph.core.models.random_weights import preset_config, random_causal_lm
    from headgraph.core.types import HeadWeights, ModelInfo

    cfg = preset_config("llama-tiny")
    lm = random_causal_lm(cfg, seed=seed, name="llama-tiny", device="cpu", dtype=torch.float32)
    H, Hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size
    dh = d // H
    qs, ks, vs, os_ = [], [], [], []
    for layer in lm.model.layers:
        a = layer.self_attn
        qs.append(a.q_proj.weight.detach().T.reshape(d, H, dh).permute(1, 0, 2))
        ks.append(a.k_proj.weight.detach().T.reshape(d, Hkv, dh).permute(1, 0, 2))
        vs.append(a.v_proj.weight.detach().T.reshape(d, Hkv, dh).permute(1, 0, 2))
        os_.append(a.o_proj.weight.detach().T.reshape(H, dh, d))
    L = len(qs)
    info = ModelInfo(name="llama-tiny", architecture="LlamaForCausalLM", n_layers=L, n_heads=H,
                     n_kv_heads=Hkv, d_model=d, d_head=dh, d_vocab=None, dtype="float32",
                     layer_indices=tuple(range(L)), processing="raw", source="config")
    return HeadWeights(info=info, W_Q=torch.stack(qs), W_K=torch.stack(ks), W_V=torch.stack(vs),
                       W_O=torch.stack(os_), W_U=None, fingerprint=f"llama{seed}")


def test_random_init_null_matches_transformers_init_and_the_haar_law():
    from scipy.stats import ks_2samp

    from headgraph.core.stats.nulls import random_init_null

    hf = [_hf_llama_heads(s) for s in range(8)]
    exact = random_init_null(hf, "OQ")  # the caller's own from_config models, pooled
    built = random_init_null(hf[0], "OQ", target=256, max_models=16)  # Gaussian builder
    assert exact.kind == built.kind == "random_init" and exact.seed == 8
    assert exact.samples.numel() == 8 * 16 and built.samples.numel() >= 256
    assert ks_2samp(exact.samples.numpy(), built.samples.numpy()).pvalue > 1e-3
    m = haar_moments(64, 16, 16)  # closed form: PK of Haar planes in R^64
    for dist in (exact, built):
        assert abs(dist.mean - m.mean) < 4 * m.std / math.sqrt(dist.samples.numel())
        assert dist.std == pytest.approx(m.std, rel=0.25)


def test_random_init_null_of_the_demo_and_what_beats_it():
    from headgraph.core.models.demo import load_demo_model
    from headgraph.core.stats.nulls import random_init_heads, random_init_null

    heads = load_demo_model().head_weights()
    null = random_init_null(heads, "OK")
    assert null.samples.numel() == 4 * 64 and null.seed == 4  # 8 x 8 forward pairs, 4 inits
    assert null.source_rank == null.target_rank == 16
    again = random_init_heads(heads.info, seed=1)
    assert again.info.architecture == heads.info.architecture and again.W_U is None
    assert torch.equal(again.W_Q, random_init_heads(heads.info, seed=1).W_Q)  # seeded
    m = haar_moments(128, 16, 16)
    assert abs(null.mean - m.mean) < 4 * m.std / math.sqrt(256)
    pk = projection_kernel(heads, "OK")
    q95 = float(torch.quantile(null.samples, 0.95))
    assert bool((pk.scores[0, 0, 1] > q95).all())  # the previous-token head feeds every L1 key
    d = null.to_dict()
    assert d["kind"] == "random_init" and d["n_samples"] == 256
    with pytest.raises(InvalidInput):
        random_init_null(heads, "OK", target=0)
    with pytest.raises(InvalidInput):
        random_init_null([], "OK")
    with pytest.raises(InvalidInput):
        random_init_heads(heads.info, seed=-1)


def test_random_init_null_from_fewer_layers_has_the_full_models_distribution():
    """Random-init layers are drawn alike, so the null uses only as many as give its target
    pairs; their PKs follow the all-layer model's distribution (KS test) at a fraction of the cost."""
    from dataclasses import replace

    from scipy.stats import ks_2samp

    from headgraph.core.models.loading import load_model
    from headgraph.core.stats.nulls import random_init_heads, random_init_layers, random_init_null
    from headgraph.core.scores.pk import projection_kernel

    info = replace(load_model("demo").heads.info, name="wide", architecture="llama", n_layers=24,
                   layer_indices=tuple(range(24)))
    layers = random_init_layers(info, "OK", 600)
    assert 2 <= layers < 24
    assert 8 * 8 * layers * (layers - 1) // 2 >= 600  # forward pairs of the subset reach the target
    full = projection_kernel(random_init_heads(info, seed=7), "OK")
    some = projection_kernel(random_init_heads(info, seed=8, n_layers=layers), "OK")
    assert some.scores.shape[0] == layers
    a, b = full.scores[full.valid].double().numpy(), some.scores[some.valid].double().numpy()
    assert ks_2samp(a, b).pvalue > 0.01
    trained = load_model("demo").heads
    null = random_init_null(replace_info(trained, info), "OK", target=600)
    assert null.to_dict()["n_samples"] >= 600


def replace_info(heads, info):
    """``heads`` with another ModelInfo (random_init_null reads only the shapes from it)."""
    from dataclasses import replace

    return replace(heads, info=info)
