"""The ``headgraph`` console script, offline, on a local GPT-2-architecture checkpoint folder.

Numbers are checked against an independent float64 computation straight from the saved
safetensors (GPT-2 Conv1D layout), not against headgraph's own code.
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import networkx as nx
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

pytestmark = pytest.mark.slow  # every test runs the console script in subprocesses: ~2 min

torch.set_num_threads(1)
HEADGRAPH = Path(sys.executable).with_name("headgraph")
N_LAYER, N_HEAD, D_MODEL = 3, 4, 32
D_HEAD = D_MODEL // N_HEAD
CORPUS = [
    "When Mary and John went to the shops, John gave the bag to Mary.",
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Attention heads read from and write to the residual stream.",
    "Projection kernels compare subspaces through principal angles.",
] * 20


def build_gpt2_dir(folder: Path) -> Path:
    """A random tiny GPT2LMHeadModel plus a byte-level BPE tokenizer trained with `tokenizers`."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS, vocab_size=320, min_frequency=1,
                            special_tokens=["<|endoftext|>"], show_progress=False)
    tok = GPT2TokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<|endoftext|>",
                            eos_token="<|endoftext|>", unk_token="<|endoftext|>")
    config = GPT2Config(n_layer=N_LAYER, n_head=N_HEAD, n_embd=D_MODEL, n_positions=64,
                        vocab_size=len(tok), bos_token_id=tok.bos_token_id,
                        eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    GPT2LMHeadModel(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory) -> Path:
    # Not conftest's gpt2_tiny_dir: 2 layers x 4 heads have only 16 forward pairs, and the
    # export must rank 20 of them.
    return build_gpt2_dir(tmp_path_factory.mktemp("ckpt") / "gpt2-tiny")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


def run_cli(*args: str, cache: Path, expect: int = 0) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               HEADGRAPH_CACHE_DIR=str(cache))
    proc = subprocess.run([str(HEADGRAPH), *args], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == expect, proc.stderr[-3000:]
    return proc


def head_weights(folder: Path) -> tuple[list[torch.Tensor], ...]:
    """float64 per-head (W_Q, W_K, W_V [d, dh], W_O [dh, d]) lists, heads in layer-major order."""
    sd = load_file(str(folder / "model.safetensors"))
    w_q, w_k, w_v, w_o = [], [], [], []
    for layer in range(N_LAYER):
        c_attn = sd[f"transformer.h.{layer}.attn.c_attn.weight"].double()  # [d, 3d], x @ W
        c_proj = sd[f"transformer.h.{layer}.attn.c_proj.weight"].double()  # [d, d], z @ W
        q, k, v = c_attn.split(D_MODEL, dim=1)
        for h in range(N_HEAD):
            cols = slice(h * D_HEAD, (h + 1) * D_HEAD)
            w_q.append(q[:, cols])
            w_k.append(k[:, cols])
            w_v.append(v[:, cols])
            w_o.append(c_proj[cols, :])  # [dh, d]
    return w_q, w_k, w_v, w_o


def reference_similarity(weights: tuple[list[torch.Tensor], ...], name: tuple[str, str]) -> tuple[float, float]:
    """float64 (linear CKA, orthogonal Procrustes) of O_i^T vs K_j for the pair ``name`` = (source,
    target) of ``head_weights``, from their definitions on the matrices centred over d_model."""
    _, w_k, _, w_o = weights
    i, j = (int(n[1:].split("H")[0]) * N_HEAD + int(n.split("H")[1]) for n in name)
    x, y = w_o[i].T, w_k[j]
    x, y = x - x.mean(0), y - y.mean(0)
    cka = float(torch.linalg.norm(y.T @ x).square() / (torch.linalg.norm(x.T @ x) * torch.linalg.norm(y.T @ y)))
    proc = float(torch.linalg.svdvals(x.T @ y).sum() / (torch.linalg.norm(x) * torch.linalg.norm(y)))
    return cka, proc


def reference_scores(folder: Path) -> dict[tuple[str, str], tuple[float, float]]:
    """float64 (PK of O_i vs K_j, CS K-mode of i -> j) for every forward head pair."""
    w_q, w_k, w_v, w_o = head_weights(folder)

    def basis(m: torch.Tensor) -> torch.Tensor:
        return torch.linalg.svd(m, full_matrices=False).U

    out = {}
    for i in range(N_LAYER * N_HEAD):
        for j in range(N_LAYER * N_HEAD):
            if i // N_HEAD >= j // N_HEAD:
                continue
            pk = float((basis(w_o[i].T).T @ basis(w_k[j])).square().sum())
            left = w_v[i] @ w_o[i]  # W_OV [d, d]
            right = w_k[j] @ w_q[j].T  # W_QK^T
            cs = float(torch.linalg.norm(left @ right) / (torch.linalg.norm(left) * torch.linalg.norm(right)))
            out[(f"L{i // N_HEAD}H{i % N_HEAD}", f"L{j // N_HEAD}H{j % N_HEAD}")] = (pk, cs)
    return out


def test_export_json_ranks_pairs_offline_and_matches_float64(gpt2_dir, cache_dir):
    proc = run_cli("export", str(gpt2_dir), "--pairing", "OK", "--top", "20", "--format", "json",
                   cache=cache_dir)
    data = json.loads(proc.stdout)  # exactly one JSON object on stdout
    assert data["pairing"] == "OK" and data["model"] == str(gpt2_dir.resolve())
    pairs = data["pairs"]
    assert len(pairs) == 20
    pks = [p["pk"] for p in pairs]
    assert pks == sorted(pks, reverse=True)
    ref = reference_scores(gpt2_dir)
    weights = head_weights(gpt2_dir)
    expected_top = sorted(ref, key=lambda k: -ref[k][0])[:20]
    assert [(p["source"], p["target"]) for p in pairs] == expected_top
    for p in pairs:
        pk, cs = ref[(p["source"], p["target"])]
        assert p["pk"] == pytest.approx(pk, abs=1e-4)
        assert 0.0 <= p["pk"] <= D_HEAD
        assert p["normalized"] == pytest.approx(pk / D_HEAD, abs=1e-5)
        assert p["cs"] == pytest.approx(cs, rel=1e-4, abs=1e-6)
        cka, proc = reference_similarity(weights, (p["source"], p["target"]))
        assert (p["cka"], p["procrustes"]) == (pytest.approx(cka, abs=1e-5), pytest.approx(proc, abs=1e-5))
    assert set(pairs[0]) == {"source", "target", "pk", "normalized", "cs", "cka", "procrustes"}


def test_export_csv_and_graphml_and_cs_ranking(gpt2_dir, cache_dir, tmp_path):
    proc = run_cli("export", str(gpt2_dir), "--pairing", "OK", "--top", "20", "--format", "csv",
                   cache=cache_dir)
    rows = list(csv.DictReader(io.StringIO(proc.stdout)))
    assert len(rows) == 20
    assert list(rows[0]) == ["source", "target", "pk", "normalized", "cs", "cka", "procrustes"]
    ref = reference_scores(gpt2_dir)
    vals = [float(r["pk"]) for r in rows]
    assert vals == sorted(vals, reverse=True)
    assert all(float(r["pk"]) == pytest.approx(ref[(r["source"], r["target"])][0], abs=1e-4)
               for r in rows)

    out = tmp_path / "g.graphml"
    run_cli("export", str(gpt2_dir), "--pairing", "OK", "--top", "7", "--format", "graphml",
            "-o", str(out), cache=cache_dir)
    g = nx.read_graphml(out, force_multigraph=True)
    assert g.number_of_edges() == 7
    assert {d["pairing"] for _, _, d in g.edges(data=True)} == {"OK"}
    top7 = set(sorted(ref, key=lambda k: -ref[k][0])[:7])
    assert {(u, v) for u, v in g.edges()} == top7

    by_cs = json.loads(run_cli("export", str(gpt2_dir), "--pairing", "OK", "--top", "5",
                               "--metric", "cs", "--format", "json", cache=cache_dir).stdout)
    expected = sorted(ref, key=lambda k: -ref[k][1])[:5]
    assert [(p["source"], p["target"]) for p in by_cs["pairs"]] == expected
    assert [p["cs"] for p in by_cs["pairs"]] == sorted((p["cs"] for p in by_cs["pairs"]), reverse=True)


def test_models_and_cache_info_clear(gpt2_dir, cache_dir):
    listing = run_cli("models", cache=cache_dir).stdout
    assert listing.splitlines()[0].split()[:3] == ["demo", "builtin", "available"]
    models = json.loads(run_cli("models", "--json", cache=cache_dir).stdout)["models"]
    ids = [m["id"] for m in models]
    assert ids[0] == "demo" and "gpt2" in ids
    offline = {m["id"]: m["status"] for m in models}
    assert offline["gpt2"] in ("available", "not available offline")

    info = json.loads(run_cli("cache", "info", cache=cache_dir).stdout)
    assert info["entries"] > 0 and info["computations"] > 0
    before = info["computations"]
    run_cli("export", str(gpt2_dir), "--pairing", "OK", "--top", "20", "--format", "json",
            cache=cache_dir)
    assert json.loads(run_cli("cache", "info", cache=cache_dir).stdout)["computations"] == before
    cleared = json.loads(run_cli("cache", "clear", cache=cache_dir).stdout)
    assert cleared["cleared"] > 0
    after = json.loads(run_cli("cache", "info", cache=cache_dir).stdout)
    assert after["entries"] == 0 and after["computations"] == 0


def test_compute_reports_progress_on_stderr_only(tmp_path):
    proc = run_cli("compute", "demo", "--pairings", "OK", cache=tmp_path / "c")
    out = json.loads(proc.stdout)
    assert out["model"] == "demo" and "pk OK" in out["computed"] and "cs K" in out["computed"]
    assert "100%" in proc.stderr


# -- hubs ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def api(gpt2_dir, tmp_path_factory):
    """The HTTP API in-process (its own cache), serving the same local folder as local:<name>."""
    from fastapi.testclient import TestClient

    from headgraph.server.http.app import create_app
    from headgraph.server.settings import Settings

    settings = Settings(cache_dir=tmp_path_factory.mktemp("api-cache"), compute_processes=0,
                        model_root=gpt2_dir.parent)
    with TestClient(create_app(settings)) as client:
        yield client


def check_hub_report(report: dict, graph: dict, pairings: list[str], k: int) -> None:
    """The CLI's hub table against degrees counted from the API graph's own edge list."""
    edges = graph["graph"]["edges"]
    assert len(edges) == k * len(pairings) == sum(report["edge_counts"].values())
    assert {e["pairing"] for e in edges} == set(pairings) == set(report["pairings"])
    ins, outs, weight = {}, {}, {}
    for e in edges:
        outs[e["source"]] = outs.get(e["source"], 0) + 1
        ins[e["target"]] = ins.get(e["target"], 0) + 1
        for end in (e["source"], e["target"]):
            weight[end] = weight.get(end, 0.0) + e["score"]
    rows = report["rows"]
    names = [r["name"] for r in rows]
    assert sorted(names) == sorted({n["id"] for n in graph["graph"]["nodes"]}) == sorted(weight)
    assert names == [r["name"] for r in graph["hubs"]["rows"]]  # same ranking as the API
    for r in rows:
        assert (r["in_degree"], r["out_degree"]) == (ins.get(r["name"], 0), outs.get(r["name"], 0))
        assert r["degree"] == r["in_degree"] + r["out_degree"]
        assert r["weighted_degree"] == pytest.approx(weight[r["name"]], rel=1e-9)
    # Ranked by total degree, ties by weighted degree, then name.
    keys = [(-r["degree"], -r["weighted_degree"], r["name"]) for r in rows]
    assert keys == sorted(keys) and [r["rank"] for r in rows] == list(range(1, len(rows) + 1))
    degrees = np.array([r["degree"] for r in rows], dtype=float)
    threshold = degrees.mean() + 2 * degrees.std()
    assert report["threshold"] == pytest.approx(threshold)
    assert [r["is_hub"] for r in rows] == [i == 0 or d > threshold for i, d in enumerate(degrees)]
    assert report["top_hub"] == rows[0]["name"] == report["hubs"][0]
    g = nx.MultiDiGraph()
    g.add_edges_from((e["source"], e["target"], {"score": e["score"]}) for e in edges)
    pagerank = nx.pagerank(g, weight="score")
    assert all(r["pagerank"] == pytest.approx(pagerank[r["name"]], abs=1e-6) for r in rows)
    assert "total degree" in report["rule"] and f"top-{k}" in report["graph_rule"]


@pytest.mark.parametrize("which, pairings, k", [("demo", "OQ,OK,OV", 20), ("folder", "OQ,OK,OV", 20),
                                                ("demo", "OK,OV", 7)])
def test_hubs_json_matches_api_graph(which, pairings, k, gpt2_dir, cache_dir, api):
    model = "demo" if which == "demo" else str(gpt2_dir)
    api_model = "demo" if which == "demo" else f"local:{gpt2_dir.name}"
    args = ["hubs", model, "--json"] + (["--pairings", pairings, "--top", str(k)]
                                        if (pairings, k) != ("OQ,OK,OV", 20) else [])
    report = json.loads(run_cli(*args, cache=cache_dir).stdout)  # exactly one JSON object
    graph = api.get("/api/graph", params={"model": api_model, "pairings": pairings, "k": k})
    assert graph.status_code == 200, graph.text
    check_hub_report(report, graph.json(), pairings.split(","), k)
    if which == "folder":
        assert report["model"] == str(gpt2_dir.resolve())
        assert {r["name"] for r in report["rows"]} <= {f"L{a}H{b}" for a in range(N_LAYER)
                                                       for b in range(N_HEAD)}


def test_hubs_text_table_and_help(cache_dir):
    full = json.loads(run_cli("hubs", "demo", "--json", cache=cache_dir).stdout)
    text = run_cli("hubs", "demo", "--rows", "3", cache=cache_dir).stdout
    lines = text.splitlines()
    assert any(line.startswith("rule: hub = total degree > mean + 2 std") for line in lines)
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["rank", "node"])
    assert lines[header].split() == ["rank", "node", "in", "out", "total", "weighted", "pagerank",
                                     "betweenness", "hub"]
    table = [line.split() for line in lines[header + 1:]]
    assert [row[1] for row in table] == [r["name"] for r in full["rows"][:3]]
    assert [int(row[4]) for row in table] == [r["degree"] for r in full["rows"][:3]]
    assert table[0][-1] == "yes"
    helptext = run_cli("hubs", "--help", cache=cache_dir).stdout
    assert "headgraph hubs gpt2" in helptext and "L4H7" in helptext
    assert "--top must be in 1..1000" in run_cli("hubs", "demo", "--top", "0", cache=cache_dir,
                                                 expect=2).stderr
    bad = run_cli("hubs", "demo", "--pairings", "OX", cache=cache_dir, expect=2)
    assert "pairing" in bad.stderr and "Traceback" not in bad.stderr


def test_bad_inputs_fail_cleanly(tmp_path):
    proc = run_cli("export", "no-such-model", "--format", "json", cache=tmp_path, expect=2)
    assert proc.stdout == ""
    assert "unknown model 'no-such-model'" in proc.stderr and "demo" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = run_cli("export", "demo", "--pairing", "XY", cache=tmp_path, expect=2)
    assert "pairing" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_cli("export", "demo", "--top", "0", cache=tmp_path, expect=2)
    assert "--top" in proc.stderr


def test_any_random_spec_works_at_the_terminal_without_being_listed(tmp_path):
    """The CLI is local: a ``random:`` spec is a model without HEADGRAPH_MODELS naming it (the
    server offers only the listed ones); its top pair's PK is that of the spec's weights
    (float64, from their definition)."""
    from headgraph.core.models.loading import load_model
    from headgraph.server.errors import NotFound
    from headgraph.server.models.offered import Registry
    from headgraph.server.settings import Settings

    spec = "random:gpt2-tiny@3"
    assert spec not in os.environ.get("HEADGRAPH_MODELS", "")
    proc = run_cli("export", spec, "--pairing", "OK", "--top", "5", "--format", "json", cache=tmp_path)
    data = json.loads(proc.stdout)
    assert data["model"] == spec and len(data["pairs"]) == 5
    heads = load_model(spec, device="cpu").heads
    top = data["pairs"][0]
    (ls, hs), (lt, ht) = ([int(x) for x in n[1:].split("H")] for n in (top["source"], top["target"]))
    out_basis = torch.linalg.svd(heads.W_O[ls, hs].double().T, full_matrices=False).U
    key_basis = torch.linalg.svd(heads.W_K[lt, ht].double(), full_matrices=False).U
    assert top["pk"] == pytest.approx(float((out_basis.T @ key_basis).square().sum()), abs=1e-4)
    with pytest.raises(NotFound, match="unknown model"):  # a server still offers only its list
        Registry(Settings.from_env({})).resolve(spec)


def test_the_command_list_loads_without_torch():
    """Every ``headgraph`` call builds the parser of every command (plug-ins included): it must
    not import torch (seconds), which only the commands that compute need."""
    code = ("import sys; from headgraph.server.cli.main import build_parser; build_parser(); "
            "print(sorted(m for m in ('torch', 'transformers', 'dash', 'plotly') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", out.stdout
