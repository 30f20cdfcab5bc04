"""The page's component tree: model bar, view tabs, control widgets built from the URL's state,
one container per view, side panels.

Imports ``figures``, ``state`` and ``api`` (enforced by import-linter).
"""
