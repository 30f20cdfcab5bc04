"""headgraph: attention-head affinity from weights (Projection Kernel, Composition Score).

Public notebook API::

    import headgraph as hg
    heads = hg.load_heads("demo")            # hub name, local folder, or built-in
    ok = hg.projection_kernel(heads, "OK")   # .scores/.normalized/.valid [Ls, Hs, Lt, Ht]
    cs = hg.composition_score(heads, "K")
"""

from __future__ import annotations

from typing import Any

__all__ = ["load_heads", "projection_kernel", "composition_score"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # Lazy, so `import headgraph.server` does not pay for every core import up front.
    if name in __all__:
        from headgraph.core import api

        return getattr(api, name)
    raise AttributeError(f"module 'headgraph' has no attribute {name!r}")
