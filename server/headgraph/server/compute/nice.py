"""The nice level of a compute process, as an absolute level (standard library only, so a
process can set it before importing anything heavy).

>>> run_at_nice(0) >= 0
True
"""

from __future__ import annotations

import os


def run_at_nice(level: int) -> int:
    """Lower this process to nice ``level``, an absolute level: never added to the level it
    inherited (a server started under ``nice``), never raised back above it. The level now."""
    try:
        current = os.nice(0)
        if level > current:
            current = os.nice(level - current)
    except OSError:
        pass
    return os.nice(0)


__all__ = ["run_at_nice"]
