"""Shared test fixtures: small random models saved as local Hugging Face folders (no download)."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from pathlib import Path
from typing import Any

import pytest
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


def boot_bridge(folder: Path) -> Any:
    """A TransformerBridge of a local folder on the CPU, in eval mode."""
    from transformer_lens.model_bridge import TransformerBridge

    bridge = TransformerBridge.boot_transformers(str(folder), device="cpu")
    bridge.eval()
    return bridge


def _gpt2(folder: Path, layers: int, heads: int, width: int, seed: int) -> Path:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=layers, n_head=heads, n_embd=width, n_positions=64)
    return save_random_model(folder, cfg, GPT2LMHeadModel, seed)


@pytest.fixture(scope="session")
def gpt2_small_random_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """GPT-2-small-shaped random model (12 layers x 12 heads x d_model 768), tiny vocabulary."""
    return _gpt2(tmp_path_factory.mktemp("gpt2_small_random"), 12, 12, 768, seed=0)


@pytest.fixture(scope="session")
def gpt2_tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny random GPT-2 (2 layers x 4 heads x d_model 64)."""
    return _gpt2(tmp_path_factory.mktemp("gpt2_tiny"), 2, 4, 64, seed=1)


@pytest.fixture(scope="session")
def gpt2_cs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Small random GPT-2 (4 layers x 4 heads x d_model 128) for Composition Score checks."""
    return _gpt2(tmp_path_factory.mktemp("gpt2_cs"), 4, 4, 128, seed=2)


@pytest.fixture(scope="session")
def qwen2_gqa_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Qwen2-shaped random grouped-query model: 3 layers, 4 query heads, 2 KV heads, d_model 64."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                      hidden_size=64, intermediate_size=128, max_position_embeddings=64)
    return save_random_model(tmp_path_factory.mktemp("qwen2_gqa"), cfg, Qwen2ForCausalLM, seed=3)


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


@pytest.fixture
def make_heads() -> Any:
    """Factory: ``make_heads(W_Q, W_K, W_V, W_O, layer_indices=None) -> HeadWeights``."""
    return heads_from_tensors


@pytest.fixture(scope="module")
def browser() -> Any:
    """Debian's chromium through playwright, one per test module (tests/browser.py's flags)."""
    from playwright.sync_api import sync_playwright

    from browser import launch_browser

    with sync_playwright() as p:
        b = launch_browser(p)
        yield b
        b.close()
