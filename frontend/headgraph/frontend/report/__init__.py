"""``headgraph report MODEL``: a findings page (markdown + figures) from the HTTP API's numbers.

``numbers`` fetches every number over HTTP (a server it starts on a free loopback port, or
``--url``), ``claims`` decides each of the paper's claims by stated rules (``verdicts``: their
outcomes; ``recovery``: the recovery sections and the task-circuit claims), ``charts`` draws
the figures (reusing ``headgraph.frontend.figures``), ``markdown`` writes the page and
``command`` is the subcommand the ``headgraph`` CLI finds through the ``headgraph.commands``
entry point.

The top layer of the frontend: may import every frontend package (enforced by import-linter).
"""
