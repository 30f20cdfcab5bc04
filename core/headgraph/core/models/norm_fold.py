"""Norm-aware head weights: the gains of the norms around attention folded into the heads.

A head reads the residual stream through its layer's pre-attention norm, normalized(x) * g_pre
(+ a bias), and on models with a post-attention norm (Gemma 2/3) writes through
normalized(attn_out) * g_post. The normalization divides by a per-token scalar (RMS or
standard deviation; LayerNorm also centres), so what the gains change is which residual
directions a head reads and writes: the norm-aware matrices are

    W_Q' = diag(g_pre) W_Q,  W_K' = diag(g_pre) W_K,  W_V' = diag(g_pre) W_V,
    W_O' = W_O diag(g_post)   (W_O [d_head, d_model]; g_post = 1 without a post-norm),

per layer (TransformerLens's ``fold_ln`` folds the same pre-attention gain). The raw weights
("raw" subspaces, the default) ignore the gains; on Gemma, whose RMSNorm applies the gain as
1 + w and writes every head through a post-norm, the two can differ completely.

Gains are measured, not guessed from the architecture: each norm module is run on a probe
+-2^16 (alternating signs, mean 0, so RMSNorm and LayerNorm both normalize it to +-1 up to
eps / 2^32) and its negation; half their output difference divided by the signs is the gain
the module applies, whatever its convention (w, 1 + w) and without its bias. GGUF files store
the applied gain directly (llama.cpp's converter adds Gemma's 1), read from
``blk.{i}.attn_norm.weight`` and ``blk.{i}.post_attention_norm.weight``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal, get_args

import torch

from headgraph.core.errors import InvalidInput, UnsupportedModel
from headgraph.core.models.fingerprint import weights_fingerprint
from headgraph.core.types import HeadWeights

Subspaces = Literal["raw", "norm"]
SUBSPACES: tuple[Subspaces, ...] = get_args(Subspaces)
_PROBE = 2.0 ** 16


def check_subspaces(mode: str) -> Subspaces:
    """``mode`` if it is one of SUBSPACES, else InvalidInput listing them."""
    if mode not in SUBSPACES:
        raise InvalidInput(f"unknown subspaces mode {mode!r}; allowed: {list(SUBSPACES)}",
                           allowed=list(SUBSPACES))
    return mode  # type: ignore[return-value]


@dataclass(frozen=True)
class NormGains:
    """Per-layer gains of the norms around attention, in layer positions.

    pre: [L, d_model], the pre-attention norm's gain (ones where a layer has none); post:
    [L, d_model] or None, the post-attention norm's gain; kind: what they are, in words.
    """

    pre: torch.Tensor
    post: torch.Tensor | None
    kind: str

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON summary (no tensors): kind and whether a post-norm is folded."""
        return {"kind": self.kind, "post_norm": self.post is not None}


def fold_norm_gains(heads: HeadWeights, gains: NormGains) -> HeadWeights:
    """HeadWeights with the gains folded in (see the module docstring): readers scaled by
    ``gains.pre`` along d_model, writers by ``gains.post``; ModelInfo.subspaces "norm" and
    ModelInfo.norm_gains ``gains.kind``, a new fingerprint (so cached results of the raw
    weights are never reused), an empty cache. Pure: the input is not modified."""
    if heads.info.subspaces == "norm":
        raise InvalidInput(f"{heads.info.name}: its weights already have the norm gains folded in")
    L, d = heads.W_Q.shape[0], heads.W_Q.shape[2]
    for name, g in (("pre", gains.pre), ("post", gains.post)):
        if g is not None and tuple(g.shape) != (L, d):
            raise InvalidInput(f"{name}-attention gains {tuple(g.shape)} do not match [{L}, {d}]")

    def read(w: torch.Tensor) -> torch.Tensor:  # [L, H, d, dh] scaled along d
        return w * gains.pre.to(w.device, w.dtype)[:, None, :, None]

    W_Q, W_K, W_V = read(heads.W_Q), read(heads.W_K), read(heads.W_V)
    W_O = heads.W_O
    if gains.post is not None:
        W_O = W_O * gains.post.to(W_O.device, W_O.dtype)[:, None, None, :]
    else:
        W_O = W_O.clone()
    info = replace(heads.info, subspaces="norm", norm_gains=gains.kind)
    fp = weights_fingerprint([W_Q, W_K, W_V, W_O, heads.W_U], processing=info.processing,
                             extra=",".join(map(str, info.layer_indices)) + "|norm")
    return HeadWeights(info=info, W_Q=W_Q, W_K=W_K, W_V=W_V, W_O=W_O, W_U=heads.W_U,
                       fingerprint=fp, tokenizer=heads.tokenizer)


def probe_gain(module: Any, d_model: int, *, dtype: torch.dtype, device: torch.device | str
               ) -> torch.Tensor:
    """The gain [d_model] a norm module applies (float64), measured on the +-2^16 probe and its
    negation (bias and the normalization itself cancel; see the module docstring)."""
    if d_model % 2:
        raise UnsupportedModel(f"measuring a norm's gain needs an even width (d_model {d_model})")
    signs = torch.ones(d_model, dtype=torch.float64)
    signs[1::2] = -1.0
    x = torch.stack([signs, -signs]) * _PROBE
    with torch.no_grad():
        out = module(x.to(device=device, dtype=dtype)[None])[0]
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (2, d_model):
        raise UnsupportedModel("a norm module did not return one [d_model] vector per input")
    out = out.detach().to("cpu", torch.float64)
    return (out[0] - out[1]) / (2.0 * signs)


def bridge_norm_gains(bridge: Any) -> NormGains:
    """Gains of a TransformerBridge's attention blocks: ``ln1`` (pre) and, where a block has
    one, ``ln1_post`` (post), each measured by :func:`probe_gain` on the wrapped module."""
    blocks = [b for _, b in bridge.blocks_with("attn")]
    d = int(bridge.cfg.d_model)
    p = next(iter(bridge.parameters()))
    pre, post, posts = [], [], 0
    kinds: set[str] = set()
    for block in blocks:
        ln = getattr(block, "ln1", None)
        ln_post = getattr(block, "ln1_post", None)
        for part, mod, out in (("pre", ln, pre), ("post", ln_post, post)):
            if mod is None:
                out.append(torch.ones(d, dtype=torch.float64))
                continue
            inner = getattr(mod, "original_component", None) or mod
            kinds.add(type(inner).__name__)
            posts += part == "post"
            out.append(probe_gain(inner, d, dtype=p.dtype, device=p.device))
    kind = ", ".join(sorted(kinds)) or "no norms"
    return NormGains(pre=torch.stack(pre), post=torch.stack(post) if posts else None,
                     kind=kind + (" with post-attention norms" if posts else ""))


def demo_norm_gains(model: Any) -> NormGains:
    """Gains of the built-in demo model's per-layer LayerNorm (ones when it has none)."""
    L, d = int(model.cfg.n_layers), int(model.cfg.d_model)
    if not model.cfg.layer_norm:
        return NormGains(pre=torch.ones(L, d, dtype=torch.float64), post=None, kind="no norms")
    return NormGains(pre=model.ln_w.detach().to("cpu", torch.float64).clone(), post=None,
                     kind="LayerNorm")


__all__ = ["SUBSPACES", "NormGains", "Subspaces", "bridge_norm_gains", "check_subspaces",
           "demo_norm_gains", "fold_norm_gains", "probe_gain"]
