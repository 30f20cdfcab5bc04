"""The anisotropic null reads each role's covariance once: per-layer accumulation equals the
float64 definition, and every pairing sharing a role gets the samples of the uncached path."""

from __future__ import annotations

import torch

from headgraph.core.stats.nulls import (
    anisotropic_null,
    anisotropic_pk_samples,
    release_null_factors,
    role_covariance,
)


def test_role_covariance_and_cached_null(make_heads):
    g = torch.Generator().manual_seed(3)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    heads = make_heads(r(3, 4, 16, 4).to(torch.bfloat16), r(3, 2, 16, 4).to(torch.bfloat16),
                       r(3, 2, 16, 4).to(torch.bfloat16), r(3, 4, 4, 16).to(torch.bfloat16))
    w = heads.W_K.double()
    want = torch.einsum("lhdr,lher->de", w, w) / (3 * 2 * 4)
    sigma = role_covariance(heads, "K")
    assert (sigma - want).abs().max() < 1e-5 * want.abs().max()
    assert not any(k[0] == "role_covariance" for k in heads._cache)  # not kept: 128 MiB at 7B
    for pairing in ("OK", "QK", "OV"):
        got = anisotropic_null(heads, pairing, samples=64, seed=2)
        ref = anisotropic_pk_samples(role_covariance(heads, pairing[0]),
                                     role_covariance(heads, pairing[1]), 4, 4, 64, seed=2)
        assert torch.equal(got.samples, torch.sort(ref).values)
        assert (got.source_rank, got.target_rank) == (4, 4)
    assert not any(k[0] == "bases" for k in heads._cache)  # no bases factorized for the null
    # the eigen-factors are shared by the pairings until released; the null results stay
    assert {k[1] for k in heads._cache if k[0] == "role_eig"} == {"O", "Q", "K", "V"}
    assert release_null_factors(heads) == 4
    assert not any(k[0] == "role_eig" for k in heads._cache)
    assert anisotropic_null(heads, "OV", samples=64, seed=2) is got  # the result is kept
