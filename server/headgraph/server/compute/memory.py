"""Give the heap's free memory back to the system after a computation.

glibc serves allocations below its (self-raising) mmap threshold from the heap, and freed heap
memory stays mapped: after a forward pass or a factorization of a large model, hundreds of MiB
(~0.75 GiB after a 1B model's pattern scores) count in the process's resident size although
nothing uses them, and the next stage's peak adds to them. ``trim`` asks glibc to return them
(``malloc_trim(0)``); elsewhere (another libc, another system) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any


@functools.cache
def _libc() -> Any:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


def trim() -> bool:
    """Return free heap memory to the system; True when glibc did (released anything)."""
    libc = _libc()
    return bool(libc.malloc_trim(0)) if libc is not None else False


__all__ = ["trim"]
