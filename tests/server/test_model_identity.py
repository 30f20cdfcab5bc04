"""A result belongs to the model that produced it: checkpoints with equal attention weights that
differ elsewhere (an MLP weight, a norm weight, a config field the forward reads, another
architecture) share their weight-level results (one cache entry, computed once) but never an
activation-level result or a remembered refusal, on one real server over one shared cache."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import httpx
import pytest
import torch
from safetensors.torch import load_file, save_file

from headgraph.core.activations.patterns import pattern_scores
from headgraph.core.models.loading import load_model
from headgraph.server.cache.store import make_key

from api_support import err, ok
from model_support import save_random_model

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]  # a server, ~30 s

LLAMAS = ("base", "mlp", "norm", "eps")
DIMS = dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, hidden_size=32,
            intermediate_size=64, max_position_embeddings=64, tie_word_embeddings=False)


def _edit_tensor(folder: Path, name: str) -> None:
    path = folder / "model.safetensors"
    sd = load_file(str(path))
    t = sd[name].clone()
    t.mul_(-1.5).add_(0.3)  # a whole different matrix / gain, same shape and size
    sd[name] = t
    save_file(sd, str(path), metadata={"format": "pt"})


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """base, mlp (layer 0's MLP), norm (layer 0's pre-MLP norm), eps (rms_norm_eps): llama
    checkpoints; olmo2: an OLMo-2 checkpoint (q/k norms, a post-attention norm) holding base's
    attention, embedding and unembedding weights."""
    from transformers import LlamaConfig, LlamaForCausalLM, Olmo2Config, Olmo2ForCausalLM

    root = tmp_path_factory.mktemp("same-attention")
    base = save_random_model(root / "base", LlamaConfig(**DIMS), LlamaForCausalLM, seed=1)
    for name in ("mlp", "norm", "eps"):
        shutil.copytree(base, root / name)
    _edit_tensor(root / "mlp", "model.layers.0.mlp.down_proj.weight")
    _edit_tensor(root / "norm", "model.layers.0.post_attention_layernorm.weight")
    cfg = json.loads((root / "eps" / "config.json").read_text())
    (root / "eps" / "config.json").write_text(json.dumps({**cfg, "rms_norm_eps": 0.5}))
    olmo = save_random_model(root / "olmo2", Olmo2Config(**DIMS), Olmo2ForCausalLM, seed=2)
    theirs, ours = load_file(str(olmo / "model.safetensors")), load_file(str(base / "model.safetensors"))
    save_file({k: ours.get(k, v) for k, v in theirs.items()}, str(olmo / "model.safetensors"),
              metadata={"format": "pt"})
    return root


@pytest.fixture(scope="module")
def url(launch_server, tmp_path_factory, root):
    env = {"HEADGRAPH_MODEL_ROOT": str(root), "HEADGRAPH_DEVICE": "cpu"}
    with launch_server(tmp_path_factory.mktemp("shared") / "cache", workers=1, env=env,
                       check_errors=True) as srv:
        yield srv.url


@pytest.fixture(scope="module")
def http(url):
    with httpx.Client(base_url=url, timeout=300) as client:
        yield client


def _counts(http: httpx.Client) -> dict[str, int]:
    return ok(http.get("/api/cache/stats"))["counts"]


def _core_patterns(folder: Path) -> dict[str, torch.Tensor]:
    """Pattern scores straight from core on the folder's own model (not through the server)."""
    scores = pattern_scores(load_model(str(folder), device="cpu").patterns).to_dict()["scores"]
    return {k: torch.tensor(v, dtype=torch.float64) for k, v in scores.items()}


def _api_patterns(http: httpx.Client, model: str) -> dict[str, torch.Tensor]:
    body = ok(http.get("/api/patterns", params={"model": model}))
    return {k: torch.tensor([[float("nan") if x is None else x for x in row] for row in v],
                            dtype=torch.float64) for k, v in body["scores"].items()}


def _close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], layer: int | None = None) -> bool:
    pick = (lambda t: t) if layer is None else (lambda t: t[layer])
    return a.keys() == b.keys() and all(
        torch.allclose(pick(a[k]), pick(b[k]), atol=1e-5, equal_nan=True) for k in a)


def test_weight_results_shared_activation_results_not(http, root):
    ids = {name: f"local:{name}" for name in (*LLAMAS, "olmo2")}
    infos = {name: ok(http.get("/api/models/info", params={"model": m})) for name, m in ids.items()}
    weights_fp = {i["fingerprint"] for i in infos.values()}
    assert len(weights_fp) == 1, weights_fp  # equal attention weights, W_U and tokenizer
    (wfp,) = weights_fp
    model_fps = {name: i["model_fingerprint"] for name, i in infos.items()}
    assert len(set(model_fps.values())) == len(model_fps), model_fps

    # weight-level: one entry under the weights fingerprint, computed once for all five
    pk = [ok(http.get("/api/pk", params={"model": m, "pairing": "OK"})) for m in ids.values()]
    assert all(p["grid"] == pk[0]["grid"] for p in pk)
    counts = _counts(http)
    assert counts[make_key(wfp, "pk", {"pairing": "OK", "order": "forward"})] == 1

    # activation-level: each model's own, as core computes it on that model
    api = {name: _api_patterns(http, ids[name]) for name in LLAMAS}
    counts = _counts(http)
    for name in LLAMAS:
        assert counts[make_key(model_fps[name], "patterns", {"format": 2})] == 1
        assert _close(api[name], _core_patterns(root / name)), name
    assert not any(f"/{wfp}/patterns" in k for k in counts)
    # layer 0 attends before any MLP or post-attention norm: equal there unless eps changed;
    # layer 1 reads what they wrote
    for name in ("mlp", "norm"):
        assert _close(api[name], api["base"], layer=0), name
        assert not _close(api[name], api["base"], layer=1), name
    assert not _close(api["eps"], api["base"], layer=0)


def test_a_refusal_is_the_models_own(http, root):
    """OLMo-2's path-ablation refusal (a post-attention norm) is remembered for OLMo-2 only:
    the llama with the same attention weights is ablated, as core ablates it."""
    from headgraph.core.activations.ablation import path_ablation, top_edges
    from headgraph.core.scores.pk import projection_kernel

    params = {"pairing": "OK", "top": 2}
    message = err(http.get("/api/ablation", params={"model": "local:olmo2", **params}), 422)
    assert "post-attention norm" in message
    before = _counts(http)
    again = err(http.get("/api/ablation", params={"model": "local:olmo2", **params}), 422)
    assert again == message and _counts(http) == before  # remembered, not computed again
    body = ok(http.get("/api/ablation", params={"model": "local:base", **params}))
    lm = load_model(str(root / "base"), device="cpu")
    direct = path_ablation(lm, top_edges(projection_kernel(lm.heads, "OK"), 2))
    assert len(body["edges"]) == 2
    for row, e in zip(body["edges"], direct.effects, strict=True):
        assert row["effect_text"] == pytest.approx(e.effects["text"], rel=1e-5)
        assert row["effect_random"] == pytest.approx(e.effects["random"], rel=1e-5)


def test_same_name_new_mlp_is_a_new_model(http, root):
    """Weights swapped under one name, attention unchanged: the served patterns (store key and
    the warm-response memo) follow the new model."""
    swap = root / "swap"
    shutil.copytree(root / "base", swap)
    first = _api_patterns(http, "local:swap")
    assert _close(first, _api_patterns(http, "local:base"))
    shutil.copy(root / "mlp" / "model.safetensors", swap / "new.safetensors")
    os.replace(swap / "new.safetensors", swap / "model.safetensors")
    info = ok(http.get("/api/models/info", params={"model": "local:swap"}))
    assert info["model_fingerprint"] == ok(http.get("/api/models/info",
                                                    params={"model": "local:mlp"}))["model_fingerprint"]
    assert _close(_api_patterns(http, "local:swap"), _api_patterns(http, "local:mlp"))
