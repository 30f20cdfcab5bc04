"""Attention-pattern scores per head: identity, previous-token, first-token, duplicate, induction.

These read a model's *behaviour* (its attention probabilities on prompts), the usual
functional labels that weight-based graphs (PK, CS) are checked against. Each score is a
mean attention probability, so it lies in [0, 1]. Query position 0 is left out of every
score (it can only attend to itself), as are padding positions.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from headgraph.core.activations.prompts import default_prompts
from headgraph.core.errors import InvalidInput, UnsupportedModel
from headgraph.core.models.runnable import tokenize_prompts
from headgraph.core.types import PatternSource

PATTERN_KINDS: tuple[str, ...] = ("identity", "previous_token", "first_token",
                                  "duplicate_token", "induction")


@dataclass(frozen=True)
class PatternScores:
    """Per-head pattern scores; every grid is [L, H] with values in [0, 1].

    identity: attention to the query's own position; previous_token: to position i-1;
    first_token: to position 0 (BOS when the model prepends one); duplicate_token: to
    earlier positions holding the same token (queries with such a position only);
    induction: on repeated random tokens [r r], from each position of the second copy to the
    token after its earlier occurrence (i - len(r) + 1).
    """

    identity: torch.Tensor
    previous_token: torch.Tensor
    first_token: torch.Tensor
    duplicate_token: torch.Tensor
    induction: torch.Tensor
    layer_indices: tuple[int, ...]
    n_prompts: int
    induction_length: int
    seed: int

    def grid(self, kind: str) -> torch.Tensor:
        """The [L, H] grid of one of PATTERN_KINDS."""
        if kind not in PATTERN_KINDS:
            raise InvalidInput(f"unknown pattern kind {kind!r}; "
                             f"expected one of {list(PATTERN_KINDS)}")
        return getattr(self, kind)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly: {"layer_indices", "kinds", "scores": {kind: [[float]*H]*L}, ...}."""
        return {
            "layer_indices": list(self.layer_indices),
            "kinds": list(PATTERN_KINDS),
            "scores": {k: self.grid(k).detach().to("cpu", torch.float64).tolist()
                       for k in PATTERN_KINDS},
            "n_prompts": self.n_prompts,
            "induction_length": self.induction_length,
            "seed": self.seed,
        }


# -- scoring ------------------------------------------------------------------------------

def _patterns(source: PatternSource, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    fn: Callable[..., torch.Tensor] = source.attention_patterns  # may take attention_mask=
    if "attention_mask" in inspect.signature(fn).parameters:
        pats = fn(ids, attention_mask=mask)
    else:
        pats = fn(ids)
    if pats.ndim != 5 or pats.shape[1] != ids.shape[0] or pats.shape[-1] != ids.shape[-1]:
        raise UnsupportedModel(f"attention_patterns returned shape {tuple(pats.shape)}; "
                         f"expected [L, {ids.shape[0]}, H, {ids.shape[-1]}, {ids.shape[-1]}]")
    return pats.float()


def _masked_mean(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Mean of values [L, B, H, P] over (B, P) where valid [B, P]; 0 where nothing is valid."""
    w = valid.to(values.dtype)[None, :, None, :]
    total = (values * w).sum(dim=(1, 3))
    return total / w.sum(dim=(1, 3)).clamp_min(1.0)


def text_pattern_scores(patterns: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor
                        ) -> dict[str, torch.Tensor]:
    """identity / previous / first / duplicate grids [L, H] from patterns [L, B, H, T, T].

    ids, mask: [B, T] (mask True on real tokens). Query 0 and padded queries are excluded;
    duplicate_token averages only over queries that have an earlier same-token key.
    """
    mask = mask.to(patterns.device)
    ids = ids.to(patterns.device)
    T = ids.shape[-1]
    pos = torch.arange(T, device=patterns.device)
    q_valid = mask & (pos >= 1)[None, :]  # [B, T]
    identity = _masked_mean(torch.diagonal(patterns, dim1=-2, dim2=-1), q_valid)
    prev = _masked_mean(torch.diagonal(patterns, offset=-1, dim1=-2, dim2=-1), q_valid[:, 1:])
    first = _masked_mean(patterns[..., 0], q_valid)
    earlier = pos[None, :] < pos[:, None]  # [q, k]: k < q
    same = (ids[:, :, None] == ids[:, None, :]) & earlier[None] & mask[:, None, :]  # [B, q, k]
    dup_attn = (patterns * same[None, :, None].to(patterns.dtype)).sum(-1)  # [L, B, H, q]
    duplicate = _masked_mean(dup_attn, q_valid & same.any(-1))
    return {"identity": identity, "previous_token": prev, "first_token": first,
            "duplicate_token": duplicate}


def induction_tokens(source: PatternSource, *, length: int, batch: int, seed: int,
                     device: torch.device | str | None = None) -> torch.Tensor:
    """[batch, (bos) + 2*length] ids: BOS when the source uses one, then r r with r random.

    Tokens of r are distinct (drawn without replacement from ``source.token_pool()`` or
    range(d_vocab)) so every second-copy position has exactly one earlier occurrence.
    """
    pool_fn: Callable[[], torch.Tensor] | None = getattr(source, "token_pool", None)
    d_vocab = getattr(source, "d_vocab", None)
    if pool_fn is None and d_vocab is None:
        raise UnsupportedModel("the pattern source has neither token_pool() nor d_vocab")
    pool = (pool_fn() if pool_fn is not None else torch.arange(int(d_vocab or 0))).to("cpu")
    if len(pool) < length:
        raise InvalidInput(f"vocabulary of {len(pool)} tokens is too small for length {length}")
    gen = torch.Generator().manual_seed(seed)
    picks = torch.rand(batch, len(pool), generator=gen).argsort(dim=-1)[:, :length]
    r = pool[picks]
    parts = [r, r]
    bos = getattr(source, "bos_token_id", None)
    if bos is not None:
        parts.insert(0, torch.full((batch, 1), int(bos), dtype=torch.long))
    return torch.cat(parts, dim=-1).to(device if device is not None else "cpu")


def repeated_random_tokens(source: PatternSource, *, length: int, batch: int, seed: int,
                           device: torch.device | str | None = None) -> tuple[torch.Tensor, int, int]:
    """([batch, (bos) + 2*length'] ids of [(bos) r r], length', offset): ``length`` shortened so
    the sequence fits the source's context (``n_ctx``); offset 1 when a BOS leads, else 0."""
    offset = 0 if getattr(source, "bos_token_id", None) is None else 1
    n_ctx = getattr(source, "n_ctx", None)
    length = length if not n_ctx else min(length, (int(n_ctx) - offset) // 2)
    rr = induction_tokens(source, length=length, batch=batch, seed=seed, device=device)
    return rr, length, offset


def induction_scores(patterns: torch.Tensor, *, length: int, offset: int) -> torch.Tensor:
    """Induction grid [L, H] from patterns [L, B, H, T, T] on [offset tokens] r r.

    Query i in the second copy (offset+length <= i < offset+2*length) attends to the key
    i - length + 1; that offset diagonal starts at i = length - 1, so skip its first offset+1.
    """
    diag = torch.diagonal(patterns, offset=-(length - 1), dim1=-2, dim2=-1)[..., offset + 1:]
    return diag.mean(dim=(1, 3))


def pattern_scores(
    source: PatternSource,
    *,
    prompts: list[str] | None = None,
    seed: int = 0,
    device: str | torch.device | None = None,
    induction_length: int = 20,
    induction_batch: int = 8,
) -> PatternScores:
    """Score every head's attention pattern: one batched forward for the prompts, one for [r r].

    prompts: texts for identity / previous / first / duplicate (default: the bundled IOI set);
    seed: the random tokens of the induction sequences; device: where the grids are returned
    (default: where the source computed them). Grids are [L, H] in [0, 1].
    """
    prompts = default_prompts() if prompts is None else list(prompts)
    if not prompts:
        raise InvalidInput("pattern_scores needs at least one prompt")
    ids, mask = tokenize_prompts(source, prompts)
    grids = text_pattern_scores(_patterns(source, ids, mask), ids, mask)

    rr, length, offset = repeated_random_tokens(source, length=induction_length,
                                                batch=induction_batch, seed=seed, device=ids.device)
    rr_mask = torch.ones_like(rr, dtype=torch.bool)
    grids["induction"] = induction_scores(_patterns(source, rr, rr_mask), length=length,
                                          offset=offset)
    if device is not None:
        grids = {k: v.to(device) for k, v in grids.items()}
    layer_indices = getattr(source, "layer_indices", None)
    if layer_indices is None:
        layer_indices = tuple(range(grids["identity"].shape[0]))
    return PatternScores(**grids, layer_indices=tuple(layer_indices), n_prompts=len(prompts),
                         induction_length=length, seed=seed)
