"""Freed heap memory goes back to the system after a computation (server.compute.memory)."""

from __future__ import annotations


def test_trim_returns_freed_heap_memory():
    """After many heap-sized tensors are freed, malloc_trim gives their pages back: the
    resident size falls (glibc; the CI machine's libc)."""
    import psutil
    import torch

    from headgraph.server.compute.memory import trim

    proc = psutil.Process()
    held = [torch.ones(16 * 1024) for _ in range(12000)]  # 64 KiB each: heap, not mmap
    del held[1::2]  # every other one: the heap cannot shrink from its top
    before = proc.memory_info().rss
    del held
    trim()
    assert proc.memory_info().rss < before - 400 * 2**20  # ~160 MiB come back without trim
