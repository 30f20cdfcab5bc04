"""headgraph.server: the FastAPI service, result cache, compute jobs and CLI over headgraph.core.

Packages, top layer first (each imports only the ones below it; import-linter enforces it):
``cli`` (the ``headgraph`` command), ``http`` (the API) and ``sweep`` (Ray sweeps), ``services``
(typed answers and the composition root ``services.wiring``), ``computations`` (the registered
pure computations), ``compute`` (the computation registry, compute processes, the result
cache), ``models`` (offered models, the model catalog), ``cache`` (the on-disk store); and the
base modules ``settings``, ``logs`` and ``errors``. The server never imports the frontend: a
dashboard plugs in through the ``headgraph.frontends`` entry point.
"""

__version__ = "0.1.0"
