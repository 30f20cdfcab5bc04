"""Content fingerprints of the weights a result was computed from (cache keys rely on them)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any, cast

import torch

from headgraph.core.types import COMPUTE_VERSION


# Bytes hashed per piece: a tensor is fed in C order a slice at a time, never copied whole.
_DIGEST_CHUNK_BYTES = 64 * 1024 * 1024


def _c_order_pieces(t: torch.Tensor) -> Iterator[torch.Tensor]:
    """Contiguous CPU pieces of t whose bytes, one after another, are t's bytes in C order:
    views of a contiguous CPU tensor; otherwise slices along the leading dimensions, each
    copied (to the CPU, contiguous) only when it is small."""
    if t.device.type == "cpu" and t.is_contiguous():
        flat = t.reshape(-1)
        step = max(1, _DIGEST_CHUNK_BYTES // max(1, t.element_size()))
        for start in range(0, flat.numel(), step):
            yield flat[start:start + step]
    elif t.dim() <= 1 or t.numel() * t.element_size() <= _DIGEST_CHUNK_BYTES:
        yield t.to("cpu").contiguous().reshape(-1)
    else:
        for row in t:
            yield from _c_order_pieces(row)


def tensor_digest(hasher: hashlib._Hash, tensor: torch.Tensor) -> None:
    """Feed a tensor's dtype, shape and exact bytes into ``hasher`` (piece by piece: no copy
    of the whole tensor, so fingerprinting multi-GiB weights needs no extra memory)."""
    t = tensor.detach()
    hasher.update(f"{t.dtype}|{tuple(t.shape)}|".encode())
    for piece in _c_order_pieces(t):
        # bfloat16 has no numpy view: hash its raw 16-bit pattern instead.
        if piece.dtype == torch.bfloat16:
            piece = piece.view(torch.int16)
        hasher.update(piece.numpy().data)


def weights_fingerprint(
    tensors: list[torch.Tensor | None], *, processing: str, extra: str = ""
) -> str:
    """SHA-256 (hex, 16 chars) of the weights actually used + processing + compute version."""
    h = hashlib.sha256()
    h.update(f"v{COMPUTE_VERSION}|{processing}|{extra}|".encode())
    for t in tensors:
        if t is None:
            h.update(b"none|")
        else:
            tensor_digest(h, t)
    return h.hexdigest()[:16]


def tokenizer_digest(tokenizer: Any) -> str:
    """SHA-256 (hex, 12 chars) of what a tokenizer maps text to: its vocabulary, special ids
    and the ids it gives the empty string (so whether it adds a BOS). Results that read
    tokens (token tables, patterns, effects) depend on it, not only on the weights."""
    h = hashlib.sha256()
    if tokenizer is None:
        return "none"
    h.update(type(tokenizer).__name__.encode())
    get_vocab = getattr(tokenizer, "get_vocab", None)
    if callable(get_vocab):
        vocab = cast("dict[str, int]", get_vocab())
        for token, i in sorted(vocab.items(), key=lambda kv: kv[1]):
            h.update(f"{i}:{token}\x00".encode("utf-8", "surrogatepass"))
        h.update(repr(sorted(getattr(tokenizer, "all_special_ids", []) or [])).encode())
        try:
            h.update(repr(list(tokenizer("", add_special_tokens=True)["input_ids"])).encode())
        except Exception as err:  # a tokenizer that cannot encode: its refusal is its identity
            h.update(type(err).__name__.encode())
    else:  # the demo model tokenizes itself: its class and vocabulary size say it all
        h.update(repr(getattr(tokenizer, "d_vocab", None)).encode())
    return h.hexdigest()[:12]


def with_tokenizer(fingerprint: str, tokenizer: Any) -> str:
    """A weights fingerprint extended by the tokenizer's digest (16 hex chars)."""
    if tokenizer is None:
        return fingerprint
    return hashlib.sha256(f"{fingerprint}|{tokenizer_digest(tokenizer)}".encode()
                          ).hexdigest()[:16]
