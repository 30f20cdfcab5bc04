"""The dashboard's view state: its URL query form, the URL writer's transitions and when each
view's results are ready.

Imports ``api`` only (enforced by import-linter).
"""
