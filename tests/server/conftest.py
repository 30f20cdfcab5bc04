"""Fixtures of the server tier: the API server a module shares (a real ``headgraph serve`` on
loopback through conftest.py's ``launch_server``, serving the demo model and a local GQA model),
a client on it, and the demo's float64 reference (from its safetensors alone: SVD bases,
explicit W_OV / W_QK products). Each is module-scoped: a module that needs another server
defines its own fixture of the same name. Helpers (``ok``, ``err``, ``haar``, ...) are in
tests/api_support.py."""

from __future__ import annotations

import httpx
import pytest
import torch
from safetensors.torch import load_file

from headgraph.core.models.demo import DEMO_DIR

from api_support import H, L


@pytest.fixture(scope="module")
def model_root(tmp_path_factory):
    """A model root holding a tiny grouped-query (Qwen2) checkpoint without a tokenizer."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    root = tmp_path_factory.mktemp("models")
    cfg = Qwen2Config(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                      hidden_size=32, intermediate_size=64, vocab_size=300,
                      max_position_embeddings=64, tie_word_embeddings=False)
    torch.manual_seed(3)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(root / "qwen2-tiny")
    return root


@pytest.fixture(scope="module")
def server(launch_server, tmp_path_factory, model_root):
    """One server for the module (demo + local:qwen2-tiny); none of its answers may be a 5xx."""
    cache = tmp_path_factory.mktemp("api") / "cache"
    env = {"HEADGRAPH_MODEL_ROOT": str(model_root), "HEADGRAPH_DEVICE": "cpu"}
    with launch_server(cache, workers=1, env=env, check_errors=True) as srv:
        yield srv


@pytest.fixture(scope="module")
def api(server):
    with httpx.Client(base_url=server.url, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def ref():
    """The demo model's PK grids, forward-pair mask and K-composition CS in float64."""
    sd = {k: v.double() for k, v in load_file(str(DEMO_DIR / "model.safetensors")).items()}

    def basis(m):
        return torch.linalg.svd(m, full_matrices=False).U

    U = {"Q": basis(sd["W_Q"]), "K": basis(sd["W_K"]), "V": basis(sd["W_V"]),
         "O": basis(sd["W_O"].transpose(-2, -1))}
    pk = {p: torch.einsum("abdi,cedj->abceij", U[p[0]], U[p[1]]).square().sum((-2, -1))
          for p in ("OQ", "OK", "OV")}
    forward = torch.zeros(L, H, L, H, dtype=torch.bool)
    forward[0, :, 1, :] = True
    left = sd["W_V"] @ sd["W_O"]  # W_OV [L, H, d, d]
    right_k = sd["W_K"] @ sd["W_Q"].transpose(-2, -1)  # W_QK^T
    prod = torch.einsum("abij,cejk->abceik", left, right_k)
    cs_k = torch.linalg.matrix_norm(prod) / (
        torch.linalg.matrix_norm(left)[:, :, None, None] * torch.linalg.matrix_norm(right_k)[None, None])
    return {"sd": sd, "U": U, "pk": pk, "forward": forward, "cs_K": cs_k}
