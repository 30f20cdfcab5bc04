"""Runnable views of a loaded model: the PatternSource over a TransformerBridge, and prompt
tokenization any PatternSource answers (right-padded ids and their mask)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from headgraph.core.errors import UnsupportedModel
from headgraph.core.types import PatternSource

# -- tokenization every runnable source shares ---------------------------------------------

class TokenizedSource:
    """Prompt tokenization of a runnable source from the model's own tokenizer: ids as it
    makes them (its special tokens, nothing added), right-padded, with their mask; a BOS only
    where the tokenizer itself adds one (``bos_token_id`` says which). Subclasses run the model
    (``attention_patterns``)."""

    def __init__(self, tokenizer: Any | None, *, d_vocab: int, n_ctx: int | None,
                 device: str | torch.device) -> None:
        self.tokenizer: Any | None = tokenizer
        self.d_vocab: int = int(d_vocab)
        self.n_ctx: int | None = n_ctx
        self._device = device
        prefix = self._encode("")
        self.bos_token_id: int | None = int(prefix[0]) if len(prefix) else None

    def _encode(self, text: str) -> list[int]:
        """Ids as the model's own tokenizer makes them, at most the model's context."""
        tok = self.tokenizer
        if tok is None:
            raise UnsupportedModel("this model has no tokenizer to encode prompts with")
        ids = [int(i) for i in tok(text, add_special_tokens=True)["input_ids"]]
        return ids[: self.n_ctx] if self.n_ctx else ids

    def tokenize(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-padded ids [batch, pos] and mask [batch, pos]."""
        rows = [self._encode(t) for t in texts]
        pad = getattr(self.tokenizer, "pad_token_id", None) or 0
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), int(pad), dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.bool)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
            mask[i, : len(r)] = True
        return ids.to(self._device), mask.to(self._device)

    def to_tokens(self, texts: list[str]) -> torch.Tensor:
        return self.tokenize(texts)[0]

    def token_pool(self) -> torch.Tensor:
        """Ids safe to draw random tokens from: in the tokenizer and the embedding, not special."""
        tok = self.tokenizer
        n = min(self.d_vocab, len(tok)) if tok is not None else self.d_vocab
        keep = torch.ones(n, dtype=torch.bool)
        special = [i for i in (getattr(tok, "all_special_ids", None) or []) if 0 <= i < n]
        keep[special] = False
        return torch.nonzero(keep).flatten()


# -- a PatternSource for TransformerLens bridges ------------------------------------------

class BridgePatternSource(TokenizedSource):
    """PatternSource over a TransformerBridge and the model's own tokenizer.

    ``tokenizer``: the tokenizer as the checkpoint ships it (default: the bridge's). The
    bridge rebuilds its tokenizer with ``add_bos_token=True``, so prompts encoded by it would
    start with a BOS the model's own tokenizer never adds (SmolLM2: ``<|im_start|>``)."""

    def __init__(self, bridge: Any, tokenizer: Any | None = None) -> None:
        self.bridge = bridge
        self.layer_indices: tuple[int, ...] = tuple(int(i) for i, _ in bridge.blocks_with("attn"))
        cfg = bridge.cfg
        super().__init__(tokenizer if tokenizer is not None else bridge.tokenizer,
                         d_vocab=int(cfg.d_vocab),
                         n_ctx=int(cfg.n_ctx) if getattr(cfg, "n_ctx", None) else None,
                         device=cfg.device)

    def _encode(self, text: str) -> list[int]:
        if self.tokenizer is None:  # the bridge's own (it truncates to the context)
            return self.bridge.to_tokens(text, padding_side="right",
                                         move_to_device=False)[0].tolist()
        return super()._encode(text)

    @torch.no_grad()
    def attention_patterns(self, tokens: torch.Tensor,
                           attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Attention probabilities [L, batch, H, q, k] from ``blocks.{l}.attn.hook_pattern``."""
        kwargs = {}
        if attention_mask is not None:
            kwargs["attention_mask"] = attention_mask.to(tokens.device).long()
        try:
            _, cache = self.bridge.run_with_cache(
                tokens, names_filter=lambda n: n.endswith("hook_pattern"), **kwargs)
        except (AttributeError, AssertionError, NotImplementedError, TypeError) as err:
            raise UnsupportedModel(f"TransformerLens cannot run this model's forward "
                                   f"({type(err).__name__}: {' '.join(str(err).split())[:200]})"
                                   ) from err
        try:
            pats = [cache[f"blocks.{i}.attn.hook_pattern"] for i in self.layer_indices]
        except KeyError as err:
            raise UnsupportedModel(f"the bridge did not report attention patterns ({err}); "
                               "it needs eager attention") from err
        return torch.stack(pats)



def tokenize_prompts(source: PatternSource, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask) from ``source.tokenize`` or, for a bare PatternSource, per-prompt lengths."""
    tokenize: Callable[[list[str]], tuple[torch.Tensor, torch.Tensor]] | None = getattr(
        source, "tokenize", None)
    if tokenize is not None:
        return tokenize(prompts)
    ids = source.to_tokens(prompts)
    lengths = torch.tensor([source.to_tokens([p]).shape[-1] for p in prompts], device=ids.device)
    mask = torch.arange(ids.shape[-1], device=ids.device)[None, :] < lengths[:, None]
    return ids, mask
