"""schemathesis hooks of tests/server/test_schemathesis.py (SCHEMATHESIS_HOOKS): a JSONL body.

The API documents a JSONL body (POST /api/tasks) as OpenAPI 3.2 reads a sequential media type:
the schema is that of the lines as an array. schemathesis has no serializer for it, so this one
writes a generated array one JSON text a line (anything else, as negative tests generate, as
one JSON text)."""

from __future__ import annotations

import json
from typing import Any

import schemathesis


@schemathesis.serializer("application/x-ndjson", "application/jsonl")
def jsonl(ctx: Any, value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    items = value if isinstance(value, list) else [value]
    return "".join(json.dumps(item) + "\n" for item in items).encode()
