"""GGUF models in the server, on the real SmolLM2-135M-Instruct Q4_1 file (conftest's ``gguf_path``):
a GGUF under a model root is confined to it (core's loader and the server's registry), and a
real server lists ``smollm2`` and answers its PK. core's GGUF loading is tests/core/test_gguf.py.
"""

from __future__ import annotations

import shutil

import httpx
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


@pytest.mark.slow  # cold PK of SmolLM2 on a real server: ~35 s
def test_server_lists_smollm2_and_answers_pk(launch_server, gguf_path, tmp_path):
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HEADGRAPH_DEVICE": "cpu"}
    with launch_server(tmp_path / "cache", workers=1, env=env) as srv, \
            httpx.Client(base_url=srv.url, timeout=300) as api:
        models = {m["id"]: m for m in api.get("/api/models").json()["models"]}
        assert models["smollm2"]["status"] == "available"
        resp = api.get("/api/pk", params={"model": "smollm2", "pairing": "OK"})
        assert resp.status_code == 200, resp.text[:500]
        grid = resp.json()
        assert grid["shape"] == [L, H, L, H_KV]
        info = api.get("/api/models/info", params={"model": "smollm2"}).json()["info"]
        assert info["quantization"] == "Q4_1" and info["name"] == "smollm2"
        assert str(gguf_path) not in resp.text + str(info)
        errors = srv.server_errors()
    assert not errors, errors


