"""The dashboard's only way to the data: the HTTP client of the headgraph API, the browser user's
credential, the API's vocabulary and what a callback reaches besides its arguments.

The bottom layer of the frontend; never imports headgraph.server or headgraph.core (enforced
by import-linter).
"""
