"""Read a checkpoint's attention weights straight from its safetensors, one tensor at a time.

For checkpoints too big to boot in memory: only W_Q/W_K/W_V/W_O (and the unembedding) are read,
in TransformerLens layout, processing "raw", source "safetensors" (no runnable model). Tensor
names are matched per architecture family (GPT-2, Llama/Qwen2/Mistral, BERT, BLOOM/GPT-NeoX);
``checkpoint_bytes`` sizes a checkpoint from its headers alone so ``load_model`` can decide
whether to stream.
"""

from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path
from typing import Any

import torch

from headgraph.core.errors import UnsupportedModel
from headgraph.core.models.fingerprint import weights_fingerprint
from headgraph.core.models.model_root import weight_map_files
from headgraph.core.types import HeadWeights, ModelInfo

_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2,
                "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def safetensors_files(folder: Path) -> list[Path]:
    """Checkpoint shards: those named by model.safetensors.index.json, else every *.safetensors.
    Index entries must be plain file names in the folder (PathNotAllowed for an absolute path
    or ``..``); an unreadable index is UnsupportedModel."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return [folder / n for n in weight_map_files(index)]
    return sorted(folder.glob("*.safetensors"))


MAX_HEADER_BYTES = 100 << 20


def _header(path: Path) -> dict[str, Any]:
    """The JSON header of one safetensors file (tensor names, dtypes, shapes), read alone;
    UnsupportedModel naming the file (``folder/name``) when it is missing, not a safetensors
    header, or its tensors' data does not end where the file does (truncated or padded)."""
    shown = f"{path.parent.name}/{path.name}"
    try:
        with open(path, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            if n > MAX_HEADER_BYTES:
                raise ValueError("header too large")
            header = json.loads(fh.read(n))
            size = os.fstat(fh.fileno()).st_size
        if not isinstance(header, dict):
            raise ValueError("header is not an object")
        ends = {key: int(meta["data_offsets"][1]) for key, meta in header.items() if key != "__metadata__"}
    except (OSError, ValueError, struct.error, RecursionError, KeyError, TypeError, IndexError):
        raise UnsupportedModel(f"{shown}: not a readable safetensors file") from None
    data = size - 8 - n
    last = max(ends, key=lambda k: ends[k], default=None)
    if last is not None and ends[last] > data:
        raise UnsupportedModel(f"{shown}: truncated safetensors file: tensor {last[:80]!r} ends at byte "
                               f"{ends[last]} of the data, which holds {max(data, 0)}")
    if last is not None and ends[last] < data:
        raise UnsupportedModel(f"{shown}: not a readable safetensors file ({data - ends[last]} bytes "
                               "after its last tensor)")
    return header


def checkpoint_bytes(folder: str | Path, dtype: torch.dtype = torch.float32) -> int:
    """Bytes the checkpoint's safetensors would take once loaded as ``dtype`` (headers only)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    total = 0
    for f in safetensors_files(Path(folder)):
        for key, meta in _header(f).items():
            if key == "__metadata__":
                continue
            try:
                numel = 1
                for s in meta["shape"]:
                    numel *= int(s)
                total += numel * max(itemsize, _DTYPE_BYTES.get(str(meta["dtype"]), 4))
            except (KeyError, TypeError, ValueError):
                raise UnsupportedModel(f"{f.name}: tensor {str(key)[:80]!r} has no valid "
                                       "shape/dtype in its safetensors header") from None
    return total


def available_memory() -> int:
    """Bytes of memory available to this process now (psutil's ``available``)."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:  # pragma: no cover - psutil ships with the environment
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def too_big_for_memory(folder: Path, dtype: torch.dtype) -> bool:
    """True when booting would need more than ~80% of available RAM (safetensors only)."""
    if not safetensors_files(folder):
        return False
    return checkpoint_bytes(folder, dtype) > 0.8 * available_memory()


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


_STORED_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
                  "BF16": torch.bfloat16}


def load_heads_safetensors(folder: str | Path, *, device: str | torch.device | None = None,
                           dtype: torch.dtype | None = torch.float32, name: str | None = None
                           ) -> HeadWeights:
    """Read only the attention weights (and unembedding) of a checkpoint, one tensor at a time.

    dtype: the weights' dtype; None keeps the checkpoint's stored precision (that of its first
    attention tensor: bf16 stays bf16, half the memory of float32; computations upcast a
    chunk at a time), float32 for stored types that are not floating point.

    Handles GPT-2 (fused c_attn, Conv1D [in, out] layout), Llama / Qwen2 / Mistral style
    (q/k/v/o_proj, GQA), BERT (attention.self.query/key/value, attention.output.dense) and
    BLOOM / GPT-NeoX (per-head fused query_key_value). Returns HeadWeights in TL layout,
    processing "raw", source "safetensors"; sharded checkpoints via their index json.
    """
    from safetensors import safe_open

    folder = Path(folder)
    name = name or str(folder)
    files = safetensors_files(folder)
    if not files:
        raise UnsupportedModel(f"{name}: no *.safetensors files in the model folder")
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
    if dtype is None:
        first = next(loc for table in found.values() for key, loc in sorted(table.items()) if key[0] == prefix)
        dtype = _STORED_DTYPES.get(str(_header(first[0])[first[1]].get("dtype")), torch.float32)
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
