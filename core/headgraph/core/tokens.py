"""Token names for head subspaces: which unembedding directions lie most inside a head-role subspace.

For a head's role subspace with orthonormal basis U [d_model, r] (``role_bases``) and the
vocabulary-centred unembedding vectors ũ_t = u_t - mean_t' u_t' (u_t = W_U[:, t]), the score of
token t is the fraction of its vector's norm inside the subspace::

    score(t) = ||U^T ũ_t||_2 / ||ũ_t||_2        in [0, 1]   (0 when ũ_t = 0)

Centring removes the direction all logits share (it does not change any softmax), and
normalising keeps tokens with large unembedding norms from winning by size alone.

Decoded strings come in two forms: ``text``, the token's exact text (GPT-2 byte-level "Ġthe"
-> " the", "Ċ" -> "\\n"; bytes that are not whole UTF-8 characters -> "\\xNN"), and ``display``,
the same with whitespace made visible: space -> "␣", newline -> "↵", tab -> "⇥", CR -> "␍".
A model with no tokenizer gets ``"#<id>"`` names.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch

from headgraph.core.errors import InvalidInput, UnsupportedModel
from headgraph.core.subspaces import role_bases
from headgraph.core.types import HeadWeights
from headgraph.core.vocabulary import check_role, head_label

FORMULA = ("score(t) = ||U^T (u_t - mean_t u_t)|| / ||u_t - mean_t u_t||, "
           "U orthonormal basis of the head-role subspace")
# Elements of one [heads*r, vocab-tile] product; bounds memory for 50k-token vocabularies.
TILE_ELEMENTS = 1 << 24
_VISIBLE = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"}


@dataclass(frozen=True)
class TokenTable:
    """Top-k tokens per head of one role.

    token_ids / scores: [n_layers, n_heads, k] (CPU), best first; layers: original block
    numbers of the rows; heads: head indices of the columns (KV heads for K/V under GQA);
    names: node names ("L4H7" or "L5KV1"); text / display: decoded strings [n_layers][n_heads][k].
    """

    role: str
    k: int
    layers: tuple[int, ...]
    heads: tuple[int, ...]
    names: tuple[tuple[str, ...], ...]
    token_ids: torch.Tensor
    scores: torch.Tensor
    text: tuple[tuple[tuple[str, ...], ...], ...]
    display: tuple[tuple[tuple[str, ...], ...], ...]
    formula: str = FORMULA

    def for_head(self, layer: int, head: int) -> list[dict[str, Any]]:
        """Ranked tokens of one head (layer = original block number)."""
        i, j = self.layers.index(layer), self.heads.index(head)
        return [{"id": int(t), "score": float(s), "text": self.text[i][j][n],
                 "display": self.display[i][j][n]}
                for n, (t, s) in enumerate(zip(self.token_ids[i, j].tolist(),
                                               self.scores[i, j].tolist()))]

    def to_dict(self) -> dict[str, Any]:
        """JSON form: role, k, formula and one entry per head with its ranked tokens."""
        return {"role": self.role, "k": self.k, "formula": self.formula,
                "heads": [{"name": self.names[i][j], "layer": layer, "head": head,
                           "tokens": self.for_head(layer, head)}
                          for i, layer in enumerate(self.layers)
                          for j, head in enumerate(self.heads)]}


def subspace_token_scores(U: torch.Tensor, W_U: torch.Tensor, k: int,
                          *, tile_elements: int = TILE_ELEMENTS) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k (scores, token ids) of ``score(t)`` for every basis in ``U`` [N, d_model, r].

    One matmul per vocabulary tile for all N heads at once; returns [N, k] each, best first
    (ties: lower token id first). Works on U's device; computes in float32 (float64 if given).
    """
    dtype = torch.float64 if torch.float64 in (U.dtype, W_U.dtype) else torch.float32
    U = U.to(dtype)
    W = W_U.to(U.device)  # [d, V], kept in its dtype; tiles are converted (no full copy)
    N, d, r = U.shape
    V = W.shape[1]
    k = min(int(k), V)
    Ut = U.transpose(1, 2).reshape(N * r, d)
    tile = max(1, tile_elements // max(N * r, 1))
    total = torch.zeros(d, dtype=torch.float64, device=U.device)
    for v0 in range(0, V, tile):
        total += W[:, v0: v0 + tile].to(torch.float64).sum(dim=1)
    mean = (total / V).to(dtype)[:, None]  # centre over the vocabulary
    best_s = torch.empty(N, 0, dtype=dtype, device=U.device)
    best_i = torch.empty(N, 0, dtype=torch.long, device=U.device)
    for v0 in range(0, V, tile):
        C = W[:, v0: v0 + tile].to(dtype) - mean  # [d, c] centred token vectors
        inside = (Ut @ C).reshape(N, r, -1).square().sum(dim=1)  # [N, c] = ||U^T ũ_t||^2
        total = C.square().sum(dim=0)  # [c] = ||ũ_t||^2
        s = torch.where(total > 0, (inside / total.clamp_min(torch.finfo(dtype).tiny)).sqrt(),
                        torch.zeros_like(inside)).clamp(max=1.0)
        ids = torch.arange(v0, v0 + C.shape[1], device=U.device).expand(N, -1)
        cat_s, cat_i = torch.cat([best_s, s], dim=1), torch.cat([best_i, ids], dim=1)
        order = torch.sort(cat_s, dim=1, descending=True, stable=True).indices[:, :k]
        best_s, best_i = cat_s.gather(1, order), cat_i.gather(1, order)
    return best_s, best_i


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


def top_tokens(heads: HeadWeights, role: str, *, k: int = 10, layer: int | None = None,
               head: int | None = None) -> TokenTable:
    """Top-k tokens of every head's ``role`` subspace (optionally one layer and/or head).

    ``layer`` is an ORIGINAL block number (as in node names), ``head`` an index among the role's
    heads (KV heads for K/V). Score: see the module docstring / ``FORMULA``.
    Raises UnsupportedModel when the model has no unembedding W_U.
    """
    check_role(role)
    if heads.W_U is None:
        raise UnsupportedModel(f"{heads.info.name} has no unembedding (W_U): token names of "
                               "head subspaces need one")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise InvalidInput(f"k must be an integer >= 1, got {k!r}")
    info = heads.info
    U = role_bases(heads, role).U  # [L, H, d_model, r]
    rows = list(range(U.shape[0]))
    cols = list(range(U.shape[1]))
    if layer is not None:
        if layer not in info.layer_indices:
            raise InvalidInput(f"layer {layer} is not an attention layer of {info.name} "
                             f"({list(info.layer_indices)})")
        rows = [info.layer_indices.index(layer)]
    if head is not None:
        if not 0 <= head < U.shape[1]:
            raise InvalidInput(f"head {head} out of range for role {role} (0..{U.shape[1] - 1})")
        cols = [head]
    sub = U[rows][:, cols]  # [nL, nH, d, r]
    nL, nH, d, r = sub.shape
    s, ids = subspace_token_scores(sub.reshape(nL * nH, d, r), heads.W_U, k)
    kk = s.shape[1]
    s, ids = s.reshape(nL, nH, kk).cpu(), ids.reshape(nL, nH, kk).cpu()
    flat = ids.flatten().tolist()
    uniq = sorted(set(flat))
    names = dict(zip(uniq, decode_tokens(heads.tokenizer, uniq)))
    text = tuple(tuple(tuple(names[t] for t in ids[i, j].tolist()) for j in range(nH))
                 for i in range(nL))
    display = tuple(tuple(tuple(visible(x) for x in cell) for cell in row) for row in text)
    grouped = role in ("K", "V") and info.n_kv_heads < info.n_heads
    layers = tuple(info.layer_indices[i] for i in rows)
    return TokenTable(role=role, k=kk, layers=layers, heads=tuple(cols),
                      names=tuple(tuple(head_label(lay, h, kv=grouped) for h in cols)
                                  for lay in layers),
                      token_ids=ids, scores=s,
                      text=text, display=display)
