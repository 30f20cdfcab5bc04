"""The isotropic random reference: PK between Haar-random planes, analytic and Monte-Carlo.

Answers "is this overlap larger than between random planes in isotropic R^d?" (the paper's
reference). For a Haar-random m-plane and any n-plane in R^d, PK = tr(P_m P_n) has
mean m n / d and variance 2 m n (d - m)(d - n) / (d^2 (d - 1)(d + 2)); for m = n this is
TransformerLens's 2 m^2 (d - m)^2 / (d^2 (d - 1)(d + 2)). (The general form reduces to the
Beta(n/2, (d-n)/2) variance for m = 1 and is checked against Monte-Carlo in the tests.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from numbers import Integral
from typing import Any

import numpy as np
import torch

from headgraph.core.errors import InvalidInput
from headgraph.core.names import ROLES
from headgraph.core.scores.layer_order import layer_mask
from headgraph.core.scores.pk import all_pairings
from headgraph.core.types import HeadWeights, PairScores

# Gaussian draws per Monte-Carlo batch are capped at this many entries.
_MC_BATCH_ELEMS = 1 << 24
_GRID_POINTS = 2048
_HIST_BINS = 60
# Density floor (relative to the peak) so log ratios stay finite where one sample has no mass.
_DENSITY_FLOOR = 1e-6


@dataclass(frozen=True)
class HaarMoments:
    """Mean and variance of PK between a Haar-random m-plane and an n-plane in R^d."""

    mean: float
    variance: float

    @property
    def std(self) -> float:
        return math.sqrt(self.variance)


def _check_dims(d: int, m: int, n: int) -> None:
    for name, value in (("d", d), ("m", m), ("n", n)):
        if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
            raise InvalidInput(f"{name} must be a positive integer, got {value!r}")
    if d < 2 or m > d or n > d:
        raise InvalidInput(f"need d >= 2 and ranks m, n <= d; got d={d}, m={m}, n={n}")


def haar_moments(d: int, m: int, n: int | None = None) -> HaarMoments:
    """Analytic PK moments: mean m n / d, variance 2 m n (d-m)(d-n) / (d^2 (d-1)(d+2))."""
    n = m if n is None else n
    _check_dims(d, m, n)
    mean = m * n / d
    variance = 2.0 * m * n * (d - m) * (d - n) / (d * d * (d - 1) * (d + 2))
    return HaarMoments(mean=float(mean), variance=float(variance))


def haar_basis(g: torch.Tensor) -> torch.Tensor:
    """Orthonormalize Gaussian columns g [..., d, m] by QR with the sign fix diag(R) > 0,
    which makes the result exactly Haar-distributed."""
    q, r = torch.linalg.qr(g)
    signs = torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))
    signs = torch.where(signs == 0, torch.ones_like(signs), signs)
    return q * signs[..., None, :]


def _qr_samples(d: int, m: int, n: int, count: int, seed: int,
                device: torch.device | str | None) -> torch.Tensor:
    gen = torch.Generator().manual_seed(int(seed))
    batch = max(1, _MC_BATCH_ELEMS // (d * (m + n)))
    out = []
    for start in range(0, count, batch):
        k = min(batch, count - start)
        g = torch.randn(k, d, m + n, generator=gen, dtype=torch.float64)
        if device is not None:
            g = g.to(device)
        u = haar_basis(g[..., :m])
        v = haar_basis(g[..., m:])
        out.append((u.transpose(-2, -1) @ v).square().sum(dim=(-2, -1)))
    return torch.cat(out)


def _wishart_factor(k: int, m: int, dof: int, gen: torch.Generator,
                    rng: np.random.Generator) -> torch.Tensor:
    """k draws of X [m, w] with X X^T ~ Wishart_m(dof, I): Bartlett's lower-triangular factor
    when dof >= m, else a Gaussian [m, dof]. float32."""
    if dof < m:
        return torch.randn(k, m, dof, generator=gen)
    low = torch.randn(k, m, m, generator=gen).tril_(-1)
    chi = rng.chisquare(dof - np.arange(m), size=(k, m))
    low.diagonal(dim1=-2, dim2=-1).copy_(torch.from_numpy(np.sqrt(chi)))
    return low


def _wishart_samples(d: int, m: int, n: int, count: int, seed: int,
                     device: torch.device | str | None) -> torch.Tensor:
    """Same law, by invariance: a Haar m-plane is span(G), G = [G1; G2] Gaussian [d, m]; against
    the fixed coordinate n-plane PK = tr(A (A + B)^-1) with A = G1^T G1 ~ Wishart_m(n) and
    B = G2^T G2 ~ Wishart_m(d - n) independent, both drawn as m x m factors (Bartlett), so a
    sample costs O(m^3) instead of O(d m^2). float32 arithmetic (S is well conditioned)."""
    gen = torch.Generator().manual_seed(int(seed))
    rng = np.random.default_rng(int(seed))  # chi-square draws (torch has no seeded sampler)
    batch = max(1, _MC_BATCH_ELEMS // (m * m))  # factors are at most [m, m]
    out = []
    for start in range(0, count, batch):
        k = min(batch, count - start)
        fa = _wishart_factor(k, m, n, gen, rng)
        fb = _wishart_factor(k, m, d - n, gen, rng)
        if device is not None:
            fa, fb = fa.to(device), fb.to(device)
        s = torch.baddbmm(fa @ fa.transpose(-2, -1), fb, fb.transpose(-2, -1))
        chol = torch.linalg.cholesky(s)
        x = torch.linalg.solve_triangular(chol, fa, upper=False)
        out.append(x.square().sum(dim=(-2, -1), dtype=torch.float64))
    return torch.cat(out)


def haar_pk_samples(
    d: int, m: int, n: int, count: int, *, seed: int, device: torch.device | str | None = None,
    method: str = "qr",
) -> torch.Tensor:
    """``count`` Monte-Carlo PK values [count] (float64) between independent Haar m- and n-planes.

    method "qr": both planes from QR of Gaussian matrices with the sign fix (literal, O(d m^2)
    per sample); "wishart": the same distribution from m x m matrices (see _wishart_samples,
    ~10x faster at d=768, m=64; used by kl_grid). Seeded and batched; draws are made on the CPU
    so results do not depend on ``device``.
    """
    _check_dims(d, m, n)
    if isinstance(count, bool) or not isinstance(count, Integral) or count < 1:
        raise InvalidInput(f"count must be a positive integer, got {count!r}")
    if method == "qr":
        return _qr_samples(d, m, n, count, seed, device)
    if method == "wishart":
        return _wishart_samples(d, m, n, count, seed, device)
    raise InvalidInput(f"method must be 'qr' or 'wishart', got {method!r}")


def zscores(pk: PairScores, d_model: int) -> torch.Tensor:
    """(PK - Haar mean) / Haar std per pair, using each pair's effective ranks; 0 where invalid
    (or where the Haar variance is 0, i.e. a plane fills R^d). Same shape as ``pk.scores``."""
    if pk.kind != "pk":
        raise InvalidInput(f"zscores needs Projection Kernel scores, got kind {pk.kind!r}")
    m = pk.source_ranks.clamp(max=pk.source_rank).to(torch.float64)[:, :, None, None]
    n = pk.target_ranks.clamp(max=pk.target_rank).to(torch.float64)[None, None]
    mean, var = _haar_pk_moments(m, n, float(d_model))
    ok = pk.valid & (var > 0)
    z = (pk.scores.to(torch.float64) - mean) / var.clamp(min=1e-300).sqrt()
    return torch.where(ok, z, 0.0).to(pk.scores.dtype)


def _haar_pk_moments(m: Any, n: Any, d: float) -> tuple[Any, Any]:
    """Mean and variance of PK between Haar-random planes of ranks m and n in R^d (tensors
    or floats alike)."""
    return m * n / d, 2.0 * m * n * (d - m) * (d - n) / (d * d * (d - 1) * (d + 2))


def pair_zscore(pk: float, source_rank: int, target_rank: int, d_model: int) -> float:
    """One pair's :func:`zscores` cell from its PK and its two heads' effective ranks (a pair
    against the layer order, whose grid is never computed); 0, as in the grid, where a rank
    is 0 or the Haar variance is (a plane fills R^d)."""
    mean, var = _haar_pk_moments(float(source_rank), float(target_rank), float(d_model))
    if source_rank <= 0 or target_rank <= 0 or var <= 0:
        return 0.0
    return (pk - mean) / math.sqrt(var)


@dataclass(frozen=True)
class PairingHistogram:
    """Densities of one pairing's model PKs and of random PKs on common bins (for plots)."""

    pairing: str
    bin_edges: list[float]
    model_density: list[float]
    random_density: list[float]
    model_mean: float
    random_mean: float
    n_pairs: int

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class KLGrid:
    """KL(random || model) per (source role, target role), 4 x 4 in ROLES order.

    ``kl[i][j]`` is for pairing ``ROLES[i] + ROLES[j]``; None where a pairing has < 2 valid pairs.
    """

    roles: tuple[str, ...]
    kl: list[list[float | None]]
    histograms: dict[str, PairingHistogram]
    d_model: int
    rank: int
    samples: int
    seed: int
    order: str
    analytic_mean: float
    analytic_std: float
    method: str = field(default="")
    heads_per_layer: dict[str, int] = field(default_factory=dict)

    @property
    def sampled(self) -> bool:
        """Whether the model distributions read a sample of each layer's heads."""
        return bool(self.heads_per_layer)

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form."""
        return {
            "roles": list(self.roles),
            "kl": self.kl,
            "histograms": {k: v.to_dict() for k, v in self.histograms.items()},
            "d_model": self.d_model,
            "rank": self.rank,
            "samples": self.samples,
            "seed": self.seed,
            "order": self.order,
            "analytic_mean": self.analytic_mean,
            "analytic_std": self.analytic_std,
            "method": self.method,
            "heads_per_layer": dict(self.heads_per_layer),
        }


def _kde(values: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Gaussian KDE of ``values`` on the uniform ``grid`` (bandwidth by Scott's rule, as
    scipy.stats.gaussian_kde: std * n^(-1/5)), computed as a binned KDE: linear binning onto
    the grid, then convolution with the sampled Gaussian kernel. Floored, renormalized."""
    n = values.size
    step = grid[1] - grid[0]
    pos = np.clip((values - grid[0]) / step, 0.0, grid.size - 1.000001)
    left = np.floor(pos).astype(np.int64)
    frac = pos - left
    counts = np.bincount(left, weights=1.0 - frac, minlength=grid.size)
    counts += np.bincount(left + 1, weights=frac, minlength=grid.size + 1)[: grid.size]
    std = float(values.std(ddof=1)) if n > 1 else 0.0
    width = max(std * n ** (-0.2), step)  # a degenerate sample gets a one-step-wide bump
    half = int(np.ceil(5.0 * width / step))
    offsets = np.arange(-half, half + 1) * step
    kernel = np.exp(-0.5 * (offsets / width) ** 2)
    kernel /= kernel.sum()
    dens = np.convolve(counts, kernel, mode="full")[half: half + grid.size]
    dens = np.maximum(dens, _DENSITY_FLOOR * dens.max())
    return dens / np.trapezoid(dens, grid)


def kl_divergence(random_values: np.ndarray, model_values: np.ndarray) -> float:
    """KL(random || model) = integral p_r log(p_r / p_m) of the two samples' Gaussian KDEs
    (Scott's rule, binned) on a common 2048-point grid spanning both samples plus a 10%
    margin, each density floored at 1e-6 of its peak (so disjoint samples give a large but
    finite value, ~log(1e6) = 13.8)."""
    lo = min(random_values.min(), model_values.min())
    hi = max(random_values.max(), model_values.max())
    pad = 0.1 * (hi - lo) if hi > lo else 1.0
    grid = np.linspace(lo - pad, hi + pad, _GRID_POINTS)
    p = _kde(random_values, grid)
    q = _kde(model_values, grid)
    return float(np.trapezoid(p * np.log(p / q), grid))


def sampled_heads(heads: HeadWeights, max_pairs: int, *, order: str = "forward",
                  seed: int = 0) -> tuple[HeadWeights, dict[str, int]]:
    """``heads`` itself (and {}) when every pairing has at most ``max_pairs`` head pairs under
    ``order``; else HeadWeights of k heads per layer and role (k = min(H_role,
    floor(sqrt(max_pairs / layer pairs)))), drawn uniformly per layer (seeded) and copied
    (only they), with the k of each role. Each pairing then has about ``max_pairs`` pairs."""
    if isinstance(max_pairs, bool) or not isinstance(max_pairs, Integral) or max_pairs < 1:
        raise InvalidInput(f"max_pairs must be a positive integer, got {max_pairs!r}")
    layer_pairs = int(layer_mask(heads.info.layer_indices, order, torch.device("cpu")).sum())
    widest = max(heads.role(r).shape[1] for r in ROLES)
    if layer_pairs * widest * widest <= max_pairs:
        return heads, {}
    k = max(1, math.isqrt(max_pairs // max(1, layer_pairs)))
    gen = torch.Generator().manual_seed(int(seed))
    picked: dict[str, torch.Tensor] = {}
    counts: dict[str, int] = {}
    for role, w in (("Q", heads.W_Q), ("K", heads.W_K), ("V", heads.W_V), ("O", heads.W_O)):
        n = w.shape[1]
        counts[role] = min(n, k)
        idx = torch.stack([torch.randperm(n, generator=gen)[:counts[role]].sort().values
                           for _ in range(w.shape[0])])
        picked[role] = torch.stack([w[layer, idx[layer]] for layer in range(w.shape[0])])
    info = replace(heads.info, n_heads=counts["Q"], n_kv_heads=counts["K"])
    sub = HeadWeights(info=info, W_Q=picked["Q"], W_K=picked["K"], W_V=picked["V"],
                      W_O=picked["O"], W_U=None, fingerprint=f"{heads.fingerprint}|heads{k}@{seed}")
    return sub, counts


def kl_grid(heads: HeadWeights, *, samples: int = 20000, seed: int = 0, order: str = "forward",
            max_pairs: int = 40000) -> KLGrid:
    """KL(random || weight pairs) for all 16 role pairings, plus histograms and means.

    The random reference is the Monte-Carlo PK between Haar planes of width r = the common basis
    width (d_head), drawn once (``samples``, ``seed``); each pairing's model distribution is its
    valid pairs' raw PKs (``order``): all of them when every pairing has at most ``max_pairs``
    pairs, else the pairs among a seeded sample of each layer's heads (:func:`sampled_heads`;
    ``heads_per_layer`` says how many), which is what the histograms and KL need at a fraction
    of the cost of 16 full PK grids. Densities: binned Gaussian KDE (Scott's rule) on a common
    grid (see ``kl_divergence``); histograms use 60 common bins over both samples' range.
    """
    d = heads.info.d_model
    r = min(heads.W_O.shape[-2:])  # the common basis width, as role_bases(heads, "O").rank
    rand = haar_pk_samples(d, r, r, samples, seed=seed, method="wishart").cpu().numpy()
    moments = haar_moments(d, r, r)
    source, per_layer = sampled_heads(heads, max_pairs, order=order, seed=seed)
    results = all_pairings(source, order=order)
    kl: list[list[float | None]] = []
    hists: dict[str, PairingHistogram] = {}
    for s_role in ROLES:
        row: list[float | None] = []
        for t_role in ROLES:
            p = s_role + t_role
            res = results[p]
            vals = res.scores[res.valid].to(torch.float64).cpu().numpy()
            if vals.size < 2:
                row.append(None)
                continue
            row.append(kl_divergence(rand, vals))
            lo = float(min(vals.min(), rand.min()))
            hi = float(max(vals.max(), rand.max()))
            edges = np.linspace(lo, hi if hi > lo else lo + 1.0, _HIST_BINS + 1)
            hists[p] = PairingHistogram(
                pairing=p,
                bin_edges=edges.tolist(),
                model_density=np.histogram(vals, bins=edges, density=True)[0].tolist(),
                random_density=np.histogram(rand, bins=edges, density=True)[0].tolist(),
                model_mean=float(vals.mean()),
                random_mean=float(rand.mean()),
                n_pairs=int(vals.size),
            )
        kl.append(row)
    return KLGrid(
        roles=tuple(ROLES), kl=kl, histograms=hists, d_model=d, rank=r, samples=samples,
        seed=seed, order=order, analytic_mean=moments.mean, analytic_std=moments.std,
        method="KL(random || model), binned Gaussian KDE (Scott) on a common 2048-point grid",
        heads_per_layer=per_layer,
    )


__all__ = [
    "HaarMoments", "KLGrid", "PairingHistogram", "haar_basis", "haar_moments",
    "haar_pk_samples", "kl_divergence", "kl_grid", "pair_zscore", "sampled_heads", "zscores",
]
