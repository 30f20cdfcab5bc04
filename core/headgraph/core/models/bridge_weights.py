"""Read per-head attention weights out of a TransformerBridge, as TransformerLens's own PK does.

TransformerLens's ``attention_head_subspace_affinity`` reads ``blocks_with("attn")`` and each
block's ``attn.W_Q/W_K/W_V`` ([heads, d_model, d_head], K/V with native KV heads) and
``attn.W_O`` ([heads, d_head, d_model]); we read the same tensors so the two agree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from headgraph.core.errors import UnsupportedModel
from headgraph.core.models.fingerprint import weights_fingerprint
from headgraph.core.types import HeadWeights, ModelInfo


def _stack(blocks: list[tuple[int, Any]], attr: str, name: str) -> torch.Tensor:
    mats = []
    for layer, block in blocks:
        try:
            w = getattr(block.attn, attr)
        except (AttributeError, NotImplementedError, RuntimeError, ValueError) as err:
            raise UnsupportedModel(f"{name}: layer {layer} cannot expose attn.{attr}: {err}") from err
        if not isinstance(w, torch.Tensor) or w.ndim != 3:
            raise UnsupportedModel(f"{name}: layer {layer} attn.{attr} is not a [heads, ., .] tensor")
        mats.append(w.detach())
    shapes = {tuple(m.shape) for m in mats}
    if len(shapes) != 1:
        raise UnsupportedModel(f"{name}: attn.{attr} shapes differ across layers: {sorted(shapes)}")
    return torch.stack(mats)


def heads_from_bridge(
    bridge: Any,
    *,
    name: str,
    source: str,
    processing: str = "bridge",
    device: str | torch.device | None = None,
) -> HeadWeights:
    """Extract stacked head weights, W_U and tokenizer from a booted TransformerBridge.

    Returns HeadWeights with W_Q [L,H,d,dh], W_K/W_V [L,Hkv,d,dh], W_O [L,H,dh,d] on
    ``device`` (default: where the bridge lives), layer_indices = original block numbers.
    """
    blocks_with: Callable[[str], Iterable[tuple[int, Any]]] | None = getattr(bridge, "blocks_with", None)
    if blocks_with is None or not callable(blocks_with):
        raise UnsupportedModel(f"{name}: model must be a TransformerBridge exposing blocks_with('attn')")
    blocks = list(blocks_with("attn"))
    if not blocks:
        raise UnsupportedModel(f"{name}: no attention layers found")
    with torch.no_grad():
        W_Q = _stack(blocks, "W_Q", name)
        W_K = _stack(blocks, "W_K", name)
        W_V = _stack(blocks, "W_V", name)
        W_O = _stack(blocks, "W_O", name)
        try:
            W_U = bridge.W_U.detach()
        except (AttributeError, NotImplementedError, RuntimeError, ValueError):
            W_U = None
    L, H, d_model, d_head = W_Q.shape
    if W_O.shape != (L, H, d_head, d_model):
        raise UnsupportedModel(f"{name}: W_O shape {tuple(W_O.shape)} does not match W_Q {tuple(W_Q.shape)}")
    if W_K.shape[2:] != (d_model, d_head) or W_V.shape != W_K.shape:
        raise UnsupportedModel(f"{name}: K/V shapes {tuple(W_K.shape)}, {tuple(W_V.shape)} are inconsistent")
    if W_U is not None and (W_U.ndim != 2 or W_U.shape[0] != d_model):
        W_U = None
    cfg = getattr(bridge, "cfg", None)
    arch = str(getattr(cfg, "original_architecture", None) or getattr(cfg, "architecture", None)
               or type(getattr(bridge, "original_model", bridge)).__name__)
    if device is not None:
        W_Q, W_K, W_V, W_O = (t.to(device) for t in (W_Q, W_K, W_V, W_O))
        W_U = W_U.to(device) if W_U is not None else None
    info = ModelInfo(
        name=name,
        architecture=arch,
        n_layers=L,
        n_heads=H,
        n_kv_heads=W_K.shape[1],
        d_model=d_model,
        d_head=d_head,
        d_vocab=None if W_U is None else int(W_U.shape[1]),
        dtype=str(W_Q.dtype).replace("torch.", ""),
        layer_indices=tuple(int(layer) for layer, _ in blocks),
        processing=processing,
        source=source,
    )
    fp = weights_fingerprint([W_Q, W_K, W_V, W_O, W_U], processing=processing,
                             extra=",".join(map(str, info.layer_indices)))
    return HeadWeights(info=info, W_Q=W_Q, W_K=W_K, W_V=W_V, W_O=W_O, W_U=W_U,
                       fingerprint=fp, tokenizer=getattr(bridge, "tokenizer", None))
