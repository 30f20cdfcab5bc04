"""Path ablation (core.ablation): activation-level effects of head-graph edges.

Checked against independent references: a float64 re-implementation of the demo model's
forward written here from its weights (delta added to the target layer's inputs), and, for
random-weight GPT-2 and grouped-query Qwen2 bridges, a manual patched forward through other
TransformerLens hooks (delta through the LayerNorm by hand, added at the q/k/v linears'
inputs) with weights read from the saved checkpoint. Plus the issue-15 acceptance criterion
(the demo's K-path effects put L0H0 first for every layer-1 target), zero effect for a
source whose output is constant, input validation and split-half reliability.

The server side (GET /api/ablation, /api/validation, `headgraph verify`) is in
tests/server/test_ablation_api.py.
"""

from __future__ import annotations

import copy

import pytest
import torch

from headgraph.core.activations.ablation import (Edge, ablation_runner, path_ablation, path_of_pairing,
                                     top_edges)
from headgraph.core.errors import InvalidInput, UnsupportedModel
from headgraph.core.models.loading import load_model
from headgraph.core.models.runnable import BridgePatternSource
from headgraph.core.scores.pk import projection_kernel

TEXTS = ["The quick brown fox jumps over the lazy dog.", "When Mary and John went to the store,",
         "The lazy dog", "Mary went to the quick fox and the dog,"]

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one torch thread


@pytest.fixture(scope="module")
def demo():
    return load_model("demo", device="cpu")


@pytest.fixture(scope="module")
def demo_all_k(demo):
    H = demo.info.n_heads
    return path_ablation(demo, [Edge(0, s, 1, t, "K") for s in range(H) for t in range(H)])


def test_demo_k_path_puts_l0h0_first_for_every_layer1_target(demo_all_k):
    H = 8
    for prompt_set in ("text", "random"):
        eff = demo_all_k.effect(prompt_set).reshape(H, H)  # [source head, target head]
        assert eff.argmax(0).tolist() == [0] * H, (prompt_set, eff)
        assert float(eff[0].min()) > 1.5 * float(eff[1:].max())
    assert demo_all_k.n_prompts == {"text": 20, "random": 20}


def test_reliability_is_reported(demo_all_k):
    d = demo_all_k.to_dict()
    for prompt_set in ("text", "random"):
        rel = d["reliability"][prompt_set]
        assert -1 <= rel["reliability"] <= 1 and -1 <= rel["r_half"] <= 1
        assert rel["n_edges"] == 64 and rel["n_prompts"] == [10, 10]
        assert rel["reliability"] > 0.8  # the demo's effects are stable across halves
    edge = d["edges"][0]
    assert edge["source"] == "L0H0" and edge["target"] == "L1H0" and edge["measure"] == "tvd"
    assert set(edge) >= {"effect_text", "effect_random", "halves", "path"}


# -- the float64 reference for the demo -------------------------------------------------------

def demo_reference(model, ids, mask, sl, sh, tl, path, ablation="mean"):
    """The effect, by hand in float64: the demo's forward written out, S's mean-ablated (or
    resample-ablated: the next prompt's z_S, the mean where that prompt is shorter) output
    change added (through the frozen-scale LayerNorm) to layer tl's P input only."""
    p = {k: v.detach().double() for k, v in model.state_dict().items()}
    cfg = model.cfg
    T = ids.shape[1]
    pos = p["W_pos"][:T]
    causal = torch.ones(T, T, dtype=torch.bool).tril()

    def attention(layer, q_in, k_in, v_in):
        q = torch.einsum("bpd,hde->bhpe", q_in, p["W_Q"][layer]) + p["b_Q"][layer][:, None]
        k = torch.einsum("bpd,hde->bhpe", k_in, p["W_K"][layer]) + p["b_K"][layer][:, None]
        v = torch.einsum("bpd,hde->bhpe", v_in, p["W_V"][layer]) + p["b_V"][layer][:, None]
        scores = q @ k.transpose(-1, -2) / cfg.d_head ** 0.5
        pattern = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        return pattern, pattern @ v  # [b,h,q,k], [b,h,p,e]

    x = p["W_E"][ids]
    clean = []
    for layer in range(cfg.n_layers):
        mu = x.mean(-1, keepdim=True)
        scale = ((x - mu) ** 2).mean(-1, keepdim=True).add(cfg.ln_eps).sqrt()
        h = (x - mu) / scale * p["ln_w"][layer] + p["ln_b"][layer]
        pattern, z = attention(layer, h + pos, h + pos, h)
        clean.append((h, scale, pattern, z))
        x = x + torch.einsum("bhpe,hed->bpd", z, p["W_O"][layer]) + p["b_O"][layer]
    z_s = clean[sl][3][:, sh]  # [b, p, e]
    mean = z_s[mask].mean(0)
    new = mean.expand_as(z_s)
    if ablation == "resample":
        new = torch.stack([torch.where(mask[(i + 1) % len(ids)][:, None], z_s[(i + 1) % len(ids)], mean)
                           for i in range(len(ids))])
    delta = ((new - z_s) @ p["W_O"][sl, sh]) * mask[..., None]
    h, scale, pattern, z = clean[tl]
    ld = (delta - delta.mean(-1, keepdim=True)) / scale * p["ln_w"][tl]
    ins = {"Q": h + pos, "K": h + pos, "V": h}
    ins[path] = ins[path] + ld
    pattern1, z1 = attention(tl, ins["Q"], ins["K"], ins["V"])
    valid = (mask & (torch.arange(T) >= 1)).double()  # [b, p]
    if path == "V":
        o0 = torch.einsum("bhpe,hed->bhpd", z, p["W_O"][tl])
        o1 = torch.einsum("bhpe,hed->bhpd", z1, p["W_O"][tl])
        num = ((o1 - o0).norm(dim=-1) * valid[:, None]).sum(dim=(0, 2))
        return num / (o0.norm(dim=-1) * valid[:, None]).sum(dim=(0, 2))  # per target head
    tvd = 0.5 * (pattern1 - pattern).abs().sum(-1)  # [b, h, q]
    return (tvd * valid[:, None]).sum(dim=(0, 2)) / valid.sum()


@pytest.mark.parametrize(("sl", "sh", "path"), [(0, 0, "K"), (0, 6, "Q"), (0, 3, "V")])
def test_demo_matches_float64_reference(demo, sl, sh, path):
    model = demo.patterns
    H = demo.info.n_heads
    prompts = ["t01 t02 t03 t04 t01 t02 t03", "t10 t11 t12 t13 t14 t15 t10 t11 t12 t13 t14",
               "When Mary and John went to the shops, John gave the bag to"]
    result = path_ablation(model, [Edge(sl, sh, 1, t, path) for t in range(H)], prompts=prompts,
                           induction_batch=3)
    ids, mask = model.tokenize(prompts)
    ref = demo_reference(model, ids, mask, sl, sh, 1, path)
    ours = result.effect("text")
    assert float(ref.max()) > 1e-3  # a real effect, not 0 == 0
    torch.testing.assert_close(ours, ref, rtol=2e-4, atol=1e-6)


@pytest.mark.parametrize(("sl", "sh", "path"), [(0, 0, "K"), (0, 3, "V")])
def test_demo_resample_ablation_matches_float64_reference(demo, sl, sh, path):
    model = demo.patterns
    H = demo.info.n_heads
    prompts = ["t01 t02 t03 t04 t01 t02 t03", "t10 t11 t12 t13 t14 t15 t10 t11 t12 t13 t14",
               "When Mary and John went to the shops, John gave the bag to", "t05 t06 t05"]
    edges = [Edge(sl, sh, 1, t, path) for t in range(H)]
    result = path_ablation(model, edges, prompts=prompts, induction_batch=3, ablation="resample",
                           batch_size=3)  # the next prompt's z crosses a batch boundary
    ids, mask = model.tokenize(prompts)
    ref = demo_reference(model, ids, mask, sl, sh, 1, path, ablation="resample")
    assert float(ref.max()) > 1e-3
    torch.testing.assert_close(result.effect("text"), ref, rtol=2e-4, atol=1e-6)
    mean = path_ablation(model, edges, prompts=prompts, induction_batch=3)
    assert float((mean.effect("text") - ref).abs().max()) > 1e-3  # a different intervention
    assert result.to_dict()["ablation"] == "resample" and "resample" in result.to_dict()["method"]
    with pytest.raises(InvalidInput, match="unknown ablation"):
        path_ablation(model, edges, prompts=prompts, ablation="zero")


def test_constant_source_output_has_zero_effect(demo):
    model = copy.deepcopy(demo.patterns)
    with torch.no_grad():  # L0H2's values no longer depend on the input: z == b_V everywhere
        model.W_V[0, 2] = 0
        model.b_V[0, 2] = torch.linspace(-1, 1, model.cfg.d_head)
    result = path_ablation(model, [Edge(0, 2, 1, t, p) for t in (0, 5) for p in ("Q", "K", "V")])
    for e in result.effects:
        assert abs(e.effects["text"]) < 1e-5 and abs(e.effects["random"]) < 1e-5, e


def test_invalid_edges_are_refused(demo):
    with pytest.raises(InvalidInput, match="earlier layer"):
        path_ablation(demo, [Edge(1, 0, 1, 3, "K")])
    with pytest.raises(InvalidInput, match="earlier layer"):
        path_ablation(demo, [Edge(1, 0, 0, 3, "K")])
    with pytest.raises(InvalidInput, match="source_head"):
        path_ablation(demo, [Edge(0, 8, 1, 3, "K")])
    with pytest.raises(InvalidInput, match="target_layer"):
        path_ablation(demo, [Edge(0, 0, 2, 3, "K")])
    with pytest.raises(InvalidInput, match="path") as err:
        path_ablation(demo, [Edge(0, 0, 1, 3, "O")])
    assert err.value.allowed == ["Q", "K", "V"]
    with pytest.raises(InvalidInput):
        path_ablation(demo, [])
    with pytest.raises(InvalidInput):
        path_of_pairing("QK")
    assert path_of_pairing("OV") == "V"


def test_unrunnable_model_is_unsupported(demo):
    streamed = copy.copy(demo)
    streamed.patterns = None
    with pytest.raises(UnsupportedModel, match="cannot be run"):
        ablation_runner(streamed)
    with pytest.raises(UnsupportedModel):
        ablation_runner(object())


def test_top_edges_and_progress(demo):
    ok = projection_kernel(demo.heads, "OK")
    edges = top_edges(ok, 3)
    assert [(e.source_layer, e.source_head, e.path) for e in edges] == [(0, 0, "K")] * 3
    seen = []
    result = path_ablation(demo, edges, progress=lambda f, m: seen.append((f, m)))
    fractions = [f for f, _ in seen]
    assert fractions == sorted(fractions) and fractions[-1] == pytest.approx(1.0)
    assert all(isinstance(m, str) and m for _, m in seen)
    assert result.reliability["text"].n_edges == 3


# -- bridges: a manual patched forward through other TL hooks -----------------------------------

def _checkpoint_weights(folder, arch, layers):
    """W_O per layer [H, dh, d] and ln1 weights, read from the saved safetensors."""
    from safetensors.torch import load_file

    state = load_file(str(folder / "model.safetensors"))
    out = {}
    for layer in layers:
        if arch == "gpt2":
            o = state[f"transformer.h.{layer}.attn.c_proj.weight"]  # Conv1D [in=H*dh, out=d]
            out[layer] = o
        else:
            out[layer] = state[f"model.layers.{layer}.self_attn.o_proj.weight"].T  # [H*dh, d]
    return out


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory):
    """A random Gemma (v1) checkpoint: GQA 4q/1kv, RMSNorm applied as normalized * (1 + w)."""
    from model_support import save_random_model
    from transformers import GemmaConfig, GemmaForCausalLM

    cfg = GemmaConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                      hidden_size=64, intermediate_size=128, max_position_embeddings=128)
    return save_random_model(tmp_path_factory.mktemp("gemma"), cfg, GemmaForCausalLM)


@pytest.fixture(scope="module", params=["gpt2", "qwen2", "gemma"])
def bridge_case(request, gpt2_tiny_dir, qwen2_gqa_dir, gemma_dir):
    from model_support import boot_bridge

    folder = {"gpt2": gpt2_tiny_dir, "qwen2": qwen2_gqa_dir, "gemma": gemma_dir}[request.param]
    bridge = boot_bridge(folder)
    gen = torch.Generator().manual_seed(5)
    weights = {}
    for layer in range(bridge.cfg.n_layers):  # non-trivial norm weights (init is all ones)
        w = torch.empty(bridge.cfg.d_model).uniform_(0.5, 1.5, generator=gen)
        with torch.no_grad():
            bridge.blocks[layer].ln1.original_component.weight.copy_(w)
        # the gain the norm applies: Gemma's RMSNorm multiplies by 1 + weight
        weights[layer] = 1 + w if request.param == "gemma" else w
    return request.param, folder, bridge, weights


def bridge_reference(bridge, arch, folder, ln_w, ids, mask, sl, sh, tl, path):
    """Effects of S=(sl, sh) on every target of layer tl (path P), by a manual patched forward:
    delta through ln1 by hand, added at the input of the layer's P linear (attn.{p}.hook_in)."""
    cfg = bridge.cfg
    H, dh = cfg.n_heads, cfg.d_head
    n_kv = getattr(cfg, "n_key_value_heads", None) or H
    W_O = _checkpoint_weights(folder, arch, [sl, tl])
    _, cache = bridge.run_with_cache(ids, attention_mask=mask.long())
    z_s = cache[f"blocks.{sl}.attn.hook_z"][:, :, sh].double()  # [b, p, dh]
    mean = z_s[mask].mean(0)
    delta = ((mean - z_s) @ W_O[sl][sh * dh:(sh + 1) * dh].double()) * mask[..., None]
    x = cache[f"blocks.{tl}.hook_resid_pre"].double()
    if cfg.normalization_type == "LN":
        mu = x.mean(-1, keepdim=True)
        scale = ((x - mu) ** 2).mean(-1, keepdim=True).add(cfg.eps).sqrt()
        ld = (delta - delta.mean(-1, keepdim=True)) / scale
    else:
        scale = (x ** 2).mean(-1, keepdim=True).add(cfg.eps).sqrt()
        ld = delta / scale
    ld = (ld * ln_w[tl].double()).float()
    got = {}

    def add(t, hook):
        return t + ld

    def capture(t, hook):
        got["out"] = t.detach().double()  # (hook_z reports itself as o.hook_in)

    measured = f"blocks.{tl}.attn.hook_z" if path == "V" else f"blocks.{tl}.attn.hook_pattern"
    with torch.no_grad(), bridge.hooks(fwd_hooks=[(f"blocks.{tl}.attn.{path.lower()}.hook_in", add),
                                                   (measured, capture)]):
        bridge(ids, attention_mask=mask.long())
    valid = (mask & (torch.arange(ids.shape[1]) >= 1)).double()
    if path == "V":
        W = W_O[tl].double().reshape(H, dh, -1)
        o0 = torch.einsum("bphe,hed->bphd", cache[measured].double(), W)
        o1 = torch.einsum("bphe,hed->bphd", got["out"], W)
        num = ((o1 - o0).norm(dim=-1) * valid[..., None]).sum(dim=(0, 1))
        den = (o0.norm(dim=-1) * valid[..., None]).sum(dim=(0, 1))
        if n_kv != H:
            num, den = num.reshape(n_kv, -1).mean(-1), den.reshape(n_kv, -1).mean(-1)
        return num / den
    tvd = 0.5 * (got["out"] - cache[measured].double()).abs().sum(-1)  # [b, h, q]
    per_head = (tvd * valid[:, None]).sum(dim=(0, 2)) / valid.sum()
    if path == "K" and n_kv != H:
        per_head = per_head.reshape(n_kv, -1).mean(-1)
    return per_head


@pytest.mark.parametrize("path", ["Q", "K", "V"])
def test_bridge_matches_manual_patched_forward(bridge_case, path):
    arch, folder, bridge, ln_w = bridge_case
    cfg = bridge.cfg
    n_kv = getattr(cfg, "n_key_value_heads", None) or cfg.n_heads
    n_targets = cfg.n_heads if path == "Q" else n_kv
    sl, sh, tl = 0, 1, 1
    result = path_ablation(bridge, [Edge(sl, sh, tl, t, path) for t in range(n_targets)],
                           prompts=TEXTS, induction_batch=2, induction_length=6)
    ids, mask = BridgePatternSource(bridge).tokenize(TEXTS)
    assert not bool(mask.all())  # padding is exercised
    ref = bridge_reference(bridge, arch, folder, ln_w, ids, mask, sl, sh, tl, path)
    assert float(ref.max()) > 1e-4
    torch.testing.assert_close(result.effect("text"), ref, rtol=2e-3, atol=1e-6)
    if arch == "qwen2" and path != "Q":
        assert result.effects[0].target == "L1KV0"


def test_a_post_attention_norm_is_refused_naming_it(tmp_path):
    """Gemma-3 writes each attention output through a norm (ln1_post) before the residual add,
    so a head's write is not (mean z - z) W_O: path ablation and data-weighted PK refuse it,
    naming the norm, rather than give a wrong number."""
    from model_support import save_random_model
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    from headgraph.core.activations.data_pk import data_pk

    cfg = Gemma3TextConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                           hidden_size=64, intermediate_size=128, max_position_embeddings=128,
                           sliding_window=16)
    lm = load_model(str(save_random_model(tmp_path / "g3", cfg, Gemma3ForCausalLM)), device="cpu")
    with pytest.raises(UnsupportedModel, match=r"post-attention norm \(ln1_post\)"):
        path_ablation(lm, [Edge(0, 0, 1, 0, "K")])
    with pytest.raises(UnsupportedModel, match="post-attention norm"):
        data_pk(lm, ["OK"])
