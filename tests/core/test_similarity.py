"""Linear CKA, orthogonal Procrustes and norm-aware PK against float64 references: a random
grouped-query model, a random Gemma-3-shaped checkpoint with post-attention norms (gains
applied as 1 + w), a random Qwen2 (RMSNorm, no post-norm) and a random GPT-2 (LayerNorm)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.linalg
import torch

from model_support import save_random_model
from headgraph.core.errors import InvalidInput, UnsupportedModel
from headgraph.core.models.loading import load_model
from headgraph.core.models.norm_fold import NormGains, fold_norm_gains
from headgraph.core.scores.pk import all_pairings, projection_kernel
from headgraph.core.scores.similarity import all_similarities, cka, procrustes, similarity

pytestmark = pytest.mark.usefixtures("one_thread")


def _np(heads: Any, role: str, layer: int, head: int) -> np.ndarray:
    return heads.role(role)[layer, head].to(torch.float64).numpy()


def _ref_cka(x: np.ndarray, y: np.ndarray) -> float:
    x = x - x.mean(axis=0)
    y = y - y.mean(axis=0)
    return float(np.linalg.norm(y.T @ x) ** 2 / (np.linalg.norm(x.T @ x) * np.linalg.norm(y.T @ y)))


def _ref_procrustes(x: np.ndarray, y: np.ndarray) -> float:
    x = x - x.mean(axis=0)
    y = y - y.mean(axis=0)
    return float(np.linalg.svd(x.T @ y, compute_uv=False).sum() / (np.linalg.norm(x) * np.linalg.norm(y)))


def _check(heads: Any, kind: str, pairing: str, order: str = "forward", tol: float = 1e-6) -> int:
    """Every cell of the grid equals the float64 reference (valid) or 0 (invalid); returns the
    number of valid cells."""
    ref = _ref_cka if kind == "cka" else _ref_procrustes
    res = similarity(heads, kind, pairing, order=order)
    assert res.kind == kind and torch.equal(res.scores, res.normalized)
    L, hs, _, ht = res.scores.shape
    idx = heads.info.layer_indices
    n = 0
    for sl in range(L):
        for sh in range(hs):
            for tl in range(L):
                for th in range(ht):
                    keep = {"forward": idx[sl] < idx[tl], "all": True,
                            "same-layer": idx[sl] == idx[tl]}[order]
                    assert bool(res.valid[sl, sh, tl, th]) == keep
                    if not keep:
                        assert res.scores[sl, sh, tl, th] == 0
                        continue
                    want = ref(_np(heads, pairing[0], sl, sh), _np(heads, pairing[1], tl, th))
                    got = float(res.scores[sl, sh, tl, th])
                    assert abs(got - want) < tol, (kind, pairing, sl, sh, tl, th, got, want)
                    n += 1
    return n


def _random(L: int, H: int, Hkv: int, d: int, dh: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    return [r(L, H, d, dh), r(L, Hkv, d, dh), r(L, Hkv, d, dh), r(L, H, dh, d)]


@pytest.mark.parametrize("kind", ["cka", "procrustes"])
@pytest.mark.parametrize("pairing", ["OQ", "OK", "OV"])
def test_similarity_equals_float64_reference_on_a_gqa_model(make_heads, kind, pairing):
    heads = make_heads(*_random(3, 4, 2, 40, 6, seed=0))
    n = _check(heads, kind, pairing)
    assert n == 3 * 4 * (2 if pairing != "OQ" else 4)  # layer pairs (0,1) (0,2) (1,2)
    assert _check(heads, kind, pairing, order="all") == 9 * 4 * (2 if pairing != "OQ" else 4)


def test_similarity_orders_layer_positions_and_bounds(make_heads):
    W = _random(3, 2, 2, 24, 5, seed=1)
    heads = make_heads(*W, layer_indices=(0, 4, 9))
    for kind in ("cka", "procrustes"):
        _check(heads, kind, "OK", order="same-layer")
        res = similarity(heads, kind, "QK", order="same-layer")
        # a head compared with itself: CKA and Procrustes are 1
        diag = torch.einsum("abab->ab", similarity(heads, kind, "QQ", order="same-layer").scores)
        assert torch.allclose(diag, torch.ones_like(diag), atol=1e-12)
        assert bool((res.scores >= 0).all() and (res.scores <= 1).all())


def test_planted_relation_and_basis_dependence(make_heads):
    """K of head (2, 1) spans O(0, 0)'s write span: CKA / Procrustes see it most strongly
    when the bases match up to an orthogonal map, less under a skewed basis (PK stays 1)."""
    W_Q, W_K, W_V, W_O = _random(3, 2, 2, 32, 4, seed=2)
    q, _ = torch.linalg.qr(torch.randn(4, 4, generator=torch.Generator().manual_seed(3), dtype=torch.float64))
    W_K[2, 1] = W_O[0, 0].T @ q
    heads = make_heads(W_Q, W_K, W_V, W_O)
    assert float(cka(heads, "OK").scores[0, 0, 2, 1]) == pytest.approx(1.0, abs=1e-12)
    assert float(procrustes(heads, "OK").scores[0, 0, 2, 1]) == pytest.approx(1.0, abs=1e-12)
    skew = torch.diag(torch.tensor([1.0, 3.0, 10.0, 30.0], dtype=torch.float64))
    W_K2 = W_K.clone()
    W_K2[2, 1] = W_O[0, 0].T @ skew
    heads2 = make_heads(W_Q, W_K2, W_V, W_O)
    assert float(cka(heads2, "OK").scores[0, 0, 2, 1]) < 0.9
    assert float(procrustes(heads2, "OK").scores[0, 0, 2, 1]) < 0.9
    assert float(projection_kernel(heads2, "OK").normalized[0, 0, 2, 1]) == pytest.approx(1.0, abs=1e-9)
    for kind in ("cka", "procrustes"):  # the planted pair ranks first either way
        grid = similarity(heads2, kind, "OK").scores
        assert int(grid.reshape(-1).argmax()) == int(torch.tensor(0 * 2 * 3 * 2 + 0 * 3 * 2 + 2 * 2 + 1))


def test_zero_heads_are_invalid_and_errors_name_the_choices(make_heads):
    W_Q, W_K, W_V, W_O = _random(2, 2, 2, 16, 3, seed=4)
    W_O[0, 1] = 0.0
    heads = make_heads(W_Q, W_K, W_V, W_O)
    for kind in ("cka", "procrustes"):
        res = similarity(heads, kind, "OK")
        assert not bool(res.valid[0, 1].any()) and bool(res.valid[0, 0, 1].all())
    with pytest.raises(InvalidInput, match="cka"):
        similarity(heads, "svcca", "OK")
    with pytest.raises(InvalidInput):
        similarity(heads, "cka", "XK")
    both = all_similarities(heads, "cka", pairings=["OK", "OV"])
    assert both["OK"] is cka(heads, "OK")  # cached per pairing


def test_float32_weights_stay_close_to_float64(make_heads):
    W = _random(3, 4, 2, 48, 8, seed=5)
    h64 = make_heads(*W)
    h32 = make_heads(*(w.to(torch.float32) for w in W))
    for kind in ("cka", "procrustes"):
        a, b = similarity(h32, kind, "OV"), similarity(h64, kind, "OV")
        assert a.scores.dtype == torch.float32
        assert (a.scores.double() - b.scores)[b.valid].abs().max() < 2e-6


# -- real checkpoints: Gemma-3 (post-norms, 1 + w), Qwen2 (RMSNorm), GPT-2 (LayerNorm) ---------

def _randomize_norms(folder: Path, model_cls: Any, names: tuple[str, ...], seed: int) -> Path:
    """Give the checkpoint's norm weights random values (random init leaves them constant)."""
    model = model_cls.from_pretrained(folder, torch_dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(n in name for n in names):
                p.copy_(torch.randn(p.shape, generator=g) * 0.8 + (0.0 if "gemma" in
                        type(model).__name__.lower() else 1.0))
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def gemma3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    cfg = Gemma3TextConfig(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                           head_dim=16, hidden_size=64, intermediate_size=128,
                           max_position_embeddings=128, sliding_window=16)
    folder = save_random_model(tmp_path_factory.mktemp("gemma3"), cfg, Gemma3ForCausalLM, seed=7)
    return _randomize_norms(folder, Gemma3ForCausalLM, ("layernorm",), seed=8)


@pytest.fixture(scope="module")
def qwen2_norm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                      hidden_size=64, intermediate_size=128, max_position_embeddings=64)
    folder = save_random_model(tmp_path_factory.mktemp("qwen2n"), cfg, Qwen2ForCausalLM, seed=9)
    return _randomize_norms(folder, Qwen2ForCausalLM, ("layernorm",), seed=10)


@pytest.fixture(scope="module")
def gpt2_norm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=3, n_head=4, n_embd=64, n_positions=64)
    folder = save_random_model(tmp_path_factory.mktemp("gpt2n"), cfg, GPT2LMHeadModel, seed=11)
    return _randomize_norms(folder, GPT2LMHeadModel, ("ln_1",), seed=12)


@pytest.mark.parametrize("kind", ["cka", "procrustes"])
def test_similarity_equals_float64_reference_on_gemma3(gemma3_dir, kind):
    heads = load_model(str(gemma3_dir), device="cpu", dtype=torch.float64).heads
    assert heads.info.n_kv_heads == 2
    for pairing in ("OQ", "OK", "OV"):
        _check(heads, kind, pairing)
    folded = load_model(str(gemma3_dir), device="cpu", dtype=torch.float64, subspaces="norm").heads
    _check(folded, kind, "OK")


def _hf_heads(folder: Path, kind: str) -> dict[str, list[np.ndarray]]:
    """Per-layer float64 head matrices ([d, dh] readers, [d, dh] = W_O^T writers) with the norm
    gains folded in, straight from the checkpoint's parameters (no bridge)."""
    import transformers

    cfg = transformers.AutoConfig.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float64)
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    out: dict[str, list[np.ndarray]] = {"Q": [], "K": [], "V": [], "O": []}
    if kind == "gpt2":
        d, H = cfg.n_embd, cfg.n_head
        dh = d // H
        for i in range(cfg.n_layer):
            g = sd[f"transformer.h.{i}.ln_1.weight"]
            w = sd[f"transformer.h.{i}.attn.c_attn.weight"]  # [d, 3d] (Conv1D)
            for j, role in enumerate("QKV"):
                part = g[:, None] * w[:, j * d:(j + 1) * d]
                out[role].append(np.stack([part[:, h * dh:(h + 1) * dh] for h in range(H)]))
            o = sd[f"transformer.h.{i}.attn.c_proj.weight"]  # [d_in = H dh, d]
            out["O"].append(np.stack([o[h * dh:(h + 1) * dh].T for h in range(H)]))
        return out
    H, Hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    dh = getattr(cfg, "head_dim", None) or cfg.hidden_size // H
    gemma = kind == "gemma3"
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        g = sd[p + "input_layernorm.weight"] + (1.0 if gemma else 0.0)
        for role, n in (("Q", H), ("K", Hkv), ("V", Hkv)):
            w = sd[p + f"self_attn.{role.lower()}_proj.weight"]  # [n dh, d]
            out[role].append(np.stack([g[:, None] * w[h * dh:(h + 1) * dh].T for h in range(n)]))
        o = sd[p + "self_attn.o_proj.weight"]  # [d, H dh]
        post = sd[p + "post_attention_layernorm.weight"] + 1.0 if gemma else np.ones(o.shape[0])
        out["O"].append(np.stack([post[:, None] * o[:, h * dh:(h + 1) * dh] for h in range(H)]))
    return out


def _scipy_pk(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sum(np.cos(scipy.linalg.subspace_angles(a, b)) ** 2))


@pytest.mark.parametrize("model", ["gemma3", "qwen2", "gpt2"])
def test_norm_aware_pk_equals_float64_reference(model, gemma3_dir, qwen2_norm_dir, gpt2_norm_dir):
    folder = {"gemma3": gemma3_dir, "qwen2": qwen2_norm_dir, "gpt2": gpt2_norm_dir}[model]
    lm = load_model(str(folder), device="cpu", dtype=torch.float64, subspaces="norm")
    raw = load_model(str(folder), device="cpu", dtype=torch.float64)
    assert lm.info.subspaces == "norm" and raw.info.subspaces == "raw"
    assert lm.heads.fingerprint != raw.heads.fingerprint  # cache keys differ
    ref = _hf_heads(folder, model)
    res = all_pairings(lm.heads, pairings=["OQ", "OK", "OV"])
    raw_res = all_pairings(raw.heads, pairings=["OQ", "OK", "OV"])
    moved = 0.0
    for pairing, r in res.items():
        L, hs, _, ht = r.scores.shape
        for sl in range(L):
            for sh in range(hs):
                for tl in range(sl + 1, L):
                    for th in range(ht):
                        want = _scipy_pk(ref["O"][sl][sh], ref[pairing[1]][tl][th])
                        assert abs(float(r.scores[sl, sh, tl, th]) - want) < 1e-6, (pairing, sl, sh, tl, th)
        moved = max(moved, float((r.scores - raw_res[pairing].scores).abs().max()))
    assert moved > 1e-3  # the gains change the graph (they were randomized)
    gains = lm.info.to_dict()
    assert gains["subspaces"] == "norm"


def test_fold_is_pure_and_checks_shapes(make_heads):
    W = _random(2, 2, 1, 8, 2, seed=6)
    heads = make_heads(*W)
    pre = torch.rand(2, 8, dtype=torch.float64) + 0.5
    post = torch.rand(2, 8, dtype=torch.float64) + 0.5
    folded = fold_norm_gains(heads, NormGains(pre=pre, post=post, kind="test"))
    assert torch.equal(heads.W_Q, W[0])  # input untouched
    assert torch.allclose(folded.W_K[1, 0], torch.diag(pre[1]) @ W[1][1, 0])
    assert torch.allclose(folded.W_O[0, 1], W[3][0, 1] @ torch.diag(post[0]))
    with pytest.raises(InvalidInput, match="already"):
        fold_norm_gains(folded, NormGains(pre=pre, post=None, kind="test"))
    with pytest.raises(InvalidInput, match="do not match"):
        fold_norm_gains(heads, NormGains(pre=pre[:, :4], post=None, kind="test"))
    with pytest.raises(InvalidInput, match="subspaces"):
        load_model("demo", device="cpu", subspaces="folded")


def test_demo_norm_aware_folds_its_layernorm():
    demo = load_model("demo", device="cpu", subspaces="norm")
    from headgraph.core.models.demo import load_demo_model, DEMO_DIR

    ln_w = load_demo_model(DEMO_DIR, device="cpu").ln_w.detach()
    raw = load_model("demo", device="cpu")
    assert torch.allclose(demo.heads.W_Q, raw.heads.W_Q * ln_w[:, None, :, None])
    assert torch.equal(demo.heads.W_O, raw.heads.W_O)  # no post-norm


@pytest.mark.slow
def test_gguf_norm_gains_read_from_the_file(gguf_path):
    from headgraph.core.models.gguf_file import gguf_norm_gains

    gains = gguf_norm_gains(gguf_path, (0, 1, 29))
    assert gains.pre.shape[0] == 3 and gains.post is None and gains.kind.startswith("GGUF")
    with pytest.raises(UnsupportedModel):
        gguf_norm_gains(gguf_path, (0, 999))
