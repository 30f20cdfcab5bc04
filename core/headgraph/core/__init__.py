"""headgraph.core: attention-head affinity from weights (Projection Kernel, Composition Score).

Pure torch computation, no web. The notebook entry points::

    import headgraph.core as hg
    heads = hg.load_heads("demo")            # hub name, local folder, or built-in
    ok = hg.projection_kernel(heads, "OK")   # .scores/.normalized/.valid [Ls, Hs, Lt, Ht]
    cs = hg.composition_score(heads, "K")
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["__version__", "composition_score", "load_heads", "projection_kernel"]
__version__ = "0.1.0"

if TYPE_CHECKING:
    from headgraph.core.scores.composition_score import composition_score
    from headgraph.core.models.loading import load_heads
    from headgraph.core.scores.pk import projection_kernel

_LAZY = {"load_heads": "headgraph.core.models.loading", "projection_kernel": "headgraph.core.scores.pk",
         "composition_score": "headgraph.core.scores.composition_score"}


def __getattr__(name: str) -> Any:
    # Lazy, so importing one submodule (errors, vocabulary) does not load torch and TL.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'headgraph.core' has no attribute {name!r}")
