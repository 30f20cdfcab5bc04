"""What kind of transformer a config describes, and the configs headgraph refuses by name.

headgraph analyses decoder-only causal LMs. Encoder-decoder models (T5, BART, ...) and
encoder-only ones (BERT, RoBERTa, ...) built "as a causal LM" are refused with their kind;
so are configs TransformerLens is known to wrap wrongly, with the cause rather than the
error their wrapping raises.
"""

from __future__ import annotations

from typing import Any

DECODER_ONLY = "decoder-only causal LMs"


def model_kind(config: dict[str, Any]) -> str:
    """"encoder-decoder", "encoder-only" or "decoder-only" for a config (as a dict): its
    ``is_encoder_decoder`` flag, or whether transformers maps its model type to a
    sequence-to-sequence or a masked-LM head (the encoder families)."""
    from transformers.models.auto import modeling_auto as auto

    model_type = str(config.get("model_type") or "")
    if config.get("is_encoder_decoder") or model_type in auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES:
        return "encoder-decoder"
    if model_type in auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return "encoder-only"
    return "decoder-only"


def kind_refusal(config: dict[str, Any]) -> str | None:
    """"bert is an encoder-only model; headgraph analyses decoder-only causal LMs", or None
    for a decoder-only config."""
    kind = model_kind(config)
    if kind == "decoder-only":
        return None
    return f"{config.get('model_type') or 'this model'} is an {kind} model; headgraph analyses {DECODER_ONLY}"


def wrapping_refusal(config: dict[str, Any]) -> str | None:
    """The cause, for configs TransformerLens's adapters are known not to wrap: GPT-BigCode
    with separate K/V heads (``multi_query=False``) and Falcon's new decoder architecture
    with more than one KV head (its fused QKV weight is split as if it had one)."""
    model_type = config.get("model_type")
    if model_type == "gpt_bigcode" and not config.get("multi_query", True):
        return ("gpt_bigcode with multi_query=False (one K/V per head): TransformerLens's "
                "GPT-BigCode adapter splits the fused QKV weight for multi-query models only")
    if model_type == "falcon" and config.get("new_decoder_architecture"):
        n_kv = config.get("num_kv_heads")
        if n_kv is not None and int(n_kv) != 1:
            return (f"falcon's new decoder architecture with {n_kv} KV heads: TransformerLens "
                    "splits its fused, per-group QKV weight as if there were one KV head")
    return None


def config_refusal(config: dict[str, Any]) -> str | None:
    """Why headgraph refuses a config at load (kind or a known wrapping defect), or None."""
    return kind_refusal(config) or wrapping_refusal(config)


__all__ = ["DECODER_ONLY", "config_refusal", "kind_refusal", "model_kind", "wrapping_refusal"]
