"""Directed head graphs from pair scores: building and exporting them, hubs, head-class label sets,
model diffs and per-edge timelines over checkpoints.

The top layer of core: may import every other core package (enforced by import-linter).
"""
