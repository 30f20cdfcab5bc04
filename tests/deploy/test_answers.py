"""The frontend's answer types (headgraph.frontend.api.answers) are the server's response models.

answers.py is written by scripts/openapi_types.py from the OpenAPI document of the server's
app; these tests regenerate it and fail when the checked-in file differs (a response model
changed without the script being run), and check against real answers that every field the
TypedDicts require does arrive.
"""

from __future__ import annotations

import copy
import difflib
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from fastapi.testclient import TestClient

from headgraph.frontend.api import answers
from headgraph.server.http.app import create_app
from headgraph.server.settings import Settings

pytestmark = pytest.mark.slow  # builds the app's OpenAPI and runs the generator: ~10 s

ROOT = Path(__file__).resolve().parents[2]


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("openapi_types", ROOT / "scripts" / "openapi_types.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def script() -> ModuleType:
    return load_script()


@pytest.fixture(scope="module")
def document(script: ModuleType) -> dict[str, Any]:
    return script.openapi_document()


def test_answers_py_is_what_the_script_writes(script: ModuleType, document: dict[str, Any]) -> None:
    written = script.render(document)
    checked_in = script.TARGET.read_text(encoding="utf-8")
    diff = "".join(difflib.unified_diff(checked_in.splitlines(True), written.splitlines(True),
                                        "answers.py (checked in)", "answers.py (from the app)", n=1))
    assert written == checked_in, ("answers.py is stale: run .venv/bin/python scripts/openapi_types.py\n"
                                   + diff[:4000])


def test_a_changed_response_model_changes_the_module(script: ModuleType, document: dict[str, Any]) -> None:
    changed = copy.deepcopy(document)
    health = changed["components"]["schemas"]["Health"]
    health["properties"]["uptime_days"] = {"type": "integer", "default": 0}
    written = script.render(changed)
    assert written != script.TARGET.read_text(encoding="utf-8")
    block = written.split("class Health(TypedDict):", 1)[1].split("\nclass ", 1)[0]
    assert "    uptime_days: int\n" in block  # a field with a default is required too


def test_every_schema_is_a_typeddict(document: dict[str, Any]) -> None:
    for name, schema in document["components"]["schemas"].items():
        if schema.get("type") == "object" and "properties" in schema:
            cls = getattr(answers, name)
            assert cls.__required_keys__ == frozenset(schema["properties"]), name


@pytest.mark.parametrize(("path", "answer"), [
    ("/api/health", "Health"), ("/api/auth", "AuthOut"), ("/api/vocabulary", "VocabularyOut"),
    ("/api/cache/stats", "CacheStats"), ("/api/models", "ModelList"), ("/api/labels", "LabelSetList"),
    ("/api/tasks", "TaskList"), ("/api/queue", "Queue"),
])
def test_real_answers_carry_every_required_field(tmp_path: Path, path: str, answer: str) -> None:
    cls = getattr(answers, answer)
    with TestClient(create_app(Settings(cache_dir=tmp_path / "cache", compute_processes=0))) as client:
        body = client.get(path).raise_for_status().json()
    assert cls.__required_keys__ <= set(body), sorted(cls.__required_keys__ - set(body))
    if answer == "ModelList":  # and one level down: each model's summary
        assert body["models"]
        for model in body["models"]:
            assert answers.ModelSummary.__required_keys__ <= set(model)
