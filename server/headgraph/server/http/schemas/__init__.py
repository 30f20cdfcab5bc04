"""Pydantic models of what the API answers (and what OpenAPI at /docs documents), one module
per resource; ``common`` holds the shapes and the error body every endpoint shares."""
