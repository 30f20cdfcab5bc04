"""Orthonormal bases of batches of [d, w] matrices (heads) under the rank rule of
core.scores.subspaces, and the factor M with U = W M where it exists.

Factorization (cheapest exact one first):

* Cholesky QR for heads whose small Gram matrix G = W^T W is proven to have full rank: G is
  rounded by at most ~d w eps lambda_max, so when
  ``lambda_min > (rtol^2 + 2 d w eps) lambda_max`` (w = d_head) no singular value
  (s = sqrt(lambda)) can lie below the rank threshold. The proof needs no eigensolver: a
  guaranteed upper bound on lambda_max (Gershgorin on G and G^2) and a Cholesky
  factorization of G shifted down by the threshold (plus its rounding bound) that completes
  (see _shifted_cholesky_ok). The basis is Z = W L^-T (G = L L^T), orthonormal to
  ~eps * cond(W)^2; a second pass (Z^T Z = L2 L2^T, Z <- Z L2^-T, "CholeskyQR2") is applied
  to heads not proven to have cond(W)^2 < 8 (the same shifted test at lambda_max / 8),
  bringing every basis to ~eps. Cost: two small batched matrix products plus [w, w]
  factorizations.
* Householder QR W = Q R plus the singular values of the small R (equal to W's) for every
  other head (near rank-deficient or truncated), with Q rotated by R's left singular vectors
  where the order of directions matters (rank-deficient heads, truncation to a common rank),
  giving exactly the SVD's U.
"""

from __future__ import annotations

import torch

from headgraph.core.errors import UnsupportedModel
from headgraph.core.scores.gemm import bmm_nt

# Bytes of input matrix per factorization call; larger roles are split into chunks of heads.
FACTOR_CHUNK_BYTES = 512 * 1024 * 1024


def _qr_svd(mats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Thin QR of [n, d, w] plus the singular values of R (= those of mats): (Q, R, S)."""
    try:
        q, r = torch.linalg.qr(mats)
        s = torch.linalg.svdvals(r)
    except RuntimeError as err:  # LAPACK failures on non-finite input
        raise UnsupportedModel(f"weights cannot be factorized: {err}") from err
    if not bool(torch.isfinite(s).all()):
        raise UnsupportedModel("weights contain non-finite values")
    return q, r, s


def _householder(mats: torch.Tensor, rtol: float,
                 want: int | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Exact path for [n, d, w]: (U [n, d, min(d, w)], measured ranks [n], singular values).

    Q of a thin QR spans each head's column space; it is rotated to the left singular vectors
    (U = Q U_R) where the order matters: every head when truncating (``want``), rank-deficient
    heads otherwise.
    """
    u, r_factor, s = _qr_svd(mats)
    ranks = (s > s[:, :1] * rtol).sum(dim=-1)
    width = u.shape[-1]
    rotate = (torch.arange(u.shape[0], device=u.device) if want is not None
              else torch.nonzero(ranks < width).flatten())
    if rotate.numel():
        u[rotate] = u[rotate] @ torch.linalg.svd(r_factor[rotate]).U
    return u, ranks, s


def _cholesky_inverse(gram: torch.Tensor,
                      work: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """L^-1 for G = L L^T [n, w, w] and a bool [n] telling where the factorization worked.

    work: optional [2, n, w, w] scratch (L^-1 is returned in work[1]): each fresh temporary of
    a few MB costs more in first-touch page faults than the arithmetic on it.
    """
    if work is None:
        work = torch.empty((2, *gram.shape), dtype=gram.dtype, device=gram.device)
    info = torch.empty(gram.shape[0], dtype=torch.int32, device=gram.device)
    torch.linalg.cholesky_ex(gram, out=(work[0], info))
    eye = torch.eye(gram.shape[-1], dtype=gram.dtype, device=gram.device).expand_as(gram)
    torch.linalg.solve_triangular(work[0], eye, upper=False, out=work[1])
    return work[1], info == 0


def _scratch(gram: torch.Tensor, work: torch.Tensor | None) -> torch.Tensor:
    """[2, n, w, w] scratch for the small factorizations (see _cholesky_inverse)."""
    if work is None:
        return torch.empty((2, *gram.shape), dtype=gram.dtype, device=gram.device)
    return work


class Scratch:
    """Buffers for the small per-head matrices, [3, n, w, w] per shape (the Gram matrices and
    two work slots), reused by every role factorized in one call: each fresh few-MB temporary
    costs more in first-touch page faults than the arithmetic on it."""

    def __init__(self) -> None:
        self._bufs: dict[tuple, torch.Tensor] = {}

    def get(self, n: int, w: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        key = (n, w, dtype, device)
        if key not in self._bufs:
            self._bufs[key] = torch.empty(3, n, w, w, dtype=dtype, device=device)
        return self._bufs[key]


def _lambda_max_bound(gram: torch.Tensor, work: torch.Tensor | None = None) -> torch.Tensor:
    """A guaranteed upper bound on the largest eigenvalue of each G [n, w, w] (symmetric PSD),
    without an eigensolver: the smaller of Gershgorin's bound on G and the square root of
    Gershgorin's bound on G^2 (computed from G scaled by its largest diagonal entry, plus the
    products' worst-case rounding), which is usually within a few percent of lambda_max."""
    w = gram.shape[-1]
    eps = torch.finfo(gram.dtype).eps
    work = _scratch(gram, work)
    scale = gram.diagonal(dim1=-2, dim2=-1).amax(-1).clamp(min=torch.finfo(gram.dtype).tiny)
    g = torch.div(gram, scale[:, None, None], out=work[0])
    g2 = torch.bmm(g, g, out=work[1])
    row = g.abs_().sum(-1).amax(-1)  # Gershgorin: |lambda| <= max row sum
    row2 = g2.abs_().sum(-1).amax(-1) + (w + 1) * eps * row * row
    return torch.minimum(row, row2.sqrt()) * scale * (1.0 + 4.0 * eps)


def _shifted_cholesky_ok(gram: torch.Tensor, shift: torch.Tensor,
                         work: torch.Tensor | None = None) -> torch.Tensor:
    """bool [n]: proven lambda_min(G) > shift. Cholesky completing on fl(G - sigma I) makes
    G - sigma I + E positive definite with ||E||_2 <= ~(w + 1) eps trace(G) (Demmel), so sigma
    is raised by that much (and by the subtraction's rounding) before the attempt."""
    w = gram.shape[-1]
    eps = torch.finfo(gram.dtype).eps
    work = _scratch(gram, work)
    diag = gram.diagonal(dim1=-2, dim2=-1)
    slack = (1.01 * (w + 1) * eps) * diag.sum(-1) + eps * diag.abs().amax(-1)
    shifted = work[0].copy_(gram)
    shifted.diagonal(dim1=-2, dim2=-1).sub_((shift + slack)[:, None])
    info = torch.empty(gram.shape[0], dtype=torch.int32, device=gram.device)
    torch.linalg.cholesky_ex(shifted, out=(work[1], info))
    return info == 0


def _certify(gram: torch.Tensor, d: int, rtol: float,
             work: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For the Gram matrices G = W^T W [n, w, w] of [d, w] heads: (single, certified), bool [n].
    certified: full rank proven (lambda_min > (rtol^2 + 2 d w eps) lambda_max: no singular
    value lies below the rank threshold, so Cholesky QR is exact under the rank rule); single:
    also lambda_min > lambda_max / 8 proven, so one pass leaves an orthogonality error of ~eps
    (certified heads without it need a second pass, CholeskyQR2)."""
    w = gram.shape[-1]
    eps = torch.finfo(gram.dtype).eps
    top = _lambda_max_bound(gram, work)
    theta = rtol * rtol + 2.0 * d * w * eps  # full rank: lambda_min > theta * lambda_max
    single = _shifted_cholesky_ok(gram, max(theta, 0.125) * top, work)
    certified = single.clone()
    if theta < 0.125 and not bool(single.all()):
        idx = torch.nonzero(~single).flatten()
        certified[idx] = _shifted_cholesky_ok(gram[idx], theta * top[idx])
    return single & (top > 0), certified & (top > 0)


def _orthonormalize(mats: torch.Tensor, rtol: float, want: int | None,
                    scratch: Scratch | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Bases of [n, d, w] (compute dtype): (U [n, d, min(d, w)], ranks [n]).

    Certified full-rank heads go through Cholesky QR (see the module docstring), the rest
    (and every head when truncating to ``want``) through Householder QR + SVD of R.
    """
    n, d, w = mats.shape
    if want is not None or w > d or n == 0:
        return _householder(mats, rtol, want)[:2]
    bufs = (scratch or Scratch()).get(n, w, mats.dtype, mats.device)
    gram = bmm_nt(mats.transpose(-2, -1), mats.transpose(-2, -1), out=bufs[0])
    # A non-finite weight makes its column's squared norm (a diagonal entry) non-finite.
    if not bool(torch.isfinite(gram.diagonal(dim1=-2, dim2=-1)).all()):
        raise UnsupportedModel("weights contain non-finite values")
    work = bufs[1:]
    single, certified = _certify(gram, d, rtol, work)
    inv, ok = _cholesky_inverse(gram, work)
    certified &= ok
    if bool(certified.all()):
        u = bmm_nt(mats, inv)  # W L^-T
    else:
        u = torch.empty(n, d, w, dtype=mats.dtype, device=mats.device)
        idx = torch.nonzero(certified).flatten()
        u[idx] = bmm_nt(mats[idx], inv[idx])
    # CholeskyQR2 where one pass can leave an orthogonality error above ~8 eps.
    second = certified & ~single
    if bool(second.any()):
        idx = torch.nonzero(second).flatten()
        z = u[idx] if idx.numel() < n else u
        inv2, ok2 = _cholesky_inverse(bmm_nt(z.transpose(-2, -1), z.transpose(-2, -1)))
        if not bool(ok2.all()):
            certified[idx[~ok2]] = False
        z = bmm_nt(z, inv2)
        if idx.numel() < n:
            u[idx] = z
        else:
            u = z
    ranks = torch.full((n,), w, dtype=torch.long, device=mats.device)
    if not bool(certified.all()):
        idx = torch.nonzero(~certified).flatten()
        u_exact, ranks_exact, _ = _householder(mats[idx], rtol, None)
        u[idx], ranks[idx] = u_exact, ranks_exact
    return u, ranks


def factorize(mats: torch.Tensor, dtype: torch.dtype, rtol: float, want: int | None,
               scratch: Scratch | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Bases of ``[N, d, w]`` in ``dtype``: (U [N, d, k], ranks [N]), k = min(d, w).

    One batched call for all heads; only roles whose input exceeds FACTOR_CHUNK_BYTES are split
    into chunks of heads (converted chunk by chunk, so no full-precision copy of a huge role).
    """
    n, d, w = mats.shape
    per_head = max(1, d * w * torch.finfo(dtype).bits // 8 * 3)
    chunk = max(1, min(n, FACTOR_CHUNK_BYTES // per_head))
    if chunk >= n:
        return _orthonormalize(mats.to(dtype), rtol, want, scratch)
    k = min(d, w)
    u = torch.empty(n, d, k, dtype=dtype, device=mats.device)
    ranks = torch.empty(n, dtype=torch.long, device=mats.device)
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        u[start:stop], ranks[start:stop] = _orthonormalize(mats[start:stop].to(dtype), rtol, want,
                                                           scratch)
    return u, ranks


def cholesky_factors(mats: torch.Tensor, rtol: float, scratch: Scratch) -> torch.Tensor | None:
    """M [n, w, w] with U = mats M orthonormal for [n, d, w] heads (compute dtype): Cholesky
    QR's L^-T, times a second pass's L2^-T where one pass is not enough (as _orthonormalize
    computes U). None when a head is not certified full rank (the exact path needs U itself)."""
    n, d, w = mats.shape
    bufs = scratch.get(n, w, mats.dtype, mats.device)
    gram = bmm_nt(mats.transpose(-2, -1), mats.transpose(-2, -1), out=bufs[0])
    if not bool(torch.isfinite(gram.diagonal(dim1=-2, dim2=-1)).all()):
        raise UnsupportedModel("weights contain non-finite values")
    single, certified = _certify(gram, d, rtol, bufs[1:])
    inv, ok = _cholesky_inverse(gram, bufs[1:])
    if not bool((certified & ok).all()):
        return None
    m = inv.transpose(-2, -1).clone()  # U = W L^-T
    idx = torch.nonzero(~single).flatten()
    if idx.numel():  # CholeskyQR2: Z = W L^-T, Z^T Z = L2 L2^T, U = Z L2^-T
        z = bmm_nt(mats[idx], inv[idx])
        inv2, ok2 = _cholesky_inverse(bmm_nt(z.transpose(-2, -1), z.transpose(-2, -1)))
        if not bool(ok2.all()):
            return None
        m[idx] = m[idx] @ inv2.transpose(-2, -1)
    return m


__all__ = ["FACTOR_CHUNK_BYTES", "Scratch", "cholesky_factors", "factorize"]
