"""Which models the server offers (``offered``: ids, specs, file stamps) and the model catalog
(``catalog``: models loaded in this process and the identities of all of them).

Imports ``cache`` and the base modules, never compute, services or http (enforced by
import-linter).
"""
