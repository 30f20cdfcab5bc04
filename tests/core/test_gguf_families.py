"""A GGUF of every llama.cpp family whose attention headgraph reads runs: tiny random GGUFs
(llama; qwen2 with q/k/v biases; qwen3 and gemma3 with q/k norms; gemma2 and gemma3 with
post-norms) written as llama.cpp names their tensors. transformers' GGUF config conversion
leaves out what TransformerLens needs (the causal-LM class: a Gemma-3 GGUF was refused "Could
not determine supported architecture") and the file's head width (a Qwen3 GGUF was built with
128-wide heads): headgraph fills both from the file, and the runnable model's per-head
weights equal those PK read from the file by headgraph's own reader."""

from __future__ import annotations

import pytest
import torch

from headgraph.core.models.loading import load_model

from model_support import write_tiny_gguf

FAMILIES = ("llama", "qwen2", "qwen3", "gemma2", "gemma3")


@pytest.mark.parametrize("arch", FAMILIES)
def test_a_gguf_of_each_family_runs_with_the_weights_pk_reads(arch, tmp_path):
    path = write_tiny_gguf(tmp_path / f"{arch}.gguf", arch, seed=7)
    lm = load_model(str(path), device="cpu")
    assert lm.info.architecture == arch and lm.patterns is not None
    ids, mask = lm.patterns.tokenize(["When Mary and John went to the store, John gave"])
    pats = lm.patterns.attention_patterns(ids, mask)
    assert pats.shape[:3] == (2, 1, 4) and pats.shape[-1] == pats.shape[-2] == ids.shape[-1]
    assert torch.allclose(pats.sum(-1), torch.ones(()), atol=1e-5)  # each query row a distribution
    blocks = list(lm.patterns.bridge.blocks_with("attn"))
    for name in ("W_Q", "W_K", "W_V", "W_O"):
        ran = torch.stack([getattr(b.attn, name).detach() for _, b in blocks])
        read = getattr(lm.heads, name)
        assert ran.shape == read.shape, (name, ran.shape, read.shape)
        assert torch.allclose(ran, read.to(ran.dtype), atol=1e-6), name


def test_loading_and_running_a_gguf_parses_it_once_per_scope(tmp_path, monkeypatch):
    """GGUFReader parses every metadata field when built (seconds for a real vocabulary):
    loading a GGUF builds one reader for the weights and tokenizer, booting its runnable model
    one for headgraph's and transformers' reads (config, weights, tokenizer), where unshared
    they were six. gguf's own names are restored after each scope, and the model is the same."""
    import gguf

    from headgraph.core.models import gguf_reads

    path = write_tiny_gguf(tmp_path / "llama.gguf", "llama", seed=3)
    original = gguf.GGUFReader
    built: list[str] = []

    class Counting(original):  # every parse, whoever asks for it, goes through __init__
        def __init__(self, *args, **kwargs):
            built.append(str(args[0]))
            super().__init__(*args, **kwargs)

    # NamingReader derives from the class gguf has at its first use: count that one's parses.
    gguf_reads._classes.cache_clear()
    monkeypatch.setattr(gguf, "GGUFReader", Counting)
    try:
        lm = load_model(str(path), device="cpu")
        after_load = len(built)
        blocks = list(lm.patterns.bridge.blocks_with("attn"))  # boots: transformers reads it
        assert (after_load, len(built)) == (1, 2), built
        assert gguf.GGUFReader is Counting and gguf.get_tensor_name_map is gguf_reads._classes()[1]
        ran = torch.stack([b.attn.W_Q.detach() for _, b in blocks])
        assert torch.allclose(ran, lm.heads.W_Q.to(ran.dtype), atol=1e-6)
        # Outside every scope nothing is shared: each read is its own parse.
        gguf_reads.parse(path), gguf_reads.parse(path)
        assert len(built) == 4
    finally:
        gguf_reads._classes.cache_clear()
