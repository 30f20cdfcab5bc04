"""Fixtures and float64 reference shared by the HTTP API tests (test_server_api*.py): a real
uvicorn subprocess on loopback serving the demo model and a local GQA model; the reference is
computed from the demo's safetensors alone (SVD bases, explicit W_OV / W_QK products)."""

from __future__ import annotations

import math

import httpx
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from headgraph.core.models.demo import DEMO_DIR
from headgraph.server.http.launch import ServerProcess

torch.set_num_threads(1)
L, H, D, DH = 2, 8, 128, 16


# -- fixtures ---------------------------------------------------------------------------------

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
def server(tmp_path_factory, model_root):
    cache = tmp_path_factory.mktemp("api") / "cache"
    env = {"HEADGRAPH_MODEL_ROOT": str(model_root), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "HEADGRAPH_DEVICE": "cpu"}
    with ServerProcess(cache, workers=1, env=env) as srv:
        yield srv
        errors = srv.server_errors()
    assert not errors, errors


@pytest.fixture(scope="module")
def api(server):
    with httpx.Client(base_url=server.url, timeout=120) as client:
        yield client


def ok(resp: httpx.Response) -> dict:
    assert resp.status_code == 200, resp.text[:1000]
    return resp.json()


def err(resp: httpx.Response, status: int) -> str:
    assert resp.status_code == status, resp.text[:1000]
    body = resp.json()
    assert body["error"]["status"] == status
    return body["error"]["message"]


# -- independent float64 reference of the demo model ---------------------------------------

@pytest.fixture(scope="module")
def ref():
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


def haar(m: float, n: float, d: float = D) -> tuple[float, float]:
    mean = m * n / d
    var = 2 * m * n * (d - m) * (d - n) / (d * d * (d - 1) * (d + 2))
    return mean, math.sqrt(var)


def top_cells(grid: torch.Tensor, valid: torch.Tensor, k: int) -> list[tuple[str, str]]:
    flat = torch.where(valid, grid, -torch.inf).flatten()
    idx = torch.argsort(flat, descending=True, stable=True)[:k]
    out = []
    for i in idx.tolist():
        a, b, c, e = np.unravel_index(i, grid.shape)
        out.append((f"L{a}H{b}", f"L{c}H{e}"))
    return out
