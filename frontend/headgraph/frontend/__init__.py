"""headgraph.frontend: the Dash dashboard, reading every number through the HTTP API.

Packages, top layer first (each imports only the ones below it; import-linter enforces it):
``report`` (the findings page command), ``app`` (the Dash app and its mount on the server),
``callbacks`` (one module per view), ``layout`` (the component tree), ``figures`` (pure
Plotly builders), ``state`` (the URL state) and ``api`` (the HTTP client). It never imports
headgraph.server or headgraph.core.
"""
