"""headgraph.server: the FastAPI service, result cache, compute jobs and CLI over headgraph.core."""

__version__ = "0.1.0"
