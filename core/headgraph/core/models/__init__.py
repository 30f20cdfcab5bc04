"""Models in, per-head weights out: loading a spec (the demo, a hub name, a local folder, a GGUF
file, random weights, a checkpoint of a series) into ``HeadWeights`` and, where the model can run,
a ``PatternSource``; offline hub access, tokenizers, the model root that confines local folders,
and weight fingerprints.

Imports only ``headgraph.core.errors``, ``types`` and ``names`` (enforced by import-linter).
"""
