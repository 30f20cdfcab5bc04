"""A checkpoint too big for memory, run a block at a time from its safetensors.

``StreamedPatternSource`` builds the transformers model of a local folder on the meta device
(accelerate's ``init_empty_weights``: parameters without storage, buffers such as rotary
frequencies computed from the config; never remote code; eager attention) and gives every block of it
(each decoder layer, the embedding, the final norm) a pair of forward hooks: before the block
runs, its parameters are read from the folder's safetensors (``safe_open``, one tensor at a
time) in the compute dtype; after, they go back to the meta device. So a forward pass holds
one decoder layer (a 7B model's: ~0.8 GB in float32) and the activations, never the model,
and the model's own forward code runs unchanged: any architecture transformers builds from
its config works, with its own attention masks and rotary embeddings. The price is reading
every block's weights from disk once per forward pass, which is why the pattern scores batch
their prompts into one pass. Attention patterns come from the decoder's ``output_attentions``.

Data-weighted PK and ablations patch activations through a TransformerLens bridge, which
needs the whole model: a streamed source has no ``bridge`` and those say so.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import torch

from headgraph.core.errors import UnsupportedModel
from headgraph.core.models.runnable import TokenizedSource
from headgraph.core.models.streamed import safetensors_files


def _tensor_files(folder: Path) -> dict[str, Path]:
    """Checkpoint tensor name -> the shard holding it."""
    from safetensors import safe_open

    where: dict[str, Path] = {}
    for f in safetensors_files(folder):
        with safe_open(str(f), framework="pt", device="cpu") as fh:
            for key in fh.keys():  # noqa: SIM118 - safe_open is not a mapping
                where.setdefault(key, f)
    return where


def _blocks(base: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The units loaded together: each element of the decoder's module lists (its layers) and
    each other direct child holding parameters (embedding, final norm); names relative to base."""
    out: list[tuple[str, torch.nn.Module]] = []
    for name, child in base.named_children():
        if isinstance(child, torch.nn.ModuleList):
            out.extend((f"{name}.{i}", m) for i, m in enumerate(child))
        elif any(True for _ in child.parameters()):
            out.append((name, child))
    return out


class _BlockLoader:
    """Forward hooks that read a block's parameters before it runs and drop them after."""

    def __init__(self, files: dict[str, Path], prefixes: tuple[str, ...], dtype: torch.dtype,
                 device: torch.device) -> None:
        self.files, self.prefixes, self.dtype, self.device = files, prefixes, dtype, device

    def key(self, name: str) -> str:
        """The checkpoint's name of a parameter (with or without the base model's prefix)."""
        for prefix in self.prefixes:
            if prefix + name in self.files:
                return prefix + name
        raise UnsupportedModel(f"parameter {name!r} is not in the checkpoint's safetensors "
                               "(renamed by this architecture's loader): it cannot be streamed")

    def load(self, prefix: str, module: torch.nn.Module) -> None:
        from safetensors import safe_open

        for name, param in list(module.named_parameters()):
            key = self.key(prefix + name)
            with safe_open(str(self.files[key]), framework="pt", device="cpu") as fh:
                value = fh.get_tensor(key).to(self.device, self.dtype)
            if tuple(value.shape) != tuple(param.shape):
                raise UnsupportedModel(f"{key}: shape {tuple(value.shape)} in the checkpoint, "
                                       f"{tuple(param.shape)} in the model its config builds")
            owner, _, leaf = name.rpartition(".")
            target = module.get_submodule(owner) if owner else module
            setattr(target, leaf, torch.nn.Parameter(value, requires_grad=False))

    @staticmethod
    def drop(module: torch.nn.Module) -> None:
        module.to("meta")

    def attach(self, prefix: str, module: torch.nn.Module) -> None:
        module.register_forward_pre_hook(lambda m, args: self.load(prefix, m))
        module.register_forward_hook(lambda m, args, out: self.drop(m))


class StreamedPatternSource(TokenizedSource):
    """PatternSource over a local safetensors checkpoint run a block at a time (see the module
    docstring). ``tokenizer``: the folder's own; ``layer_indices``: the attention layers the
    weights were read for (patterns come back in that order)."""

    def __init__(self, folder: str | Path, tokenizer: Any, *, layer_indices: tuple[int, ...],
                 device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> None:
        from transformers import AutoConfig

        self.folder = Path(folder)
        config = AutoConfig.from_pretrained(str(self.folder), trust_remote_code=False)
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        self._config = config
        self.device = torch.device(device)
        self.dtype = dtype
        self.layer_indices = tuple(layer_indices)
        self._lock = threading.Lock()
        self._base: torch.nn.Module | None = None
        n_ctx = getattr(text, "max_position_embeddings", None)
        super().__init__(tokenizer, d_vocab=int(text.vocab_size), n_ctx=int(n_ctx) if n_ctx else None,
                         device=self.device)

    def _model(self) -> torch.nn.Module:
        """The decoder on the meta device with its loading hooks (built on first use)."""
        with self._lock:
            base = self._base
            if base is None:
                base = self._base = self._build()
            return base

    def _build(self) -> torch.nn.Module:
        from accelerate import init_empty_weights
        from transformers import AutoModelForCausalLM

        with init_empty_weights(include_buffers=False):  # parameters only on meta
            model = AutoModelForCausalLM.from_config(
                self._config, attn_implementation="eager", trust_remote_code=False)
        base = model.base_model
        files = _tensor_files(self.folder)
        # checkpoint names relative to the CausalLM, or to its base model
        prefix = next((n + "." for n, m in model.named_children() if m is base), "")
        loader = _BlockLoader(files, (prefix, ""), self.dtype, self.device)
        for name, module in _blocks(base):  # every parameter must be readable before a run
            for pname, _ in module.named_parameters():
                loader.key(f"{name}.{pname}")
            loader.attach(f"{name}.", module)
        # buffers built by the config (rotary frequencies) are computed, not stored
        for mod in base.modules():
            for bname, buf in list(mod.named_buffers(recurse=False)):
                if buf.is_meta:
                    raise UnsupportedModel(f"buffer {bname!r} of the streamed model has no value "
                                           "(not computed from the config)")
        return base.eval()

    @torch.no_grad()
    def attention_patterns(self, tokens: torch.Tensor,
                           attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Attention probabilities [L, batch, H, q, k] of the weights' layers, one pass."""
        base = self._model()
        kwargs: dict[str, Any] = {"output_attentions": True, "use_cache": False}
        if attention_mask is not None:
            kwargs["attention_mask"] = attention_mask.to(self.device).long()
        out = base(input_ids=tokens.to(self.device), **kwargs)
        atts = out.attentions
        if not atts or any(a is None for a in atts):
            raise UnsupportedModel("the streamed model did not report attention patterns")
        try:
            return torch.stack([atts[i] for i in self.layer_indices]).float()
        except IndexError as err:
            raise UnsupportedModel(f"the streamed model reported {len(atts)} attention layers, "
                                   f"the weights name layers {list(self.layer_indices)}") from err


def streamed_source(folder: Path, tokenizer: Any, layer_indices: tuple[int, ...], *,
                    device: str | torch.device = "cpu") -> StreamedPatternSource | None:
    """A streamed pattern source for ``folder``, or None when it cannot have one (no tokenizer,
    or a config transformers does not know)."""
    if tokenizer is None:
        return None
    try:
        return StreamedPatternSource(folder, tokenizer, layer_indices=layer_indices, device=device)
    except (OSError, ValueError, KeyError):  # an architecture transformers cannot build
        return None


__all__ = ["StreamedPatternSource", "streamed_source"]
