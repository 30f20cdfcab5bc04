"""core.gemm: every backend gives a @ b^T to float32 rounding, checked against float64."""

from __future__ import annotations

import itertools
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from headgraph.core.gemm import addmm_nt_, bmm_nt, gemm_nt, native_available, onednn_available

# The compiled kernel runs on x86-64 CPUs with AVX-512 (this machine: checked below).
needs_native = pytest.mark.skipif(not native_available(), reason="no AVX-512 on this CPU")
NATIVE = pytest.param("native", marks=needs_native)


def _rand(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_onednn_is_used_here():
    # This machine's torch ships oneDNN; the speed of core.overlaps relies on it.
    assert onednn_available()


def _cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def test_compiled_kernel_is_built_and_used_exactly_where_the_cpu_runs_it():
    # The install compiles core/_ntkernel.c (a C compiler is part of the set-up here); the
    # kernel is used only on x86-64 CPUs with AVX-512F and FMA, as /proc/cpuinfo reports them.
    import headgraph.core._ntkernel as kernel

    runs_it = platform.machine() in ("x86_64", "AMD64") and {"avx512f", "fma"} <= _cpu_flags()
    assert kernel.supported() == runs_it
    assert native_available() == runs_it


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


@pytest.mark.parametrize("backend", [NATIVE, "onednn", "blas", "auto"])
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
    with pytest.raises(ValueError, match="batched"):
        gemm_nt(a.float(), b.float(), "native")
    with pytest.raises(ValueError, match="compiled kernel"):  # float32 only
        bmm_nt(a[None], b[None], backend="native")


@pytest.mark.parametrize("backend", ["blas", "auto"])
def test_operands_with_gaps_between_rows_match_float64(backend):
    # A column range of a wider matrix: oneDNN would run a slow reference kernel on it, so
    # "auto" takes BLAS, and an explicit "onednn" says it cannot.
    a, b = _rand(40, 900, seed=6)[:, 100:700], _rand(30, 900, seed=7)[:, 100:700]
    got = gemm_nt(a, b, backend)
    assert (got.double() - a.double() @ b.double().T).abs().max() < 1e-3
    with pytest.raises(ValueError, match="oneDNN"):
        gemm_nt(a, b, "onednn")


@pytest.mark.parametrize("backend", [NATIVE, "onednn", "blas", "auto"])
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


@needs_native
@pytest.mark.parametrize("layout", ["rr", "cc", "rc", "cr"])  # row- or column-major items of a, b
def test_native_kernel_matches_float64_on_odd_sizes_and_strides(layout):
    # Sizes around the kernel's 16-wide vectors, 2- and 4-row tiles and 128-column blocks,
    # an empty inner dimension (zeros), and both strides of either operand.
    g = torch.Generator().manual_seed(11)
    for n, m, w, k in itertools.product([1, 3], [1, 2, 5, 17], [1, 15, 17, 64, 129, 200],
                                        [0, 1, 17, 64, 100]):
        a = (torch.randn(n, m, k, generator=g) if layout[0] == "r"
             else torch.randn(n, k, m, generator=g).transpose(1, 2))
        b = (torch.randn(n, w, k, generator=g) if layout[1] == "r"
             else torch.randn(n, k, w, generator=g).transpose(1, 2))
        out = bmm_nt(a, b, backend="native")
        ref = a.double() @ b.double().transpose(1, 2)
        assert out.shape == (n, m, w)
        assert (out.double() - ref).abs().max() <= 1e-6 * max(1, k), (n, m, w, k)


@needs_native
@pytest.mark.parametrize("threads", [1, 2])
def test_native_kernel_writes_only_its_blocks_of_a_larger_buffer(threads):
    # The layout of core.overlaps' feature buffers: each item's rows in blocks of R rows, the
    # blocks far apart in a larger buffer, columns contiguous. Every entry of the blocks is
    # written (they start as NaN) and nothing around them is touched; items are split over
    # threads when torch has more than one.
    g = torch.Generator().manual_seed(12)
    n, blocks, rows, w, k = 7, 3, 5, 40, 64
    a = torch.randn(n, blocks * rows, k, generator=g)
    b = torch.randn(n, w, k, generator=g)
    store = torch.full((blocks, n + 1, rows, w + 3), float("nan"))
    dst = store[:, :n, :, 1:w + 1].permute(1, 0, 2, 3)  # [n, blocks, rows, w], gaps around
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        assert bmm_nt(a, b, out=[dst], backend="native")[0] is dst
    finally:
        torch.set_num_threads(before)
    ref = a.double() @ b.double().transpose(1, 2)
    assert (dst.reshape(n, blocks * rows, w).double() - ref).abs().max() < 1e-4
    untouched = torch.ones_like(store, dtype=torch.bool)
    untouched[:, :n, :, 1:w + 1] = False
    assert store[untouched].isnan().all()


def test_pk_without_the_compiled_kernel_is_the_same(tmp_path):
    # HEADGRAPH_NATIVE=0 switches the kernel off (torch's oneDNN/BLAS path): the Projection
    # Kernel of a random GPT-2-tiny model (bases) and projector-Gram sums on d = 300 (pieces,
    # with bands shorter than 128) agree to float32 rounding either way.
    script = tmp_path / "pk.py"
    script.write_text(
        "import sys, torch\n"
        "import headgraph as hg\n"
        "from headgraph.core.gemm import native_available\n"
        "from headgraph.core.overlaps import pairwise_sq_overlap\n"
        "heads = hg.load_heads('random:gpt2-tiny')\n"
        "r = hg.projection_kernel(heads, 'OK')\n"
        "g = torch.Generator().manual_seed(5)\n"
        "u = torch.linalg.qr(torch.randn(3, 5, 300, 24, generator=g))[0]\n"
        "v = torch.linalg.qr(torch.randn(3, 4, 300, 40, generator=g))[0]\n"
        "sq = pairwise_sq_overlap(u, v, order='all', method='gram')\n"
        "torch.save({'native': native_available(), 'scores': r.scores, 'sq': sq}, sys.argv[1])\n")
    got = {}
    for flag in ("1", "0"):
        env = {**os.environ, "HEADGRAPH_NATIVE": flag}
        subprocess.run([sys.executable, str(script), str(tmp_path / flag)], env=env, check=True,
                       timeout=300)
        got[flag] = torch.load(tmp_path / flag)
    assert got["0"]["native"] is False
    assert got["1"]["native"] == native_available()
    assert torch.allclose(got["1"]["scores"], got["0"]["scores"], atol=1e-5)
    assert torch.allclose(got["1"]["sq"], got["0"]["sq"], atol=1e-5)
    assert got["1"]["sq"].abs().sum() > 0


@needs_native
def test_native_kernel_refuses_operands_that_do_not_pair_up():
    # The kernel reads raw addresses: mismatched items or inner sizes must stop before it.
    a = _rand(3, 8, 16, seed=13)
    with pytest.raises(ValueError, match="do not pair up"):
        bmm_nt(a, _rand(2, 8, 16, seed=14), backend="native")
    with pytest.raises(ValueError, match="do not pair up"):
        bmm_nt(a, _rand(3, 8, 15, seed=15), backend="native")
    with pytest.raises(ValueError, match="does not hold"):
        bmm_nt(a, _rand(3, 8, 16, seed=16), out=torch.empty(3, 8, 9), backend="native")
