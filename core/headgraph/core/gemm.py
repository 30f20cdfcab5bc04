"""a @ b^T for the large float32 products of core.overlaps, on the fastest exact backend.

Batched products (``bmm_nt``) first try headgraph's compiled kernel (core/_ntkernel.c:
AVX-512, every item's result stored straight into the caller's strided destination, one call
for all items), built at install time where a C compiler exists and used after a self-check
against float64. Otherwise, and for single products:

PyTorch sends a float32 ``mm`` on CPU to MKL BLAS, which on AMD CPUs runs its AVX2 kernels
(~95 GFLOP/s on one Zen core here); oneDNN, which PyTorch also ships (``torch.ops.mkldnn``),
JIT-compiles AVX-512 kernels for the same CPU and runs these products ~2x faster. Both are
float32 multiply-adds with float32 accumulation; oneDNN is used only after a self-check against
a float64 product shows it computes in full float32 (a reduced-precision math mode, e.g. from
ONEDNN_DEFAULT_FPMATH_MODE=BF16, fails the check). Anything else (CUDA, float64, an empty
inner dimension, a torch without oneDNN) goes through ``torch.mm``.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from typing import Any
from collections.abc import Sequence

import torch

BACKENDS = ("auto", "native", "onednn", "blas")
# Smallest per-item product (multiply-adds) that bmm_nt sends through the oneDNN loop.
_LOOP_MACS = 1 << 20


def _onednn_op() -> Any:
    """The op's resolved overload (calling it skips the per-call overload lookup), or None."""
    if not torch.backends.mkldnn.is_available():
        return None
    packet = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)
    return getattr(packet, "default", None)


@cache
def onednn_available() -> bool:
    """Whether oneDNN's float32 inner product is present and exact to float32 rounding here."""
    op = _onednn_op()
    if op is None:
        return False
    g = torch.Generator().manual_seed(0)
    a = torch.randn(8, 1024, generator=g)
    b = torch.randn(8, 1024, generator=g)
    try:
        got = op(a, b, None, "none", [], "")
    except RuntimeError:
        return False
    ref = a.double() @ b.double().T
    # float32 accumulation over 1024 terms: ~1e-5 here; bf16 inputs would give ~0.1.
    return bool(((got.double() - ref).abs().max() < 1e-3).item())


@cache
def _ntkernel() -> Any:
    """The compiled kernel module when it was built and this CPU can run it, else None
    (also None when the environment sets HEADGRAPH_NATIVE=0 at first use)."""
    if os.environ.get("HEADGRAPH_NATIVE", "1").strip() == "0":
        return None
    try:
        from headgraph.core import _ntkernel
    except ImportError:
        return None
    return _ntkernel if _ntkernel.supported() else None


@cache
def native_available() -> bool:
    """Whether the compiled batched kernel is present and exact to float32 rounding here
    (checked on odd sizes, strided operands and a chunked destination)."""
    if _ntkernel() is None:
        return False
    g = torch.Generator().manual_seed(0)
    a = torch.randn(3, 37, 150, generator=g).transpose(1, 2)  # [3, 150, 37], column-major items
    b = torch.randn(3, 140, 37, generator=g)
    out = torch.full((3, 5, 30, 140), float("nan"))
    _native_into(a, b, out)
    ref = a.double() @ b.double().transpose(1, 2)
    return bool(((out.reshape(3, 150, 140).double() - ref).abs().max() < 1e-4).item())


@cache
def _pool(workers: int) -> ThreadPoolExecutor:
    """Threads for splitting one kernel call by items (the kernel releases the GIL)."""
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="headgraph-nt")


def _native_usable(a: torch.Tensor, b: torch.Tensor, parts: Sequence[torch.Tensor]) -> bool:
    """float32 CPU operands and destinations with contiguous columns (a new result qualifies)."""
    return (all(t.device.type == "cpu" and t.dtype == torch.float32 for t in (a, b, *parts))
            and all(p.stride(-1) == 1 for p in parts))


def _native_into(a: torch.Tensor, b: torch.Tensor, dst: torch.Tensor) -> None:
    """dst [B, M, N] or [B, C, R, N] (C blocks of R rows, last stride 1) = a [B, M, K] @
    b [B, N, K]^T by the compiled kernel, items split over torch's thread count."""
    mod = _ntkernel()
    n, m, k = a.shape
    d4 = dst if dst.dim() == 4 else dst.unsqueeze(1)
    chunk = max(1, d4.shape[2])
    if b.dim() != 3 or b.shape[0] != n or b.shape[2] != k:
        raise ValueError(f"operands {tuple(a.shape)} and {tuple(b.shape)} do not pair up")
    if d4.shape[0] != n or d4.shape[1] * d4.shape[2] != m or d4.shape[3] != b.shape[1]:
        raise ValueError(f"destination {tuple(dst.shape)} does not hold [{n}, {m}, {b.shape[1]}]")
    if n == 0 or m == 0 or b.shape[1] == 0:
        return

    def run(h0: int, h1: int) -> None:
        mod.nt_rows(a[h0].data_ptr(), *a.stride(), b[h0].data_ptr(), *b.stride(),
                    d4[h0].data_ptr(), d4.stride(0), d4.stride(1), chunk, d4.stride(2),
                    h1 - h0, m, b.shape[1], k)

    workers = min(torch.get_num_threads(), n)
    if workers <= 1:
        run(0, n)
        return
    bounds = [n * i // workers for i in range(workers + 1)]
    jobs = [_pool(workers).submit(run, h0, h1) for h0, h1 in zip(bounds, bounds[1:]) if h1 > h0]
    for job in jobs:
        job.result()


def _dense(x: torch.Tensor) -> bool:
    """Row- or column-major without gaps: oneDNN runs a slow reference kernel on other
    strides (a row slice of a wider matrix measured ~500x slower than a copy)."""
    return x.is_contiguous() or x.transpose(0, 1).is_contiguous()


def _onednn_for(a: torch.Tensor, b: torch.Tensor, backend: str) -> Any:
    """The oneDNN op to use for a @ b^T, or None for torch's own BLAS path."""
    if backend not in BACKENDS or backend == "native":
        raise ValueError(f"backend must be one of {list(BACKENDS)}, got {backend!r}"
                         + (" ('native' is for batched products)" if backend == "native" else ""))
    usable = (a.device.type == "cpu" and a.dtype == torch.float32 and b.dtype == torch.float32
              and a.shape[1] > 0 and _dense(a) and _dense(b) and onednn_available())
    if backend == "onednn" and not usable:
        raise ValueError("oneDNN float32 products are not available for these tensors here")
    return _onednn_op() if usable and backend != "blas" else None


def gemm_nt(a: torch.Tensor, b: torch.Tensor, backend: str = "auto") -> torch.Tensor:
    """a [M, K] @ b [N, K]^T -> a new [M, N]. backend: "auto" (oneDNN for float32 CPU tensors
    when :func:`onednn_available`, else BLAS), "onednn" (ValueError if unusable) or "blas"."""
    op = _onednn_for(a, b, backend)
    return torch.mm(a, b.transpose(0, 1)) if op is None else op(a, b, None, "none", [], "")


def addmm_nt_(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, alpha: float = 1.0,
              backend: str = "auto") -> torch.Tensor:
    """acc [M, N] += alpha * a [M, K] @ b [N, K]^T in place (fused addmm on the BLAS path)."""
    op = _onednn_for(a, b, backend)
    if op is None:
        return acc.addmm_(a, b.transpose(0, 1), alpha=alpha)
    return acc.add_(op(a, b, None, "none", [], ""), alpha=alpha)


def bmm_nt(a: torch.Tensor, b: torch.Tensor,
           out: torch.Tensor | Sequence[torch.Tensor] | None = None,
           backend: str = "auto") -> Any:
    """a [B, M, K] @ b [B, N, K]^T -> [B, M, N], returned or written into ``out``: one
    [B, M, N] tensor, or a list of parts taking consecutive row ranges of the result, each
    [B, M_j, N] or [B, C_j, R_j, N] (C_j blocks of R_j rows, any strides: one copy per item
    fills all blocks), the rows summing to M; a list is returned as given.

    backend "auto" takes the compiled kernel when :func:`native_available` and the tensors
    suit it (float32 on the CPU, destinations with contiguous columns): one call for all
    items, each result stored in place. Otherwise: PyTorch exposes no batched oneDNN product
    with a different right operand per item, so on the oneDNN path this is a loop of per-item
    products (each result copied into place); it runs 1.2-2x faster than MKL's batched product
    for the per-head products of core.subspaces and core.overlaps (items of >= _LOOP_MACS
    multiply-adds); smaller items go through ``torch.bmm``. "native" raises ValueError where
    the kernel cannot run.
    """
    n, m, k = a.shape
    parts = list(out) if isinstance(out, (list, tuple)) else None
    if parts is not None:
        rows = [math.prod(p.shape[1:-1]) for p in parts]
        if sum(rows) != m or any(p.dim() not in (3, 4) for p in parts):
            raise ValueError(f"out parts {[tuple(p.shape) for p in parts]} do not split {m} rows")
    if backend in ("auto", "native"):
        given = parts if parts is not None else [] if out is None else [out]
        if native_available() and _native_usable(a, b, given):
            dsts = given or [torch.empty(n, m, b.shape[1], dtype=a.dtype, device=a.device)]
            start = 0
            for p in dsts:
                count = math.prod(p.shape[1:-1])
                _native_into(a[:, start:start + count], b, p)
                start += count
            return out if out is not None else dsts[0]
        if backend == "native":
            raise ValueError("the compiled kernel is not available for these tensors here")
    op = _onednn_for(a[0] if n else a.new_empty(0, 0), b[0] if n else b.new_empty(0, 0), backend)
    if op is None or (backend == "auto" and m * b.shape[1] * k < _LOOP_MACS):
        if parts is None:
            return torch.bmm(a, b.transpose(1, 2), out=out)
        start = 0
        for p in parts:
            blocks = p.unbind(1) if p.dim() == 4 else [p]
            for blk in blocks:
                torch.bmm(a[:, start:start + blk.shape[1]], b.transpose(1, 2), out=blk)
                start += blk.shape[1]
        return out
    if out is None:
        out = torch.empty(n, m, b.shape[1], dtype=a.dtype, device=a.device)
    no_post: list[Any] = []
    if parts is None:
        for ai, bi, oi in zip(a.unbind(), b.unbind(), out.unbind()):
            oi.copy_(op(ai, bi, None, "none", no_post, ""))
        return out
    shapes = [p.shape[1:] for p in parts]
    if len(parts) == 1:
        for ai, bi, oi in zip(a.unbind(), b.unbind(), parts[0].unbind()):
            oi.copy_(op(ai, bi, None, "none", no_post, "").view(shapes[0]))
        return out
    for ai, bi, *dst in zip(a.unbind(), b.unbind(), *(p.unbind() for p in parts)):
        for piece, o, shape in zip(op(ai, bi, None, "none", no_post, "").split(rows), dst, shapes):
            o.copy_(piece.view(shape))
    return out


__all__ = ["BACKENDS", "addmm_nt_", "bmm_nt", "gemm_nt", "native_available", "onednn_available"]
