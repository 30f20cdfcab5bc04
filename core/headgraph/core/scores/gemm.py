"""a @ b^T products for core.scores.overlaps and core.scores.subspaces, on plain torch.

One product path on every device: ``torch.mm`` / ``torch.addmm`` / ``torch.bmm`` (MKL or
OpenBLAS on the CPU, cuBLAS on CUDA), float32 multiply-adds with float32 accumulation (float64
kept). The "nt" convention (right operand given row-major, used transposed) matches how the
callers hold their data: both operands are stacks of per-head feature rows. Operands may be
strided views (a row slice of a wider matrix, a transposed matrix); results are written into
``out`` where the caller reuses a buffer.
"""

from __future__ import annotations

import torch

from headgraph.core.errors import InvalidInput


def _check_pair(a: torch.Tensor, b: torch.Tensor, dims: int) -> None:
    """a [..., M, K] and b [..., N, K] with ``dims`` dimensions each and equal leading sizes."""
    if a.dim() != dims or b.dim() != dims or a.shape[:-2] != b.shape[:-2] or a.shape[-1] != b.shape[-1]:
        raise InvalidInput(f"operands {tuple(a.shape)} and {tuple(b.shape)} do not pair up "
                           f"as [..., M, K] @ [..., N, K]^T ({dims}-d)")


def gemm_nt(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [M, K] @ b [N, K]^T -> a new [M, N]."""
    _check_pair(a, b, 2)
    return torch.mm(a, b.transpose(0, 1))


def addmm_nt_(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    """acc [M, N] += alpha * a [M, K] @ b [N, K]^T in place (one fused addmm); returns acc."""
    _check_pair(a, b, 2)
    if acc.shape != (a.shape[0], b.shape[0]):
        raise InvalidInput(f"accumulator {tuple(acc.shape)} does not hold [{a.shape[0]}, {b.shape[0]}]")
    return acc.addmm_(a, b.transpose(0, 1), alpha=alpha)


def bmm_nt(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """a [B, M, K] @ b [B, N, K]^T -> [B, M, N] for every item at once (one ``torch.bmm``),
    returned or written into ``out`` [B, M, N] (reused buffers avoid fresh allocations)."""
    _check_pair(a, b, 3)
    if out is not None and out.shape != (a.shape[0], a.shape[1], b.shape[1]):
        raise InvalidInput(f"destination {tuple(out.shape)} does not hold "
                           f"[{a.shape[0]}, {a.shape[1]}, {b.shape[1]}]")
    return torch.bmm(a, b.transpose(1, 2), out=out)


__all__ = ["addmm_nt_", "bmm_nt", "gemm_nt"]
