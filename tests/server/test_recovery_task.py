"""Recovery tables against a task circuit's edges (core's side: tests/core/test_circuit_reference.py):
`headgraph recovery --task` on the demo against numpy on the circuit's own edges and the demo's
float64 PK and CS (tests/server/conftest.py's ``ref``), the circuit reused from the cache under
GET /api/circuit's key, ``--edges``, MIB files as ``--circuit`` (a grouped-query one on a local
Qwen2), a task circuit of a tiny grouped-query Llama, and GET /api/recovery's task= and its 4xx
on a real uvicorn server (conftest.py's ``api``)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from headgraph.core.models.loading import load_model
from headgraph.core.stats.recovery import METRICS, metric_grids, recovery_table
from headgraph.server.cli.main import main

from api_support import err, ok

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]  # circuits, a server (~1 min)

CIRCUIT_KEY = {"task": "induction", "jsonl": None, "method": "eap-ig", "steps": 5, "pairs": 32}


def run(capsys, *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def cell(name: str) -> tuple[int, int]:
    """(block, head) of "L1H3" / "L1KV0" / "L1H3.K"."""
    m = re.match(r"^L(\d+)(?:H|KV)(\d+)", name)
    assert m is not None, name
    return int(m.group(1)), int(m.group(2))


def edge_mask(edges: list[tuple[str, str]], path: str, shape: tuple[int, ...]) -> np.ndarray:
    """The reference straight from circuit names: head writers into ``path`` readers (demo blocks
    are positions)."""
    pos = np.zeros(shape, dtype=bool)
    for w, r in edges:
        if re.match(r"^L\d+H\d+$", w) and r.endswith("." + path):
            pos[(*cell(w), *cell(r))] = True
    return pos


def auc_bound(scores: np.ndarray, pos: np.ndarray, tol: float) -> tuple[float, float]:
    """ROC-AUC by counting pairs (ties half), and how far float32 rounding (|diff| <= tol) may
    move it."""
    p, n = scores[pos][:, None], scores[~pos][None, :]
    auc = float(((p > n) + 0.5 * (p == n)).mean())
    return auc, float((np.abs(p - n) <= tol).mean())


def check_row(row: dict, grid: np.ndarray, valid: np.ndarray, pos: np.ndarray, k: int, tol: float) -> None:
    """A table row against numpy on the float64 ``grid``: ROC-AUC, and its top-k list really a
    top k whose precision and endpoint share are what the row says."""
    auc, slack = auc_bound(grid[valid], pos[valid], tol)
    assert row["auc"]["value"] == pytest.approx(auc, abs=slack + 1e-9), row["metric"]
    top = [tuple(cell(e) for e in pair.split(" -> ")) for pair in row["top"]]
    cells = [(a, b, c, d) for (a, b), (c, d) in top]
    assert len(cells) == k and all(valid[c] for c in cells)
    kth = np.sort(grid[valid])[-k]
    assert all(grid[c] >= kth - tol for c in cells)
    assert row["precision"]["value"] == pytest.approx(np.mean([pos[c] for c in cells]))
    src, tgt = pos.any(axis=(2, 3)), pos.any(axis=(0, 1))
    share = np.mean([(int(src[a, b]) + int(tgt[c, d])) / 2 for a, b, c, d in cells])
    assert row["endpoint_share"]["value"] == pytest.approx(share)


def test_task_recovery_on_the_demo_equals_numpy_on_the_circuit(tmp_path, capsys, ref):
    cache = str(tmp_path / "cache")
    answer = json.loads(run(capsys, "circuit", "demo", "--task", "induction", "--top", "2000", "--json",
                            "-q", "--cache-dir", cache))
    report = json.loads(run(capsys, "recovery", "demo", "--task", "induction", "--k", "10", "--json",
                            "-q", "--cache-dir", cache))
    size = answer["circuit_size"]
    c = report["circuit"]
    assert (c["source"], c["task"], c["method"], c["steps"], c["size"], c["n_edges"]) == (
        "task", "induction", "eap-ig", 5, size, answer["n_edges"])
    assert "smallest circuit on the faithfulness curve reaching 80%" in c["rule"]
    assert c["rule"] in report["reference"] and c["rule"] in report["method"]
    assert report["labels"] is None and [r["metric"] for r in report["rows"]] == list(METRICS)
    circuit = [(e["writer"], e["reader"]) for e in answer["edges"] if e["rank"] <= size]
    valid = ref["forward"].numpy()
    pos = edge_mask(circuit, "K", valid.shape)
    assert report["n_valid"] == int(valid.sum()) and report["n_reference"] == int(pos.sum()) > 0
    assert sorted(report["reference_edges"]) == sorted(
        f"L{a}H{b} -> L{c_}H{d}" for a, b, c_, d in zip(*np.nonzero(pos)))
    rows = {r["metric"]: r for r in report["rows"]}
    check_row(rows["pk"], ref["pk"]["OK"].numpy(), valid, pos, 10, 1e-4)
    check_row(rows["cs"], ref["cs_K"].numpy(), valid, pos, 10, 1e-5)
    # the head-level intervals and paired differences: core's recovery_table on numpy's reference
    grids, v = metric_grids(load_model("demo", device="cpu").heads, "OK")
    core = recovery_table(grids, v, torch.from_numpy(pos), k=10, n_resamples=report["n_resamples"], seed=0)
    for row in report["rows"]:
        want = core.row(row["metric"]).to_dict()
        for field in ("endpoint_share", "precision", "auc", "precision_diff", "auc_diff"):
            for end in ("value", "low", "high"):
                got, exp = (row[field] or {}).get(end), (want[field] or {}).get(end)
                assert got == pytest.approx(exp, abs=1e-9), (row["metric"], field, end)

    # the circuit came from the cache under GET /api/circuit's key, computed once
    from argparse import Namespace

    from headgraph.server.cli.common import resolve_model, services_for

    services = services_for(Namespace(cache_dir=cache))
    model = resolve_model(services, "demo")
    key = services.cache.key(model, "circuit", **CIRCUIT_KEY)
    assert services.store.compute_counts()[key] == 1
    text = run(capsys, "recovery", "demo", "--task", "induction", "--edges", "40", "-q", "--cache-dir", cache)
    assert "reference: the eap-ig circuit of task 'induction'" in text and "top 40 of" in text
    assert services.store.compute_counts()[key] == 1
    # keys: a task circuit's table is keyed by the whole model, like the circuit, and names it
    rkeys = [k for k in services.store.compute_counts() if "/recovery?" in k]
    assert len(rkeys) == 2 and all("circuit=task+induction+bundled-n32-seed0+eap-ig" in k for k in rkeys)
    assert all(k.split("/")[1] == key.split("/")[1] for k in rkeys)  # the model fingerprint
    top40 = json.loads(run(capsys, "recovery", "demo", "--task", "induction", "--edges", "40", "--json",
                           "-q", "--cache-dir", cache))
    pos40 = edge_mask([(e["writer"], e["reader"]) for e in answer["edges"] if e["rank"] <= 40], "K",
                      valid.shape)
    assert top40["n_reference"] == int(pos40.sum()) and top40["circuit"]["size"] == 40
    assert main(["recovery", "demo", "--task", "induction", "--edges", "100000", "-q", "--cache-dir", cache]) != 0
    assert "1..257" in capsys.readouterr().err

    # headgraph's own circuit answer as a file: the same reference, so the same table; keyed by
    # the file and the weights (the edges are given, nothing of the run is read)
    saved = tmp_path / "answer.json"
    saved.write_text(json.dumps(answer))
    from_file = json.loads(run(capsys, "recovery", "demo", "--circuit", str(saved), "--k", "10", "--json",
                               "--cache-dir", cache))
    assert from_file["circuit"]["source"] == "headgraph" and from_file["circuit"]["size"] == size
    assert from_file["reference_edges"] == report["reference_edges"] and from_file["rows"] == report["rows"]
    fkeys = [k for k in services.store.compute_counts() if "circuit=file+headgraph" in k]
    ident = services.catalog.known_identity(model)
    assert len(fkeys) == 1 and ident is not None and fkeys[0].split("/")[1] == ident.fingerprint


def mib(cfg: dict, edges: dict[str, tuple[float, bool]]) -> dict:
    nodes = {"input": {"in_graph": False}, "logits": {"in_graph": False}}
    for layer in range(cfg["n_layers"]):
        for h in range(cfg["n_heads"]):
            nodes[f"a{layer}.h{h}"] = {"in_graph": False}
    return {"cfg": cfg, "nodes": nodes,
            "edges": {k: {"score": s, "in_graph": g} for k, (s, g) in edges.items()}}


def test_a_mib_file_as_the_circuit(tmp_path, capsys, ref, model_root):
    cache = str(tmp_path / "cache")
    path = tmp_path / "circuit.json"
    path.write_text(json.dumps(mib({"n_layers": 2, "n_heads": 8}, {
        "a0.h0->a1.h3<k>": (0.9, True), "a0.h6->a1.h1<k>": (0.5, True), "a0.h2->a1.h2<q>": (0.4, True),
        "input->a1.h0<k>": (0.8, True), "a1.h2->logits": (0.7, True), "a0.h5->a1.h5<k>": (-0.95, False)})))
    report = json.loads(run(capsys, "recovery", "demo", "--circuit", str(path), "--k", "5", "--json",
                            "--cache-dir", cache))
    assert report["reference_edges"] == ["L0H0 -> L1H3", "L0H6 -> L1H1"]
    c = report["circuit"]
    assert (c["source"], c["size"], c["n_edges"], c["n_head_edges"]) == ("mib", 5, 6, 3)
    pos = np.zeros(ref["forward"].shape, dtype=bool)
    pos[0, 0, 1, 3] = pos[0, 6, 1, 1] = True
    check_row(report["rows"][0], ref["pk"]["OK"].numpy(), ref["forward"].numpy(), pos, 5, 1e-4)
    top = json.loads(run(capsys, "recovery", "demo", "--circuit", str(path), "--edges", "2", "--json",
                         "--cache-dir", cache))  # by |score|: the negative one is first
    assert top["reference_edges"] == ["L0H0 -> L1H3", "L0H5 -> L1H5"]
    assert "top 2 of 6 edges by |score|" in top["reference"]
    assert main(["recovery", "demo", "--circuit", str(path), "--pairing", "OV", "--cache-dir", cache]) != 0
    assert "no OV head -> head edge" in capsys.readouterr().err
    assert main(["recovery", "demo", "--circuit", str(path), "--method", "eap", "--cache-dir", cache]) != 0
    assert "only with --task" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{not json")
    assert main(["recovery", "demo", "--circuit", str(tmp_path / "bad.json"), "--cache-dir", cache]) != 0
    assert "not JSON" in capsys.readouterr().err

    # grouped-query: MIB's K / V edges per query head land on the KV head's cell
    gqa = tmp_path / "gqa.json"
    gqa.write_text(json.dumps(mib({"n_layers": 3, "n_heads": 4, "n_key_value_heads": 2}, {
        "a0.h1->a1.h2<k>": (0.2, True), "a0.h1->a1.h3<k>": (0.3, True), "a0.h0->a2.h0<v>": (0.4, True),
        "a1.h3->a2.h1<q>": (0.1, True)})))
    qwen = str(model_root / "qwen2-tiny")
    ok_ = json.loads(run(capsys, "recovery", qwen, "--circuit", str(gqa), "--k", "3", "--json",
                         "--cache-dir", cache))
    assert ok_["n_valid"] == 4 * 2 * 3 and ok_["reference_edges"] == ["L0H1 -> L1KV1"]
    ov = json.loads(run(capsys, "recovery", qwen, "--circuit", str(gqa), "--pairing", "OV", "--k", "3",
                        "--json", "--cache-dir", cache))
    assert ov["reference_edges"] == ["L0H0 -> L2KV0"] and ov["n_reference"] == 1
    assert main(["recovery", qwen, "--circuit", str(path), "--cache-dir", cache]) != 0  # the demo's file
    assert "2 layers x 8 heads" in capsys.readouterr().err


def test_a_task_circuit_of_a_grouped_query_llama(tmp_path, capsys):
    from transformers import LlamaConfig, LlamaForCausalLM

    from model_support import save_random_model

    folder = save_random_model(tmp_path / "llama-gqa", LlamaConfig(
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, hidden_size=32,
        intermediate_size=64, max_position_embeddings=64), LlamaForCausalLM, seed=0)
    cache = str(tmp_path / "cache")
    answer = json.loads(run(capsys, "circuit", str(folder), "--task", "induction", "--pairs", "4",
                            "--top", "2000", "--json", "-q", "--cache-dir", cache))
    ranked = [(e["rank"], e["writer"], e["reader"]) for e in answer["edges"]]
    size = [i for i, w, r in ranked if re.match(r"^L\d+H\d+$", w) and r.endswith(".K")][4]
    report = json.loads(run(capsys, "recovery", str(folder), "--task", "induction", "--pairs", "4",
                            "--edges", str(size), "--json", "-q", "--cache-dir", cache))
    assert report["n_valid"] == 4 * 2 * 3  # query-head sources, KV-head targets
    k_edges = {(w, r) for i, w, r in ranked
               if i <= size and re.match(r"^L\d+H\d+$", w) and r.endswith(".K")}
    assert all("KV" in r for _, r in k_edges) and len(k_edges) == report["n_reference"] == 5
    assert sorted(report["reference_edges"]) == sorted(f"{w} -> {r[:-2]}" for w, r in k_edges)


def test_api_task_reference_and_its_errors(api):
    body = ok(api.get("/api/recovery", params={"model": "demo", "task": "induction", "k": 5}))
    assert body["circuit"]["source"] == "task" and body["labels"] is None and body["k"] == 5
    circuit = ok(api.get("/api/circuit", params={"model": "demo", "task": "induction", "top": 2000}))
    assert body["circuit"]["size"] == circuit["circuit_size"]
    k_edges = {(e["writer"], e["reader"]) for e in circuit["circuit"]
               if re.match(r"^L\d+H\d+$", e["writer"]) and e["reader"].endswith(".K")}
    assert body["n_reference"] == len(k_edges) == body["circuit"]["n_reference_edges"]
    sized = ok(api.get("/api/recovery", params={"model": "demo", "task": "induction", "edges": 30, "k": 5}))
    assert sized["circuit"]["size"] == 30 and "top 30 of 257" in sized["reference"]

    def get(**params):
        return api.get("/api/recovery", params={"model": "demo", **params})

    assert "exactly one" in err(get(labels="patterns", task="induction"), 422)
    assert "exactly one" in err(get(), 422)
    assert "unknown task" in err(get(task="no-such-task"), 404)
    assert "1..257" in err(get(task="induction", edges=100000), 422)
    assert "only with a task circuit" in err(get(labels="patterns", edges=10), 422)
    assert get(task="induction", method="bogus").status_code == 422
    assert get(task="induction", edges=0).status_code == 422
    assert get(task="induction", pairing="QK").status_code == 422
    # the label set's answer keeps its form
    labelled = ok(get(labels="patterns", k=5))
    assert labelled["labels"] == "patterns" and labelled["circuit"] is None
