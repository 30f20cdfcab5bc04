"""Orthonormal bases of every head's Q/K/V/O subspace, batched over all heads of a role.

Rank rule as TransformerLens's ``orthonormal_subspace``: singular values are computed in
float32 (float64 kept), and a head's numerical rank counts singular values above
``rtol * s_max`` with default ``rtol = max(d_model, d_head) * eps(compute dtype)``.

Factorization: one batched thin QR W = Q R and the singular values of the small R (equal to
W's), instead of a full SVD of W, which costs ~1.5x as much on CPU. Q is an orthonormal basis
of a full-rank head's span (PK does not depend on the basis); where the order of directions
matters (rank-deficient heads, truncation to a common rank) Q is rotated by R's left singular
vectors, giving exactly the SVD's U.
"""

from __future__ import annotations

import math
from numbers import Integral, Real

import torch

from headgraph.core.types import ROLES, HeadWeights, RoleBases

# Bytes of input matrix per factorization call; larger roles are split into chunks of heads.
_FACTOR_CHUNK_BYTES = 512 * 1024 * 1024


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; every other dtype is computed in float32 (as TransformerLens)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def default_rtol(d_model: int, d_head: int, dtype: torch.dtype) -> float:
    """TransformerLens's default relative rank tolerance: ``max(d_model, d_head) * eps``."""
    return max(d_model, d_head) * torch.finfo(compute_dtype(dtype)).eps


def _check_rtol(rtol: float | None, d_model: int, d_head: int, dtype: torch.dtype) -> float:
    if rtol is None:
        return default_rtol(d_model, d_head, dtype)
    if isinstance(rtol, bool) or not isinstance(rtol, Real) or not math.isfinite(rtol) or rtol < 0:
        raise ValueError(f"rtol must be a finite non-negative real number, got {rtol!r}")
    return float(rtol)


def _check_rank(rank: int | None, width: int) -> int | None:
    if rank is None:
        return None
    if isinstance(rank, bool) or not isinstance(rank, Integral) or not 1 <= rank <= width:
        raise ValueError(f"rank must be an integer between 1 and {width}, got {rank!r}")
    return int(rank)


def _qr_svd(mats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Thin QR of [n, d, w] plus the singular values of R (= those of mats): (Q, R, S)."""
    try:
        q, r = torch.linalg.qr(mats)
        s = torch.linalg.svdvals(r)
    except RuntimeError as err:  # LAPACK failures on non-finite input
        raise ValueError(f"weights cannot be factorized: {err}") from err
    if not bool(torch.isfinite(s).all()):
        raise ValueError("weights contain non-finite values")
    return q, r, s


def _factorize(mats: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Batched thin QR of ``[N, d, w]`` in ``dtype``: (Q [N, d, k], R [N, k, w], S [N, k]),
    k = min(d, w), S the singular values of each matrix (those of its R).

    One call for all heads; only roles whose input exceeds _FACTOR_CHUNK_BYTES are split into
    chunks of heads (converted chunk by chunk, so no full-precision copy of a huge role).
    """
    n, d, w = mats.shape
    per_head = max(1, d * w * torch.finfo(dtype).bits // 8 * 3)
    chunk = max(1, min(n, _FACTOR_CHUNK_BYTES // per_head))
    if chunk >= n:
        return _qr_svd(mats.to(dtype))
    k = min(d, w)
    q = torch.empty(n, d, k, dtype=dtype, device=mats.device)
    r = torch.empty(n, k, w, dtype=dtype, device=mats.device)
    s = torch.empty(n, k, dtype=dtype, device=mats.device)
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        q[start:stop], r[start:stop], s[start:stop] = _qr_svd(mats[start:stop].to(dtype))
    return q, r, s


def role_bases(
    heads: HeadWeights, role: str, *, rank: int | None = None, rtol: float | None = None
) -> RoleBases:
    """Orthonormal bases of ``role`` for all heads: U [L, H_role, d_model, r].

    Without ``rank``, r = min(d_model, d_head) and a head whose measured rank is smaller keeps
    zero columns past its rank, so Projection Kernels see only its measured subspace; measured
    ranks are reported in ``.ranks`` [L, H_role]. With ``rank``, every head is truncated to its
    leading ``rank`` singular directions (ValueError naming the head when a measured rank is
    smaller). Computed once per (role, rank, rtol) and cached in ``heads._cache``.
    """
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; expected one of {list(ROLES)}")
    key = ("bases", role, rank, rtol)
    cached = heads._cache.get(key)
    if cached is not None:
        return cached

    w = heads.role(role)
    if not torch.is_floating_point(w):
        raise ValueError(f"role {role} weights must be floating point, got {w.dtype}")
    L, H, d_model, d_head = w.shape
    width = min(d_model, d_head)
    eff_rtol = _check_rtol(rtol, d_model, d_head, w.dtype)
    want = _check_rank(rank, width)
    try:
        u, r_factor, s = _factorize(w.detach().reshape(L * H, d_model, d_head), compute_dtype(w.dtype))
    except ValueError as err:
        raise ValueError(f"role {role}: {err}") from err
    threshold = s[:, :1] * eff_rtol
    ranks = (s > threshold).sum(dim=-1)
    if want is not None:
        short = torch.nonzero(ranks < want).flatten()
        if short.numel():
            i = int(short[0])
            raise ValueError(
                f"requested rank {want} exceeds measured rank {int(ranks[i])} of role {role} "
                f"at layer {heads.info.layer_indices[i // H]}, head {i % H} (rtol {eff_rtol:.3g})"
            )
        r = want
    else:
        r = width
    # Q spans each head's column space; rotate to the left singular vectors (U = Q U_R) where
    # the order matters: every head when truncating, rank-deficient heads otherwise.
    rotate = torch.arange(L * H, device=u.device) if want is not None else torch.nonzero(ranks < width).flatten()
    if rotate.numel():
        u_r = torch.linalg.svd(r_factor[rotate]).U
        u[rotate] = u[rotate] @ u_r
    del r_factor
    if want is not None:
        u = u[..., :want]
    else:
        keep = torch.arange(r, device=u.device) < ranks[:, None]
        u.mul_(keep[:, None, :].to(u.dtype))
    bases = RoleBases(
        role=role,
        U=u.reshape(L, H, d_model, r).contiguous(),
        ranks=ranks.reshape(L, H).to(torch.long),
        rank=r,
        rtol=eff_rtol,
        singular_values=s.reshape(L, H, -1),
    )
    heads._cache[key] = bases
    return bases


def effective_ranks(bases: RoleBases) -> torch.Tensor:
    """Dimension of each head's subspace as used by PK: min(measured rank, basis width) [L, H]."""
    return bases.ranks.clamp(max=bases.rank)


def rank_report(heads: HeadWeights) -> dict[str, list[tuple[int, int, int]]]:
    """Rank-deficient heads per role: ``{role: [(original layer, head, measured rank), ...]}``."""
    report: dict[str, list[tuple[int, int, int]]] = {}
    for role in ROLES:
        bases = role_bases(heads, role)
        deficient = torch.nonzero(bases.ranks < bases.rank).tolist()
        report[role] = [
            (int(heads.info.layer_indices[layer]), int(head), int(bases.ranks[layer, head]))
            for layer, head in deficient
        ]
    return report
