"""Statistics of the scores: the isotropic (Haar) reference and its KL, anisotropy-aware null
distributions, per-pair p-values and Benjamini-Hochberg FDR.

Imports ``scores``, ``models`` and the base modules (enforced by import-linter).
"""
