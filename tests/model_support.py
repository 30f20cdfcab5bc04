"""Small random models for the tests, built here (no download): a byte-level BPE tokenizer, a
randomly initialized Hugging Face model saved as a local folder, a TransformerBridge of such a
folder, and HeadWeights straight from tensors. conftest.py's fixtures use them; tests import
them (``from model_support import boot_bridge``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def byte_bpe_tokenizer() -> Any:
    """A tiny byte-level BPE tokenizer trained on a few words (PreTrainedTokenizerFast)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    text = ["The quick brown fox jumps over the lazy dog.", "When Mary and John went to the store,"]
    tok.train_from_iterator(text * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>",
                                   eos_token="<|endoftext|>", unk_token="<|endoftext|>")


def save_random_model(folder: Path, config: Any, model_cls: Any, seed: int = 0) -> Path:
    """Randomly initialized ``model_cls(config)`` + tokenizer saved to ``folder`` (returned)."""
    tokenizer = byte_bpe_tokenizer()
    config.vocab_size = len(tokenizer)
    config.bos_token_id = config.eos_token_id = tokenizer.bos_token_id
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def save_gemma3_random_norms(folder: Path, seed: int = 0) -> Path:
    """A tiny Gemma-3-shaped checkpoint (3 layers, 4 query / 2 KV heads, d_model 64: RMSNorm
    gains applied as 1 + w, a post-attention norm) whose norm weights are random (random init
    leaves them 0, so folding them in would change nothing), saved to ``folder``."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    cfg = Gemma3TextConfig(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                           head_dim=16, hidden_size=64, intermediate_size=128,
                           max_position_embeddings=128, sliding_window=16)
    save_random_model(folder, cfg, Gemma3ForCausalLM, seed=seed)
    model = Gemma3ForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layernorm" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.8)
    model.save_pretrained(folder)
    return folder


def boot_bridge(folder: Path) -> Any:
    """A TransformerBridge of a local folder on the CPU, in eval mode."""
    from transformer_lens.model_bridge import TransformerBridge

    bridge = TransformerBridge.boot_transformers(str(folder), device="cpu")
    bridge.eval()
    return bridge


def heads_from_tensors(W_Q: torch.Tensor, W_K: torch.Tensor, W_V: torch.Tensor, W_O: torch.Tensor,
                       layer_indices: tuple[int, ...] | None = None) -> Any:
    """HeadWeights straight from stacked tensors (W_Q [L,H,d,dh], W_K/W_V [L,Hkv,d,dh], W_O [L,H,dh,d])."""
    from headgraph.core.models.fingerprint import weights_fingerprint
    from headgraph.core.types import HeadWeights, ModelInfo

    L, H, d, dh = W_Q.shape
    layers = tuple(range(L)) if layer_indices is None else tuple(layer_indices)
    info = ModelInfo(name="random", architecture="random", n_layers=L, n_heads=H,
                     n_kv_heads=W_K.shape[1], d_model=d, d_head=dh, d_vocab=None,
                     dtype=str(W_Q.dtype).replace("torch.", ""), layer_indices=layers,
                     processing="raw", source="config")
    fp = weights_fingerprint([W_Q, W_K, W_V, W_O], processing="raw")
    return HeadWeights(info=info, W_Q=W_Q, W_K=W_K, W_V=W_V, W_O=W_O, W_U=None, fingerprint=fp)


def _add_gguf_tokenizer(w: Any) -> int:
    """The tests' byte-level BPE tokenizer (``byte_bpe_tokenizer``, 300 tokens) as a GGUF
    "gpt2" tokenizer in writer ``w``; its vocabulary size."""
    import json

    tok = byte_bpe_tokenizer()
    model = json.loads(tok.backend_tokenizer.to_str())["model"]
    tokens = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([1] * len(tokens))
    w.add_token_merges(merges)
    w.add_bos_token_id(tok.bos_token_id)
    w.add_eos_token_id(tok.eos_token_id)
    return len(tokens)


def write_tiny_gguf(path: Path, arch: str, *, layers: int = 2, heads: int = 4,
                    kv_heads: int = 2, width: int = 32, ff: int = 64, seed: int = 0) -> Path:
    """A tiny random float32 GGUF of llama.cpp architecture ``arch`` (llama; qwen2 with q/k/v
    biases; qwen3 and gemma3 with q/k norms; gemma2 and gemma3 with post-norms), written
    tensor by tensor as llama.cpp names them, with the tests' byte-level BPE tokenizer."""
    import gguf
    import numpy as np

    g = torch.Generator().manual_seed(seed)
    w = gguf.GGUFWriter(str(path), arch)
    vocab = _add_gguf_tokenizer(w)
    d_head = width // heads
    w.add_block_count(layers)
    w.add_context_length(128)
    w.add_embedding_length(width)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(vocab)
    w.add_key_length(d_head)
    w.add_value_length(d_head)

    def rand(name: str, *shape: int) -> None:
        w.add_tensor(name, (torch.randn(*shape, generator=g) * 0.2).numpy().astype(np.float32))

    def ones(name: str, n: int) -> None:
        w.add_tensor(name, np.ones(n, np.float32))

    rand("token_embd.weight", vocab, width)
    for i in range(layers):
        ones(f"blk.{i}.attn_norm.weight", width)
        rand(f"blk.{i}.attn_q.weight", heads * d_head, width)
        rand(f"blk.{i}.attn_k.weight", kv_heads * d_head, width)
        rand(f"blk.{i}.attn_v.weight", kv_heads * d_head, width)
        rand(f"blk.{i}.attn_output.weight", width, heads * d_head)
        if arch == "qwen2":
            rand(f"blk.{i}.attn_q.bias", heads * d_head)
            rand(f"blk.{i}.attn_k.bias", kv_heads * d_head)
            rand(f"blk.{i}.attn_v.bias", kv_heads * d_head)
        if arch in ("qwen3", "gemma3"):
            ones(f"blk.{i}.attn_q_norm.weight", d_head)
            ones(f"blk.{i}.attn_k_norm.weight", d_head)
        if arch in ("gemma2", "gemma3"):
            ones(f"blk.{i}.post_attention_norm.weight", width)
            ones(f"blk.{i}.post_ffw_norm.weight", width)
        ones(f"blk.{i}.ffn_norm.weight", width)
        rand(f"blk.{i}.ffn_gate.weight", ff, width)
        rand(f"blk.{i}.ffn_up.weight", ff, width)
        rand(f"blk.{i}.ffn_down.weight", width, ff)
    ones("output_norm.weight", width)
    rand("output.weight", vocab, width)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
