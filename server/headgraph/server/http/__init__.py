"""The HTTP API: the FastAPI app factory, dependencies (``Annotated`` aliases for each service),
access rules, body limits, exception handlers, warm JSON responses, response schemas and one
router per resource.

Imports ``services`` and everything below it, never cli or sweep (enforced by import-linter).
"""
