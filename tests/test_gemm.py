"""core.gemm: both backends give a @ b^T to float32 rounding, checked against float64."""

from __future__ import annotations

import pytest
import torch

from headgraph.core.gemm import addmm_nt_, bmm_nt, gemm_nt, onednn_available


def _rand(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_onednn_is_used_here():
    # This machine's torch ships oneDNN; the speed of core.overlaps relies on it.
    assert onednn_available()


@pytest.mark.parametrize("backend", ["onednn", "blas", "auto"])
@pytest.mark.parametrize("m,n,k", [(12, 96, 4096), (1, 1, 1), (33, 7, 300), (5, 4, 0)])
def test_gemm_nt_matches_float64(backend, m, n, k):
    if backend == "onednn" and k == 0:
        with pytest.raises(ValueError):
            gemm_nt(_rand(m, k, seed=1), _rand(n, k, seed=2), backend)
        return
    a, b = _rand(m, k, seed=1), _rand(n, k, seed=2)
    ref = a.double() @ b.double().T
    got = gemm_nt(a, b, backend)
    assert got.shape == (m, n) and got.dtype == torch.float32
    assert (got.double() - ref).abs().max() <= 1e-6 * max(1.0, k)
    acc = torch.ones(m, n)
    addmm_nt_(acc, a, b, alpha=2.0, backend=backend)
    assert (acc.double() - (1 + 2 * ref)).abs().max() <= 2e-6 * max(1.0, k)


@pytest.mark.parametrize("backend", ["onednn", "blas", "auto"])
def test_bmm_nt_on_strided_views_matches_float64(backend):
    u = _rand(6, 300, 64, seed=3)
    a, b = u[:, 100:228], u[:, 0:256]  # row slices of every head, as core.overlaps builds pieces
    out = torch.empty(6, 128, 256)
    bmm_nt(a, b, out=out, backend=backend)
    ref = a.double() @ b.double().transpose(1, 2)
    assert (out.double() - ref).abs().max() < 1e-4
    w = u.transpose(1, 2)  # [6, 64, 300], not contiguous: Gram matrices W^T W
    gram = bmm_nt(w, w, backend=backend)
    assert (gram.double() - w.double() @ w.double().transpose(1, 2)).abs().max() < 1e-3


def test_float64_and_bad_backends():
    a, b = _rand(4, 8, seed=4).double(), _rand(3, 8, seed=5).double()
    assert torch.allclose(gemm_nt(a, b), a @ b.T)  # float64 goes through torch.mm
    with pytest.raises(ValueError, match="oneDNN"):
        gemm_nt(a, b, "onednn")
    with pytest.raises(ValueError, match="backend"):
        gemm_nt(a.float(), b.float(), "fast")


@pytest.mark.parametrize("backend", ["blas", "auto"])
def test_operands_with_gaps_between_rows_match_float64(backend):
    # A column range of a wider matrix: oneDNN would run a slow reference kernel on it, so
    # "auto" takes BLAS, and an explicit "onednn" says it cannot.
    a, b = _rand(40, 900, seed=6)[:, 100:700], _rand(30, 900, seed=7)[:, 100:700]
    got = gemm_nt(a, b, backend)
    assert (got.double() - a.double() @ b.double().T).abs().max() < 1e-3
    with pytest.raises(ValueError, match="oneDNN"):
        gemm_nt(a, b, "onednn")


@pytest.mark.parametrize("backend", ["onednn", "blas", "auto"])
@pytest.mark.parametrize("m,n", [(128, 256), (8, 8)])  # the oneDNN loop and the torch.bmm path
def test_bmm_nt_into_row_ranges_matches_float64(backend, m, n):
    u = _rand(5, 400, 64, seed=8)
    a, b = u[:, :m], u[:, 100:100 + n]
    parts = [torch.full((5, m // 4, n), float("nan")), torch.full((5, m - m // 4, n), float("nan"))]
    assert bmm_nt(a, b, out=parts, backend=backend) is parts
    ref = a.double() @ b.double().transpose(1, 2)
    got = torch.cat(parts, dim=1).double()
    assert (got - ref).abs().max() < 1e-4
    with pytest.raises(ValueError, match="do not split"):
        bmm_nt(a, b, out=[torch.empty(5, m - 1, n)], backend=backend)
    # blocks of rows into a strided 4-D part: [item, block, row, col] stored block-major
    store = torch.full((4, 5, m // 4, n), float("nan"))
    bmm_nt(a, b, out=[store.permute(1, 0, 2, 3)], backend=backend)
    assert (store.permute(1, 0, 2, 3).reshape(5, m, n).double() - ref).abs().max() < 1e-4
