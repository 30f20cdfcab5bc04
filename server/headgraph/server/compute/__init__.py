"""Running computations: the registry of named computations from which every cache key derives,
the pool of compute processes, and the result cache every computation goes through.

Imports ``models``, ``cache`` and the base modules (enforced by import-linter).
"""
