"""Sweeps: the chosen results of many models computed on Ray into one result cache (what to sweep,
the task one worker runs, the driver).

Imports ``services`` and everything below it, never http (enforced by import-linter).
"""
