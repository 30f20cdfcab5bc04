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
