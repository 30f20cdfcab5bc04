"""Token names for head subspaces: which unembedding directions lie most inside a head-role subspace.

For a head's role subspace with orthonormal basis U [d_model, r] (``role_bases``) and the
vocabulary-centred unembedding vectors ũ_t = u_t - mean_t' u_t' (u_t = W_U[:, t]), the score of
token t is the fraction of its vector's norm inside the subspace::

    score(t) = ||U^T ũ_t||_2 / ||ũ_t||_2        in [0, 1]   (0 when ũ_t = 0)

Centring removes the direction all logits share (it does not change any softmax), and
normalising keeps tokens with large unembedding norms from winning by size alone.

Each token comes as ``text`` (its exact text) and ``display`` (whitespace made visible), as
core.readout.token_text decodes them; a model with no tokenizer gets ``"#<id>"`` names.

Every list is flagged against random planes of its head's rank (core.readout.baselines:
BASELINE_RULE, the Haar and the unembedding-shaped baselines); the scores come from one tiled
pass over the vocabulary per group of layers (core.readout.projection).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from headgraph.core.errors import InvalidInput, UnsupportedModel
from headgraph.core.names import check_role, head_label
# re-exported: the baselines and the scorer live in their own modules
from headgraph.core.readout.baselines import BASELINE_METHODS as BASELINE_METHODS
from headgraph.core.readout.baselines import BASELINE_QUANTILE as BASELINE_QUANTILE
from headgraph.core.readout.baselines import BASELINE_RULE as BASELINE_RULE
from headgraph.core.readout.baselines import BASELINE_SAMPLES as BASELINE_SAMPLES
from headgraph.core.readout.baselines import BASELINE_SEED as BASELINE_SEED
from headgraph.core.readout.baselines import UNEMBEDDING_SAMPLES as UNEMBEDDING_SAMPLES
from headgraph.core.readout.baselines import TokenBaseline as TokenBaseline
from headgraph.core.readout.baselines import baseline_flags as baseline_flags
from headgraph.core.readout.baselines import haar_gaussians as haar_gaussians
from headgraph.core.readout.baselines import token_baseline as token_baseline
from headgraph.core.readout.baselines import token_baselines as token_baselines
from headgraph.core.readout.baselines import unembedding_factor as unembedding_factor
from headgraph.core.readout.projection import TILE_ELEMENTS as TILE_ELEMENTS
from headgraph.core.readout.projection import subspace_token_scores as subspace_token_scores
from headgraph.core.readout.token_text import decode_tokens, visible
from headgraph.core.scores.subspaces import layer_bases
from headgraph.core.types import HeadWeights

FORMULA = ("score(t) = ||U^T (u_t - mean_t u_t)|| / ||u_t - mean_t u_t||, "
           "U orthonormal basis of the head-role subspace")
# Bases scored together by top_tokens (layers are grouped up to this size).
BASES_BYTES = 256 * 1024 * 1024


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
            # columns past every batched head's rank are zero: they are left out of the product
            width = max(1, int(torch.cat(rank_rows[-len(batch):]).max()))
            s_b, i_b = subspace_token_scores(torch.cat(batch)[:, :, :width], unembed, k)
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
    distinct = sorted({int(r) for r in ranks.flatten().tolist()})

    def key(rank: int) -> tuple[Any, ...]:
        return ("token_baseline", rank, kk, baseline_samples, int(baseline_seed))

    missing = [r for r in distinct if key(r) not in heads._cache]
    if missing:  # every missing rank from one draw and one pass (core.readout.baselines)
        for rank, base in token_baselines(heads.W_U, missing, kk, samples=baseline_samples,
                                          seed=int(baseline_seed)).items():
            heads._cache[key(rank)] = base
    for rank in distinct:
        base = heads._cache[key(rank)]
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
