"""Token ids to text: each token's exact text and a display form with whitespace made visible.

``text`` is the token's exact text (GPT-2 byte-level "Ġthe" -> " the", "Ċ" -> "\\n"; SentencePiece
"▁the" -> " the", "<0x0A>" -> "\\n"; bytes that are not whole UTF-8 characters -> "\\xNN");
``display`` (``visible``) is the same with whitespace shown: space -> "␣", newline -> "↵",
tab -> "⇥", CR -> "␍". A token that cannot be named is ``"#<id>"``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import torch

_VISIBLE = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"}


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: printable stand-in character -> byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def _bytes_text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="backslashreplace")


def visible(text: str) -> str:
    """``text`` with whitespace shown (space ␣, newline ↵, tab ⇥, CR ␍), other controls as \\xNN."""
    out = []
    for ch in text:
        if ch in _VISIBLE:
            out.append(_VISIBLE[ch])
        elif ord(ch) < 32 or ord(ch) == 127:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "".join(out)


def _sp_text(token: str) -> str:
    """SentencePiece piece -> text ("▁" is a space, "<0x0A>" a raw byte)."""
    if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        try:
            return _bytes_text(bytes([int(token[3:5], 16)]))
        except ValueError:
            return token
    return token.replace("▁", " ")


def decode_tokens(tokenizer: Any, ids: list[int]) -> list[str]:
    """Exact text of each token id (see module docstring); ``"#<id>"`` when it cannot be named.

    HF tokenizers: byte-level BPE pieces go through GPT-2's byte decoder, SentencePiece pieces
    through "▁" -> space, others through ``tokenizer.decode([id])``. Objects with
    ``to_str_tokens`` (the demo model) are asked directly.
    """
    if tokenizer is None:
        return [f"#{i}" for i in ids]
    if hasattr(tokenizer, "convert_ids_to_tokens"):
        n_vocab = len(tokenizer) if hasattr(tokenizer, "__len__") else None
        vocab = tokenizer.convert_ids_to_tokens(list(range(n_vocab))) if n_vocab else []
        bd = _byte_decoder()
        pieces = [t for t in vocab if t]
        n_bytes = sum(all(ch in bd for ch in t) for t in pieces)
        byte_level = bool(pieces) and n_bytes >= 0.99 * len(pieces) and \
            any(any(ord(ch) >= 256 and ch in bd for ch in t) for t in pieces)
        sentencepiece = not byte_level and sum("▁" in t for t in pieces) > 0.05 * max(len(pieces), 1)
        out = []
        for i in ids:
            tok = vocab[i] if n_vocab and 0 <= i < n_vocab else None
            if not tok:
                out.append(f"#{i}")
            elif byte_level and all(ch in bd for ch in tok):
                out.append(_bytes_text(bytes(bd[ch] for ch in tok)))
            elif sentencepiece:
                out.append(_sp_text(tok))
            else:
                out.append(tokenizer.decode([i]) if hasattr(tokenizer, "decode") else tok)
        return out
    if hasattr(tokenizer, "to_str_tokens"):
        return list(tokenizer.to_str_tokens(torch.tensor(ids, dtype=torch.long)))
    if hasattr(tokenizer, "decode"):
        return [tokenizer.decode([i]) for i in ids]
    return [f"#{i}" for i in ids]


__all__ = ["decode_tokens", "visible"]
