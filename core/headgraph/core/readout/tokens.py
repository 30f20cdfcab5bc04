"""Token names for head subspaces: which unembedding directions lie most inside a head-role subspace.

For a head's role subspace with orthonormal basis U [d_model, r] (``role_bases``) and the
vocabulary-centred unembedding vectors ũ_t = u_t - mean_t' u_t' (u_t = W_U[:, t]), the score of
token t is the fraction of its vector's norm inside the subspace::

    score(t) = ||U^T ũ_t||_2 / ||ũ_t||_2        in [0, 1]   (0 when ũ_t = 0)

Centring removes the direction all logits share (it does not change any softmax), and
normalising keeps tokens with large unembedding norms from winning by size alone.

Each token comes as ``text`` (its exact text) and ``display`` (whitespace made visible), as
core.readout.token_text decodes them; a model with no tokenizer gets ``"#<id>"`` names.

**Random-subspace baseline.** A list of top tokens is only informative when its scores beat
what any subspace of the same rank gets: against a V-token unembedding in d_model dimensions
even a random rank-r plane has tokens with scores well above sqrt(r / d_model), its extreme
order statistics. ``token_baseline`` scores ``samples`` Haar-random rank-r subspaces (seeded,
the same centred, normalised unembedding) and keeps their top-k scores; ``top_tokens`` then
flags (BASELINE_RULE), with q = BASELINE_QUANTILE (0.95):

* a head's list as ``above_baseline`` when the mean of its top-k scores exceeds the q-quantile
  over the random subspaces of *their* mean top-k score (same k, same rank);
* each token at list rank i as ``above_baseline`` when its score exceeds the q-quantile of the
  random subspaces' i-th best score (rank-matched order statistics, so slicing a list to a
  smaller k keeps every token's flag).

**Unembedding-shaped baseline** (``method="unembedding"``). Haar planes ignore that the
unembedding's token vectors crowd into a few directions: a plane along them names tokens by
construction. This baseline spans its random planes by Gaussian columns with the covariance
of the centred unembedding Sigma_U = W~ W~^T / V (planes QR(Sigma_U^(1/2) G), a small ridge
keeping them full rank), so a list counts only when it beats planes that respect that
anisotropy; UNEMBEDDING_SAMPLES (200) planes resolve its 0.95 point.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from headgraph.core.errors import InvalidInput, UnsupportedModel
from headgraph.core.names import check_role, head_label
from headgraph.core.readout.token_text import decode_tokens, visible
from headgraph.core.scores.subspaces import layer_bases
from headgraph.core.stats.reference import haar_basis
from headgraph.core.types import HeadWeights

FORMULA = ("score(t) = ||U^T (u_t - mean_t u_t)|| / ||u_t - mean_t u_t||, "
           "U orthonormal basis of the head-role subspace")
# Elements of one [heads*r, vocab-tile] product; bounds memory for 50k-token vocabularies.
TILE_ELEMENTS = 1 << 24
# Bases scored together by top_tokens (layers are grouped up to this size).
BASES_BYTES = 256 * 1024 * 1024
BASELINE_SAMPLES = 40  # Haar-random subspaces per rank (seeded; a few dozen, as the 95% point needs)
BASELINE_SEED = 0
BASELINE_QUANTILE = 0.95
BASELINE_METHODS = ("haar", "unembedding")
UNEMBEDDING_SAMPLES = 200  # planes of the unembedding-shaped baseline: its 0.95 point from 200 draws
_UNEMBEDDING_RIDGE = 1e-7  # relative ridge so Sigma_U's planes stay full rank
BASELINE_RULE = ("a head's list is above baseline when the mean of its top-k scores exceeds the "
                 "0.95-quantile of the mean top-k score of Haar-random subspaces of the same rank "
                 "(same centred, normalised unembedding); a token at list rank i is above baseline "
                 "when its score exceeds the 0.95-quantile of the random subspaces' i-th best score")


@dataclass(frozen=True)
class TokenBaseline:
    """Top-k token scores of ``samples`` Haar-random rank-``rank`` subspaces (one unembedding).

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


@dataclass(frozen=True)
class TokenTable:
    """Top-k tokens per head of one role.

    token_ids / scores: [n_layers, n_heads, k] (CPU), best first; layers: original block
    numbers of the rows; heads: head indices of the columns (KV heads for K/V under GQA);
    names: node names ("L4H7" or "L5KV1"); text / display: decoded strings ``[n_layers][n_heads][k]``.
    Baseline (module docstring): ranks [n_layers, n_heads] measured rank of each head's
    subspace; baselines: one TokenBaseline per distinct rank; mean_scores [n_layers, n_heads]
    mean of the k scores; above_baseline [n_layers, n_heads] and token_above [n_layers,
    n_heads, k] the flags of BASELINE_RULE.
    """

    role: str
    k: int
    layers: tuple[int, ...]
    heads: tuple[int, ...]
    names: tuple[tuple[str, ...], ...]
    token_ids: torch.Tensor
    scores: torch.Tensor
    text: tuple[tuple[tuple[str, ...], ...], ...]
    display: tuple[tuple[tuple[str, ...], ...], ...]
    ranks: torch.Tensor
    baselines: tuple[TokenBaseline, ...]
    mean_scores: torch.Tensor
    above_baseline: torch.Tensor
    token_above: torch.Tensor
    formula: str = FORMULA

    def baseline_of(self, rank: int) -> TokenBaseline:
        """The random-subspace baseline of one rank."""
        for b in self.baselines:
            if b.rank == rank:
                return b
        raise KeyError(rank)

    def for_head(self, layer: int, head: int) -> list[dict[str, Any]]:
        """Ranked tokens of one head (layer = original block number)."""
        i, j = self.layers.index(layer), self.heads.index(head)
        thr = self.baseline_of(int(self.ranks[i, j])).rank_threshold.tolist()
        above = self.token_above[i, j].tolist()
        return [{"id": int(t), "score": float(s), "text": self.text[i][j][n],
                 "display": self.display[i][j][n], "baseline": float(thr[n]),
                 "above_baseline": bool(above[n])}
                for n, (t, s) in enumerate(zip(self.token_ids[i, j].tolist(),
                                               self.scores[i, j].tolist()))]

    def to_dict(self) -> dict[str, Any]:
        """JSON form: role, k, formula, the baseline (rule, samples, seed, quantile, per-rank
        lists), how many heads are above it, and one entry per head with its rank, mean score,
        flag, the threshold it was compared with and its ranked tokens (each with its
        rank-matched threshold ``baseline`` and flag ``above_baseline``)."""
        heads = []
        for i, layer in enumerate(self.layers):
            for j, head in enumerate(self.heads):
                rank = int(self.ranks[i, j])
                b = self.baseline_of(rank)
                heads.append({"name": self.names[i][j], "layer": layer, "head": head,
                              "rank": rank, "mean_score": float(self.mean_scores[i, j]),
                              "baseline_threshold": float(b.mean_topk_threshold[self.k - 1]),
                              "above_baseline": bool(self.above_baseline[i, j]),
                              "tokens": self.for_head(layer, head)})
        first = self.baselines[0] if self.baselines else None
        return {"role": self.role, "k": self.k, "formula": self.formula,
                "baseline": {"method": "haar", "rule": BASELINE_RULE,
                             "samples": 0 if first is None else first.samples,
                             "seed": BASELINE_SEED if first is None else first.seed,
                             "quantile": BASELINE_QUANTILE if first is None else first.quantile,
                             "by_rank": {str(b.rank): b.to_dict() for b in self.baselines}},
                "n_above_baseline": int(self.above_baseline.sum()),
                "heads": heads}


def subspace_token_scores(U: torch.Tensor, W_U: torch.Tensor, k: int,
                          *, tile_elements: int = TILE_ELEMENTS) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k (scores, token ids) of ``score(t)`` for every basis in ``U`` [N, d_model, r].

    One matmul per vocabulary tile for all N heads at once; returns [N, k] each, best first
    (ties: lower token id first). Works on U's device; computes in float32 (float64 if given).
    """
    dtype = torch.float64 if torch.float64 in (U.dtype, W_U.dtype) else torch.float32
    U = U.to(dtype)
    W = W_U.to(U.device)  # [d, V], kept in its dtype; tiles are converted (no full copy)
    N, d, r = U.shape
    V = W.shape[1]
    k = min(int(k), V)
    Ut = U.transpose(1, 2).reshape(N * r, d)
    tile = max(1, tile_elements // max(N * r, 1))
    total = torch.zeros(d, dtype=torch.float64, device=U.device)
    for v0 in range(0, V, tile):
        total += W[:, v0: v0 + tile].to(torch.float64).sum(dim=1)
    mean = (total / V).to(dtype)[:, None]  # centre over the vocabulary
    best_s = torch.empty(N, 0, dtype=dtype, device=U.device)
    best_i = torch.empty(N, 0, dtype=torch.long, device=U.device)
    for v0 in range(0, V, tile):
        C = W[:, v0: v0 + tile].to(dtype) - mean  # [d, c] centred token vectors
        inside = (Ut @ C).reshape(N, r, -1).square().sum(dim=1)  # [N, c] = ||U^T ũ_t||^2
        total = C.square().sum(dim=0)  # [c] = ||ũ_t||^2
        s = torch.where(total > 0, (inside / total.clamp_min(torch.finfo(dtype).tiny)).sqrt(),
                        torch.zeros_like(inside)).clamp(max=1.0)
        ids = torch.arange(v0, v0 + C.shape[1], device=U.device).expand(N, -1)
        cat_s, cat_i = torch.cat([best_s, s], dim=1), torch.cat([best_i, ids], dim=1)
        order = torch.sort(cat_s, dim=1, descending=True, stable=True).indices[:, :k]
        best_s, best_i = cat_s.gather(1, order), cat_i.gather(1, order)
    return best_s, best_i


def haar_gaussians(d_model: int, rank: int, samples: int, seed: int) -> torch.Tensor:
    """The seeded Gaussian draws behind ``token_baseline``: [samples, d_model, rank] float64 on
    the CPU (torch.Generator(seed)); their QR bases (``reference.haar_basis``) are Haar-random
    rank-``rank`` subspaces. Exposed so a test can rebuild the same subspaces independently."""
    gen = torch.Generator().manual_seed(int(seed))
    return torch.randn(samples, d_model, rank, generator=gen, dtype=torch.float64)


def _check_baseline_args(rank: int, k: int, samples: int, quantile: float) -> None:
    for name, value, low in (("rank", rank, 0), ("k", k, 1), ("samples", samples, 2)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise InvalidInput(f"{name} must be an integer >= {low}, got {value!r}")
    if not 0.0 < float(quantile) < 1.0:
        raise InvalidInput(f"quantile must lie in (0, 1), got {quantile!r}")


def unembedding_factor(W_U: torch.Tensor) -> torch.Tensor:
    """F [d_model, d_model] float64 (CPU) with F F^T = Sigma_U + ridge: the eigen-factor of the
    centred unembedding's covariance W~ W~^T / V (W~ = W_U minus its mean token vector)."""
    W = W_U.detach().to("cpu", torch.float64)
    W = W - W.mean(dim=1, keepdim=True)
    sigma = W @ W.T / W.shape[1]
    sigma = sigma + _UNEMBEDDING_RIDGE * float(sigma.diagonal().mean().clamp_min(1e-300)) * torch.eye(
        sigma.shape[0], dtype=torch.float64)
    evals, evecs = torch.linalg.eigh((sigma + sigma.T) / 2)
    return evecs * evals.clamp(min=0).sqrt()[None, :]


def token_baseline(W_U: torch.Tensor, rank: int, k: int, *, samples: int = BASELINE_SAMPLES,
                   seed: int = BASELINE_SEED, quantile: float = BASELINE_QUANTILE,
                   tile_elements: int = TILE_ELEMENTS, method: str = "haar") -> TokenBaseline:
    """Top-k scores of ``samples`` Haar-random rank-``rank`` subspaces against ``W_U`` [d_model, V].

    Why: a head's top tokens always have *some* scores; this says what scores a random plane
    of the same rank reaches (module docstring). Same score as ``subspace_token_scores`` (same
    centring and normalisation): all samples are scored in one batched pass over vocabulary
    tiles (``tile_elements`` bounds the [samples * rank, tile] product, so memory stays
    bounded for 50k-token vocabularies). Bases: float64 QR of ``haar_gaussians``, scored in
    float32 like the heads (float64 when W_U is); ``method="unembedding"``: QR of
    ``unembedding_factor(W_U) @ haar_gaussians`` (module docstring). k is capped at V; rank 0
    scores 0.
    """
    if method not in BASELINE_METHODS:
        raise InvalidInput(f"unknown baseline method {method!r}; allowed: {list(BASELINE_METHODS)}",
                           allowed=list(BASELINE_METHODS))
    if W_U.ndim != 2:
        raise InvalidInput(f"W_U must be [d_model, d_vocab], got shape {tuple(W_U.shape)}")
    _check_baseline_args(rank, k, samples, quantile)
    d, V = W_U.shape
    if rank > d:
        raise InvalidInput(f"rank {rank} exceeds d_model {d}")
    k = min(int(k), V)
    if rank == 0:
        top = torch.zeros(samples, k, dtype=torch.float64)
    else:
        G = haar_gaussians(d, rank, samples, seed)
        if method == "unembedding":
            G = unembedding_factor(W_U) @ G
        U = haar_basis(G).to(W_U.device)
        U = U if W_U.dtype == torch.float64 else U.to(torch.float32)
        top = subspace_token_scores(U, W_U, k, tile_elements=tile_elements)[0]
        top = top.to("cpu", torch.float64)
    q = torch.tensor(float(quantile), dtype=torch.float64)
    depth = torch.arange(1, k + 1, dtype=torch.float64)
    mean_topk = top.cumsum(dim=1) / depth  # [S, k]: mean of the j best scores
    return TokenBaseline(rank=int(rank), k=k, samples=int(samples), seed=int(seed),
                         quantile=float(quantile), scores=top, rank_mean=top.mean(dim=0),
                         rank_threshold=torch.quantile(top, q, dim=0),
                         mean_topk_mean=mean_topk.mean(dim=0),
                         mean_topk_threshold=torch.quantile(mean_topk, q, dim=0))


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


def slice_token_payload(payload: dict[str, Any], k: int) -> dict[str, Any]:
    """A ``TokenTable.to_dict()`` payload cut to its first ``k`` tokens per head, with each
    head's mean score, threshold and flag recomputed for depth k (token flags are rank-matched
    and stay as they are) and the baseline's per-depth lists cut to k. Pure dict -> dict."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise InvalidInput(f"k must be an integer >= 1, got {k!r}")
    k = min(k, int(payload["k"]))
    base = payload.get("baseline")
    by_rank = {} if base is None else base["by_rank"]
    heads = []
    for h in payload["heads"]:
        row = dict(h, tokens=h["tokens"][:k])
        b = by_rank.get(str(h.get("rank")))
        if b is not None and row["tokens"]:
            mean = sum(t["score"] for t in row["tokens"]) / len(row["tokens"])
            thr = b["mean_topk_threshold"][len(row["tokens"]) - 1]
            row.update(mean_score=mean, baseline_threshold=thr, above_baseline=bool(mean > thr))
        heads.append(row)
    out = dict(payload, k=k, heads=heads)
    if base is not None:
        out["baseline"] = dict(base, by_rank={
            r: {**b, "k": min(k, b["k"]), **{f: b[f][:k] for f in (
                "rank_mean", "rank_threshold", "mean_topk_mean", "mean_topk_threshold")}}
            for r, b in by_rank.items()})
        out["n_above_baseline"] = sum(bool(h.get("above_baseline")) for h in heads)
    return out




def top_tokens(heads: HeadWeights, role: str, *, k: int = 10, layer: int | None = None,
               head: int | None = None, baseline_samples: int = BASELINE_SAMPLES,
               baseline_seed: int = BASELINE_SEED, bases_bytes: int = BASES_BYTES) -> TokenTable:
    """Top-k tokens of every head's ``role`` subspace (optionally one layer and/or head), each
    list flagged against the random-subspace baseline of its head's rank (module docstring).

    ``layer`` is an ORIGINAL block number (as in node names), ``head`` an index among the role's
    heads (KV heads for K/V). Score: see the module docstring / ``FORMULA``. Baselines
    (``token_baseline``, ``baseline_samples`` subspaces, seed ``baseline_seed``) depend only on
    W_U, the rank and k, so they are cached in ``heads._cache`` and shared by all roles.
    Layers' bases are factorized one layer at a time and scored in groups of up to
    ``bases_bytes``. Raises UnsupportedModel when the model has no unembedding W_U.
    """
    check_role(role)
    if heads.W_U is None:
        raise UnsupportedModel(f"{heads.info.name} has no unembedding (W_U): token names of "
                               "head subspaces need one")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise InvalidInput(f"k must be an integer >= 1, got {k!r}")
    if isinstance(baseline_samples, bool) or not isinstance(baseline_samples, int) \
            or baseline_samples < 2:
        raise InvalidInput(f"baseline_samples must be an integer >= 2, got {baseline_samples!r}")
    info = heads.info
    n_layers, n_heads = heads.role(role).shape[:2]
    rows = list(range(n_layers))
    cols = list(range(n_heads))
    if layer is not None:
        if layer not in info.layer_indices:
            raise InvalidInput(f"layer {layer} is not an attention layer of {info.name} "
                             f"({list(info.layer_indices)})")
        rows = [info.layer_indices.index(layer)]
    if head is not None:
        if not 0 <= head < n_heads:
            raise InvalidInput(f"head {head} out of range for role {role} (0..{n_heads - 1})")
        cols = [head]
    # Layers' bases a group at a time (up to BASES_BYTES): a 7B model's role (2 GiB) is never
    # held whole, a small model's is scored in one batch.
    scores, found, rank_rows, batch = [], [], [], []
    unembed = heads.W_U

    def score_batch() -> None:
        if batch:
            s_b, i_b = subspace_token_scores(torch.cat(batch), unembed, k)
            scores.append(s_b)
            found.append(i_b)
            batch.clear()

    for row in rows:
        u, layer_ranks = layer_bases(heads, role, row)
        if batch and (len(batch) + 1) * u[cols].nbytes > bases_bytes:
            score_batch()
        batch.append(u[cols])
        rank_rows.append(layer_ranks[cols])
    score_batch()
    nL, nH = len(rows), len(cols)
    kk = scores[0].shape[1]
    s = torch.cat(scores).reshape(nL, nH, kk).cpu()
    ids = torch.cat(found).reshape(nL, nH, kk).cpu()
    flat = ids.flatten().tolist()
    uniq = sorted(set(flat))
    names = dict(zip(uniq, decode_tokens(heads.tokenizer, uniq)))
    text = tuple(tuple(tuple(names[t] for t in ids[i, j].tolist()) for j in range(nH))
                 for i in range(nL))
    display = tuple(tuple(tuple(visible(x) for x in cell) for cell in row) for row in text)
    grouped = role in ("K", "V") and info.n_kv_heads < info.n_heads
    layers = tuple(info.layer_indices[i] for i in rows)
    ranks = torch.stack(rank_rows).to("cpu", torch.long)
    baselines = []
    mean = torch.zeros(nL, nH, dtype=torch.float64)
    above = torch.zeros(nL, nH, dtype=torch.bool)
    token_above = torch.zeros(nL, nH, kk, dtype=torch.bool)
    for rank in sorted(set(ranks.flatten().tolist())):
        key = ("token_baseline", int(rank), kk, baseline_samples, int(baseline_seed))
        base = heads._cache.get(key)
        if base is None:
            base = token_baseline(heads.W_U, int(rank), kk, samples=baseline_samples,
                                  seed=int(baseline_seed))
            heads._cache[key] = base
        baselines.append(base)
        sel = ranks == rank
        m, a, t = baseline_flags(s[sel], base)
        mean[sel], above[sel], token_above[sel] = m, a, t
    return TokenTable(role=role, k=kk, layers=layers, heads=tuple(cols),
                      names=tuple(tuple(head_label(lay, h, kv=grouped) for h in cols)
                                  for lay in layers),
                      token_ids=ids, scores=s,
                      text=text, display=display, ranks=ranks, baselines=tuple(baselines),
                      mean_scores=mean, above_baseline=above, token_above=token_above)
