"""Read a GGUF file's attention weights (llama.cpp's format), dequantized, one tensor at a time.

A ``.gguf`` file, or a folder holding one (and no config.json), is a model spec. The file is
memory-mapped with ``gguf.GGUFReader``; only ``blk.{i}.attn_q/attn_k/attn_v/attn_output``
and the unembedding (``output.weight``, else the tied ``token_embd.weight``) are dequantized
(``gguf.quants.dequantize``), so the rest of the model is never read. llama.cpp stores the
rows of Llama's Q and K weights permuted for its rotary layout; they are permuted back exactly
as transformers does when it loads a GGUF (``LlamaTensorProcessor._reverse_permute_weights``),
so W_Q/W_K equal the Hugging Face checkpoint's. The tokenizer is built from the file's own
metadata (transformers' GGUF tokenizer converter). Result: HeadWeights in TransformerLens
layout, processing "raw", source "gguf", ``ModelInfo.quantization`` naming the attention
tensors' quantization type (e.g. "Q4_1"); no runnable pattern source.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from headgraph.core.errors import InvalidInput, UnsupportedModel
from headgraph.core.models.fingerprint import weights_fingerprint
from headgraph.core.models.gguf_reads import GGUFTensorError, parse
from headgraph.core.models.norm_fold import NormGains
from headgraph.core.models.shapes import CONFIG_FIELDS, bounded_int, check_tensor_size
from headgraph.core.types import HeadWeights, ModelInfo

GGUF_SUFFIX = ".gguf"
# Architectures whose Q/K rows llama.cpp's converter permutes (transformers undoes it for these).
PERMUTED_ARCHS = frozenset({"llama", "mistral"})
_ATTN_Q = re.compile(r"^blk\.(\d{1,5})\.attn_q\.weight$")
_BLOCK = re.compile(r"^blk\.(\d{1,9})\.")
_ROLES = ("attn_q", "attn_k", "attn_v", "attn_output")


def is_gguf_file(path: str | os.PathLike[str]) -> bool:
    """True for an existing file whose name ends in ``.gguf``."""
    p = Path(path)
    try:
        return p.name.lower().endswith(GGUF_SUFFIX) and p.is_file()
    except (OSError, ValueError):
        return False


def gguf_files(folder: str | os.PathLike[str]) -> list[Path]:
    """The ``*.gguf`` files directly in ``folder`` (sorted; [] when it is not a folder)."""
    try:
        return sorted(p for p in Path(folder).iterdir() if is_gguf_file(p))
    except (OSError, ValueError):
        return []


def find_gguf(path: str | os.PathLike[str], *, shown: str) -> Path:
    """The GGUF file a spec names: the file itself, or the one ``.gguf`` in a folder.

    UnsupportedModel (naming ``shown`` only) when the folder holds none or several."""
    p = Path(path)
    if is_gguf_file(p):
        return p
    found = gguf_files(p)
    if len(found) == 1:
        return found[0]
    if not found:
        raise UnsupportedModel(f"{shown}: no .gguf file in the model folder")
    raise UnsupportedModel(f"{shown}: the model folder holds several .gguf files "
                           f"({', '.join(f.name for f in found)}); give one file")


def is_gguf_spec(path: str | os.PathLike[str]) -> bool:
    """A ``.gguf`` file, or a folder with no config.json holding at least one ``.gguf``."""
    if is_gguf_file(path):
        return True
    p = Path(path)
    try:
        return p.is_dir() and not (p / "config.json").is_file() and bool(gguf_files(p))
    except (OSError, ValueError):
        return False


def _reader(path: Path, shown: str) -> Any:
    """The file's reader (one parse per ``gguf_reads.shared_reads`` scope); UnsupportedModel
    naming ``shown`` when it cannot be read."""
    try:
        return parse(path)
    except GGUFTensorError as err:
        raise UnsupportedModel(f"{shown}: not a readable GGUF file: {err}") from None
    except (OSError, ValueError, KeyError, IndexError, TypeError) as err:
        raise UnsupportedModel(f"{shown}: not a readable GGUF file ({type(err).__name__})") \
            from None


def gguf_parameters(path: str | os.PathLike[str], *, shown: str) -> int:
    """Elements of every tensor in a GGUF file (its header only: the data stays mapped, unread)."""
    return sum(int(t.n_elements) for t in _reader(Path(path), shown).tensors)


def gguf_metadata(path: Path, *, shown: str, prefixes: tuple[str, ...] = ("general.",)) -> dict[str, Any]:
    """The file's metadata whose keys start with ``prefixes`` or with its architecture's name
    (``llama.``, ``qwen3.``): key -> value (lists and strings as stored; no tokenizer arrays)."""
    reader = _reader(path, shown)
    arch = _field(reader, "general.architecture")
    keep = prefixes + ((f"{arch}.",) if isinstance(arch, str) else ())
    return {key: _field(reader, key) for key in reader.fields if key.startswith(keep)}


def _field(reader: Any, key: str) -> Any:
    """The value of a metadata key (None when absent)."""
    field = reader.fields.get(key)
    if field is None:
        return None
    try:
        return field.contents()
    except (ValueError, IndexError, TypeError, UnicodeDecodeError):
        return None


def _field_int(reader: Any, arch: str, *names: str) -> Any:
    """The first of ``names`` present, as an int where it is a whole number (else as stored,
    for ``shapes.bounded_int`` to refuse by name); None when none is present."""
    for n in names:
        value = _field(reader, f"{arch}.{n}")
        if isinstance(value, list):  # per-layer head counts: take the first layer's
            value = value[0] if value else None
        if value is not None:
            try:
                return int(value) if float(value).is_integer() else value
            except (TypeError, ValueError, OverflowError):
                return value
    return None


def check_block_count(reader: Any, arch: str, tensors: dict[str, Any], *, shown: str) -> None:
    """Refuse a file whose ``{arch}.block_count`` is not the number of blocks it holds (the
    distinct ``blk.{i}.`` indices, every one below it): a count of 10**9 over 30 blocks must
    not be served as 30 layers."""
    count = _field_int(reader, arch, "block_count")
    if count is None:
        return
    field = f"{arch}.block_count"
    count = bounded_int(count, field=field, hi=CONFIG_FIELDS["layers"][1], shown=shown)
    blocks = sorted({int(m.group(1)) for n in tensors if (m := _BLOCK.match(n))})
    if len(blocks) != count or (blocks and blocks[-1] >= count):
        held = f"blk.{blocks[0]} .. blk.{blocks[-1]}" if blocks else "none"
        raise InvalidInput(f"{shown}: {field} is {count}, but the file holds {len(blocks)} blocks "
                           f"({held})")


def reverse_permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's rotary row permutation of a Q/K weight [n_head*d_head, d_in] (as
    transformers' ``_reverse_permute_weights``, with ``n_head`` the heads of that weight)."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def _dequantized(tensor: Any) -> torch.Tensor:
    """One GGUF tensor as float32 [rows, cols] in PyTorch (nn.Linear: [out, in]) orientation."""
    from gguf.quants import dequantize

    array = dequantize(tensor.data, tensor.tensor_type)
    return torch.from_numpy(array.copy()).to(torch.float32)


def quantization_name(types: list[str]) -> str:
    """The quantization of a set of tensor types: one name, or ``"Q4_K+Q6_K"`` when mixed."""
    counts = Counter(types)
    return "+".join(sorted(counts, key=lambda t: (-counts[t], t)))


def load_gguf_tokenizer(path: Path) -> Any | None:
    """A Hugging Face tokenizer built from the GGUF's own tokenizer metadata (None when the
    file has none or transformers cannot convert it)."""
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name,
                                             local_files_only=True)
    except Exception:  # any converter failure: the model still loads, tokens are "#<id>"
        return None


# Attention weights over this size in float32 are kept in float16 (a 7B model's: 8.6 GB in
# float32, 4.3 in float16). Decided by the model's shapes, not the machine, so a file has one
# fingerprint everywhere; a dequantized GGUF value (a small integer times a float16 scale, or a
# float16/bfloat16 weight) keeps ~11 significant bits, as float16 does.
LARGE_ATTENTION_BYTES = 2 << 30


def load_heads_gguf(path: str | os.PathLike[str], *, device: str | torch.device | None = None,
                    dtype: torch.dtype | None = None, name: str | None = None,
                    tokenizer: bool = True) -> HeadWeights:
    """Per-head attention weights (and unembedding) of a GGUF file, dequantized tensor by tensor.

    ``path``: the ``.gguf`` file (or a folder holding exactly one); ``name``: what ModelInfo
    and messages call it (default: the path); ``dtype``: of the weights (default float32, or
    float16 above LARGE_ATTENTION_BYTES of float32 attention weights). Returns HeadWeights in TL layout (W_Q
    [L, H, d_model, d_head], W_K/W_V [L, H_kv, ...], W_O [L, H, d_head, d_model], W_U
    [d_model, d_vocab]), processing "raw", source "gguf", with the file's tokenizer when
    ``tokenizer`` and it can be built.
    """
    shown = name or str(path)
    file = find_gguf(path, shown=shown)
    reader = _reader(file, shown)
    arch = str(_field(reader, "general.architecture") or "")
    H = _field_int(reader, arch, "attention.head_count")
    d_model = _field_int(reader, arch, "embedding_length")
    if not arch or H is None or d_model is None:
        raise UnsupportedModel(f"{shown}: GGUF metadata lacks the architecture, head count or "
                               "embedding length")
    H = bounded_int(H, field=f"{arch}.attention.head_count", hi=1024, shown=shown)
    d_model = bounded_int(d_model, field=f"{arch}.embedding_length", hi=65536, shown=shown)
    kv = _field_int(reader, arch, "attention.head_count_kv")  # absent: one per query head
    H_kv = bounded_int(H if kv is None else kv, field=f"{arch}.attention.head_count_kv", hi=H, shown=shown)
    if H % H_kv:
        raise InvalidInput(f"{shown}: {H} attention heads are not a multiple of {H_kv} key/value heads")
    key_length = _field_int(reader, arch, "attention.key_length")  # absent: the width split in heads
    d_head = bounded_int(d_model // H if key_length is None else key_length,
                         field=f"{arch}.attention.key_length", hi=8192, shown=shown)
    tensors = {t.name: t for t in reader.tensors}
    layers = sorted({int(m.group(1)) for n in tensors if (m := _ATTN_Q.match(n))})
    if not layers:
        fused = any(n.endswith(".attn_qkv.weight") for n in tensors)
        raise UnsupportedModel(f"{shown}: no separate attn_q/attn_k/attn_v tensors in this GGUF"
                               + (" (fused attn_qkv is not supported)" if fused else ""))
    check_block_count(reader, arch, tensors, shown=shown)
    declared = f"shapes (head_count {H}, head_count_kv {H_kv}, key_length {d_head}, embedding_length {d_model})"
    for role, heads in (("attn_q", H), ("attn_k", H_kv), ("attn_v", H_kv), ("attn_output", H)):
        key = f"blk.{layers[0]}.{role}.weight"
        if key in tensors:  # checked before anything of the declared size is allocated
            check_tensor_size(key, int(tensors[key].n_elements), heads * d_head * d_model,
                              shown=shown, declared=declared)
    L = len(layers)
    if dtype is None:
        elements = L * (2 * H + 2 * H_kv) * d_model * d_head
        dtype = torch.float16 if 4 * elements > LARGE_ATTENTION_BYTES else torch.float32
    W_Q = torch.empty(L, H, d_model, d_head, dtype=dtype)
    W_K = torch.empty(L, H_kv, d_model, d_head, dtype=dtype)
    W_V = torch.empty(L, H_kv, d_model, d_head, dtype=dtype)
    W_O = torch.empty(L, H, d_head, d_model, dtype=dtype)
    types: list[str] = []
    permute = arch in PERMUTED_ARCHS

    def read(layer: int, role: str) -> torch.Tensor:
        key = f"blk.{layer}.{role}.weight"
        if key not in tensors:
            raise UnsupportedModel(f"{shown}: layer {layer} lacks the tensor {key}")
        types.append(tensors[key].tensor_type.name)
        return _dequantized(tensors[key])

    def linear_in(w: torch.Tensor, heads: int) -> torch.Tensor:
        """[heads*d_head, d_model] -> [heads, d_model, d_head]."""
        return w.reshape(heads, d_head, d_model).transpose(1, 2)

    try:
        for i, layer in enumerate(layers):
            q, k = read(layer, "attn_q"), read(layer, "attn_k")
            if permute:
                q, k = reverse_permute(q, H), reverse_permute(k, H_kv)
            W_Q[i] = linear_in(q, H)
            W_K[i] = linear_in(k, H_kv)
            W_V[i] = linear_in(read(layer, "attn_v"), H_kv)
            o = read(layer, "attn_output")  # [d_model, H*d_head]
            W_O[i] = o.reshape(d_model, H, d_head).permute(1, 2, 0)
    except (RuntimeError, ValueError, NotImplementedError) as err:  # shapes, unknown quant types
        raise UnsupportedModel(f"{shown}: cannot read the attention tensors of this GGUF "
                               f"({type(err).__name__}: {err})") from err
    unembed = tensors.get("output.weight") or tensors.get("token_embd.weight")
    W_U = None
    if unembed is not None:
        try:
            W_U = _dequantized(unembed).T.to(dtype).contiguous()
        except (RuntimeError, ValueError, NotImplementedError):
            W_U = None
        if W_U is not None and W_U.shape[0] != d_model:
            W_U = None
    if device is not None:
        W_Q, W_K, W_V, W_O = (t.to(device) for t in (W_Q, W_K, W_V, W_O))
        W_U = W_U.to(device) if W_U is not None else None
    info = ModelInfo(
        name=shown, architecture=arch, n_layers=L, n_heads=H, n_kv_heads=H_kv,
        d_model=d_model, d_head=d_head, d_vocab=None if W_U is None else int(W_U.shape[1]),
        dtype=str(dtype).replace("torch.", ""), layer_indices=tuple(layers),
        processing="raw", source="gguf", quantization=quantization_name(types),
    )
    fp = weights_fingerprint([W_Q, W_K, W_V, W_O, W_U], processing="raw",
                             extra=",".join(map(str, info.layer_indices)))
    tok = load_gguf_tokenizer(file) if tokenizer else None
    return HeadWeights(info=info, W_Q=W_Q, W_K=W_K, W_V=W_V, W_O=W_O, W_U=W_U, fingerprint=fp,
                       tokenizer=tok)


def gguf_norm_gains(path: str | os.PathLike[str], layer_indices: tuple[int, ...], *,
                    shown: str | None = None) -> NormGains:
    """Gains of the norms around attention of a GGUF file's layers (core.models.norm_fold's
    NormGains, float64): ``blk.{i}.attn_norm.weight`` before attention and, where the file has
    them (Gemma 2/3), ``blk.{i}.post_attention_norm.weight`` after it. llama.cpp stores the
    gain a norm applies (its converter adds Gemma's 1 to the weight), so they are used as read.
    """
    shown = shown or str(path)
    reader = _reader(find_gguf(path, shown=shown), shown)
    tensors = {t.name: t for t in reader.tensors}

    def gains(role: str) -> list[torch.Tensor] | None:
        keys = [f"blk.{layer}.{role}.weight" for layer in layer_indices]
        if not any(k in tensors for k in keys):
            return None
        missing = [k for k in keys if k not in tensors]
        if missing:
            raise UnsupportedModel(f"{shown}: some layers lack their {role} ({missing[0]})")
        try:
            return [_dequantized(tensors[k]).to(torch.float64).reshape(-1) for k in keys]
        except (RuntimeError, ValueError, NotImplementedError) as err:
            raise UnsupportedModel(f"{shown}: cannot read {role} ({type(err).__name__}: {err})") from err

    pre, post = gains("attn_norm"), gains("post_attention_norm")
    if pre is None:
        raise UnsupportedModel(f"{shown}: no attn_norm tensors: the pre-attention norm is unknown")
    return NormGains(pre=torch.stack(pre), post=None if post is None else torch.stack(post),
                     kind="GGUF attn_norm" + (" with post-attention norms" if post else ""))
