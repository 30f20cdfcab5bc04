"""Where results live on disk: the diskcache store with cross-process single-flight locks and
checksummed values, safe and read-only access to damaged or read-only cache folders, and the
cache-only request mode (``ColdMiss``).

The bottom layer of the server: imports only ``settings``, ``logs``, ``errors`` and core
(enforced by import-linter).
"""
