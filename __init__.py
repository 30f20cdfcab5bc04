"""headgraph: attention-head affinity from weights (Projection Kernel, Composition Score).

Public notebook API::

    import headgraph as hg
    heads = hg.load_heads("demo")            # hub name, local folder, or built-in
    ok = hg.projection_kernel(heads, "OK")   # .scores/.normalized/.valid [Ls, Hs, Lt, Ht]
    cs = hg.composition_score(heads, "K")
"""

from headgraph.core.api import composition_score, load_heads, projection_kernel

__all__ = ["load_heads", "projection_kernel", "composition_score"]
__version__ = "0.1.0"
