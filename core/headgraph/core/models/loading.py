"""Load a model's per-head attention weights (and a runnable pattern source) from a spec.

Spec forms:

- ``"demo"``: the built-in trained demo model (core/data/demo), always offline, no TL needed;
- ``"demo@step-<step>"``: a checkpoint of the bundled demo series (core.models.series);
- a ``.gguf`` file, or a folder holding one and no config.json: llama.cpp weights, attention
  tensors dequantized one at a time (``core.models.gguf_file``; processing "raw"); runnable through a
  pattern source that dequantizes the whole model on first use (``core.models.gguf_runnable``);
- a local folder: a Hugging Face checkpoint (booted with ``TransformerBridge.boot_transformers``)
  or a folder holding a demo-format config (our own loader);
- a hub name (``gpt2``, ``Qwen/Qwen2-0.5B-Instruct``, ...): booted from the local HF cache
  when the whole snapshot is there, else downloaded; offline or unreachable hub ->
  ``ModelUnavailable`` with instructions, never a raw traceback;
- ``random:<preset>[@seed]`` or ``random:<path to config.json or folder>[@seed]``: random
  weights built from a transformers config with ``from_config`` (seeded, default seed 0) and
  handed to ``boot_transformers(hf_model=...)`` with a small offline byte-level tokenizer.

Processing: "bridge" = the bridge's default weights, exactly what TL's own PK reads (for HF
models these are the raw checkpoint weights); "raw" = the same for HF models; "processed" =
LayerNorm folded and writing weights centred (``bridge.enable_compatibility_mode()``).
Checkpoints too big for memory are read tensor by tensor from their safetensors instead
(``load_heads_safetensors``; attention weights only, processing "raw", no pattern source).

This module resolves specs and boots bridges; the pieces live next to it: ``core.models.hub``
(offline switches, HF cache lookup, ModelUnavailable messages), ``core.models.model_root``
(specs confined to the model root, messages without server paths), ``core.models.streamed`` (the
safetensors reader), ``core.models.random_weights`` (presets, seeded random models) and
``core.models.tokenizer`` (the offline byte-level tokenizer).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from headgraph.core.errors import HeadgraphError, InvalidInput, UnsupportedModel
from headgraph.core.models.gguf_file import (
    GGUF_SUFFIX,
    find_gguf,
    gguf_norm_gains,
    is_gguf_spec,
    load_heads_gguf,
)
from headgraph.core.models.gguf_reads import shared_reads
from headgraph.core.models.gguf_runnable import LazyGGUFSource, transformers_supports
from headgraph.core.models.hub import (
    cached_snapshot,
    check_hub_name,
    fetch_failed,
    hub_unavailable,
    is_network_error,
)
from headgraph.core.models.norm_fold import (
    bridge_norm_gains,
    check_subspaces,
    demo_norm_gains,
    fold_norm_gains,
)
from headgraph.core.models.model_kind import config_refusal, model_kind, wrapping_refusal
from headgraph.core.models.model_root import check_model_folder, check_root, quoted, scrubbed
from headgraph.core.models.random_weights import (
    RANDOM_PREFIX,
    RANDOM_PRESETS,
    hf_config,
    is_demo_config,
    parse_random_spec,
    preset_config,
    random_causal_lm,
    random_demo_model,
    read_config_json,
)
from headgraph.core.models.shapes import check_config_shapes
from headgraph.core.models.series import demo_checkpoint, is_demo_checkpoint_spec
from headgraph.core.models.fingerprint import model_fingerprint, with_tokenizer
from headgraph.core.models.streamed_runnable import streamed_source
from headgraph.core.models.streamed import (
    load_heads_safetensors,
    safetensors_files,
    too_big_for_memory,
)
from headgraph.core.models.tokenizer import byte_level_tokenizer, has_tokenizer
from headgraph.core.models.whole_model import runnable_digest
from headgraph.core.types import PROCESSINGS, HeadWeights, ModelInfo, PatternSource

__all__ = ["LoadedModel", "load_heads", "load_model", "norm_aware"]


@dataclass
class LoadedModel:
    """Head weights plus what runs the model: pattern source (streamed: a block at a time), tokenizer."""

    heads: HeadWeights
    patterns: PatternSource | None
    tokenizer: Any | None
    info: ModelInfo
    bridge: Any | None = None  # the TransformerBridge, when one was booted
    gguf: Path | None = None  # the GGUF file the weights were read from
    folder: Path | None = None  # the streamed checkpoint's folder, read a tensor at a time
    content_digest: str | None = None  # core.models.fingerprint.runnable_digest, on first use

    @property
    def model_fingerprint(self) -> str:
        """The model fingerprint (core.models.fingerprint): the weights fingerprint joined
        with everything else that runs the model (parameters, buffers, config, files,
        tokenizer). Activation-level results are keyed by it; computed once, on first use."""
        if self.content_digest is None:
            self.content_digest = runnable_digest(self)
        return model_fingerprint(self.heads.fingerprint, self.content_digest)


# -- public entry points ------------------------------------------------------------------

def load_model(
    spec: str,
    *,
    device: str | None = None,
    processing: str = "bridge",
    dtype: torch.dtype | str | None = None,
    model_root: str | None = None,
    streaming: bool | None = None,
    name: str | None = None,
    subspaces: str = "raw",
) -> LoadedModel:
    """Load ``spec`` (see module docstring) into HeadWeights and a PatternSource.

    device: where weights live (default: cuda when available, else cpu); dtype: bridge load
    dtype (default float32); model_root: local paths must resolve inside it, and so must every
    file of the folder and every ``weight_map`` entry of its index, links followed
    (PathNotAllowed; ``~`` is then never expanded); streaming: None = read safetensors tensor
    by tensor only if the model would not fit in memory, True = always (folder with
    safetensors; processing "raw"), False = never; name: what ModelInfo.name and messages call
    a local folder (default: its path; a server passes its model id, never a server path);
    subspaces: "raw" weights, or "norm" with the norm gains around attention folded into the
    heads (:func:`norm_aware`; ModelInfo.subspaces says which).
    """
    check_subspaces(subspaces)
    try:
        lm = _load_model(spec, device=device, processing=processing, dtype=dtype,
                         model_root=model_root, streaming=streaming, name=name)
    except HeadgraphError:
        raise
    except _FILE_ERRORS as err:  # a damaged weights or JSON file: the model's fault, not ours
        raise UnsupportedModel(f"{name or quoted(spec)}: a model file cannot be read "
                               f"({type(err).__name__}: {_one_line(err)})") from err
    if subspaces == "norm":
        lm = norm_aware(lm)
    # Results keyed by this fingerprint read tokens too: same weights + another tokenizer is
    # another model.
    lm.heads.fingerprint = with_tokenizer(lm.heads.fingerprint, lm.tokenizer)
    return lm


def _file_errors() -> tuple[type[BaseException], ...]:
    from safetensors import SafetensorError

    return (SafetensorError, json.JSONDecodeError, UnicodeDecodeError)


_FILE_ERRORS = _file_errors()


def _wrap_error(err: BaseException, config: Any) -> str:
    """What a failed ``boot_transformers`` says, in one line ("no adapter for X" rather than
    the list of every adapter)."""
    if str(err).startswith("Could not determine supported architecture"):
        arch = (getattr(config, "architectures", None) or ["this architecture"])[0]
        return f"it has no adapter for {arch}"
    return f"{type(err).__name__}: {_one_line(err)}"


def _one_line(err: BaseException, limit: int = 200) -> str:
    text = " ".join(str(err).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _load_model(spec: str, *, device: str | None, processing: str,
                dtype: torch.dtype | str | None, model_root: str | None,
                streaming: bool | None, name: str | None) -> LoadedModel:
    if processing not in PROCESSINGS:
        raise InvalidInput(f"unknown processing {processing!r}; "
                           f"expected one of {list(PROCESSINGS)}", allowed=list(PROCESSINGS))
    spec = (spec or "").strip()
    if not spec:
        raise InvalidInput("empty model spec; give 'demo', a local folder, a hub name or "
                           "'random:<preset>'")
    device = device or _default_device()
    torch_dtype = _as_dtype(dtype)
    if spec == "demo":
        from headgraph.core.models.demo import DEMO_DIR
        return _load_demo_folder(DEMO_DIR, name="demo", device=device, processing=processing)
    if is_demo_checkpoint_spec(spec):  # a checkpoint of the bundled demo series
        return _load_demo_folder(demo_checkpoint(spec).folder, name=spec, device=device,
                                 processing=processing)
    if spec.startswith(RANDOM_PREFIX):
        return _load_random(spec, device=device, processing=processing, dtype=torch_dtype,
                            model_root=model_root)
    if _looks_like_path(spec, expand=model_root is None) or _names_gguf(spec, model_root):
        folder = check_root(spec, model_root, shown=name)
        if is_gguf_spec(folder):
            return _load_gguf(folder, name=name or str(folder), device=device,
                              processing=processing, model_root=model_root,
                              shown=name or quoted(spec))
        if not folder.is_dir() or not (folder / "config.json").is_file():
            raise HeadgraphError(f"{name or quoted(spec)} is not a model folder "
                                 "(no config.json in it)")
        if model_root is not None:
            check_model_folder(folder, model_root, shown=name or quoted(spec))
        return _load_folder(folder, name=name or str(folder), source="local", device=device,
                            processing=processing, dtype=torch_dtype, streaming=streaming,
                            hide=model_root)
    return _load_hub(spec, device=device, processing=processing, dtype=torch_dtype,
                     streaming=streaming)


def norm_aware(lm: LoadedModel) -> LoadedModel:
    """``lm`` with norm-aware head weights (core.models.norm_fold): the gains of the norms
    around attention, measured on the bridge's modules, the demo's LayerNorm or read from the
    GGUF file, folded into readers and writers. The runnable parts are kept as they are.
    UnsupportedModel for streamed checkpoints (no norm modules are loaded)."""
    from headgraph.core.models.demo import DemoModel

    if lm.bridge is not None:
        gains = bridge_norm_gains(lm.bridge)
    elif isinstance(lm.patterns, DemoModel):
        gains = demo_norm_gains(lm.patterns)
    elif lm.gguf is not None:
        gains = gguf_norm_gains(lm.gguf, lm.info.layer_indices, shown=lm.info.name)
    else:
        raise UnsupportedModel(f"{lm.info.name}: norm-aware subspaces need the model's norms; "
                               "streamed safetensors read the attention weights only")
    heads = fold_norm_gains(lm.heads, gains)
    return dataclasses.replace(lm, heads=heads, info=heads.info)


def load_heads(
    spec: str,
    *,
    device: str | None = None,
    processing: str = "bridge",
    model_root: str | None = None,
) -> HeadWeights:
    """Per-head weights of ``spec`` (= ``load_model(spec, ...).heads``)."""
    return load_model(spec, device=device, processing=processing, model_root=model_root).heads


# -- helpers: devices, paths --------------------------------------------------------------

def _default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _as_dtype(dtype: torch.dtype | str | None) -> torch.dtype:
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    value = getattr(torch, str(dtype).replace("torch.", ""), None)
    if not isinstance(value, torch.dtype):
        raise InvalidInput(f"unknown dtype {dtype!r}")
    return value


def _names_gguf(spec: str, model_root: str | None) -> bool:
    """A relative spec naming a ``.gguf`` file (``model.gguf``, ``sub/model.gguf``)."""
    if not spec.lower().endswith(GGUF_SUFFIX):
        return False
    return os.path.isfile(os.path.expanduser(spec) if model_root is None else spec)


def _looks_like_path(spec: str, *, expand: bool = True) -> bool:
    if spec.startswith(("/", "./", "../", "~", ".\\")) or spec in (".", ".."):
        return True
    return os.path.isdir(os.path.expanduser(spec) if expand else spec)


# -- demo ---------------------------------------------------------------------------------

def _load_demo_folder(folder: Path, *, name: str, device: str, processing: str) -> LoadedModel:
    from headgraph.core.models.demo import load_demo_model

    if processing == "processed":
        raise UnsupportedModel(
            f"{name}: the demo model has raw weights only (its positions enter queries and keys "
            "after the LayerNorm, so folding LayerNorm is not a weight-only change); use "
            "processing 'raw' or 'bridge'")
    model = load_demo_model(folder, device=device)
    heads = model.head_weights(name=name, device=device)
    return LoadedModel(heads=heads, patterns=model, tokenizer=model, info=heads.info)


# -- GGUF ---------------------------------------------------------------------------------

def _load_gguf(path: Path, *, name: str, device: str, processing: str, model_root: str | None,
               shown: str) -> LoadedModel:
    """A ``.gguf`` file or a folder holding one: attention tensors dequantized one at a time
    (``core.models.gguf_file``), processing "raw", tokenizer from the file; the pattern source
    (``core.models.gguf_runnable.LazyGGUFSource``, when transformers knows the architecture)
    dequantizes the whole model only when it is first run.
    Under a model root the file (or every file of the folder) must resolve inside it."""
    if processing == "processed":
        raise UnsupportedModel(f"{shown}: GGUF models give raw weights only; use processing "
                               "'raw' or 'bridge'")
    if model_root is not None:
        check_model_folder(path, model_root, shown=shown)
    try:
        with shared_reads(find_gguf(path, shown=shown)):  # one parse for weights and tokenizer
            heads = load_heads_gguf(path, device=device, name=name)
    except HeadgraphError as err:
        clean = scrubbed(err, name, path, model_root)
        if clean is err:
            raise
        raise clean from err
    patterns = None
    if transformers_supports(heads.info.architecture):  # runnable, booted on first use
        patterns = LazyGGUFSource(find_gguf(path, shown=shown), layer_indices=heads.info.layer_indices,
                                  device=device, tokenizer=heads.tokenizer, shown=shown)
    return LoadedModel(heads=heads, patterns=patterns, tokenizer=heads.tokenizer, info=heads.info,
                       gguf=find_gguf(path, shown=shown))


# -- bridges ------------------------------------------------------------------------------

def _boot(name_or_folder: str, *, device: str, dtype: torch.dtype, **kwargs: Any) -> Any:
    """``TransformerBridge.boot_transformers`` with remote code always off."""
    from transformer_lens.model_bridge import TransformerBridge

    return TransformerBridge.boot_transformers(name_or_folder, device=device, dtype=dtype,
                                               trust_remote_code=False, **kwargs)


def _from_bridge(bridge: Any, *, name: str, source: str, processing: str, device: str,
                 tokenizer: Any | None = None) -> LoadedModel:
    """Apply processing, extract heads, wrap the bridge as a pattern source. ``tokenizer``:
    the checkpoint's own (the bridge's is rebuilt to add a BOS)."""
    from headgraph.core.models.bridge_weights import heads_from_bridge
    from headgraph.core.models.runnable import BridgePatternSource

    if processing == "processed":
        if not getattr(getattr(bridge, "adapter", None), "supports_fold_ln", True):
            raise UnsupportedModel(
                f"{name}: TransformerLens cannot fold LayerNorm for this architecture "
                f"({type(bridge.adapter).__name__}); use processing 'bridge' or 'raw'")
        try:
            bridge.enable_compatibility_mode(disable_warnings=True)
        except Exception as err:
            raise UnsupportedModel(
                f"{name}: TransformerLens cannot fold LayerNorm / centre weights for this "
                f"architecture ({type(err).__name__}: {err}); use processing 'bridge' or 'raw'"
            ) from err
    try:
        heads = heads_from_bridge(bridge, name=name, source=source, processing=processing,
                                  device=device)
    except HeadgraphError:
        raise
    except Exception as err:  # torch shape errors, assertions from an unusual bridge
        raise UnsupportedModel(f"{name}: per-head weights cannot be read from this bridge "
                               f"({type(err).__name__}: {_one_line(err)})") from err
    tokenizer = tokenizer if tokenizer is not None else bridge.tokenizer
    heads.tokenizer = tokenizer
    patterns = BridgePatternSource(bridge, tokenizer) if tokenizer is not None else None
    return LoadedModel(heads=heads, patterns=patterns, tokenizer=tokenizer,
                       info=heads.info, bridge=bridge)


def _load_folder(folder: Path, *, name: str, source: str, device: str, processing: str,
                 dtype: torch.dtype, streaming: bool | None, hide: str | None = None
                 ) -> LoadedModel:
    """A local checkpoint folder: demo format, streamed safetensors, or a booted bridge.
    Messages of the errors it raises never show the folder, ``hide`` (the model root) or the
    HF cache: they say ``name``."""
    try:
        return _load_folder_in(folder, name=name, source=source, device=device,
                               processing=processing, dtype=dtype, streaming=streaming)
    except HeadgraphError as err:
        clean = scrubbed(err, name, folder, hide)
        if clean is err:
            raise
        raise clean from err


def _load_folder_in(folder: Path, *, name: str, source: str, device: str, processing: str,
                    dtype: torch.dtype, streaming: bool | None) -> LoadedModel:
    from headgraph.core.models.demo import is_demo_folder

    if is_demo_folder(folder):
        return _load_demo_folder(folder, name=name, device=device, processing=processing)
    raw = _config_json(folder, name)
    check_config_shapes(raw, shown=f"{name}/config.json")
    # Encoder-only checkpoints load as encoders (weights, bidirectional patterns); the
    # activation stages refuse them (core.activations.conformance).
    refusal = config_refusal(raw) if model_kind(raw) == "encoder-decoder" else wrapping_refusal(raw)
    if refusal is not None:
        raise UnsupportedModel(f"{name}: {refusal}")
    if streaming is None:
        streaming = too_big_for_memory(folder, dtype)
    if streaming:
        if processing == "processed":
            raise UnsupportedModel(f"{name}: streamed safetensors give raw weights only; "
                                   "processing 'processed' needs the whole model in memory")
        if not safetensors_files(folder):
            raise UnsupportedModel(f"{name}: streaming needs *.safetensors files in the folder")
        # Stored precision: a 7B model's attention weights are 4.3 GB in bf16, 8.6 in float32.
        heads = load_heads_safetensors(folder, device=device, name=name, dtype=None)
        # Token tables name tokens with the folder's own tokenizer (ids without one).
        heads.tokenizer = _own_tokenizer(folder) if has_tokenizer(folder) else None
        # Patterns run the model a block at a time from the same files (none without a tokenizer).
        patterns = streamed_source(folder, heads.tokenizer, heads.info.layer_indices, device=device)
        return LoadedModel(heads=heads, patterns=patterns, tokenizer=heads.tokenizer, info=heads.info,
                           folder=folder)
    try:
        tokenizer = _own_tokenizer(folder) if has_tokenizer(folder) else byte_level_tokenizer()
        bridge = _boot(str(folder), device=device, dtype=dtype, tokenizer=tokenizer)
    except HeadgraphError:
        raise
    except Exception as err:  # whatever wrapping raises (assertions, split sizes): a refusal
        raise UnsupportedModel(f"{name}: TransformerLens could not load this checkpoint "
                               f"({type(err).__name__}: {_one_line(err)})") from err
    return _from_bridge(bridge, name=name, source=source, processing=processing, device=device,
                        tokenizer=tokenizer)


def _own_tokenizer(folder: Path) -> Any:
    """The folder's tokenizer exactly as it ships (remote code off)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)


def _config_json(folder: Path, name: str) -> Any:
    """The folder's config.json as JSON; InvalidInput naming it when it is not JSON."""
    try:
        return json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise InvalidInput(f"{name}/config.json is not readable JSON ({type(err).__name__})") from err


# -- random models --------------------------------------------------------------------------

def _load_random(spec: str, *, device: str, processing: str, dtype: torch.dtype,
                 model_root: str | None) -> LoadedModel:
    """Random weights from a preset or a config file, seeded, booted via ``hf_model=``."""
    body, seed = parse_random_spec(spec)
    if body in RANDOM_PRESETS:
        config = preset_config(body)
    else:
        path = check_root(body, model_root)
        if model_root is not None and path.is_dir():
            check_root(path / "config.json", model_root)  # a config.json linking outside
        cfg_file, raw = read_config_json(path, spec=spec, body=body)
        if is_demo_config(raw):
            model = random_demo_model(raw, seed=seed, device=device)
            heads = model.head_weights(name=spec, device=device)
            return LoadedModel(heads=heads, patterns=model, tokenizer=model, info=heads.info)
        check_config_shapes(raw, shown=f"{body} (config)")
        config = hf_config(cfg_file)
    refusal = config_refusal(config.to_dict())  # an encoder built "as a causal LM" is not one
    if refusal is not None:
        raise UnsupportedModel(f"{spec}: {refusal}")
    hf_model = random_causal_lm(config, seed=seed, name=spec, device=device, dtype=dtype)
    tokenizer = byte_level_tokenizer() if config.vocab_size >= 257 else None
    try:
        bridge = _boot(spec, device=device, dtype=dtype, hf_model=hf_model, tokenizer=tokenizer)
    except HeadgraphError:
        raise
    except Exception as err:  # whatever wrapping raises (assertions, split sizes): a refusal
        raise UnsupportedModel(f"{spec}: TransformerLens could not wrap this model "
                               f"({_wrap_error(err, config)})") from err
    return _from_bridge(bridge, name=spec, source="config", processing=processing, device=device,
                        tokenizer=tokenizer)


# -- hub ------------------------------------------------------------------------------------

def _load_hub(name: str, *, device: str, processing: str, dtype: torch.dtype,
              streaming: bool | None) -> LoadedModel:
    """A hub name: cached snapshot -> local boot; otherwise download unless offline. Messages
    never show the HF cache folder."""
    try:
        return _load_hub_in(name, device=device, processing=processing, dtype=dtype,
                            streaming=streaming)
    except HeadgraphError as err:
        clean = scrubbed(err, name, None, None)
        if clean is err:
            raise
        raise clean from err


def _load_hub_in(name: str, *, device: str, processing: str, dtype: torch.dtype,
                 streaming: bool | None) -> LoadedModel:
    check_hub_name(name)
    snapshot = cached_snapshot(name)
    if snapshot is not None:
        return _load_folder(snapshot, name=name, source="hub", device=device,
                            processing=processing, dtype=dtype, streaming=streaming)
    unavailable = hub_unavailable(name)
    if unavailable is not None:
        raise unavailable
    try:
        bridge = _boot(name, device=device, dtype=dtype)
    except OSError as err:  # includes hub HTTP errors and "not a valid model identifier"
        raise fetch_failed(name, err) from err
    except (ValueError, KeyError, RuntimeError, NotImplementedError) as err:
        raise UnsupportedModel(f"{name}: TransformerLens could not load this model "
                               f"({type(err).__name__}: {err})") from err
    except Exception as err:  # network client errors that are not OSError (httpx, requests)
        if not is_network_error(err):
            raise
        raise fetch_failed(name, err) from err
    return _from_bridge(bridge, name=name, source="hub", processing=processing, device=device)
