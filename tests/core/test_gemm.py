"""core.gemm: a @ b^T on plain torch, checked against float64 on odd shapes and strides."""

from __future__ import annotations

import itertools

import pytest
import torch

from headgraph.core.errors import InvalidInput
from headgraph.core.scores.gemm import addmm_nt_, bmm_nt, gemm_nt
from headgraph.core.scores.overlaps import pairwise_sq_overlap


def _rand(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _operand(rows: int, k: int, layout: str, seed: int) -> torch.Tensor:
    """[rows, k]: row-major ("r"), column-major ("c"), or a column range of a wider matrix
    with gaps between rows ("g", how core.overlaps slices a piece's features)."""
    if layout == "r":
        return _rand(rows, k, seed=seed)
    if layout == "c":
        return _rand(k, rows, seed=seed).T
    return _rand(rows, k + 9, seed=seed)[:, 5:5 + k]


@pytest.mark.parametrize("la,lb", list(itertools.product("rcg", repeat=2)))
@pytest.mark.parametrize("m,n,k", [(12, 96, 4096), (1, 1, 1), (33, 7, 300), (5, 4, 0), (17, 129, 65)])
def test_gemm_and_addmm_match_float64(la, lb, m, n, k):
    a, b = _operand(m, k, la, 1), _operand(n, k, lb, 2)
    ref = a.double() @ b.double().T
    got = gemm_nt(a, b)
    assert got.shape == (m, n) and got.dtype == torch.float32
    assert (got.double() - ref).abs().max() <= 1e-6 * max(1.0, k)
    acc = torch.ones(m, n)
    assert addmm_nt_(acc, a, b, alpha=2.0) is acc
    assert (acc.double() - (1 + 2 * ref)).abs().max() <= 2e-6 * max(1.0, k)
    view = torch.ones(m + 2, n + 3)[1:m + 1, 2:n + 2]  # an accumulator that is a strided view
    addmm_nt_(view, a, b, alpha=0.5)
    assert (view.double() - (1 + 0.5 * ref)).abs().max() <= 2e-6 * max(1.0, k)


@pytest.mark.parametrize("n,m,w,k", [(1, 1, 1, 1), (3, 17, 129, 64), (6, 128, 256, 64),
                                     (2, 5, 3, 0), (4, 300, 40, 17)])
def test_bmm_nt_on_strided_views_matches_float64(n, m, w, k):
    u = _rand(n, m + w + 3, k, seed=3)
    a, b = u[:, 1:m + 1], u[:, m + 2:m + 2 + w]  # row slices of every item, as overlaps builds pieces
    ref = a.double() @ b.double().transpose(1, 2)
    out = torch.full((n, m, w), float("nan"))
    assert bmm_nt(a, b, out=out) is out
    assert (out.double() - ref).abs().max() <= 1e-6 * max(1, k)
    t = u.transpose(1, 2)  # [n, k, rows], not contiguous: Gram matrices W^T W
    gram = bmm_nt(t, t)
    assert gram.shape == (n, k, k)
    if k:
        err = (gram.double() - t.double() @ t.double().transpose(1, 2)).abs().max()
        assert err <= 1e-5 * u.shape[1]


def test_float64_stays_float64():
    a, b = _rand(4, 8, seed=4).double(), _rand(3, 8, seed=5).double()
    assert torch.allclose(gemm_nt(a, b), a @ b.T, rtol=0, atol=1e-14)
    assert bmm_nt(a[None], b[None]).dtype == torch.float64


def test_shapes_that_do_not_pair_up_are_refused():
    a = _rand(3, 8, 16, seed=13)
    with pytest.raises(InvalidInput, match="do not pair up"):
        bmm_nt(a, _rand(2, 8, 16, seed=14))
    with pytest.raises(InvalidInput, match="do not pair up"):
        bmm_nt(a, _rand(3, 8, 15, seed=14))
    with pytest.raises(InvalidInput, match="does not hold"):
        bmm_nt(a, _rand(3, 4, 16, seed=14), out=torch.empty(3, 8, 5))
    with pytest.raises(InvalidInput, match="do not pair up"):
        gemm_nt(a[0], a[0, :, :3])
    with pytest.raises(InvalidInput, match="does not hold"):
        addmm_nt_(torch.zeros(8, 7), a[0], a[1])


@pytest.mark.parametrize("d,work_bytes", [(300, None), (130, 4096)])  # a short last band; tiny pieces
def test_projector_gram_pieces_match_float64(d, work_bytes):
    # The products of core.overlaps' gram path (pieces into reused buffers, span products on
    # row and column slices of them) agree with a float64 einsum.
    g = torch.Generator().manual_seed(5)
    u = torch.linalg.qr(torch.randn(3, 5, d, 24, generator=g))[0]
    v = torch.linalg.qr(torch.randn(3, 4, d, 40, generator=g))[0]
    got = pairwise_sq_overlap(u, v, order="all", method="gram", work_bytes=work_bytes)
    ref = torch.einsum("ahdr,bkds->ahbkrs", u.double(), v.double()).square().sum((-1, -2))
    assert (got - ref).abs().max() < 2e-5
    assert ref.abs().sum() > 0
