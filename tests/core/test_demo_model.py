"""The shipped demo model: files, forward pass vs float64 reference, copying, PK's top edge."""

from __future__ import annotations

import copy
import importlib.util
import json
import math
import zlib
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from headgraph.core.models.demo import (
    ARCHITECTURE,
    DEMO_DIR,
    DemoConfig,
    DemoModel,
    is_demo_folder,
    load_demo_model,
    save_demo_model,
)
from headgraph.core.models.fingerprint import weights_fingerprint
from headgraph.core.activations.patterns import pattern_scores
from headgraph.core.scores.pk import projection_kernel

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def demo() -> DemoModel:
    return load_demo_model(device="cpu")


def _train_script():
    spec = importlib.util.spec_from_file_location("train_demo", ROOT / "scripts" / "train_demo.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _reference_forward(t: dict[str, torch.Tensor], tokens: torch.Tensor, eps: float
                       ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """float64 forward written from the stored tensors, head by head (shortformer positions)."""
    t = {k: v.double() for k, v in t.items()}
    T = tokens.shape[1]
    x = t["W_E"][tokens]
    pos = t["W_pos"][:T]
    L, H, _, dh = t["W_Q"].shape
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    patterns = []
    for layer in range(L):
        mu = x.mean(-1, keepdim=True)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)
        h = (x - mu) / torch.sqrt(var + eps) * t["ln_w"][layer] + t["ln_b"][layer]
        out = torch.zeros_like(x) + t["b_O"][layer]
        pats = []
        for head in range(H):
            q = (h + pos) @ t["W_Q"][layer, head] + t["b_Q"][layer, head]
            k = (h + pos) @ t["W_K"][layer, head] + t["b_K"][layer, head]
            v = h @ t["W_V"][layer, head] + t["b_V"][layer, head]
            a = (q @ k.transpose(-1, -2) / math.sqrt(dh)).masked_fill(~mask, -math.inf).softmax(-1)
            out = out + (a @ v) @ t["W_O"][layer, head]
            pats.append(a)
        x = x + out
        patterns.append(torch.stack(pats, dim=1))
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    x = (x - mu) / torch.sqrt(var + eps) * t["ln_final_w"] + t["ln_final_b"]
    return x @ t["W_U"] + t["b_U"], patterns


def test_shipped_files_describe_a_trained_model():
    cfg = json.loads((DEMO_DIR / "config.json").read_text())
    assert cfg["architecture"] == ARCHITECTURE == "HeadgraphAttnOnly"
    assert (cfg["n_layers"], cfg["n_heads"], cfg["d_model"], cfg["d_head"], cfg["d_vocab"]) == \
        (2, 8, 128, 16, 64)
    assert cfg["token_names"] == [f"t{i:02d}" for i in range(64)]
    vocab = json.loads((DEMO_DIR / "vocab.json").read_text())
    assert vocab == {f"t{i:02d}": i for i in range(64)}
    tr = cfg["training"]
    assert tr["seed"] == 0 and tr["steps"] >= 1000 and "shortformer" in tr["positions"]
    assert cfg["results"]["copy_accuracy"] > 0.9
    size = (DEMO_DIR / "model.safetensors").stat().st_size
    assert size < 1_000_000
    with safe_open(str(DEMO_DIR / "model.safetensors"), framework="pt") as fh:
        names = fh.keys()  # a safe_open handle is not iterable itself
        assert names and all(fh.get_tensor(k).dtype == torch.float32 for k in names)
    assert is_demo_folder(DEMO_DIR) and not is_demo_folder(DEMO_DIR.parent)


def test_forward_matches_float64_reference(demo):
    tensors = load_file(str(DEMO_DIR / "model.safetensors"))
    gen = torch.Generator().manual_seed(7)
    tokens = torch.randint(64, (3, 40), generator=gen)
    logits, pats = demo(tokens, return_patterns=True)
    ref_logits, ref_pats = _reference_forward(tensors, tokens, demo.cfg.ln_eps)
    torch.testing.assert_close(logits.double(), ref_logits, rtol=1e-4, atol=1e-4)
    for layer in range(2):
        torch.testing.assert_close(pats[layer].double(), ref_pats[layer], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(pats.sum(-1), torch.ones(2, 3, 8, 40))
    assert pats.triu(diagonal=1).abs().max() == 0  # causal


def test_positions_reach_queries_and_keys_only(demo):
    """Shortformer: with position-blind attention (W_Q = W_K = 0), W_pos cannot matter."""
    m = copy.deepcopy(demo)
    tokens = torch.randint(64, (2, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for p in (m.W_Q, m.b_Q, m.W_K, m.b_K):
            p.zero_()
        before = m(tokens)
        m.W_pos.mul_(-3.0).add_(1.0)
        after = m(tokens)
    torch.testing.assert_close(before, after)
    with torch.no_grad():  # with the trained queries/keys restored, positions do matter
        m.W_Q.copy_(demo.W_Q)
        m.W_K.copy_(demo.W_K)
        assert not torch.allclose(m(tokens), before, atol=1e-3)


def test_demo_copies_blocks_of_any_length(demo):
    """Accuracy on fresh filler+block+copy sequences, built here independently of the script."""
    gen = torch.Generator().manual_seed(99)
    correct = total = 0
    for block in (5, 11, 17, 23, 30):
        filler = 64 - 2 * block
        b = torch.randint(64, (32, block), generator=gen)
        seq = torch.cat([torch.randint(64, (32, filler), generator=gen), b, b], dim=1)
        with torch.no_grad():
            pred = demo(seq).argmax(-1)
        # predictions at copy positions 0..block-2 should name the next copied token
        start = filler + block
        correct += (pred[:, start:start + block - 1] == b[:, 1:]).sum().item()
        total += 32 * (block - 1)
    assert correct / total > 0.9


def test_top_ok_edge_runs_from_previous_token_to_induction_head(demo):
    heads = demo.head_weights()
    pk = projection_kernel(heads, "OK", order="forward")
    ok = pk.scores[0, :, 1, :].double()  # layer-0 O vs layer-1 K
    # independent float64 reference with QR bases
    U_o = torch.linalg.qr(heads.W_O[0].double().transpose(-2, -1)).Q
    U_k = torch.linalg.qr(heads.W_K[1].double()).Q
    ref = (torch.einsum("adi,bdj->abij", U_o, U_k) ** 2).sum((-2, -1))
    torch.testing.assert_close(ok, ref, rtol=1e-5, atol=1e-5)
    # the top forward edge overall lies between layer 0 and layer 1
    flat = torch.where(pk.valid, pk.scores, -1.0)
    top = torch.nonzero(flat == flat.max())[0].tolist()
    assert top[0] == 0 and top[2] == 1
    src, dst = top[1], top[3]
    s = pattern_scores(demo, seed=0)
    assert s.previous_token[0, src] > 0.5, (src, s.previous_token[0])
    assert s.induction[1, dst] > 0.5, (dst, s.induction[1])
    # far above PK between random 16-dim subspaces of R^128 (Haar mean 16*16/128 = 2)
    g = torch.Generator().manual_seed(0)
    A = torch.linalg.qr(torch.randn(400, 128, 16, generator=g, dtype=torch.float64)).Q
    B = torch.linalg.qr(torch.randn(400, 128, 16, generator=g, dtype=torch.float64)).Q
    rand = (torch.einsum("ndi,ndj->nij", A, B) ** 2).sum((-2, -1))
    assert abs(rand.mean().item() - 2.0) < 0.2
    assert (ok.max() - rand.mean()) / rand.std() > 5


def test_head_weights_and_tokenizer(demo):
    h = demo.head_weights(name="demo")
    assert h.info.processing == "raw" and h.info.source == "builtin"
    assert h.info.layer_indices == (0, 1) and h.info.d_vocab == 64
    assert h.fingerprint == weights_fingerprint([demo.W_Q, demo.W_K, demo.W_V, demo.W_O, demo.W_U],
                                                processing="raw", extra="0,1")
    ids, mask = demo.tokenize(["t00 t05 t63", "t10 Mary t10 Mary"])
    assert ids.tolist() == [[0, 5, 63, 0], [10, zlib.crc32(b"Mary") % 64, 10,
                                            zlib.crc32(b"Mary") % 64]]
    assert mask.tolist() == [[True, True, True, False], [True] * 4]
    assert torch.equal(demo.to_tokens(["t01 t02"]), torch.tensor([[1, 2]]))
    assert demo.to_str_tokens(torch.tensor([3, 62])) == ["t03", "t62"]


def test_save_load_round_trip_and_seeded_init(tmp_path):
    cfg = DemoConfig(n_layers=1, n_heads=2, d_model=16, d_head=4, d_vocab=10, n_ctx=8)
    a, b = DemoModel(cfg, seed=3), DemoModel(cfg, seed=3)
    assert torch.equal(a.W_Q, b.W_Q)
    save_demo_model(a, tmp_path, extra={"note": "x"})
    c = load_demo_model(tmp_path)
    assert c.meta["note"] == "x" and c.cfg == a.cfg
    assert c.head_weights().fingerprint == a.head_weights().fingerprint


def test_training_data_and_loss_from_the_script(demo):
    mod = _train_script()
    gen = torch.Generator().manual_seed(0)
    tokens, mask = mod.copy_batch(16, 64, 64, 4, 32, gen)
    assert tokens.shape == (16, 64) and mask.shape == (16, 63)
    for row, m in zip(tokens, mask):
        n = int(m.sum()) + 1  # masked inputs = block length - 1
        assert 4 <= n <= 32
        assert torch.equal(row[64 - n:], row[64 - 2 * n:64 - n])  # the copy
        assert m.nonzero().flatten().tolist() == list(range(64 - n, 63))
    with torch.no_grad():
        loss, acc = mod.copy_loss(demo, tokens, mask)
    assert loss < 0.2 and acc > 0.9
