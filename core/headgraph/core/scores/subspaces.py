"""Orthonormal bases of every head's Q/K/V/O subspace, batched over all heads of a role.

Rank rule as TransformerLens's ``orthonormal_subspace``: singular values are computed in
float32 (float64 kept), and a head's numerical rank counts singular values above
``rtol * s_max`` with default ``rtol = max(d_model, d_head) * eps(compute dtype)``.
The factorizations themselves are core.scores.orthonormal's.
"""

from __future__ import annotations

import math
from numbers import Integral, Real

import torch

from headgraph.core.errors import InvalidInput, UnsupportedModel
from headgraph.core.names import ROLES, check_role
from headgraph.core.scores.orthonormal import FACTOR_CHUNK_BYTES, Scratch, cholesky_factors, factorize
from headgraph.core.types import HeadWeights, RoleBases, RoleFactors


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
    chunk = max(1, FACTOR_CHUNK_BYTES // (d_model * d_head * torch.finfo(dtype).bits // 8 * 3))
    scratch = Scratch()
    parts = []
    for start in range(0, L * H, chunk):
        try:
            m = cholesky_factors(flat[start:start + chunk].to(dtype), eff_rtol, scratch)
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
    scratch = Scratch()
    return {r: _role_bases(heads, r, rank, rtol, scratch) for r in dict.fromkeys(roles)}


def _role_bases(heads: HeadWeights, role: str, rank: int | None, rtol: float | None,
                scratch: Scratch) -> RoleBases:
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
        u, ranks = factorize(w.detach().reshape(L * H, d_model, d_head),
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
        u, ranks = factorize(w[layer, head].detach()[None], compute_dtype(w.dtype), eff_rtol, want)
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
        u, ranks = factorize(w[layer].detach(), compute_dtype(w.dtype), eff_rtol, None)
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
