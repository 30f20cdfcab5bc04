"""Load a model's per-head attention weights (and a runnable pattern source) from a spec.

Spec forms:

- ``"demo"``: the built-in trained demo model (core/data/demo), always offline, no TL needed;
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
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import socket
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch

from headgraph.core.errors import HeadgraphError, ModelUnavailable, PathNotAllowed, UnsupportedModel
from headgraph.core.fingerprint import weights_fingerprint
from headgraph.core.types import PROCESSINGS, HeadWeights, ModelInfo, PatternSource

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
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt",
                    "tokenizer.model", "spiece.model", "sentencepiece.bpe.model")
_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")
_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2,
                "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


@dataclass
class LoadedModel:
    """Head weights plus what runs the model: pattern source (None when streamed), tokenizer."""

    heads: HeadWeights
    patterns: PatternSource | None
    tokenizer: Any | None
    info: ModelInfo
    bridge: Any | None = None  # the TransformerBridge, when one was booted


# -- public entry points ------------------------------------------------------------------

def load_model(
    spec: str,
    *,
    device: str | None = None,
    processing: str = "bridge",
    dtype: torch.dtype | str | None = None,
    model_root: str | None = None,
    streaming: bool | None = None,
) -> LoadedModel:
    """Load ``spec`` (see module docstring) into HeadWeights and a PatternSource.

    device: where weights live (default: cuda when available, else cpu); dtype: bridge load
    dtype (default float32); model_root: local paths must resolve inside it (PathNotAllowed);
    streaming: None = read safetensors tensor by tensor only if the model would not fit in
    memory, True = always (folder with safetensors; processing "raw"), False = never.
    """
    if processing not in PROCESSINGS:
        raise HeadgraphError(f"unknown processing {processing!r}; "
                             f"expected one of {list(PROCESSINGS)}")
    spec = (spec or "").strip()
    if not spec:
        raise HeadgraphError("empty model spec; give 'demo', a local folder, a hub name or "
                             "'random:<preset>'")
    device = device or _default_device()
    torch_dtype = _as_dtype(dtype)
    if spec == "demo":
        from headgraph.core.demo_model import DEMO_DIR
        return _load_demo_folder(DEMO_DIR, name="demo", device=device, processing=processing)
    if spec.startswith(RANDOM_PREFIX):
        return _load_random(spec, device=device, processing=processing, dtype=torch_dtype,
                            model_root=model_root)
    if _looks_like_path(spec):
        folder = _check_root(spec, model_root)
        if not folder.is_dir() or not (folder / "config.json").is_file():
            raise HeadgraphError(f"{spec!r} is not a model folder (no config.json in it)")
        return _load_folder(folder, name=str(folder), source="local", device=device,
                            processing=processing, dtype=torch_dtype, streaming=streaming)
    return _load_hub(spec, device=device, processing=processing, dtype=torch_dtype,
                     streaming=streaming)


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
        raise HeadgraphError(f"unknown dtype {dtype!r}")
    return value


def _looks_like_path(spec: str) -> bool:
    return (spec.startswith(("/", "./", "../", "~", ".\\")) or spec in (".", "..")
            or os.path.isdir(os.path.expanduser(spec)))


def _check_root(path: str | Path, model_root: str | None) -> Path:
    """Real path of ``path``; PathNotAllowed unless inside ``model_root`` (when one is given)."""
    real = Path(os.path.realpath(os.path.expanduser(str(path))))
    if model_root is not None:
        root = Path(os.path.realpath(os.path.expanduser(model_root)))
        if real != root and root not in real.parents:
            raise PathNotAllowed(f"{str(path)!r} resolves to {str(real)!r}, outside the allowed "
                                 f"model root {str(root)!r}")
    return real


# -- demo ---------------------------------------------------------------------------------

def _load_demo_folder(folder: Path, *, name: str, device: str, processing: str) -> LoadedModel:
    from headgraph.core.demo_model import load_demo_model

    if processing == "processed":
        raise UnsupportedModel(
            f"{name}: the demo model has raw weights only (its positions enter queries and keys "
            "after the LayerNorm, so folding LayerNorm is not a weight-only change); use "
            "processing 'raw' or 'bridge'")
    model = load_demo_model(folder, device=device)
    heads = model.head_weights(name=name, device=device)
    return LoadedModel(heads=heads, patterns=model, tokenizer=model, info=heads.info)


# -- bridges ------------------------------------------------------------------------------

def _boot(name_or_folder: str, *, device: str, dtype: torch.dtype, **kwargs: Any) -> Any:
    """``TransformerBridge.boot_transformers`` with remote code always off."""
    from transformer_lens.model_bridge import TransformerBridge

    return TransformerBridge.boot_transformers(name_or_folder, device=device, dtype=dtype,
                                               trust_remote_code=False, **kwargs)


def _from_bridge(bridge: Any, *, name: str, source: str, processing: str, device: str
                 ) -> LoadedModel:
    """Apply processing, extract heads, wrap the bridge as a pattern source."""
    from headgraph.core.extract import heads_from_bridge
    from headgraph.core.patterns import BridgePatternSource

    if processing == "processed":
        if not getattr(getattr(bridge, "adapter", None), "supports_fold_ln", True):
            raise UnsupportedModel(
                f"{name}: TransformerLens cannot fold LayerNorm for this architecture "
                f"({type(bridge.adapter).__name__}); use processing 'bridge' or 'raw'")
        try:
            bridge.enable_compatibility_mode(disable_warnings=True)
        except Exception as err:  # noqa: BLE001 - any failure means "cannot process this model"
            raise UnsupportedModel(
                f"{name}: TransformerLens cannot fold LayerNorm / centre weights for this "
                f"architecture ({type(err).__name__}: {err}); use processing 'bridge' or 'raw'"
            ) from err
    try:
        heads = heads_from_bridge(bridge, name=name, source=source, processing=processing,
                                  device=device)
    except ValueError as err:
        raise UnsupportedModel(f"{name}: {err}") from err
    patterns = BridgePatternSource(bridge) if bridge.tokenizer is not None else None
    return LoadedModel(heads=heads, patterns=patterns, tokenizer=bridge.tokenizer,
                       info=heads.info, bridge=bridge)


def byte_level_tokenizer() -> Any:
    """An offline GPT-2-style byte-level tokenizer with no merges: 256 bytes + <|endoftext|>.

    For random-weight models and checkpoints that ship no tokenizer (ids 0..256); it
    prepends <|endoftext|> (id 256) as BOS.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab["<|endoftext|>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = "<|endoftext|>"
    # add_bos_token / name_or_path: TransformerLens's tokenizer setup reads both.
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=special, eos_token=special,
                                   unk_token=special, pad_token=special, add_bos_token=True,
                                   name_or_path="headgraph/byte-level")


def _has_tokenizer(folder: Path) -> bool:
    return any((folder / f).is_file() for f in _TOKENIZER_FILES)


def _load_folder(folder: Path, *, name: str, source: str, device: str, processing: str,
                 dtype: torch.dtype, streaming: bool | None) -> LoadedModel:
    """A local checkpoint folder: demo format, streamed safetensors, or a booted bridge."""
    from headgraph.core.demo_model import is_demo_folder

    if is_demo_folder(folder):
        return _load_demo_folder(folder, name=name, device=device, processing=processing)
    if streaming is None:
        streaming = _too_big_for_memory(folder, dtype)
    if streaming:
        if processing == "processed":
            raise UnsupportedModel(f"{name}: streamed safetensors give raw weights only; "
                                   "processing 'processed' needs the whole model in memory")
        if not _safetensors_files(folder):
            raise UnsupportedModel(f"{name}: streaming needs *.safetensors files in {folder}")
        heads = load_heads_safetensors(folder, device=device, name=name)
        return LoadedModel(heads=heads, patterns=None, tokenizer=None, info=heads.info)
    kwargs: dict[str, Any] = {}
    if not _has_tokenizer(folder):
        kwargs["tokenizer"] = byte_level_tokenizer()
    try:
        bridge = _boot(str(folder), device=device, dtype=dtype, **kwargs)
    except (OSError, ValueError, KeyError, RuntimeError, NotImplementedError) as err:
        raise UnsupportedModel(f"{name}: TransformerLens could not load this checkpoint "
                               f"({type(err).__name__}: {err})") from err
    return _from_bridge(bridge, name=name, source=source, processing=processing, device=device)


# -- random models --------------------------------------------------------------------------

def _parse_random(spec: str) -> tuple[str, int]:
    body = spec[len(RANDOM_PREFIX):].strip()
    seed = 0
    m = re.fullmatch(r"(.+)@(\d+)", body)
    if m:
        body, seed = m.group(1), int(m.group(2))
    if not body:
        raise HeadgraphError(f"{spec!r}: give a preset ({', '.join(RANDOM_PRESETS)}) or a "
                             "config.json path after 'random:'")
    return body, seed


def _load_random(spec: str, *, device: str, processing: str, dtype: torch.dtype,
                 model_root: str | None) -> LoadedModel:
    """Random weights from a preset or a config file, seeded, booted via ``hf_model=``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    body, seed = _parse_random(spec)
    if body in RANDOM_PRESETS:
        model_type, arch, kw = RANDOM_PRESETS[body]
        config = AutoConfig.for_model(model_type, **kw)
        config.architectures = [arch]
    else:
        path = _check_root(body, model_root)
        cfg_file = path / "config.json" if path.is_dir() else path
        if not cfg_file.is_file():
            raise HeadgraphError(f"{spec!r}: {body!r} is neither a preset "
                                 f"({', '.join(RANDOM_PRESETS)}) nor a config.json file")
        try:
            raw = json.loads(cfg_file.read_text())
        except ValueError as err:
            raise HeadgraphError(f"{cfg_file}: not valid JSON ({err})") from err
        from headgraph.core.demo_model import ARCHITECTURE, DemoConfig, DemoModel

        if raw.get("architecture") == ARCHITECTURE:
            model = DemoModel(DemoConfig.from_dict(raw), seed=seed).eval().requires_grad_(False)
            model = model.to(device)
            heads = model.head_weights(name=spec, device=device)
            return LoadedModel(heads=heads, patterns=model, tokenizer=model, info=heads.info)
        try:
            config = AutoConfig.from_pretrained(str(cfg_file), trust_remote_code=False)
        except (OSError, ValueError, KeyError) as err:
            raise UnsupportedModel(f"{cfg_file}: not a transformers config ({err})") from err
        if not getattr(config, "architectures", None):
            raise UnsupportedModel(f"{cfg_file}: config names no 'architectures'")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            hf_model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
        except (ValueError, KeyError, TypeError) as err:
            raise UnsupportedModel(f"{spec}: cannot build a causal LM from this config "
                                   f"({err})") from err
    hf_model = hf_model.to(device=device, dtype=dtype).eval()
    tokenizer = byte_level_tokenizer() if config.vocab_size >= 257 else None
    try:
        bridge = _boot(spec, device=device, dtype=dtype, hf_model=hf_model, tokenizer=tokenizer)
    except (OSError, ValueError, KeyError, RuntimeError, NotImplementedError) as err:
        raise UnsupportedModel(f"{spec}: TransformerLens could not wrap this model "
                               f"({type(err).__name__}: {err})") from err
    return _from_bridge(bridge, name=spec, source="config", processing=processing, device=device)


# -- hub ------------------------------------------------------------------------------------

def hub_offline_flag() -> bool:
    """True when HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE switches the hub off."""
    flags = (os.environ.get("HF_HUB_OFFLINE", ""), os.environ.get("TRANSFORMERS_OFFLINE", ""))
    return any(f.strip().lower() in ("1", "true", "yes", "on") for f in flags)


def hub_reachable(timeout: float = 2.0) -> bool:
    """Quick TCP check of the hub endpoint (HF_ENDPOINT); DNS included, bounded by ``timeout``."""
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme != "http" else 80)

    def connect() -> bool:
        with socket.create_connection((host, port), timeout=timeout):
            return True

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    try:
        return bool(pool.submit(connect).result(timeout=timeout + 0.5))
    except (OSError, concurrent.futures.TimeoutError):
        return False
    finally:
        pool.shutdown(wait=False)


def hub_cache_dir() -> str | None:
    """HF hub cache folder from HF_HUB_CACHE / HF_HOME as set now (None: the library default)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return os.path.join(os.environ["HF_HOME"], "hub")
    return None


def cached_snapshot(repo_id: str) -> Path | None:
    """Folder of the locally cached snapshot of ``repo_id`` if it holds config, weights and
    tokenizer (no network); else None."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(repo_id, "config.json", cache_dir=hub_cache_dir())
    except Exception:  # noqa: BLE001 - an invalid repo id is simply not cached
        return None
    if not isinstance(found, str):
        return None
    folder = Path(found).parent
    has_weights = any((folder / f).is_file() for f in _WEIGHT_FILES)
    return folder if has_weights and _has_tokenizer(folder) else None


def _how_to_get(name: str) -> str:
    return (f"to use {name!r}, run headgraph once where the Hugging Face hub is reachable "
            f"(with HF_HUB_OFFLINE unset or 0) so it is cached, or download it "
            f"(huggingface-cli download {name} --local-dir <folder>) and pass that folder, "
            "or point HF_HOME at a cache that already holds it")


def _load_hub(name: str, *, device: str, processing: str, dtype: torch.dtype,
              streaming: bool | None) -> LoadedModel:
    """A hub name: cached snapshot -> local boot; otherwise download unless offline."""
    if not re.fullmatch(r"[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?", name):
        raise HeadgraphError(f"{name!r} is not 'demo', 'random:<preset>', an existing folder "
                             "or a Hugging Face model name")
    snapshot = cached_snapshot(name)
    if snapshot is not None:
        loaded = _load_folder(snapshot, name=name, source="hub", device=device,
                              processing=processing, dtype=dtype, streaming=streaming)
        return loaded
    if hub_offline_flag():
        raise ModelUnavailable(f"{name!r} is not in the local Hugging Face cache and the hub is "
                               f"switched off (HF_HUB_OFFLINE=1); {_how_to_get(name)}")
    if not hub_reachable():
        raise ModelUnavailable(f"{name!r} is not in the local Hugging Face cache and the hub "
                               f"cannot be reached from this machine; {_how_to_get(name)}")
    try:
        bridge = _boot(name, device=device, dtype=dtype)
    except OSError as err:  # includes hub HTTP errors and "not a valid model identifier"
        raise ModelUnavailable(f"could not fetch {name!r} from the Hugging Face hub "
                               f"({type(err).__name__}: {err}); {_how_to_get(name)}") from err
    except (ValueError, KeyError, RuntimeError, NotImplementedError) as err:
        raise UnsupportedModel(f"{name}: TransformerLens could not load this model "
                               f"({type(err).__name__}: {err})") from err
    except Exception as err:  # network client errors that are not OSError (httpx, requests)
        if not type(err).__module__.split(".")[0].startswith(("httpx", "requests", "urllib3")):
            raise
        raise ModelUnavailable(f"could not fetch {name!r} from the Hugging Face hub "
                               f"({type(err).__name__}: {err}); {_how_to_get(name)}") from err
    return _from_bridge(bridge, name=name, source="hub", processing=processing, device=device)


# -- streaming safetensors reader -----------------------------------------------------------

def _safetensors_files(folder: Path) -> list[Path]:
    """Checkpoint shards: those named by model.safetensors.index.json, else every *.safetensors."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / n for n in names]
    return sorted(folder.glob("*.safetensors"))


def _header(path: Path) -> dict[str, Any]:
    """The JSON header of one safetensors file (tensor names, dtypes, shapes), read alone."""
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        return json.loads(fh.read(n))


def checkpoint_bytes(folder: str | Path, dtype: torch.dtype = torch.float32) -> int:
    """Bytes the checkpoint's safetensors would take once loaded as ``dtype`` (headers only)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    total = 0
    for f in _safetensors_files(Path(folder)):
        for key, meta in _header(f).items():
            if key == "__metadata__":
                continue
            numel = 1
            for s in meta["shape"]:
                numel *= int(s)
            total += numel * max(itemsize, _DTYPE_BYTES.get(meta["dtype"], 4))
    return total


def _available_memory() -> int:
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:  # pragma: no cover - psutil ships with the environment
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def _too_big_for_memory(folder: Path, dtype: torch.dtype) -> bool:
    """True when booting would need more than ~80% of available RAM (safetensors only)."""
    if not _safetensors_files(folder):
        return False
    return checkpoint_bytes(folder, dtype) > 0.8 * _available_memory()


# Attention tensor names: (regex over the key, kind). Group 1 = prefix, group 2 = layer.
_ATTN_KEYS: tuple[tuple[str, str], ...] = (
    (r"(.*?)\bh\.(\d+)\.attn\.c_attn\.weight", "gpt2_qkv"),
    (r"(.*?)\bh\.(\d+)\.attn\.c_proj\.weight", "gpt2_o"),
    (r"(.*?)\blayers\.(\d+)\.self_attn\.q_proj\.weight", "q"),
    (r"(.*?)\blayers\.(\d+)\.self_attn\.k_proj\.weight", "k"),
    (r"(.*?)\blayers\.(\d+)\.self_attn\.v_proj\.weight", "v"),
    (r"(.*?)\blayers\.(\d+)\.self_attn\.o_proj\.weight", "o"),
    (r"(.*?)\blayer\.(\d+)\.attention\.self\.query\.weight", "q"),
    (r"(.*?)\blayer\.(\d+)\.attention\.self\.key\.weight", "k"),
    (r"(.*?)\blayer\.(\d+)\.attention\.self\.value\.weight", "v"),
    (r"(.*?)\blayer\.(\d+)\.attention\.output\.dense\.weight", "o"),
    (r"(.*?)\bh\.(\d+)\.self_attention\.query_key_value\.weight", "fused_qkv_per_head"),
    (r"(.*?)\bh\.(\d+)\.self_attention\.dense\.weight", "o"),
    (r"(.*?)\blayers\.(\d+)\.attention\.query_key_value\.weight", "fused_qkv_per_head"),
    (r"(.*?)\blayers\.(\d+)\.attention\.dense\.weight", "o"),
)
_UNEMBED_KEYS = ("lm_head.weight", "embed_out.weight", "cls.predictions.decoder.weight")
_EMBED_SUFFIXES = ("wte.weight", "embed_tokens.weight", "word_embeddings.weight",
                   "embed_in.weight")


def _cfg_int(cfg: dict[str, Any], *names: str) -> int | None:
    for src in (cfg, cfg.get("text_config") or {}):
        for n in names:
            if src.get(n) is not None:
                return int(src[n])
    return None


def load_heads_safetensors(folder: str | Path, *, device: str | torch.device | None = None,
                           dtype: torch.dtype = torch.float32, name: str | None = None
                           ) -> HeadWeights:
    """Read only the attention weights (and unembedding) of a checkpoint, one tensor at a time.

    Handles GPT-2 (fused c_attn, Conv1D [in, out] layout), Llama / Qwen2 / Mistral style
    (q/k/v/o_proj, GQA), BERT (attention.self.query/key/value, attention.output.dense) and
    BLOOM / GPT-NeoX (per-head fused query_key_value). Returns HeadWeights in TL layout,
    processing "raw", source "safetensors"; sharded checkpoints via their index json.
    """
    from safetensors import safe_open

    folder = Path(folder)
    name = name or str(folder)
    files = _safetensors_files(folder)
    if not files:
        raise UnsupportedModel(f"{name}: no *.safetensors files in {folder}")
    cfg = json.loads((folder / "config.json").read_text())
    H = _cfg_int(cfg, "num_attention_heads", "n_head", "n_heads")
    d_model = _cfg_int(cfg, "hidden_size", "n_embd", "d_model")
    if H is None or d_model is None:
        raise UnsupportedModel(f"{name}: config.json lacks the head count or hidden size")
    H_kv = _cfg_int(cfg, "num_key_value_heads") or H
    d_head = _cfg_int(cfg, "head_dim") or d_model // H

    found: dict[str, dict[tuple[str, int], tuple[Path, str]]] = {}
    unembed: tuple[Path, str, bool] | None = None
    embed: tuple[Path, str, bool] | None = None
    for f in files:
        for key in _header(f):
            for pattern, kind in _ATTN_KEYS:
                m = re.fullmatch(pattern, key)
                if m:
                    found.setdefault(kind, {})[(m.group(1), int(m.group(2)))] = (f, key)
                    break
            if key in _UNEMBED_KEYS or key.endswith(".lm_head.weight"):
                unembed = (f, key, True)
            elif embed is None and key.endswith(_EMBED_SUFFIXES) and "position" not in key:
                embed = (f, key, True)
    if not found:
        raise UnsupportedModel(f"{name}: no attention weights with a known naming "
                               "(GPT-2, Llama/Qwen2, BERT, BLOOM/GPT-NeoX) in its safetensors")
    # One stack of layers: the prefix with the most attention tensors (skips e.g. vision towers).
    counts: dict[str, int] = {}
    for table in found.values():
        for prefix, _ in table:
            counts[prefix] = counts.get(prefix, 0) + 1
    prefix = max(sorted(counts), key=lambda p: counts[p])
    layers = sorted({layer for table in found.values() for (p, layer) in table if p == prefix})
    L = len(layers)
    W_Q = torch.empty(L, H, d_model, d_head, dtype=dtype)
    W_K = torch.empty(L, H_kv, d_model, d_head, dtype=dtype)
    W_V = torch.empty(L, H_kv, d_model, d_head, dtype=dtype)
    W_O = torch.empty(L, H, d_head, d_model, dtype=dtype)

    def read(loc: tuple[Path, str]) -> torch.Tensor:
        with safe_open(str(loc[0]), framework="pt", device="cpu") as fh:
            return fh.get_tensor(loc[1]).to(dtype)

    def linear_in(w: torch.Tensor, heads: int) -> torch.Tensor:
        """nn.Linear weight [heads*d_head, d_model] -> [heads, d_model, d_head]."""
        return w.reshape(heads, d_head, d_model).transpose(1, 2)

    for i, layer in enumerate(layers):
        key = (prefix, layer)
        try:
            if "gpt2_qkv" in found:
                w = read(found["gpt2_qkv"][key])  # Conv1D [d_model, 3*d_model]
                q, k, v = w.split(H * d_head, dim=1)
                W_Q[i] = q.reshape(d_model, H, d_head).transpose(0, 1)
                W_K[i] = k.reshape(d_model, H_kv, d_head).transpose(0, 1)
                W_V[i] = v.reshape(d_model, H_kv, d_head).transpose(0, 1)
                W_O[i] = read(found["gpt2_o"][key]).reshape(H, d_head, d_model)
                continue
            if "fused_qkv_per_head" in found:
                w = read(found["fused_qkv_per_head"][key]).reshape(H, 3, d_head, d_model)
                W_Q[i], W_K[i], W_V[i] = (w[:, j].transpose(1, 2) for j in range(3))
            else:
                W_Q[i] = linear_in(read(found["q"][key]), H)
                W_K[i] = linear_in(read(found["k"][key]), H_kv)
                W_V[i] = linear_in(read(found["v"][key]), H_kv)
            o = read(found["o"][key])  # [d_model, H*d_head]
            W_O[i] = o.reshape(d_model, H, d_head).permute(1, 2, 0)
        except KeyError as err:
            raise UnsupportedModel(f"{name}: layer {layer} lacks an attention tensor "
                                   f"({err})") from err

    tied = cfg.get("tie_word_embeddings", True)
    src = unembed if unembed is not None else (embed if tied else None)
    W_U = read(src[:2]).T.contiguous() if src is not None else None
    if W_U is not None and W_U.shape[0] != d_model:
        W_U = None
    if device is not None:
        W_Q, W_K, W_V, W_O = (t.to(device) for t in (W_Q, W_K, W_V, W_O))
        W_U = W_U.to(device) if W_U is not None else None
    archs = cfg.get("architectures") or [cfg.get("model_type", "unknown")]
    info = ModelInfo(
        name=name, architecture=str(archs[0]), n_layers=L, n_heads=H, n_kv_heads=H_kv,
        d_model=d_model, d_head=d_head, d_vocab=None if W_U is None else int(W_U.shape[1]),
        dtype=str(dtype).replace("torch.", ""), layer_indices=tuple(layers),
        processing="raw", source="safetensors",
    )
    fp = weights_fingerprint([W_Q, W_K, W_V, W_O, W_U], processing="raw",
                             extra=",".join(map(str, info.layer_indices)))
    return HeadWeights(info=info, W_Q=W_Q, W_K=W_K, W_V=W_V, W_O=W_O, W_U=W_U, fingerprint=fp)
