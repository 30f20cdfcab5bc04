"""Random-subspace baselines of token lists: what top-k scores a random plane of a head's rank
reaches against the same unembedding (score as in core.readout.projection).

**Haar baseline** (``method="haar"``). Against a V-token unembedding in d_model dimensions even
a random rank-r plane has tokens with scores well above sqrt(r / d_model), its extreme order
statistics. ``token_baselines`` scores ``samples`` Haar-random subspaces (seeded, the same
centred, normalised unembedding) and keeps their top-k scores; ``baseline_flags`` then flags
(BASELINE_RULE), with q = BASELINE_QUANTILE (0.95):

* a head's list as above the baseline when the mean of its top-k scores exceeds the
  q-quantile over the random subspaces of *their* mean top-k score (same k, same rank);
* each token at list rank i as above the baseline when its score exceeds the q-quantile of the
  random subspaces' i-th best score (rank-matched order statistics, so slicing a list to a
  smaller k keeps every token's flag).

The statistic is an extreme order statistic over the whole vocabulary, whose law depends on how
the token vectors crowd together, so it is sampled: only each token's own score has a closed
law (||P x||^2 / ||x||^2 ~ Beta(r/2, (d-r)/2) for a Haar plane P of rank r).

**One draw for every rank.** Sample s's rank-r plane is the span of the first r of one seeded
sequence of Gaussian columns (``haar_gaussians`` is prefix-consistent), so its QR basis of the
largest rank holds every smaller rank's basis as its first columns, and one tiled pass over the
vocabulary (core.readout.projection.nested_token_scores) scores every rank: each rank's planes
are still ``samples`` independent Haar planes, at the cost of the largest rank alone.

**Unembedding-shaped baseline** (``method="unembedding"``). Haar planes ignore that the
unembedding's token vectors crowd into a few directions: a plane along them names tokens by
construction. This baseline spans its random planes by Gaussian columns with the covariance
of the centred unembedding Sigma_U = W~ W~^T / V (planes QR(Sigma_U^(1/2) G), a small ridge
keeping them full rank), so a list counts only when it beats planes that respect that
anisotropy; UNEMBEDDING_SAMPLES (200) planes resolve its 0.95 point. Its prefixes are nested too
(the first r columns of Sigma_U^(1/2) G are that rank's draw).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from headgraph.core.errors import InvalidInput
from headgraph.core.readout.projection import TILE_ELEMENTS, nested_token_scores
from headgraph.core.stats.reference import haar_basis

BASELINE_SAMPLES = 40  # Haar-random subspaces per rank (seeded; a few dozen, as the 95% point needs)
BASELINE_SEED = 0
BASELINE_QUANTILE = 0.95
BASELINE_METHODS = ("haar", "unembedding")
UNEMBEDDING_SAMPLES = 200  # planes of the unembedding-shaped baseline: its 0.95 point from 200 draws
_UNEMBEDDING_RIDGE = 1e-7  # relative ridge so Sigma_U's planes stay full rank
_ROWS_PER_PASS = 1 << 14  # sample bases' columns scored per vocabulary pass (bounds memory)
BASELINE_RULE = ("a head's list is above baseline when the mean of its top-k scores exceeds the "
                 "0.95-quantile of the mean top-k score of Haar-random subspaces of the same rank "
                 "(same centred, normalised unembedding); a token at list rank i is above baseline "
                 "when its score exceeds the 0.95-quantile of the random subspaces' i-th best score")


@dataclass(frozen=True)
class TokenBaseline:
    """Top-k token scores of ``samples`` random rank-``rank`` subspaces (one unembedding).

    scores: [samples, k] float64, best first, each row one random subspace. Per list depth
    j = 1..k (index j - 1): rank_mean / rank_threshold [k] are the mean and the
    ``quantile``-quantile (linear interpolation, as numpy's default) over the samples of the
    j-th best score; mean_topk_mean / mean_topk_threshold [k] the same of the mean of the
    j best scores.
    """

    rank: int
    k: int
    samples: int
    seed: int
    quantile: float
    scores: torch.Tensor
    rank_mean: torch.Tensor
    rank_threshold: torch.Tensor
    mean_topk_mean: torch.Tensor
    mean_topk_threshold: torch.Tensor

    def to_dict(self) -> dict[str, Any]:
        """JSON form: rank, k, and the four per-depth lists (index j - 1 = depth j)."""
        return {"rank": self.rank, "k": self.k,
                "rank_mean": self.rank_mean.tolist(), "rank_threshold": self.rank_threshold.tolist(),
                "mean_topk_mean": self.mean_topk_mean.tolist(),
                "mean_topk_threshold": self.mean_topk_threshold.tolist()}


def haar_gaussians(d_model: int, rank: int, samples: int, seed: int) -> torch.Tensor:
    """The seeded Gaussian draws behind the baselines: [samples, d_model, rank] float64 on the
    CPU, column j the j-th [samples, d_model] draw of torch.Generator(seed), so a smaller rank's
    draw is the first columns of a larger one's. Their QR bases (``reference.haar_basis``) are
    Haar-random rank-``rank`` subspaces. Exposed so a test can rebuild the same subspaces."""
    gen = torch.Generator().manual_seed(int(seed))
    out = torch.empty(samples, d_model, rank, dtype=torch.float64)
    for j in range(rank):
        out[:, :, j] = torch.randn(samples, d_model, generator=gen, dtype=torch.float64)
    return out


def _check_baseline_args(rank: int, k: int, samples: int, quantile: float) -> None:
    for name, value, low in (("rank", rank, 0), ("k", k, 1), ("samples", samples, 2)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise InvalidInput(f"{name} must be an integer >= {low}, got {value!r}")
    if not 0.0 < float(quantile) < 1.0:
        raise InvalidInput(f"quantile must lie in (0, 1), got {quantile!r}")


def unembedding_factor(W_U: torch.Tensor) -> torch.Tensor:
    """F [d_model, d_model] float64 (CPU) with F F^T = Sigma_U + ridge: the eigen-factor of the
    centred unembedding's covariance W~ W~^T / V (W~ = W_U minus its mean token vector)."""
    W = W_U.detach().to("cpu")
    d, V = W.shape
    tile = max(1, (1 << 24) // d)  # float64 tiles: a large vocabulary is never copied whole
    mean = sum((W[:, v0: v0 + tile].to(torch.float64).sum(dim=1) for v0 in range(0, V, tile)),
               torch.zeros(d, dtype=torch.float64)) / V
    sigma = torch.zeros(d, d, dtype=torch.float64)
    for v0 in range(0, V, tile):
        C = W[:, v0: v0 + tile].to(torch.float64) - mean[:, None]
        sigma.addmm_(C, C.T)
    sigma /= V
    sigma = sigma + _UNEMBEDDING_RIDGE * float(sigma.diagonal().mean().clamp_min(1e-300)) * torch.eye(
        sigma.shape[0], dtype=torch.float64)
    evals, evecs = torch.linalg.eigh((sigma + sigma.T) / 2)
    return evecs * evals.clamp(min=0).sqrt()[None, :]


def _summary(top: torch.Tensor, rank: int, samples: int, seed: int, quantile: float) -> TokenBaseline:
    q = torch.tensor(float(quantile), dtype=torch.float64)
    depth = torch.arange(1, top.shape[1] + 1, dtype=torch.float64)
    mean_topk = top.cumsum(dim=1) / depth  # [S, k]: mean of the j best scores
    return TokenBaseline(rank=int(rank), k=int(top.shape[1]), samples=int(samples), seed=int(seed),
                         quantile=float(quantile), scores=top, rank_mean=top.mean(dim=0),
                         rank_threshold=torch.quantile(top, q, dim=0),
                         mean_topk_mean=mean_topk.mean(dim=0),
                         mean_topk_threshold=torch.quantile(mean_topk, q, dim=0))


def token_baselines(W_U: torch.Tensor, ranks: list[int], k: int, *, samples: int = BASELINE_SAMPLES,
                    seed: int = BASELINE_SEED, quantile: float = BASELINE_QUANTILE,
                    tile_elements: int = TILE_ELEMENTS, method: str = "haar") -> dict[int, TokenBaseline]:
    """The baseline of every rank in ``ranks`` against ``W_U`` [d_model, V], from one draw of
    ``samples`` planes of the largest rank (module docstring: nested prefixes), scored in one
    pass over vocabulary tiles per group of samples (``nested_token_scores``; float32 like the
    heads, float64 when W_U is). Each rank's result equals ``token_baseline`` of that rank
    alone. k is capped at V; rank 0 scores 0."""
    if method not in BASELINE_METHODS:
        raise InvalidInput(f"unknown baseline method {method!r}; allowed: {list(BASELINE_METHODS)}",
                           allowed=list(BASELINE_METHODS))
    if W_U.ndim != 2:
        raise InvalidInput(f"W_U must be [d_model, d_vocab], got shape {tuple(W_U.shape)}")
    for rank in ranks or [0]:
        _check_baseline_args(rank, k, samples, quantile)
    d, V = W_U.shape
    if ranks and max(ranks) > d:
        raise InvalidInput(f"rank {max(ranks)} exceeds d_model {d}")
    k = min(int(k), V)
    positive = sorted({int(r) for r in ranks if r > 0})
    out = {0: _summary(torch.zeros(samples, k, dtype=torch.float64), 0, samples, seed, quantile)} \
        if 0 in ranks else {}
    if not positive:
        return out
    R = positive[-1]
    G = haar_gaussians(d, R, samples, seed)
    if method == "unembedding":
        G = unembedding_factor(W_U) @ G
    U = haar_basis(G).to(W_U.device)  # U[s, :, :r] spans sample s's rank-r plane, every r
    U = U if W_U.dtype == torch.float64 else U.to(torch.float32)
    group = max(1, _ROWS_PER_PASS // R)
    tops = torch.cat([nested_token_scores(U[s0: s0 + group], W_U, k, positive,
                                          tile_elements=tile_elements)
                      for s0 in range(0, samples, group)]).to("cpu", torch.float64)  # [S, n, k]
    for i, rank in enumerate(positive):
        out[rank] = _summary(tops[:, i].contiguous(), rank, samples, seed, quantile)
    return out


def token_baseline(W_U: torch.Tensor, rank: int, k: int, *, samples: int = BASELINE_SAMPLES,
                   seed: int = BASELINE_SEED, quantile: float = BASELINE_QUANTILE,
                   tile_elements: int = TILE_ELEMENTS, method: str = "haar") -> TokenBaseline:
    """Top-k scores of ``samples`` random rank-``rank`` subspaces against ``W_U`` [d_model, V]
    (``token_baselines`` of one rank; module docstring).

    Why: a head's top tokens always have *some* scores; this says what scores a random plane
    of the same rank reaches. Same score as ``subspace_token_scores`` (same centring and
    normalisation); ``tile_elements`` bounds the [samples * rank, tile] product, so memory stays
    bounded for large vocabularies. Bases: float64 QR of ``haar_gaussians``;
    ``method="unembedding"``: QR of ``unembedding_factor(W_U) @ haar_gaussians``.
    """
    _check_baseline_args(rank, k, samples, quantile)
    return token_baselines(W_U, [rank], k, samples=samples, seed=seed, quantile=quantile,
                           tile_elements=tile_elements, method=method)[rank]


def baseline_flags(scores: torch.Tensor, baseline: TokenBaseline
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(mean score [N], list above baseline [N], tokens above baseline [N, k]) of ranked
    scores [N, k] (best first, k <= baseline.k) against one baseline (BASELINE_RULE)."""
    if scores.ndim != 2 or not 1 <= scores.shape[1] <= baseline.k:
        raise InvalidInput(f"scores must be [N, k] with 1 <= k <= {baseline.k}, got "
                           f"{tuple(scores.shape)}")
    s = scores.to("cpu", torch.float64)
    k = s.shape[1]
    mean = s.mean(dim=1)
    return (mean, mean > baseline.mean_topk_threshold[k - 1],
            s > baseline.rank_threshold[:k][None, :])
