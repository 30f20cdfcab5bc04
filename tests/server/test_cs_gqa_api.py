"""Composition Scores of grouped-query (GQA) OK / OV pairs in every export and view.

An OK / OV pair of a GQA model targets a KV group, but CS depends on the target query head's
own W_Q / W_O, so a KV pair's CS is the mean over the query heads the group serves
(core.ranking.kv_level_cs). Checked on the local random Qwen2 folder (4 query heads, 2 KV
groups) and on the real SmolLM2 GGUF (9 query heads, 3 KV groups) against an independent
float64 reference computed from the raw Hugging Face projections with plain matmuls:
CS(i -> j) = ||W_OV^i R_j||_F / (||W_OV^i||_F ||R_j||_F) (Elhage et al. 2021), with
R_j = W_K W_Q^T (K-composition) or W_V W_O (V-composition) of target query head j.
core's kv_level_cs alone is tests/core/test_cs_gqa.py; here the API (in process) and the CLI.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import networkx as nx
import pytest
import torch
from safetensors.torch import load_file

from session_support import copy_cache

HEADGRAPH = Path(sys.executable).with_name("headgraph")
RTOL = 1e-4
HEAD = re.compile(r"^L(\d+)(H|KV)(\d+)$")


# -- independent float64 reference ------------------------------------------------------------

class Reference:
    """Per-head float64 matrices from a Llama / Qwen2 state dict (q/k/v/o_proj, x @ W.T)."""

    def __init__(self, sd: dict[str, torch.Tensor], n_layers: int, n_heads: int, n_kv: int):
        self.H, self.Hkv, self.group = n_heads, n_kv, n_heads // n_kv
        self.W: dict[str, list[torch.Tensor]] = {"Q": [], "K": [], "V": [], "O": []}
        for i in range(n_layers):
            p = f"model.layers.{i}.self_attn."
            q, k, v, o = (sd[p + f"{n}_proj.weight"].double() for n in "qkvo")
            d = q.shape[1]
            dh = q.shape[0] // n_heads
            self.W["Q"].append(q.reshape(n_heads, dh, d).transpose(-2, -1))  # [H, d, dh]
            self.W["K"].append(k.reshape(n_kv, dh, d).transpose(-2, -1))  # [Hkv, d, dh]
            self.W["V"].append(v.reshape(n_kv, dh, d).transpose(-2, -1))
            self.W["O"].append(o.reshape(d, n_heads, dh).permute(1, 2, 0))  # [H, dh, d]

    def ov(self, layer: int, q: int) -> torch.Tensor:
        return self.W["V"][layer][q // self.group] @ self.W["O"][layer][q]

    def right(self, mode: str, layer: int, q: int) -> torch.Tensor:
        if mode == "K":
            return self.W["K"][layer][q // self.group] @ self.W["Q"][layer][q].T
        if mode == "Q":
            return self.W["Q"][layer][q] @ self.W["K"][layer][q // self.group].T
        return self.ov(layer, q)

    def cs(self, mode: str, sl: int, sh: int, tl: int, tq: int) -> float:
        """CS of source query head (sl, sh) -> target query head (tl, tq)."""
        left, right = self.ov(sl, sh), self.right(mode, tl, tq)
        num = torch.linalg.matrix_norm(left @ right)
        return float(num / (torch.linalg.matrix_norm(left) * torch.linalg.matrix_norm(right)))

    def served(self, kv: int) -> list[int]:
        return list(range(kv * self.group, (kv + 1) * self.group))

    def kv_cs(self, mode: str, sl: int, sh: int, tl: int, kv: int) -> float:
        """The KV-level CS: mean over the query heads the target KV group serves."""
        vals = [self.cs(mode, sl, sh, tl, q) for q in self.served(kv)]
        return sum(vals) / len(vals)

    def expected(self, mode: str, source: str, target: str) -> tuple[float, str | None]:
        """(CS, cs_of) a record naming source and target heads must carry."""
        s, t = HEAD.match(source), HEAD.match(target)
        assert s and t and s[2] == "H", (source, target)
        sl, sh, tl, th = int(s[1]), int(s[3]), int(t[1]), int(t[3])
        if t[2] == "KV":
            of = "mean over " + ", ".join(f"L{tl}H{q}" for q in self.served(th))
            return self.kv_cs(mode, sl, sh, tl, th), of
        return self.cs(mode, sl, sh, tl, th), None


def check_rows(rows: list[dict[str, Any]], ref: Reference, mode: str, *, kv: bool) -> None:
    assert rows
    for r in rows:
        want, of = ref.expected(mode, r["source"], r["target"])
        assert ("KV" in r["target"]) == kv, r
        assert r["cs"] is not None, r
        assert float(r["cs"]) == pytest.approx(want, rel=RTOL), r
        assert (r.get("cs_of") or None) == of, r


# -- fixtures ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def qwen_ref(qwen2_gqa_dir: Path) -> Reference:
    return Reference(load_file(str(qwen2_gqa_dir / "model.safetensors")), 3, 4, 2)


@pytest.fixture(scope="module")
def client(qwen2_gqa_dir: Path, smollm2_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The HTTP API in-process, serving the Qwen2 folder as local:<name>, the demo model and
    smollm2 (the packaged GGUF; its results from the session's SmolLM2 cache, conftest)."""
    from fastapi.testclient import TestClient

    from headgraph.server.http.app import create_app
    from headgraph.server.settings import Settings

    cache = copy_cache(smollm2_cache, tmp_path_factory.mktemp("cs-gqa") / "cache")
    settings = Settings(cache_dir=cache, compute_processes=0, model_root=qwen2_gqa_dir.parent)
    with TestClient(create_app(settings)) as c:
        yield c


def get(client: Any, path: str, **params: Any) -> Any:
    resp = client.get(path, params=params)
    assert resp.status_code == 200, resp.text[:1000]
    return resp


# -- local Qwen2 (4 query heads, 2 KV groups) ------------------------------------------------

def run_cli(*args: str, cache: Path) -> str:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               HEADGRAPH_CACHE_DIR=str(cache))
    proc = subprocess.run([str(HEADGRAPH), *args], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.slow  # three CLI subprocesses: ~25 s (the other metrics: the API test below)
def test_cli_export_gives_kv_level_cs_for_ok_and_ov(qwen2_gqa_dir, qwen_ref, tmp_path):
    cache = tmp_path / "cache"
    out = run_cli("export", str(qwen2_gqa_dir), "--pairing", "OK", "--top", "10",
                  "--metric", "cs", "--format", "json", cache=cache)
    pairs = json.loads(out)["pairs"]
    assert len(pairs) == 10
    check_rows(pairs, qwen_ref, "K", kv=True)
    vals = [p["cs"] for p in pairs]  # ranked by the KV-level CS itself
    assert vals == sorted(vals, reverse=True)
    text = run_cli("export", str(qwen2_gqa_dir), "--pairing", "OV", "--top", "6",
                   "--format", "csv", cache=cache)
    rows = list(csv.DictReader(io.StringIO(text)))
    assert list(rows[0]) == ["source", "target", "pk", "normalized", "cs", "cs_of", "cka", "procrustes"]
    check_rows(rows, qwen_ref, "V", kv=True)
    # OQ targets query heads: their own CS, no cs_of
    pairs = json.loads(run_cli("export", str(qwen2_gqa_dir), "--pairing", "OQ", "--top", "5",
                               "--format", "json", cache=cache))["pairs"]
    check_rows(pairs, qwen_ref, "Q", kv=False)
    assert all(set(p) == {"source", "target", "pk", "normalized", "cs", "cka", "procrustes"} for p in pairs)


def test_api_views_and_downloads_agree_on_kv_level_cs(client, qwen2_gqa_dir, qwen_ref):
    model = f"local:{qwen2_gqa_dir.name}"
    for pairing, mode in (("OK", "K"), ("OV", "V")):
        for metric in ("pk", "normalized", "z", "cs"):
            top = get(client, "/api/top", model=model, pairing=pairing, k=8, metric=metric).json()
            check_rows(top["pairs"], qwen_ref, mode, kv=True)
        body = get(client, "/api/download/top", model=model, pairing=pairing, k=8,
                   format="json").json()
        check_rows(body["pairs"], qwen_ref, mode, kv=True)
        text = get(client, "/api/download/top", model=model, pairing=pairing, k=8,
                   format="csv", metric="cs").text
        rows = list(csv.DictReader(io.StringIO(text)))
        assert list(rows[0])[:6] == ["source", "target", "pk", "normalized", "cs", "cs_of"]
        check_rows(rows, qwen_ref, mode, kv=True)

        # the pair panel (however the KV target is named) and the scatter give the same CS
        sc = get(client, "/api/scatter", model=model, pairing=pairing).json()
        assert "mean over the target KV group's query heads" in sc["cs_of"]
        pts = sc["points"]
        for i in range(0, len(pts["cs"]), 5):
            want, _ = qwen_ref.expected(mode, pts["source"][i], pts["target"][i])
            assert pts["cs"][i] == pytest.approx(want, rel=RTOL)
        for target in ("L2KV1", "L2H3"):
            d = get(client, "/api/pair", model=model, pairing=pairing, source="L0H1",
                    target=target).json()
            assert d["target"] == "L2KV1" and d["cs_of"] == "mean over L2H2, L2H3"
            assert d["cs"] == pytest.approx(qwen_ref.kv_cs(mode, 0, 1, 2, 1), rel=RTOL)

    # graph edges: KV-group targets carry the KV-level CS and cs_of, OQ edges their own CS
    graph = get(client, "/api/graph", model=model, pairings="OQ,OK,OV", k=6).json()
    edges = graph["graph"]["edges"]
    assert len(edges) == 18
    for e in edges:
        mode = e["pairing"][1]
        want, of = qwen_ref.expected(mode, e["source"], e["target"])
        assert e["cs"] == pytest.approx(want, rel=RTOL)
        assert e.get("cs_of") == of and (of is None) == (mode == "Q")
    gml = get(client, "/api/download/graph", model=model, pairings="OK", k=4, format="graphml").text
    g = nx.read_graphml(io.StringIO(gml), force_multigraph=True)
    for u, v, d in g.edges(data=True):
        want, of = qwen_ref.expected("K", u, v)
        assert float(d["cs"]) == pytest.approx(want, rel=RTOL) and d["cs_of"] == of


def test_raw_cs_downloads_stay_per_query_head_and_say_so(client, qwen2_gqa_dir, qwen_ref):
    model = f"local:{qwen2_gqa_dir.name}"
    resp = get(client, "/api/download/cs", model=model, mode="K", format="csv")
    assert "per target query head" in resp.headers["x-headgraph-cs-of"]
    rows = list(csv.DictReader(io.StringIO(resp.text)))
    assert len(rows) == 3 * 4 * 4  # forward layer pairs x query heads x query heads
    assert not any("KV" in r["target"] for r in rows)
    for r in rows[::7]:
        assert float(r["cs"]) == pytest.approx(qwen_ref.expected("K", r["source"], r["target"])[0],
                                               rel=RTOL)
    js = get(client, "/api/download/cs", model=model, mode="V", format="json")
    grid = js.json()
    assert grid["shape"] == [3, 4, 3, 4] and "per target query head" in grid["cs_of"]
    assert grid["target_labels"][:4] == ["L0H0", "L0H1", "L0H2", "L0H3"]
    assert "x-headgraph-cs-of" in js.headers
    npy = get(client, "/api/download/cs", model=model, mode="K", format="npy")
    assert "x-headgraph-cs-of" in npy.headers
    api = get(client, "/api/cs", model=model, mode="K").json()
    assert api["shape"] == [3, 4, 3, 4] and "per target query head" in api["cs_of"]
    q = get(client, "/api/cs", model=model, mode="Q").json()  # Q-composition targets query heads
    assert q["cs_of"] is None


def test_non_gqa_models_are_unchanged(client):
    """The demo model (8 query heads, 8 KV heads): every record's CS is the pair's own CS
    (the raw grid's value exactly), with no cs_of, no download header, no grid cs_of."""
    from headgraph.core.models.demo import DEMO_DIR

    sd = {k: v.double() for k, v in load_file(str(DEMO_DIR / "model.safetensors")).items()}
    for pairing, mode in (("OK", "K"), ("OV", "V")):
        grid = get(client, "/api/cs", model="demo", mode=mode).json()
        assert grid["cs_of"] is None
        pos = {layer: i for i, layer in enumerate(grid["layer_indices"])}
        for metric in ("pk", "cs"):
            pairs = get(client, "/api/top", model="demo", pairing=pairing, k=10,
                        metric=metric).json()["pairs"]
            for p in pairs:
                assert "cs_of" not in p and "KV" not in p["target"]
                sl, tl = pos[p["source_layer"]], pos[p["target_layer"]]
                assert p["cs"] == grid["grid"][sl][p["source_head"]][tl][p["target_head"]]
                left = sd["W_V"][sl, p["source_head"]] @ sd["W_O"][sl, p["source_head"]]
                th = p["target_head"]
                right = (sd["W_K"][tl, th] @ sd["W_Q"][tl, th].T if mode == "K"
                         else sd["W_V"][tl, th] @ sd["W_O"][tl, th])
                want = float(torch.linalg.matrix_norm(left @ right)
                             / (torch.linalg.matrix_norm(left) * torch.linalg.matrix_norm(right)))
                assert p["cs"] == pytest.approx(want, rel=RTOL)
        resp = get(client, "/api/download/cs", model="demo", mode=mode, format="csv")
        assert "x-headgraph-cs-of" not in resp.headers
        text = get(client, "/api/download/top", model="demo", pairing=pairing, format="csv").text
        assert "cs_of" not in text.splitlines()[0]
    edges = get(client, "/api/graph", model="demo", pairings="OK,OV", k=5).json()["graph"]["edges"]
    assert edges and all("cs_of" not in e and e["cs"] is not None for e in edges)


# -- the real SmolLM2 GGUF (9 query heads, 3 KV groups, Q4_1) -------------------------------

@pytest.fixture(scope="module")
def smol_ref(smollm2_hf_dir: Path) -> Reference:
    """transformers' own dequantization of the packaged GGUF (conftest; not headgraph's loader)."""
    cfg = json.loads((smollm2_hf_dir / "config.json").read_text())
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (9, 3)
    sd = {k: v for k, v in load_file(str(smollm2_hf_dir / "model.safetensors")).items() if ".self_attn." in k}
    return Reference(sd, cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"])


@pytest.mark.slow  # SmolLM2's float64 reference
def test_smollm2_gguf_top_rows_have_kv_level_cs(client, smol_ref):
    for pairing, mode in (("OK", "K"), ("OV", "V")):
        for metric in ("pk", "cs"):
            pairs = get(client, "/api/top", model="smollm2", pairing=pairing, k=6,
                        metric=metric).json()["pairs"]
            assert len(pairs) == 6
            check_rows(pairs, smol_ref, mode, kv=True)
            assert all(len(p["cs_of"].split(", ")) == 3 for p in pairs)
        text = get(client, "/api/download/top", model="smollm2", pairing=pairing, k=4,
                   format="csv").text
        check_rows(list(csv.DictReader(io.StringIO(text))), smol_ref, mode, kv=True)
    edges = get(client, "/api/graph", model="smollm2", pairings="OK,OV",
                k=4).json()["graph"]["edges"]
    assert len(edges) == 8
    for e in edges:
        want, of = smol_ref.expected(e["pairing"][1], e["source"], e["target"])
        assert e["cs"] == pytest.approx(want, rel=RTOL) and e["cs_of"] == of


@pytest.mark.slow  # a CLI subprocess reading SmolLM2 from a copy of the session's cache
def test_smollm2_cli_export(smol_ref, smollm2_cache, tmp_path):
    # --similarity cached: no CKA / Procrustes grids of SmolLM2 here (the job does not compute
    # them, so their columns stay empty); they are checked on the small models
    out = run_cli("export", "smollm2", "--pairing", "OV", "--top", "5", "--format", "json",
                  "--similarity", "cached", cache=copy_cache(smollm2_cache, tmp_path / "cache"))
    pairs = json.loads(out)["pairs"]
    check_rows(pairs, smol_ref, "V", kv=True)
    assert all(p["cka"] is None and p["procrustes"] is None for p in pairs)
