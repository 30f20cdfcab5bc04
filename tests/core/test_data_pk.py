"""Data-weighted PK (core.data_pk): the share of a source head's output variance that falls in
a target's read subspace, and of the target's input variance the source contributes.

Checked against a direct float64 computation on the demo (activations captured through the
model's own z hook, the residual stream rebuilt from them by hand, explicit covariance
matrices, projectors U U^T from an SVD of the weights), for basis independence, for the
demo's induction circuit (the previous-token head's output is what the induction heads'
keys read, with heads found from attention patterns), on the real SmolLM2 GGUF (GQA shapes),
and through the API (a real uvicorn on loopback) and the CLI in
tests/server/test_data_pk_api.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headgraph.core.activations.ablation import prompt_sets
from headgraph.core.activations.data_pk import (DATA_PK_PAIRINGS, activation_covariances, counted_positions,
                                    data_pk, data_weighted_pk)
from headgraph.core.errors import InvalidInput
from headgraph.core.models.loading import load_model
from headgraph.core.scores.subspaces import role_bases
from headgraph.core.types import RoleBases

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one torch thread


@pytest.fixture(scope="module")
def demo():
    return load_model("demo", device="cpu")


@pytest.fixture(scope="module")
def demo_text(demo):
    return data_pk(demo, prompt_set="text")


@pytest.fixture(scope="module")
def demo_random(demo):
    return data_pk(demo, prompt_set="random")


def direct_demo(model, prompt_set, half=None, pairings=DATA_PK_PAIRINGS):
    """out_share and in_share [L, H, L, H] per pairing, by hand in float64 (``half`` 0 / 1:
    only the even / odd prompts of the set)."""
    net = model.patterns  # the DemoModel
    sets, _ = prompt_sets(net)
    ids, mask = sets[prompt_set]
    if half is not None:
        ids, mask = ids[half::2], mask[half::2]
    zs = {}

    def hook(name, layer, t):
        if name == "z":
            zs[layer] = t.detach().transpose(1, 2).double()  # [B, T, H, dh]

    with torch.no_grad():
        net(ids, hook=hook)
    W_O = net.W_O.detach().double()
    L, H = W_O.shape[:2]
    keep = (mask & (mask.long().cumsum(-1) > 1)).numpy()  # real positions but the first
    outs = [torch.einsum("bthe,hed->bthd", zs[a], W_O[a]) for a in range(L)]  # [B, T, H, d]
    resid = [net.W_E.detach().double()[ids]]
    resid.append(resid[0] + outs[0].sum(2) + net.b_O.detach().double()[0])
    covs_o = [[np.cov(outs[a][..., h, :].numpy()[keep], rowvar=False, bias=True)
               for h in range(H)] for a in range(L)]
    covs_x = [np.cov(resid[b].numpy()[keep], rowvar=False, bias=True) for b in range(L)]
    out = {}
    for pairing in pairings:
        W = {"Q": net.W_Q, "K": net.W_K, "V": net.W_V}[pairing[1]].detach().double()
        U = torch.linalg.svd(W, full_matrices=False).U.numpy()  # [L, H, d, dh]
        o_sh = np.zeros((L, H, L, H))
        i_sh = np.zeros((L, H, L, H))
        for a in range(L):
            for b in range(a + 1, L):
                for h in range(H):
                    for t in range(H):
                        P = U[b, t] @ U[b, t].T
                        num = np.trace(P @ covs_o[a][h])
                        o_sh[a, h, b, t] = num / np.trace(covs_o[a][h])
                        i_sh[a, h, b, t] = num / np.trace(P @ covs_x[b])
        out[pairing] = (o_sh, i_sh)
    return out, int(keep.sum())


@pytest.mark.parametrize("prompt_set", ["text", "random"])
def test_matches_a_direct_float64_computation(demo, demo_text, demo_random, prompt_set):
    ours = demo_text if prompt_set == "text" else demo_random
    ref, n = direct_demo(demo, prompt_set)
    for pairing, (o_sh, i_sh) in ref.items():
        r = ours[pairing]
        assert r.n_positions == n and r.prompt_set == prompt_set
        assert r.out_share.shape == r.in_share.shape == (2, 8, 2, 8)
        assert r.valid[0, :, 1].all() and not r.valid[1].any() and not r.valid[:, :, 0].any()
        np.testing.assert_allclose(r.out_share.numpy(), o_sh, rtol=1e-5, atol=1e-9)
        np.testing.assert_allclose(r.in_share.numpy(), i_sh, rtol=1e-5, atol=1e-9)
        assert torch.all(r.out_share_baseline == 16 / 128)


def test_a_half_of_the_prompts_is_fit_on_those_prompts_only(demo, demo_text):
    even = data_pk(demo, ("OK",), prompt_set="text", half="even")["OK"]
    ref, n = direct_demo(demo, "text", half=0, pairings=("OK",))
    assert even.n_prompts == 10 and even.n_positions == n
    np.testing.assert_allclose(even.in_share.numpy(), ref["OK"][1], rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(even.out_share.numpy(), ref["OK"][0], rtol=1e-5, atol=1e-9)
    assert not np.allclose(even.in_share.numpy(), demo_text["OK"].in_share.numpy())  # not the whole set
    with pytest.raises(InvalidInput, match="unknown half"):
        data_pk(demo, ("OK",), prompt_set="text", half="first")


def test_basis_independent(demo):
    cov = activation_covariances(demo.patterns, prompt_set="text")
    W_O = demo.heads.W_O
    gen = torch.Generator().manual_seed(0)
    for pairing in DATA_PK_PAIRINGS:
        bases = role_bases(demo.heads, pairing[1])
        q, _ = torch.linalg.qr(torch.randn(*bases.U.shape[:2], bases.rank, bases.rank,
                                           generator=gen, dtype=torch.float64))
        rotated = RoleBases(role=bases.role, U=bases.U.double() @ q, ranks=bases.ranks,
                            rank=bases.rank, rtol=bases.rtol)
        a, b = (data_weighted_pk(cov, W_O, x, pairing) for x in (bases, rotated))
        torch.testing.assert_close(a.out_share, b.out_share, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(a.in_share, b.in_share, rtol=1e-9, atol=1e-12)


def test_previous_token_head_is_what_the_induction_keys_read(demo, demo_random):
    """The demo's circuit seen in the data: heads identified from attention patterns, the
    expectation stated relative to the other sources, paths and random baselines."""
    from headgraph.core.activations.patterns import pattern_scores

    scores = pattern_scores(demo.patterns)
    prev = int(scores.previous_token[0].argmax())  # layer 0's previous-token head
    induction = torch.nonzero(scores.induction[1] > 0.4).flatten().tolist()
    assert induction, scores.induction[1]
    k, q, v = demo_random["OK"], demo_random["OQ"], demo_random["OV"]
    for t in induction:
        shares = k.in_share[0, :, 1, t]
        others = torch.cat([shares[:prev], shares[prev + 1:]])
        assert int(shares.argmax()) == prev, shares
        assert float(shares[prev]) > 2 * float(others.max())  # the source the keys read most
        assert float(shares[prev]) > float(k.in_share_baseline[0, prev, 1])  # above random
        # the keys read the previous-token head's output more than queries and values do
        assert float(shares[prev]) > float(q.in_share[0, prev, 1, t])
        assert float(shares[prev]) > float(v.in_share[0, prev, 1, t])
        assert float(k.out_share[0, prev, 1, t]) > 2 * float(k.out_share_baseline[1, t])


def test_ranges_and_bad_input(demo, demo_text):
    for r in demo_text.values():
        assert float(r.out_share.min()) >= 0 and float(r.out_share.max()) <= 1
        assert torch.isfinite(r.in_share).all() and float(r.in_share.min()) >= 0
    d = demo_text["OK"].to_dict()
    assert set(d) >= {"out_share", "in_share", "valid", "out_share_baseline", "method"}
    with pytest.raises(InvalidInput, match="O->Q/K/V"):
        data_pk(demo, ["QK"])
    with pytest.raises(InvalidInput, match="prompt set"):
        data_pk(demo, prompt_set="nope")
    assert counted_positions(torch.tensor([[0, 1, 1, 0]], dtype=torch.bool)).tolist() == \
        [[False, False, True, False]]

