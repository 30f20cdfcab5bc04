"""GGUF models in the server, on the real SmolLM2-135M-Instruct Q4_1 file (conftest's ``gguf_path``):
a GGUF under a model root is confined to it (core's loader and the server's registry). A real
server listing ``smollm2`` and serving its PK, model info and every view is
tests/browser/test_smollm2.py (from the session's SmolLM2 cache, which ``headgraph compute``
fills through the server's own loading code); core's GGUF loading is tests/core/test_gguf.py.
"""

from __future__ import annotations

import shutil

import pytest

from headgraph.core.errors import PathNotAllowed
from headgraph.core.models.loading import load_model
from headgraph.server.models.offered import Registry
from headgraph.server.settings import Settings

L, H, H_KV = 30, 9, 3


def test_gguf_under_a_model_root_is_confined(gguf_path, tmp_path):
    root = tmp_path / "models"
    (root / "linked").mkdir(parents=True)
    (root / "linked" / "model.gguf").symlink_to(gguf_path)
    with pytest.raises(PathNotAllowed):
        load_model(str(root / "linked"), device="cpu", model_root=str(root))
    with pytest.raises(PathNotAllowed):
        load_model(str(root / "linked" / "model.gguf"), device="cpu", model_root=str(root))
    with pytest.raises(PathNotAllowed):  # the file itself lies outside this root
        load_model(str(gguf_path), device="cpu", model_root=str(root))
    (root / "smol").mkdir()
    shutil.copy(gguf_path, root / "smol" / "smol.gguf")
    registry = Registry(Settings(cache_dir=tmp_path / "c", models=("demo",), model_root=root))
    ids = registry.allowed_ids()
    assert "local:smol" in ids and "smollm2" in ids and "local:linked" not in ids
    assert registry.resolve("local:smol").path == (root / "smol").resolve()
