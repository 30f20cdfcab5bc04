"""Typed containers shared by every core module.

Shapes use TransformerLens's conventions: weights are stacked per attention
layer, ``[layer, head, d_model, d_head]``; a pair grid is
``[source_layer, source_head, target_layer, target_head]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import torch

from headgraph.core.names import check_role

Processing = Literal["bridge", "raw", "processed"]
PROCESSINGS: tuple[str, ...] = ("bridge", "raw", "processed")
# Bump when any computation whose result is cached changes meaning.
COMPUTE_VERSION = "2"


@dataclass(frozen=True)
class ModelInfo:
    """What a loaded model is: shape, provenance and how its weights were read."""

    name: str
    architecture: str
    n_layers: int  # attention layers kept (len(layer_indices))
    n_heads: int  # query heads per layer
    n_kv_heads: int  # key/value heads per layer (== n_heads unless GQA)
    d_model: int
    d_head: int
    d_vocab: int | None
    dtype: str
    layer_indices: tuple[int, ...]  # original block index of each kept layer
    processing: str  # one of PROCESSINGS
    source: str  # "builtin" | "local" | "hub" | "config" | "safetensors" | "gguf"
    quantization: str | None = None  # GGUF weights: their quantization type ("Q4_1"), else None
    subspaces: str = "raw"  # "raw" weights, or "norm": norm gains folded in (core.models.norm_fold)
    norm_gains: str | None = None  # subspaces "norm": what the folded gains are (NormGains.kind)

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form (for APIs and caches)."""
        d = dict(self.__dict__)
        d["layer_indices"] = list(self.layer_indices)
        return d

    def heads_of(self, role: str) -> int:
        """Number of heads a role has per layer (K/V keep native KV heads)."""
        return self.n_kv_heads if role in ("K", "V") else self.n_heads


@dataclass
class HeadWeights:
    """Per-head attention weights of one model, stacked by attention layer.

    W_Q: [L, H, d_model, d_head]; W_K, W_V: [L, H_kv, d_model, d_head];
    W_O: [L, H, d_head, d_model] (TransformerLens convention; the O subspace is
    span(W_O^T)); W_U: [d_model, d_vocab] or None.
    """

    info: ModelInfo
    W_Q: torch.Tensor
    W_K: torch.Tensor
    W_V: torch.Tensor
    W_O: torch.Tensor
    W_U: torch.Tensor | None
    fingerprint: str
    tokenizer: Any | None = None
    _cache: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)

    def role(self, role: str) -> torch.Tensor:
        """Matrix whose column span is the role's subspace: [L, H_role, d_model, d_head]."""
        role = check_role(role)
        if role == "Q":
            return self.W_Q
        if role == "K":
            return self.W_K
        if role == "V":
            return self.W_V
        return self.W_O.transpose(-2, -1)

    @property
    def device(self) -> torch.device:
        return self.W_Q.device


@dataclass(frozen=True)
class RoleBases:
    """Orthonormal bases of one role for all heads, from one batched factorization.

    U: [L, H, d_model, r] (without a common ``rank``, columns past a head's
    measured rank are zero; see core.scores.subspaces); ranks: [L, H]
    measured numerical ranks (singular values on request: core.scores.subspaces.singular_values).
    """

    role: str
    U: torch.Tensor
    ranks: torch.Tensor
    rank: int
    rtol: float


@dataclass(frozen=True)
class RoleFactors:
    """Orthonormal bases of one role as factors, U[l, h] = a[l, h] @ m[l, h], for models whose
    dense bases do not fit in memory (core.scores.subspaces.role_factors).

    a: [L, H, d_model, d_head] the role's weights as stored (any floating dtype, not copied);
    m: [L, H, d_head, d_head] in the compute dtype; every head has full rank (ranks == rank ==
    d_head), which is what makes the factored form exact.
    """

    role: str
    a: torch.Tensor
    m: torch.Tensor
    ranks: torch.Tensor
    rank: int
    rtol: float


@dataclass(frozen=True)
class PairScores:
    """Scores for every (source head, target head) pair of one pairing.

    scores / normalized / valid: [source_layer, source_head, target_layer, target_head].
    ``kind`` is "pk" (pairing like "OK") or "cs" (pairing = mode "Q"/"K"/"V";
    normalized == scores, CS is already scale-free). Invalid cells hold 0.
    """

    kind: str
    pairing: str
    source_role: str
    target_role: str
    scores: torch.Tensor
    normalized: torch.Tensor
    valid: torch.Tensor
    layer_indices: tuple[int, ...]
    order: str
    source_ranks: torch.Tensor  # [L, Hs]
    target_ranks: torch.Tensor  # [L, Ht]
    source_rank: int
    target_rank: int


class PatternSource(Protocol):
    """A runnable model that can report attention patterns (for pattern scores)."""

    def to_tokens(self, texts: list[str]) -> torch.Tensor:
        """Token ids [batch, pos] (padded; BOS prepended when the model uses one)."""
        ...

    def attention_patterns(self, tokens: torch.Tensor) -> torch.Tensor:
        """Attention probabilities [layer, batch, head, query_pos, key_pos]."""
        ...


__all__ = ["COMPUTE_VERSION", "PROCESSINGS", "HeadWeights", "ModelInfo", "PairScores", "PatternSource",
           "Processing", "RoleBases", "RoleFactors"]
