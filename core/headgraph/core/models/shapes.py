"""Checks of a model file's declared shapes, before anything is allocated or divided by them.

A ``config.json`` or a GGUF file's metadata declares layers, heads, widths; a malformed or
hostile file (``n_head: 0``, ``n_embd: [64]``, a head count of 1000 with tensors of another
size) must be refused with a message naming the file and the field, not crash a division or
ask for 80 GB. Limits are far above any real model (Llama-3-405B: 126 layers, 128 heads,
d_model 16384).

>>> check_config_shapes({"n_layer": 2, "n_head": 4, "n_embd": 64}, shown="config.json")
>>> check_config_shapes({"n_layer": 2, "n_head": 0, "n_embd": 64}, shown="config.json")
Traceback (most recent call last):
...
headgraph.core.errors.InvalidInput: config.json: n_head must be an integer in 1..1024, got 0
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from headgraph.core.errors import InvalidInput

# What each shape is called across Hugging Face configs, and its upper bound.
CONFIG_FIELDS: dict[str, tuple[tuple[str, ...], int]] = {
    "layers": (("num_hidden_layers", "n_layer", "n_layers", "num_layers"), 1024),
    "heads": (("num_attention_heads", "n_head", "n_heads"), 1024),
    "kv_heads": (("num_key_value_heads", "n_kv_heads", "multi_query_group_num"), 1024),
    "d_model": (("hidden_size", "n_embd", "d_model"), 65536),
    "d_head": (("head_dim", "kv_channels"), 8192),
    "vocab": (("vocab_size",), 4_000_000),
}


def bounded_int(value: Any, *, field: str, hi: int, shown: str) -> int:
    """``value`` as an int in 1..hi; InvalidInput naming ``shown`` and ``field`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= hi:
        got = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise InvalidInput(f"{shown}: {field} must be an integer in 1..{hi}, got {got}")
    return value


def check_config_shapes(cfg: Mapping[str, Any], *, shown: str) -> None:
    """Refuse a config whose layer / head / width fields are not positive integers within
    bounds, whose query heads are not a multiple of its KV heads, or whose width does not split
    into heads when no head width is given. Checks a nested ``text_config`` too."""
    if not isinstance(cfg, Mapping):
        raise InvalidInput(f"{shown}: not a JSON object")
    found: dict[str, int] = {}
    for kind, (names, hi) in CONFIG_FIELDS.items():
        for name in names:
            if name in cfg and cfg[name] is not None:
                found[kind] = bounded_int(cfg[name], field=name, hi=hi, shown=shown)
                break
    heads, kv = found.get("heads"), found.get("kv_heads")
    if heads is not None and kv is not None and heads % kv:
        raise InvalidInput(f"{shown}: {heads} attention heads are not a multiple of {kv} "
                           "key/value heads")
    d_model = found.get("d_model")
    if heads is not None and d_model is not None and "d_head" not in found and d_model % heads:
        raise InvalidInput(f"{shown}: width {d_model} does not split into {heads} heads "
                           "(and no head_dim is given)")
    text = cfg.get("text_config")
    if isinstance(text, Mapping):
        check_config_shapes(text, shown=f"{shown} (text_config)")


def check_tensor_size(name: str, n_elements: int, expected: int, *, shown: str,
                      declared: str) -> None:
    """Refuse a tensor whose size disagrees with the shapes the metadata declares."""
    if n_elements != expected:
        raise InvalidInput(f"{shown}: tensor {name} holds {n_elements} values, but the declared "
                           f"{declared} need {expected}")
