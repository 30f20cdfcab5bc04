"""Pair scores from weights: orthonormal bases of every head's Q/K/V/O subspace, batched squared
overlaps, the Projection Kernel, the Composition Score, layer orders and rankings.

Imports ``models`` and the base modules (errors, types, names), never stats, activations or
graphs (enforced by import-linter).
"""
