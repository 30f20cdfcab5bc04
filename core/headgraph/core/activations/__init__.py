"""What the model does when it runs: attention-pattern scores and head flags, path ablation of
edges, data-weighted PK and the validation of weight metrics against ablation effects, over
the runners that hook a runnable model.

Imports ``readout``, ``stats``, ``scores``, ``models`` and the base modules, never ``graphs``
(enforced by import-linter).
"""
