"""The model fingerprint covers the whole runnable model: checkpoints with equal attention
weights (equal weights fingerprints) but another MLP weight, norm weight or config field the
forward reads get other model fingerprints; two loads of one folder get the same one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from headgraph.core.models.loading import load_model

from model_support import save_random_model

pytestmark = pytest.mark.usefixtures("one_thread")


def _edit_tensor(folder: Path, name: str) -> None:
    """Add 0.5 to the first entry of tensor ``name`` of the folder's model.safetensors."""
    path = folder / "model.safetensors"
    sd = load_file(str(path))
    t = sd[name].clone()
    t.view(-1)[0] += 0.5
    sd[name] = t
    save_file(sd, str(path), metadata={"format": "pt"})


def _edit_config(folder: Path, **fields: object) -> None:
    path = folder / "config.json"
    cfg = json.loads(path.read_text())
    cfg.update(fields)
    path.write_text(json.dumps(cfg))


@pytest.fixture(scope="module")
def variants(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny llama checkpoint and copies that differ outside attention only."""
    from transformers import LlamaConfig, LlamaForCausalLM

    root = tmp_path_factory.mktemp("identity")
    cfg = LlamaConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      hidden_size=32, intermediate_size=64, max_position_embeddings=64)
    base = save_random_model(root / "base", cfg, LlamaForCausalLM, seed=1)
    out = {"base": base}
    edits = {"mlp": lambda f: _edit_tensor(f, "model.layers.1.mlp.up_proj.weight"),
             "norm": lambda f: _edit_tensor(f, "model.layers.0.post_attention_layernorm.weight"),
             "eps": lambda f: _edit_config(f, rms_norm_eps=1e-2),
             "act": lambda f: _edit_config(f, hidden_act="gelu")}
    for name, edit in edits.items():
        shutil.copytree(base, root / name)
        edit(root / name)
        out[name] = root / name
    return out


def test_model_fingerprint_sees_what_attention_does_not(variants):
    loaded = {name: load_model(str(f), device="cpu") for name, f in variants.items()}
    weights = {lm.heads.fingerprint for lm in loaded.values()}
    assert len(weights) == 1  # equal attention weights, W_U and tokenizer
    models = {name: lm.model_fingerprint for name, lm in loaded.items()}
    assert len(set(models.values())) == len(models), models
    # the edits are real: the forward of each variant differs from the base's
    ids = torch.tensor([[1, 5, 9, 3]])
    with torch.no_grad():
        logits = {n: lm.bridge.original_model(ids).logits for n, lm in loaded.items()}
    for name in ("mlp", "norm", "eps", "act"):
        assert not torch.allclose(logits[name], logits["base"]), name


def test_model_fingerprint_stable_across_loads(variants):
    a = load_model(str(variants["base"]), device="cpu")
    b = load_model(str(variants["base"]), device="cpu")
    assert a.model_fingerprint == b.model_fingerprint
    assert a.model_fingerprint != a.heads.fingerprint


def test_norm_aware_is_another_model(variants):
    raw = load_model(str(variants["base"]), device="cpu")
    norm = load_model(str(variants["base"]), device="cpu", subspaces="norm")
    assert norm.heads.fingerprint != raw.heads.fingerprint
    assert norm.model_fingerprint != raw.model_fingerprint


def test_streamed_folder_without_tokenizer_has_one(variants, tmp_path):
    """Streamed from safetensors (no pattern source without a tokenizer): the model fingerprint
    comes from its files, so an MLP edit still changes it while the weights stay equal."""
    folders = {}
    for name in ("base", "mlp"):
        folders[name] = tmp_path / name
        folders[name].mkdir()
        for f in ("config.json", "model.safetensors"):
            shutil.copy(variants[name] / f, folders[name] / f)
    lms = {n: load_model(str(f), device="cpu", streaming=True) for n, f in folders.items()}
    assert all(lm.patterns is None for lm in lms.values())
    assert lms["base"].heads.fingerprint == lms["mlp"].heads.fingerprint
    assert lms["base"].model_fingerprint != lms["mlp"].model_fingerprint
    again = load_model(str(folders["base"]), device="cpu", streaming=True)
    assert again.model_fingerprint == lms["base"].model_fingerprint


def test_demo_model_fingerprint_follows_its_tensors():
    """The demo model's LayerNorm gain is read by its forward, not by its head weights."""
    lm = load_model("demo", device="cpu")
    before = lm.model_fingerprint
    assert load_model("demo", device="cpu").model_fingerprint == before
    other = load_model("demo", device="cpu")
    with torch.no_grad():
        other.patterns.ln_w[0, 0] += 1.0
    other.content_digest = None  # computed again from the edited tensors
    assert other.heads.fingerprint == lm.heads.fingerprint
    assert other.model_fingerprint != before
