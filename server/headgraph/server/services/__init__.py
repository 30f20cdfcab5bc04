"""Typed services, one per kind of answer (scores, views, graphs, details, labels, comparisons,
ablation, data-weighted PK, validation, jobs), and ``wiring``, the composition root that builds
them for one process.

Imports ``computations`` and everything below it, never http or cli (enforced by import-linter).
"""
