"""Content fingerprints of what a result was computed from (cache keys rely on them).

Two names, two scopes: the *weights fingerprint* (``HeadWeights.fingerprint``) covers the
per-head attention weights, W_U, processing, layer indices and the tokenizer: all that
weight-level results (PK, CS, nulls, token tables) read. The *model fingerprint*
(``LoadedModel.model_fingerprint``) covers the whole runnable model besides: every parameter
and buffer, the config fields its forward reads, the files it runs from: all that
activation-level results (patterns, ablations, data-weighted PK, circuits) read. Two
checkpoints with equal attention weights share the first, never the second.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
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


# -- the whole model ---------------------------------------------------------------------------

# Config entries that say where a config came from, not what the forward does.
_PROVENANCE = frozenset({"_name_or_path", "name_or_path", "transformers_version", "_commit_hash",
                         "_attn_implementation_autoset"})
_FILE_CHUNK_BYTES = 8 * 1024 * 1024


def module_digest(hasher: hashlib._Hash, module: torch.nn.Module) -> None:
    """Feed every named parameter and buffer of ``module`` (persistent or not), name by name."""
    for kind, named in (("p", module.named_parameters()), ("b", module.named_buffers())):
        for name, t in named:
            hasher.update(f"{kind}:{name}|".encode())
            if t.device.type == "meta":  # no storage: its shape is all there is
                hasher.update(f"meta|{t.dtype}|{tuple(t.shape)}|".encode())
            else:
                tensor_digest(hasher, t)


def _plain(value: Any) -> Any:
    """``value`` with provenance keys dropped from every mapping, recursively."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items() if k not in _PROVENANCE}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def config_digest(hasher: hashlib._Hash, config: Any) -> None:
    """Feed a config (a transformers ``PretrainedConfig``, anything with ``to_dict``, or a dict)
    as sorted JSON, without provenance fields (``_name_or_path``, ``transformers_version``)."""
    if config is None:
        hasher.update(b"config:none|")
        return
    as_dict = config.to_dict() if hasattr(config, "to_dict") else config
    hasher.update(b"config:")
    hasher.update(json.dumps(_plain(as_dict), sort_keys=True, default=repr).encode())
    hasher.update(b"|")


def files_digest(hasher: hashlib._Hash, files: Iterable[Path]) -> None:
    """Feed each file's name, size and bytes (read a chunk at a time)."""
    for f in files:
        hasher.update(f"file:{f.name}|{f.stat().st_size}|".encode())
        with open(f, "rb") as fh:
            while chunk := fh.read(_FILE_CHUNK_BYTES):
                hasher.update(chunk)


def model_fingerprint(weights_fp: str, content_digest: str) -> str:
    """The model fingerprint (16 hex chars): a weights fingerprint joined with the digest of
    the rest of the runnable model (``core.models.whole_model.runnable_digest``)."""
    return hashlib.sha256(f"model|{weights_fp}|{content_digest}".encode()).hexdigest()[:16]
