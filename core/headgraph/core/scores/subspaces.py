"""Orthonormal bases of every head's Q/K/V/O subspace, batched over all heads of a role.

Rank rule as TransformerLens's ``orthonormal_subspace``: singular values are computed in
float32 (float64 kept), and a head's numerical rank counts singular values above
``rtol * s_max`` with default ``rtol = max(d_model, d_head) * eps(compute dtype)``.

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

import math
from numbers import Integral, Real

import torch

from headgraph.core.errors import InvalidInput, UnsupportedModel
from headgraph.core.names import ROLES, check_role
from headgraph.core.scores.gemm import bmm_nt
from headgraph.core.types import HeadWeights, RoleBases, RoleFactors

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
        raise InvalidInput(f"rtol must be a finite non-negative real number, got {rtol!r}")
    return float(rtol)


def _check_rank(rank: int | None, width: int) -> int | None:
    if rank is None:
        return None
    if isinstance(rank, bool) or not isinstance(rank, Integral) or not 1 <= rank <= width:
        raise InvalidInput(f"rank must be an integer between 1 and {width}, got {rank!r}")
    return int(rank)


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


class _Scratch:
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
                    scratch: _Scratch | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Bases of [n, d, w] (compute dtype): (U [n, d, min(d, w)], ranks [n]).

    Certified full-rank heads go through Cholesky QR (see the module docstring), the rest
    (and every head when truncating to ``want``) through Householder QR + SVD of R.
    """
    n, d, w = mats.shape
    if want is not None or w > d or n == 0:
        return _householder(mats, rtol, want)[:2]
    bufs = (scratch or _Scratch()).get(n, w, mats.dtype, mats.device)
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


def _factorize(mats: torch.Tensor, dtype: torch.dtype, rtol: float, want: int | None,
               scratch: _Scratch | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Bases of ``[N, d, w]`` in ``dtype``: (U [N, d, k], ranks [N]), k = min(d, w).

    One batched call for all heads; only roles whose input exceeds _FACTOR_CHUNK_BYTES are split
    into chunks of heads (converted chunk by chunk, so no full-precision copy of a huge role).
    """
    n, d, w = mats.shape
    per_head = max(1, d * w * torch.finfo(dtype).bits // 8 * 3)
    chunk = max(1, min(n, _FACTOR_CHUNK_BYTES // per_head))
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


def _transforms(mats: torch.Tensor, rtol: float, scratch: _Scratch) -> torch.Tensor | None:
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


def role_factors(heads: HeadWeights, role: str, *, rtol: float | None = None) -> RoleFactors | None:
    """The role's orthonormal bases as factors U = W M, never formed: ``a`` = the role's
    weights [L, H_role, d_model, d_head] as stored (e.g. bf16, not copied), ``m`` [L, H_role,
    d_head, d_head] in the compute dtype. For models whose dense bases would not fit in memory
    (2 GiB per role at 7B). Exists only when every head is proven full rank under the rank rule
    (Cholesky QR certifies it); None otherwise (or when d_head > d_model), and callers then
    use :func:`role_bases`. Not cached: m is cheap next to the products that read it."""
    check_role(role)
    w = heads.role(role)
    if not torch.is_floating_point(w):
        raise UnsupportedModel(f"role {role} weights must be floating point, got {w.dtype}")
    L, H, d_model, d_head = w.shape
    if d_head > d_model or L * H == 0:
        return None
    dtype = compute_dtype(w.dtype)
    eff_rtol = _check_rtol(rtol, d_model, d_head, w.dtype)
    flat = w.detach().reshape(L * H, d_model, d_head)
    chunk = max(1, _FACTOR_CHUNK_BYTES // (d_model * d_head * torch.finfo(dtype).bits // 8 * 3))
    scratch = _Scratch()
    parts = []
    for start in range(0, L * H, chunk):
        try:
            m = _transforms(flat[start:start + chunk].to(dtype), eff_rtol, scratch)
        except UnsupportedModel as err:
            raise UnsupportedModel(f"role {role}: {err}") from err
        if m is None:
            return None
        parts.append(m)
    ranks = torch.full((L, H), d_head, dtype=torch.long, device=w.device)
    return RoleFactors(role=role, a=w.detach(), m=torch.cat(parts).reshape(L, H, d_head, d_head),
                       ranks=ranks, rank=d_head, rtol=eff_rtol)


def role_bases(
    heads: HeadWeights, role: str, *, rank: int | None = None, rtol: float | None = None
) -> RoleBases:
    """Orthonormal bases of ``role`` for all heads: U [L, H_role, d_model, r].

    Without ``rank``, r = min(d_model, d_head) and a head whose measured rank is smaller keeps
    zero columns past its rank, so Projection Kernels see only its measured subspace; measured
    ranks are reported in ``.ranks`` [L, H_role]. With ``rank``, every head is truncated to its
    leading ``rank`` singular directions (InvalidInput naming the head when a measured rank is
    smaller). Computed once per (role, rank, rtol) and cached in ``heads._cache``.
    """
    return roles_bases(heads, [role], rank=rank, rtol=rtol)[role]


def roles_bases(
    heads: HeadWeights, roles: list[str], *, rank: int | None = None, rtol: float | None = None
) -> dict[str, RoleBases]:
    """:func:`role_bases` of several roles, factorized with shared scratch buffers."""
    scratch = _Scratch()
    return {r: _role_bases(heads, r, rank, rtol, scratch) for r in dict.fromkeys(roles)}


def _role_bases(heads: HeadWeights, role: str, rank: int | None, rtol: float | None,
                scratch: _Scratch) -> RoleBases:
    check_role(role)
    key = ("bases", role, rank, rtol)
    cached = heads._cache.get(key)
    if cached is not None:
        return cached

    w = heads.role(role)
    if not torch.is_floating_point(w):
        raise UnsupportedModel(f"role {role} weights must be floating point, got {w.dtype}")
    L, H, d_model, d_head = w.shape
    width = min(d_model, d_head)
    eff_rtol = _check_rtol(rtol, d_model, d_head, w.dtype)
    want = _check_rank(rank, width)
    try:
        u, ranks = _factorize(w.detach().reshape(L * H, d_model, d_head),
                              compute_dtype(w.dtype), eff_rtol, want, scratch)
    except UnsupportedModel as err:
        raise UnsupportedModel(f"role {role}: {err}") from err
    if want is not None:
        short = torch.nonzero(ranks < want).flatten()
        if short.numel():
            i = int(short[0])
            raise InvalidInput(
                f"requested rank {want} exceeds measured rank {int(ranks[i])} of role {role} "
                f"at layer {heads.info.layer_indices[i // H]}, head {i % H} (rtol {eff_rtol:.3g})"
            )
        r = want
        u = u[..., :want]
    else:
        r = width
        deficient = ranks < width
        if bool(deficient.any()):
            keep = torch.arange(r, device=u.device) < ranks[:, None]
            u.mul_(keep[:, None, :].to(u.dtype))
    bases = RoleBases(
        role=role,
        U=u.reshape(L, H, d_model, r).contiguous(),
        ranks=ranks.reshape(L, H).to(torch.long),
        rank=r,
        rtol=eff_rtol,
    )
    heads._cache[key] = bases
    return bases


def head_basis(heads: HeadWeights, role: str, layer: int, head: int, *, rank: int | None = None,
               rtol: float | None = None) -> tuple[torch.Tensor, int]:
    """One head's basis [d_model, r] and measured rank, as :func:`role_bases` holds them: read
    from the cached bases of the role when they exist, else factorized alone (the same rule,
    so a pair panel never factorizes, nor keeps, every head of a large model)."""
    check_role(role)
    cached = heads._cache.get(("bases", role, rank, rtol))
    if cached is not None:
        return cached.U[layer, head], int(cached.ranks[layer, head])
    w = heads.role(role)
    _, _, d_model, d_head = w.shape
    width = min(d_model, d_head)
    eff_rtol = _check_rtol(rtol, d_model, d_head, w.dtype)
    want = _check_rank(rank, width)
    try:
        u, ranks = _factorize(w[layer, head].detach()[None], compute_dtype(w.dtype), eff_rtol, want)
    except UnsupportedModel as err:
        raise UnsupportedModel(f"role {role}: {err}") from err
    measured = int(ranks[0])
    if want is not None:
        if measured < want:
            raise InvalidInput(
                f"requested rank {want} exceeds measured rank {measured} of role {role} "
                f"at layer {heads.info.layer_indices[layer]}, head {head} (rtol {eff_rtol:.3g})")
        return u[0, :, :want], measured
    if measured < width:
        u[0, :, measured:] = 0.0
    return u[0], measured


def layer_bases(heads: HeadWeights, role: str, layer: int, *,
                rtol: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's bases of ``role`` (layer = position 0..L-1): (U [H_role, d_model, r],
    measured ranks [H_role]) exactly as :func:`role_bases` holds them (columns past a head's
    rank zero), read from the role's cached bases when present, else factorized for this layer
    alone, so a caller walking the layers never holds a 7B model's 2 GiB of bases."""
    check_role(role)
    cached = heads._cache.get(("bases", role, None, rtol))
    if cached is not None:
        return cached.U[layer], cached.ranks[layer]
    w = heads.role(role)
    _, _, d_model, d_head = w.shape
    eff_rtol = _check_rtol(rtol, d_model, d_head, w.dtype)
    try:
        u, ranks = _factorize(w[layer].detach(), compute_dtype(w.dtype), eff_rtol, None)
    except UnsupportedModel as err:
        raise UnsupportedModel(f"role {role}: {err}") from err
    width = min(d_model, d_head)
    if bool((ranks < width).any()):
        u.mul_((torch.arange(width, device=u.device) < ranks[:, None])[:, None, :].to(u.dtype))
    return u, ranks


def release_bases(heads: HeadWeights) -> int:
    """Drop every role's cached bases from ``heads._cache`` (results computed from them stay);
    returns the bytes released. A server calls it once a stage's results are stored: bases of
    a 7B-class model hold 2 GiB per role."""
    freed = 0
    for key in [k for k in heads._cache if isinstance(k, tuple) and k and k[0] == "bases"]:
        freed += heads._cache.pop(key).U.nbytes
    return freed


def singular_values(heads: HeadWeights, role: str) -> torch.Tensor:
    """Singular values of every head's weights of ``role`` [L, H, min(d_model, d_head)],
    descending, in the compute dtype (as the rank rule sees them): one batched SVD, computed on
    request (the bases themselves do not need them)."""
    check_role(role)
    w = heads.role(role).detach()
    try:
        return torch.linalg.svdvals(w.to(compute_dtype(w.dtype)))
    except RuntimeError as err:  # LAPACK failures on non-finite input
        raise UnsupportedModel(f"role {role}: weights cannot be factorized: {err}") from err


def effective_ranks(bases: RoleBases | RoleFactors) -> torch.Tensor:
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
