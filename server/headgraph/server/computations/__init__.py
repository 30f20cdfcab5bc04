"""The registered pure computations (PK, CS, z, nulls, reference, tokens, patterns, graphs,
ablation, data-weighted PK, validation) and the conversions between core's torch results
and stored payloads.

Imports ``compute``, ``models``, ``cache`` and the base modules (enforced by import-linter).
"""
