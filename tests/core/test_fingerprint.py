"""Weight fingerprints hash a tensor piece by piece: the digest equals hashlib over the whole
tensor's C-order bytes (what cache keys were built from), without copying the tensor."""

from __future__ import annotations

import hashlib
import resource

import numpy as np
import pytest
import torch

from headgraph.core.models import fingerprint


def _whole(t: torch.Tensor) -> str:
    """The digest from one copy of the whole tensor (numpy, contiguous, bf16 as int16)."""
    h = hashlib.sha256()
    h.update(f"{t.dtype}|{tuple(t.shape)}|".encode())
    c = t.detach().contiguous()
    arr = c.view(torch.int16).numpy() if c.dtype == torch.bfloat16 else c.numpy()
    h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()


@pytest.mark.parametrize("chunk", [64, 1 << 26])
def test_digest_equals_whole_bytes(monkeypatch, chunk):
    monkeypatch.setattr(fingerprint, "_DIGEST_CHUNK_BYTES", chunk)
    g = torch.Generator().manual_seed(0)
    cases = [
        torch.randn(3, 5, 7, generator=g),
        torch.randn(3, 5, 7, generator=g).to(torch.bfloat16).transpose(1, 2),  # W_O^T-like view
        torch.randn(4, 6, 9, generator=g)[:, 1:4],
        torch.randn(7, 40, generator=g).T,
        torch.tensor(2.0), torch.zeros(0, 3), torch.arange(10) > 3,
    ]
    for t in cases:
        h = hashlib.sha256()
        fingerprint.tensor_digest(h, t)
        assert h.hexdigest() == _whole(t), tuple(t.shape)


def test_large_tensor_needs_no_copy():
    big = torch.zeros(64, 1024, 1024, dtype=torch.bfloat16)  # 128 MiB
    big[3, 5, 7] = 1.0
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    a = fingerprint.weights_fingerprint([big, None], processing="raw")
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
    assert grown < 32 * 1024 * 1024
    big[3, 5, 7] = 2.0
    assert fingerprint.weights_fingerprint([big, None], processing="raw") != a
