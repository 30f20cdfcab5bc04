"""The ``headgraph`` command line: ``main`` lists the commands; each command has a module holding
its parser, command and text output; ``plugins`` adds commands found through entry points.

The top layer of the server: may import every server package (enforced by import-linter).
"""
