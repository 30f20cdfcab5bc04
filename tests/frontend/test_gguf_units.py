"""The dashboard's model description of a GGUF model (its quantization), without a browser or
a server. (GGUF loading itself is tests/core/test_gguf.py.)"""

from __future__ import annotations

L, H, H_KV, D_MODEL, D_HEAD, VOCAB = 30, 9, 3, 576, 64, 49152


def test_dashboard_shows_the_quantization():
    from headgraph.frontend.callbacks.model import describe

    info = {"n_layers": L, "n_heads": H, "n_kv_heads": H_KV, "d_model": D_MODEL, "d_head": D_HEAD,
            "d_vocab": VOCAB, "dtype": "float32", "architecture": "llama"}
    assert "Q4_1" not in describe(info)
    assert describe({**info, "quantization": "Q4_1"}).endswith("llama · GGUF Q4_1")
