"""A runnable GGUF model, built lazily: the whole model dequantized by transformers on first use.

``core.models.gguf_file`` reads only the attention tensors, streaming, which is all PK, CS and
tokens need. Attention patterns and ablations need the model to run: ``LazyGGUFSource`` is a
PatternSource that, the first time anything asks it to run (or for its bridge), dequantizes
the whole file with transformers (``AutoModelForCausalLM.from_pretrained(folder,
gguf_file=name)``, float32, eager attention, never remote code) and wraps it in a
TransformerLens ``TransformerBridge.boot_transformers(..., hf_model=model, tokenizer=tok)``;
from then on it is a ``BridgePatternSource`` over that bridge. Loading the weights for PK
stays as cheap as before: nothing here runs until patterns or ablations are asked for.

transformers reads the GGUF from a private temporary folder holding only a link to the one
file (already checked against the model root by the loader), so it never reads any other
file that happens to sit next to it (a config.json, a generation config, a link elsewhere).
The file is parsed once for all of that (``core.models.gguf_reads``).
"""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path
from typing import Any

import torch

from headgraph.core.errors import UnsupportedModel
from headgraph.core.models.gguf_reads import shared_reads


def transformers_supports(architecture: str) -> bool:
    """True when transformers can dequantize and build a GGUF of this architecture."""
    try:
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
    except ImportError:  # pragma: no cover - transformers ships with TransformerLens
        return False
    return architecture in GGUF_SUPPORTED_ARCHITECTURES


def complete_config(config: Any, file: str | os.PathLike[str], *, shown: str) -> Any:
    """What transformers' GGUF config conversion leaves out, filled from the file itself:
    ``architectures`` (the causal-LM class of the config's model type: TransformerLens picks
    its adapter by it, so a Gemma-3 GGUF could not be wrapped) and ``head_dim`` from the file's
    ``{arch}.attention.key_length`` where the conversion kept the model type's default (a
    Qwen3 GGUF with 8-wide heads was built with 128-wide ones). Returns ``config``."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from headgraph.core.models.gguf_file import gguf_metadata

    if not getattr(config, "architectures", None):
        cls = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(getattr(config, "model_type", ""))
        if isinstance(cls, str):
            config.architectures = [cls]
    meta = gguf_metadata(Path(file), shown=shown)
    arch = meta.get("general.architecture")
    key_length = meta.get(f"{arch}.attention.key_length")
    if isinstance(key_length, int) and key_length > 0 and hasattr(config, "head_dim") \
            and config.head_dim != key_length:
        config.head_dim = key_length
    return config


def boot_gguf_bridge(file: str | os.PathLike[str], *, device: str | torch.device = "cpu",
                     tokenizer: Any | None = None, shown: str | None = None) -> Any:
    """The whole GGUF ``file`` dequantized by transformers (float32, eager attention) and
    wrapped in a TransformerBridge on ``device``. ``tokenizer``: one already built from the
    file (default: transformers builds it from the file). UnsupportedModel on failure,
    naming ``shown`` only (never the path)."""
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    shown = shown or Path(file).name
    real = os.path.realpath(file)
    try:
        with tempfile.TemporaryDirectory(prefix="headgraph-gguf-") as folder:
            link = Path(folder) / "model.gguf"
            link.symlink_to(real)
            config = AutoConfig.from_pretrained(folder, gguf_file=link.name, local_files_only=True,
                                                trust_remote_code=False)
            complete_config(config, file, shown=shown)
            model = AutoModelForCausalLM.from_pretrained(
                folder, gguf_file=link.name, config=config, dtype=torch.float32,
                local_files_only=True, attn_implementation="eager", trust_remote_code=False)
            if tokenizer is None:
                tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=link.name,
                                                          local_files_only=True,
                                                          trust_remote_code=False)
        model.eval().requires_grad_(False)
        bridge = TransformerBridge.boot_transformers(
            Path(file).stem, hf_model=model, tokenizer=tokenizer,
            device=device, dtype=torch.float32, trust_remote_code=False)
    except (OSError, ValueError, KeyError, RuntimeError, NotImplementedError, TypeError) as err:
        message = str(err).replace(real, shown).replace(str(file), shown).strip()
        first = (message.splitlines() or [""])[0][:120]
        raise UnsupportedModel(
            f"{shown}: this GGUF cannot be run here (transformers: {type(err).__name__}: {first}); "
            "PK, CS and tokens come from its weights, while attention patterns, path ablation and "
            "data-weighted PK need a runnable copy (its Hugging Face folder)") from None
    bridge.eval()
    return bridge


def check_fits_in_memory(file: Path, shown: str) -> None:
    """UnsupportedModel, before anything is dequantized, when the whole model in float32 would
    need over ~80% of the available memory (a 7B GGUF: ~27 GB): the process would be killed
    mid-way instead of saying why."""
    from headgraph.core.models.gguf_file import gguf_parameters
    from headgraph.core.models.streamed import available_memory

    need = 4 * gguf_parameters(file, shown=shown)
    free = available_memory()
    if need > 0.8 * free:
        raise UnsupportedModel(
            f"{shown}: this GGUF is too big to run here ({need / 2**30:.1f} GiB in float32, "
            f"{free / 2**30:.1f} GiB available); PK, CS and tokens come from its weights, while "
            "attention patterns, path ablation and data-weighted PK need it run (its Hugging "
            "Face safetensors folder runs a layer at a time)")


class LazyGGUFSource:
    """PatternSource of a GGUF model that boots its TransformerBridge on first use.

    ``layer_indices`` is known up front (from the streamed weights); everything else
    (``bridge``, ``tokenize``, ``attention_patterns``, ``token_pool``, ``d_vocab``, ``n_ctx``,
    ``bos_token_id``) loads the model once (thread-safe) and delegates to a
    ``core.models.runnable.BridgePatternSource`` over it. ``loaded`` says whether that happened.
    """

    def __init__(self, file: str | os.PathLike[str], *, layer_indices: tuple[int, ...],
                 device: str | torch.device = "cpu", tokenizer: Any | None = None,
                 shown: str | None = None) -> None:
        self.file = Path(file)
        self.layer_indices = tuple(layer_indices)
        self.device = device
        self._tokenizer = tokenizer
        self.shown = shown or self.file.name
        self._lock = threading.Lock()
        self._inner: Any | None = None

    @property
    def loaded(self) -> bool:
        return self._inner is not None

    def _source(self) -> Any:
        if self._inner is None:
            with self._lock:
                if self._inner is None:
                    from headgraph.core.models.runnable import BridgePatternSource

                    with shared_reads(self.file):  # one parse for headgraph and transformers
                        check_fits_in_memory(self.file, self.shown)
                        bridge = boot_gguf_bridge(self.file, device=self.device,
                                                  tokenizer=self._tokenizer, shown=self.shown)
                    inner = BridgePatternSource(bridge, tokenizer=self._tokenizer)
                    if inner.layer_indices != self.layer_indices:
                        raise UnsupportedModel(
                            f"{self.shown}: the runnable model has attention layers "
                            f"{list(inner.layer_indices)[:8]}..., the GGUF's weights "
                            f"{list(self.layer_indices)[:8]}...")
                    self._inner = inner
        return self._inner

    @property
    def bridge(self) -> Any:
        """The TransformerBridge (booted on first access)."""
        return self._source().bridge

    @property
    def d_vocab(self) -> int:
        return int(self._source().d_vocab)

    @property
    def n_ctx(self) -> int | None:
        return self._source().n_ctx

    @property
    def bos_token_id(self) -> int | None:
        return self._source().bos_token_id

    def tokenize(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        return self._source().tokenize(texts)

    def to_tokens(self, texts: list[str]) -> torch.Tensor:
        return self._source().to_tokens(texts)

    def token_pool(self) -> torch.Tensor:
        return self._source().token_pool()

    def attention_patterns(self, tokens: torch.Tensor,
                           attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self._source().attention_patterns(tokens, attention_mask=attention_mask)


__all__ = ["LazyGGUFSource", "boot_gguf_bridge", "complete_config", "transformers_supports"]
