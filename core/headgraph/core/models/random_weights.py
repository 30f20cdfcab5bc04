"""Random-weight models: named presets and ``random:<preset|config>[@seed]`` specs.

A random model is built from a transformers config with ``AutoModelForCausalLM.from_config``
under a fixed seed (default 0), so the same spec always gives the same weights (and the same
fingerprint); a config in our demo format builds a seeded ``DemoModel`` instead. Booting the
result as a TransformerBridge is ``core.models.loading``'s job.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch

from headgraph.core.errors import HeadgraphError, UnsupportedModel

RANDOM_PREFIX = "random:"
# Random-weight presets: (transformers model_type, causal-LM class, config kwargs).
RANDOM_PRESETS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "gpt2-small": ("gpt2", "GPT2LMHeadModel",
                   dict(n_layer=12, n_head=12, n_embd=768, n_positions=1024, vocab_size=50257)),
    "gpt2-tiny": ("gpt2", "GPT2LMHeadModel",
                  dict(n_layer=2, n_head=4, n_embd=64, n_positions=128, vocab_size=512,
                       bos_token_id=256, eos_token_id=256)),
    "qwen2-0.5b": ("qwen2", "Qwen2ForCausalLM",
                   dict(num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                        hidden_size=896, intermediate_size=4864, vocab_size=151936,
                        max_position_embeddings=32768, tie_word_embeddings=True,
                        rms_norm_eps=1e-6)),
    "qwen2-tiny": ("qwen2", "Qwen2ForCausalLM",
                   dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        hidden_size=64, intermediate_size=128, vocab_size=512,
                        max_position_embeddings=128, tie_word_embeddings=True)),
    "bloom-560m": ("bloom", "BloomForCausalLM",
                   dict(n_layer=24, n_head=16, hidden_size=1024, vocab_size=250880)),
    "bloom-tiny": ("bloom", "BloomForCausalLM",
                   dict(n_layer=2, n_head=4, hidden_size=64, vocab_size=512)),
    "llama-tiny": ("llama", "LlamaForCausalLM",
                   dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        hidden_size=64, intermediate_size=128, vocab_size=512,
                        max_position_embeddings=128)),
}


def parse_random_spec(spec: str) -> tuple[str, int]:
    """``random:<body>[@seed]`` -> (body, seed); body is a preset name or a config path."""
    body = spec[len(RANDOM_PREFIX):].strip()
    seed = 0
    m = re.fullmatch(r"(.+)@(\d+)", body)
    if m:
        body, seed = m.group(1), int(m.group(2))
    if not body:
        raise HeadgraphError(f"{spec!r}: give a preset ({', '.join(RANDOM_PRESETS)}) or a "
                             "config.json path after 'random:'")
    return body, seed


def preset_config(preset: str) -> Any:
    """The transformers config of a ``RANDOM_PRESETS`` entry, its ``architectures`` set."""
    from transformers import AutoConfig

    model_type, arch, kw = RANDOM_PRESETS[preset]
    config = AutoConfig.for_model(model_type, **kw)
    config.architectures = [arch]
    return config


def read_config_json(path: Path, *, spec: str, body: str) -> tuple[Path, dict[str, Any]]:
    """The config.json at ``path`` (a file, or a folder holding one) and its parsed content."""
    cfg_file = path / "config.json" if path.is_dir() else path
    if not cfg_file.is_file():
        raise HeadgraphError(f"{spec!r}: {body!r} is neither a preset "
                             f"({', '.join(RANDOM_PRESETS)}) nor a config.json file")
    try:
        raw = json.loads(cfg_file.read_text())
    except ValueError as err:
        raise HeadgraphError(f"{cfg_file}: not valid JSON ({err})") from err
    return cfg_file, raw


def is_demo_config(raw: dict[str, Any]) -> bool:
    """True when a parsed config.json is in our demo-model format."""
    from headgraph.core.models.demo import ARCHITECTURE

    return raw.get("architecture") == ARCHITECTURE


def random_demo_model(raw: dict[str, Any], *, seed: int, device: str) -> Any:
    """A seeded, frozen ``DemoModel`` on ``device`` from a demo-format config dict."""
    from headgraph.core.models.demo import DemoConfig, DemoModel

    model = DemoModel(DemoConfig.from_dict(raw), seed=seed).eval().requires_grad_(False)
    return model.to(device)


def hf_config(cfg_file: Path) -> Any:
    """A transformers config from a config.json file (remote code off); it must name its
    ``architectures`` so a causal-LM class can be chosen."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(cfg_file), trust_remote_code=False)
    except (OSError, ValueError, KeyError) as err:
        raise UnsupportedModel(f"{cfg_file}: not a transformers config ({err})") from err
    if not getattr(config, "architectures", None):
        raise UnsupportedModel(f"{cfg_file}: config names no 'architectures'")
    return config


def random_causal_lm(config: Any, *, seed: int, name: str, device: str,
                     dtype: torch.dtype) -> Any:
    """``AutoModelForCausalLM.from_config(config)`` seeded with ``seed`` (global RNG untouched),
    in eval mode on ``device`` as ``dtype``."""
    from transformers import AutoModelForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            hf_model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
        except Exception as err:  # whatever a model class raises on an odd config
            raise UnsupportedModel(f"{name}: cannot build a causal LM from this config "
                                   f"({type(err).__name__}: {' '.join(str(err).split())[:200]})"
                                   ) from err
    return hf_model.to(device=device, dtype=dtype).eval()
