"""Content fingerprints of the weights a result was computed from (cache keys rely on them)."""

from __future__ import annotations

import hashlib

import torch

from headgraph.core.types import COMPUTE_VERSION


def tensor_digest(hasher: hashlib._Hash, tensor: torch.Tensor) -> None:
    """Feed a tensor's dtype, shape and exact bytes into ``hasher``."""
    t = tensor.detach().to("cpu").contiguous()
    hasher.update(f"{t.dtype}|{tuple(t.shape)}|".encode())
    # bfloat16 has no numpy view: hash its raw 16-bit pattern instead.
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    hasher.update(t.numpy().tobytes())


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
