"""Reading head subspaces through the unembedding: which token directions lie most inside a
head-role subspace, against a Haar baseline.

Imports ``stats``, ``scores``, ``models`` and the base modules (enforced by import-linter).
"""
