"""Malformed model files under the model root are refused with a 4xx naming the file and the
field, never a 500 or an allocation the size the file claims (a real server, real files).

Each folder is what a lab member might drop into ``HEADGRAPH_MODEL_ROOT`` by mistake: a
config.json with zero heads or a list for a width, GGUF files with zero heads, a tensor name
that is not ``blk.<n>.…``, metadata declaring 1000 heads of width 100000 over tiny tensors, a
block count of 10**9 over one block, zero key/value heads, a tensor cut short or declared wider
than its data, or a safetensors file cut short.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import gguf
import httpx
import numpy as np
import pytest

# serial (run alone, after the parallel part): a remembered failure answered within 2 s
# a real server on seven malformed model folders: ~15 s
pytestmark = [pytest.mark.slow, pytest.mark.serial]

GPT2 = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": 2, "n_head": 4,
        "n_embd": 64, "n_positions": 64, "vocab_size": 300}


def _config(root: Path, name: str, **fields: object) -> None:
    folder = root / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**GPT2, **fields}))


def _gguf(root: Path, name: str, *, heads: int, width: int, tensors: dict[str, tuple[int, int]],
          blocks: int = 1, kv_heads: int | None = None) -> Path:
    folder = root / name
    folder.mkdir()
    w = gguf.GGUFWriter(str(folder / "model.gguf"), "llama")
    w.add_block_count(blocks)
    w.add_head_count(heads)
    w.add_head_count_kv(heads if kv_heads is None else kv_heads)
    w.add_embedding_length(width)
    w.add_context_length(64)
    rng = np.random.default_rng(0)
    for tensor, shape in tensors.items():
        w.add_tensor(tensor, rng.standard_normal(shape).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return folder / "model.gguf"


def _declare_wider(file: Path, tensor: str, cols: int) -> None:
    """Rewrite ``tensor``'s first dimension in the GGUF header (its data stays as written)."""
    raw = bytearray(file.read_bytes())
    at = raw.index(tensor.encode()) + len(tensor) + 4  # past the name and its uint32 n_dims
    raw[at:at + 8] = cols.to_bytes(8, "little")
    file.write_bytes(bytes(raw))


def _truncated_safetensors(root: Path, name: str) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    from model_support import save_random_model

    folder = save_random_model(root / name, GPT2Config(n_layer=1, n_head=2, n_embd=16, n_positions=16,
                                                       vocab_size=64), GPT2LMHeadModel, seed=0)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])


ATTN = {f"blk.0.{r}.weight": (16, 16) for r in ("attn_q", "attn_k", "attn_v", "attn_output")}
CASES = {  # model id -> what the message must name
    "local:cfg_heads_zero": "n_head",
    "local:cfg_width_list": "n_embd",
    "local:cfg_heads_split": "split into",
    "local:gg_heads_zero": "head_count",
    "local:gg_bad_name": "attn_q",
    "local:gg_huge": "embedding_length",
    "local:gg_wide": "declared shapes",
    "local:gg_blocks_huge": "llama.block_count must be an integer in 1..1024, got 1000000000",
    "local:gg_blocks_more": "llama.block_count is 3, but the file holds 1 blocks (blk.0 .. blk.0)",
    "local:gg_kv_zero": "llama.attention.head_count_kv must be an integer in 1..2, got 0",
    "local:gg_truncated": "tensor 'blk.0.attn_output.weight' cannot be read",
    "local:gg_oversized": "tensor 'blk.0.attn_q.weight' cannot be read",
    "local:st_truncated": "st_truncated/model.safetensors: truncated safetensors file",
}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("malformed")
    _config(root, "cfg_heads_zero", n_head=0)
    _config(root, "cfg_width_list", n_embd=[64])
    _config(root, "cfg_heads_split", n_head=5)
    _gguf(root, "gg_heads_zero", heads=0, width=16, tensors=ATTN)
    _gguf(root, "gg_bad_name", heads=2, width=16,
          tensors={k.replace("blk.0.", "blk.x0."): v for k, v in ATTN.items()})
    _gguf(root, "gg_huge", heads=1000, width=100000, tensors=ATTN)
    _gguf(root, "gg_wide", heads=8, width=4096, tensors=ATTN)  # tensors far smaller than declared
    _gguf(root, "gg_tiny", heads=2, width=16, tensors=ATTN)  # well formed, but nothing can run it
    _gguf(root, "gg_blocks_huge", heads=2, width=16, tensors=ATTN, blocks=10**9)
    _gguf(root, "gg_blocks_more", heads=2, width=16, tensors=ATTN, blocks=3)
    _gguf(root, "gg_kv_zero", heads=2, width=16, tensors=ATTN, kv_heads=0)
    cut = _gguf(root, "gg_truncated", heads=2, width=16, tensors=ATTN)
    cut.write_bytes(cut.read_bytes()[:-300])  # the last tensor's data ends early
    _declare_wider(_gguf(root, "gg_oversized", heads=2, width=16, tensors=ATTN), "blk.0.attn_q.weight", 1 << 40)
    _truncated_safetensors(root, "st_truncated")
    return root


@pytest.fixture(scope="module")
def url(launch_server, tmp_path_factory, root):
    with launch_server(tmp_path_factory.mktemp("cache"), check_errors=True,
                       env={"HEADGRAPH_MODEL_ROOT": str(root)}) as srv:
        yield srv.url


@pytest.mark.parametrize("model", sorted(CASES))
def test_a_malformed_model_is_a_4xx_naming_the_field(url, root, model):
    with httpx.Client(base_url=url, timeout=120) as http:
        listed = {m["id"] for m in http.get("/api/models").json()["models"]}
        assert model in listed  # offered like any folder: it fails when it is read
        for path, params in (("/api/models/info", {"model": model}),
                             ("/api/pk", {"model": model, "pairing": "OK"})):
            r = http.get(path, params=params)
            assert r.status_code == 422, (path, r.status_code, r.text)
            message = r.json()["error"]["message"]
            assert model.split(":", 1)[1] in message and CASES[model] in message, message
            assert str(root) not in message  # the server path stays private


def test_a_label_upload_for_a_malformed_model_is_a_4xx(url):
    r = httpx.post(url + "/api/labels", params={"model": "local:gg_huge", "name": "mine"},
                   json={"classes": {"L0H0": "a"}}, timeout=120)
    assert r.status_code == 422, r.text
    assert "embedding_length" in r.json()["error"]["message"]


def _job(http: httpx.Client, model: str) -> dict:
    job = http.post("/api/models/compute", params={"model": model}).json()["job"]
    deadline = time.monotonic() + 300
    while (rec := http.get(f"/api/jobs/{job['id']}").json())["state"] in ("queued", "running"):
        assert time.monotonic() < deadline, rec
        time.sleep(0.2)
    return rec


def test_a_stage_the_model_cannot_give_leaves_the_others_and_is_remembered(url):
    """A GGUF transformers cannot run: the job computes PK and CS, records the attention
    patterns as unavailable with the reason and ends done; reading them again answers that
    reason at once (nothing recomputed) until the user asks for a new job; the newest job is
    readable without starting one."""
    model = "local:gg_tiny"
    with httpx.Client(base_url=url, timeout=120) as http:
        assert http.get("/api/jobs", params={"model": model}).status_code == 404  # none yet
        rec = _job(http, model)
        assert rec["state"] == "done", rec
        assert "patterns" in rec["unavailable"] and "cannot be run here" in rec["unavailable"]["patterns"]
        assert "pk" in rec["computed"] and "cs K" in rec["computed"]
        assert rec["message"].startswith(f"done with {len(rec['unavailable'])} stages unavailable")
        assert http.get("/api/pk", params={"model": model, "pairing": "OK"}).status_code == 200
        t0 = time.perf_counter()
        r = http.get("/api/patterns", params={"model": model})
        assert r.status_code == 422 and "cannot be run here" in r.json()["error"]["message"]
        assert time.perf_counter() - t0 < 2.0  # remembered, not booted again
        latest = http.get("/api/jobs", params={"model": model}).json()
        assert latest["id"] == rec["id"] and latest["state"] == "done"
        again = _job(http, model)  # the user asks again: tried again, same answer
        assert again["id"] != rec["id"] and again["attempt"] == rec["attempt"] + 1
        assert again["unavailable"].keys() == rec["unavailable"].keys()


def test_a_same_size_weight_swap_keeping_mtime_is_a_new_model(url, root):
    """Replacing a folder's weights by others of the same size, with the old mtime put back,
    is noticed (the stamp holds inode and ctime too): the model is read again, not served
    the old identity."""
    import os

    from transformers import GPT2Config, GPT2LMHeadModel

    from model_support import save_random_model

    cfg = GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=32)
    folder = save_random_model(root / "swap", cfg, GPT2LMHeadModel, seed=0)
    with httpx.Client(base_url=url, timeout=120) as http:
        first = http.get("/api/models/info", params={"model": "local:swap"}).json()["fingerprint"]
        weights = folder / "model.safetensors"
        before = weights.stat()
        other = save_random_model(root.parent / "swap-other", cfg, GPT2LMHeadModel, seed=1)
        os.replace(other / "model.safetensors", weights)
        os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))
        after = weights.stat()
        assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
        second = http.get("/api/models/info", params={"model": "local:swap"}).json()["fingerprint"]
        assert second != first
