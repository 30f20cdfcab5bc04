"""How much of each token's unembedding vector lies inside a subspace: the top-k tokens of many
subspaces in one tiled pass over the vocabulary.

For an orthonormal basis U [d_model, r] and the vocabulary-centred token vectors
ũ_t = u_t - mean_t' u_t' (u_t = W_U[:, t]), the score of token t is

    score(t) = ||U^T ũ_t||_2 / ||ũ_t||_2        in [0, 1]   (0 when ũ_t = 0)

Every basis is scored against a vocabulary tile with one product ``[N * r, d] @ [d, tile]``
(the cost floor: V * d * N * r multiply-adds), and only each basis's running top-k survives a
tile (``RunningTopK``: a partial selection per tile, no sort of the tile), so memory stays
bounded for any vocabulary. ``nested_token_scores`` scores the prefixes of one basis at once
(the span of its first r columns for several r, from one product and a cumulative sum): what
lets one draw of random planes serve the baselines of every rank.
"""

from __future__ import annotations

import torch

# Elements of one [bases * r, vocab-tile] product (64 MiB in float32): tiles wide enough that the
# product runs at the matmul's full rate while memory stays bounded for any vocabulary.
TILE_ELEMENTS = 1 << 24


class RunningTopK:
    """The k best (score, token id) per row over vocabulary tiles fed in id order: best first,
    equal scores by lower id (as one stable descending sort of the whole row would give).

    Each ``add`` keeps only the tile's entries at or above the row's current k-th best (a
    partial selection, ``torch.topk``), so a tile costs O(tile) and never a full sort.
    """

    def __init__(self, rows: int, k: int, dtype: torch.dtype, device: torch.device) -> None:
        self.k = int(k)
        self.seen = 0
        self.scores = torch.empty(rows, 0, dtype=dtype, device=device)
        self.ids = torch.empty(rows, 0, dtype=torch.long, device=device)

    def add(self, s: torch.Tensor, first_id: int) -> None:
        """Merge a tile's scores [rows, c] whose tokens are ids first_id .. first_id + c - 1."""
        rows, c = s.shape
        self.seen += c
        keep = min(self.k, self.seen)
        if self.scores.shape[1] + c <= keep:  # fewer tokens than k so far: all are candidates
            cand = torch.ones_like(s, dtype=torch.bool)
        else:  # the k-th best of (kept, tile) bounds every entry that can enter the list
            part = torch.topk(s, min(keep, c), dim=1).values
            kth = torch.topk(torch.cat([self.scores, part], dim=1), keep, dim=1).values[:, -1:]
            cand = s >= kth
        counts = cand.sum(dim=1)
        m = int(counts.max()) if rows else 0
        if m == 0:
            return
        # the candidates of each row, left-aligned in id order, padded with -inf
        r_idx, c_idx = cand.nonzero(as_tuple=True)
        slot = (cand.cumsum(dim=1) - 1)[r_idx, c_idx]
        cand_s = torch.full((rows, m), float("-inf"), dtype=s.dtype, device=s.device)
        cand_i = torch.full((rows, m), torch.iinfo(torch.long).max, dtype=torch.long, device=s.device)
        cand_s[r_idx, slot] = s[r_idx, c_idx]
        cand_i[r_idx, slot] = c_idx + first_id
        all_s = torch.cat([self.scores, cand_s], dim=1)  # kept ids all precede the tile's
        all_i = torch.cat([self.ids, cand_i], dim=1)
        order = torch.sort(all_s, dim=1, descending=True, stable=True).indices[:, :keep]
        self.scores, self.ids = all_s.gather(1, order), all_i.gather(1, order)


def _compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def _vocab_mean(W: torch.Tensor, tile: int) -> torch.Tensor:
    """Mean token vector [d] in float64, summed a tile at a time (no full copy of W)."""
    total = torch.zeros(W.shape[0], dtype=torch.float64, device=W.device)
    for v0 in range(0, W.shape[1], tile):
        total += W[:, v0: v0 + tile].to(torch.float64).sum(dim=1)
    return total / W.shape[1]


def _tiles(W: torch.Tensor, rows: int, dtype: torch.dtype, tile_elements: int):
    """(first id, centred token vectors [c, d] in ``dtype``, row-major, ||ũ_t||^2 [c]) over
    the vocabulary (a tied unembedding's tile is a contiguous block of the embedding)."""
    tile = max(1, tile_elements // max(rows, 1))
    mean = _vocab_mean(W, max(tile, 4096)).to(dtype)[None, :]
    for v0 in range(0, W.shape[1], tile):
        Ct = (W[:, v0: v0 + tile].T.to(dtype) - mean).contiguous()
        yield v0, Ct, Ct.square().sum(dim=1)


def _fraction(inside: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """inside / sqrt(total) (a norm over the norm of the token vector), 0 where the token vector
    is 0, at most 1 (rounding)."""
    tiny = torch.finfo(inside.dtype).tiny
    return torch.where(total > 0, inside / total.clamp_min(tiny).sqrt(),
                       torch.zeros_like(inside)).clamp(max=1.0)


def subspace_token_scores(U: torch.Tensor, W_U: torch.Tensor, k: int,
                          *, tile_elements: int = TILE_ELEMENTS) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k (scores, token ids) of ``score(t)`` for every basis in ``U`` [N, d_model, r].

    One product per vocabulary tile for all N bases at once; returns [N, k] each, best first
    (equal scores: lower token id first; identical token vectors may differ in the last bit,
    as the product rounds each row of a tile its own way). Works on U's device; computes in float32 (float64 if either
    input is); W_U [d_model, V] stays in its dtype (tiles are converted, no full copy).
    """
    dtype = _compute_dtype(U, W_U)
    U = U.to(dtype)
    W = W_U.to(U.device)
    N, d, r = U.shape
    Uc = U.permute(1, 0, 2).reshape(d, N * r)  # [d, N * r]: bases side by side
    top = RunningTopK(N, min(int(k), W.shape[1]), dtype, U.device)
    for v0, Ct, total in _tiles(W, N * r, dtype, tile_elements):
        # [c, N] = ||U^T ũ_t|| in one fused reduction over each basis's contiguous columns
        inside = torch.linalg.vector_norm((Ct @ Uc).view(-1, N, r), dim=-1)
        top.add(_fraction(inside.T, total), v0)
    return top.scores, top.ids


def nested_token_scores(Q: torch.Tensor, W_U: torch.Tensor, k: int, ranks: list[int],
                        *, tile_elements: int = TILE_ELEMENTS) -> torch.Tensor:
    """Top-k scores [S, len(ranks), k] (best first) of the spans of the first r columns of each
    orthonormal basis in ``Q`` [S, d_model, R], for each r in ``ranks`` (1 <= r <= R).

    One product [S * R, d] @ [d, tile] per tile serves every rank: the squared projections on
    the columns are summed cumulatively and read at each rank. Same score, centring, tiling
    and precision as ``subspace_token_scores``.
    """
    dtype = _compute_dtype(Q, W_U)
    Q = Q.to(dtype)
    W = W_U.to(Q.device)
    S, d, R = Q.shape
    at = torch.tensor([int(r) - 1 for r in ranks], dtype=torch.long, device=Q.device)
    Qc = Q.permute(1, 0, 2).reshape(d, S * R)
    top = RunningTopK(S * len(ranks), min(int(k), W.shape[1]), dtype, Q.device)
    for v0, Ct, total in _tiles(W, S * R, dtype, tile_elements):
        P = (Ct @ Qc).view(-1, S, R)
        if len(ranks) == 1 and ranks[0] == R:
            inside = torch.linalg.vector_norm(P, dim=-1)[:, :, None]  # [c, S, 1]
        else:  # [c, S, n_ranks]: cumulative squared projections read at each rank
            inside = P.square().cumsum(dim=-1).index_select(2, at).sqrt()
        top.add(_fraction(inside.permute(1, 2, 0).reshape(S * len(ranks), -1), total), v0)
    return top.scores.view(S, len(ranks), -1)
