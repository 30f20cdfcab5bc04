"""Token names of head subspaces vs a float64 numpy reference (own QR bases), and decoding."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from headgraph.core.models.demo import DemoConfig, DemoModel
from headgraph.core.errors import InvalidInput, UnsupportedModel
from headgraph.core.readout.token_text import decode_tokens, visible
from headgraph.core.readout.tokens import subspace_token_scores, top_tokens
from headgraph.core.types import HeadWeights, ModelInfo

torch.set_num_threads(1)

CORPUS = ["The quick brown fox jumps over the lazy dog.\nThen the dog sleeps.",
          "café naïve — ünïcödé 東京", "def f(x):\n\treturn x + 1\n"] * 20


def _train(pre, dec, alphabet):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre
    tok.decoder = dec
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=330, initial_alphabet=alphabet, special_tokens=["<|endoftext|>"]))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


@pytest.fixture(scope="module")
def bpe():
    """A tiny GPT-2-style byte-level BPE tokenizer trained here (no download)."""
    return _train(pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel(),
                  pre_tokenizers.ByteLevel.alphabet())


def make_heads(tokenizer, *, L=2, H=4, Hkv=None, d=64, dh=16, V=None, seed=0,
               layer_indices=None) -> HeadWeights:
    g = torch.Generator().manual_seed(seed)
    Hkv = H if Hkv is None else Hkv
    V = len(tokenizer) if V is None else V
    info = ModelInfo(name="tiny", architecture="GPT2LMHeadModel", n_layers=L, n_heads=H,
                     n_kv_heads=Hkv, d_model=d, d_head=dh, d_vocab=V, dtype="float32",
                     layer_indices=tuple(range(L)) if layer_indices is None else layer_indices,
                     processing="raw", source="local")
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return HeadWeights(info=info, W_Q=r(L, H, d, dh), W_K=r(L, Hkv, d, dh), W_V=r(L, Hkv, d, dh),
                       W_O=r(L, H, dh, d), W_U=r(d, V) + 0.5 * r(d, 1), fingerprint=f"t{seed}",
                       tokenizer=tokenizer)


def numpy_reference(heads: HeadWeights, role: str, k: int):
    """Float64 numpy: QR basis of the raw role weights, centred W_U, ||Q^T u|| / ||u||."""
    w = heads.role(role).double().numpy()
    WU = heads.W_U.double().numpy()
    Wc = WU - WU.mean(axis=1, keepdims=True)
    L, H = w.shape[:2]
    ids = np.zeros((L, H, k), dtype=np.int64)
    scores = np.zeros((L, H, k))
    for layer in range(L):
        for h in range(H):
            q, _ = np.linalg.qr(w[layer, h])
            s = np.linalg.norm(q.T @ Wc, axis=0) / np.linalg.norm(Wc, axis=0)
            top = np.argsort(-s, kind="stable")[:k]
            ids[layer, h], scores[layer, h] = top, s[top]
    return ids, scores


@pytest.mark.parametrize("role", ["Q", "K", "V", "O"])
def test_top_tokens_match_float64_reference(bpe, role):
    heads = make_heads(bpe)
    table = top_tokens(heads, role, k=8)
    ids, scores = numpy_reference(heads, role, 8)
    assert table.token_ids.shape == (2, 4, 8)
    assert np.array_equal(table.token_ids.numpy(), ids)
    np.testing.assert_allclose(table.scores.double().numpy(), scores, atol=1e-5)
    assert bool(((table.scores > 0) & (table.scores <= 1)).all())
    assert not [key for key in heads._cache if key[0] == "bases"]  # a layer at a time, none kept
    one_by_one = top_tokens(heads, role, k=8, bases_bytes=1)  # every layer scored alone
    assert torch.equal(one_by_one.token_ids, table.token_ids)
    assert torch.allclose(one_by_one.scores, table.scores, atol=1e-6)


def test_layer_bases_are_the_role_bases_rows(bpe):
    """What the token tables read a layer at a time equals the whole role's bases, a
    rank-deficient head (columns past its rank zero) included."""
    from headgraph.core.scores.subspaces import layer_bases, role_bases

    heads = make_heads(bpe, L=3, seed=4)
    heads.W_V[1, 2, :, 3] = heads.W_V[1, 2, :, 0]
    alone = [layer_bases(heads, "V", layer) for layer in range(3)]
    whole = role_bases(heads, "V")
    for layer, (u, ranks) in enumerate(alone):
        assert torch.equal(ranks, whole.ranks[layer])
        assert (u - whole.U[layer]).abs().max() < 1e-6
    assert int(alone[1][1][2]) == whole.rank - 1 and bool((alone[1][0][2, :, -1] == 0).all())


def test_scores_ignore_a_shift_shared_by_all_tokens(bpe):
    heads = make_heads(bpe, seed=1)
    shifted = make_heads(bpe, seed=1)
    shifted.W_U = heads.W_U + 10.0 * torch.randn(heads.info.d_model, 1)
    a, b = top_tokens(heads, "O", k=5), top_tokens(shifted, "O", k=5)
    assert torch.equal(a.token_ids, b.token_ids)
    assert torch.allclose(a.scores, b.scores, atol=1e-5)


def test_vocab_tiling_gives_identical_results(bpe):
    heads = make_heads(bpe, seed=2)
    from headgraph.core.scores.subspaces import role_bases

    U = role_bases(heads, "V").U.reshape(8, 64, 16)
    s_big, i_big = subspace_token_scores(U, heads.W_U, 7)
    s_small, i_small = subspace_token_scores(U, heads.W_U, 7, tile_elements=8 * 16 * 3)
    assert torch.equal(i_big, i_small)
    assert torch.allclose(s_big, s_small, atol=1e-6)


def test_layer_and_head_filters_use_original_blocks(bpe):
    heads = make_heads(bpe, L=3, seed=3, layer_indices=(0, 4, 9))
    full = top_tokens(heads, "Q", k=4)
    one = top_tokens(heads, "Q", k=4, layer=4, head=2)
    assert one.layers == (4,) and one.heads == (2,) and one.names == (("L4H2",),)
    assert torch.equal(one.token_ids[0, 0], full.token_ids[1, 2])
    row = top_tokens(heads, "Q", k=4, layer=9)
    assert torch.equal(row.token_ids[0], full.token_ids[2])
    with pytest.raises(InvalidInput, match="not an attention layer"):
        top_tokens(heads, "Q", layer=1)
    with pytest.raises(InvalidInput, match="out of range"):
        top_tokens(heads, "Q", head=4)


def test_gqa_kv_heads_are_named_by_group(bpe):
    heads = make_heads(bpe, H=4, Hkv=2, seed=4)
    t = top_tokens(heads, "K", k=3)
    assert t.token_ids.shape == (2, 2, 3)
    assert t.names[1] == ("L1KV0", "L1KV1")
    ids, _scores = numpy_reference(heads, "K", 3)
    assert np.array_equal(t.token_ids.numpy(), ids)


def test_byte_level_decoding_matches_the_tokenizer(bpe):
    ids = list(range(len(bpe)))
    ours = decode_tokens(bpe, ids)
    pieces = bpe.convert_ids_to_tokens(ids)
    for i, text, piece in zip(ids, ours, pieces):
        ref = bpe.decode([i])
        if "\ufffd" in ref:  # not a whole UTF-8 character: we show the bytes instead
            assert "\\x" in text
        else:
            assert text == ref
        if piece.startswith("Ġ"):
            assert text.startswith(" ") and visible(text).startswith("␣")
    newline = bpe.convert_tokens_to_ids("Ċ")
    assert decode_tokens(bpe, [newline]) == ["\n"] and visible("\n") == "↵"
    assert visible("a\tb c\x01") == "a⇥b␣c\\x01"


def test_sentencepiece_style_pieces_keep_their_leading_space():
    sp = _train(pre_tokenizers.Metaspace(), decoders.Metaspace(), [])
    pieces = sp.convert_ids_to_tokens(list(range(len(sp))))
    ids = [i for i, p in enumerate(pieces) if p.startswith("▁") and len(p) > 1]
    assert ids
    anchor = sp.convert_tokens_to_ids("▁The")
    ours = decode_tokens(sp, ids)
    for i, text in zip(ids, ours):
        # the piece's text in context: decode(anchor + piece) minus decode(anchor)
        ref = sp.decode([anchor, i])[len(sp.decode([anchor])):]
        assert text == ref and text.startswith(" ")


def test_table_text_and_json(bpe):
    heads = make_heads(bpe, seed=5)
    t = top_tokens(heads, "O", k=3)
    names = decode_tokens(bpe, t.token_ids.flatten().tolist())
    assert [x for row in t.text for cell in row for x in cell] == names
    assert t.display[0][0] == tuple(visible(x) for x in t.text[0][0])
    d = json.loads(json.dumps(t.to_dict()))
    assert d["role"] == "O" and len(d["heads"]) == 8 and d["heads"][5]["name"] == "L1H1"
    first = d["heads"][0]["tokens"][0]
    assert first["id"] == int(t.token_ids[0, 0, 0])
    assert first["score"] == pytest.approx(float(t.scores[0, 0, 0]))
    assert "||U^T" in d["formula"]


def test_no_unembedding_and_no_tokenizer(bpe):
    heads = make_heads(bpe, seed=6)
    heads.tokenizer = None
    t = top_tokens(heads, "V", k=2)
    assert t.text[0][0] == tuple(f"#{i}" for i in t.token_ids[0, 0].tolist())
    heads.W_U = None
    with pytest.raises(UnsupportedModel, match="no unembedding"):
        top_tokens(heads, "V")
    # ids beyond the tokenizer's vocabulary (padded unembedding) get id names
    assert decode_tokens(bpe, [len(bpe) + 3]) == [f"#{len(bpe) + 3}"]


def test_demo_model_names_its_tokens():
    model = DemoModel(DemoConfig(), seed=0)
    heads = model.head_weights()
    t = top_tokens(heads, "O", k=4)
    names = model.cfg.token_names
    assert all(t.text[i][j][n] == names[int(t.token_ids[i, j, n])]
               for i in range(2) for j in range(8) for n in range(4))
