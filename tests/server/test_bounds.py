"""No API answer for a model with many heads ships its whole per-pair grid or scatter unless
asked (``download=true``): a real server on a random Llama of 4 layers x 96 query heads
(147,456 cells per OQ grid, 55,296 forward OQ pairs) answers the layer overview and a bounded
scatter, each saying what it left out; the full answers match them cell by cell."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import torch

from headgraph.server.services.bounds import MAX_GRID_CELLS, MAX_SCATTER_POINTS

pytestmark = pytest.mark.slow

MODEL = "local:llama-wide"
L, H, HKV = 4, 96, 24
LIMIT = 5 * 1024 * 1024


@pytest.fixture(scope="module")
def api(launch_server, tmp_path_factory):
    from transformers import AutoModelForCausalLM, LlamaConfig

    root = tmp_path_factory.mktemp("models")
    cfg = LlamaConfig(num_hidden_layers=L, num_attention_heads=H, num_key_value_heads=HKV,
                      hidden_size=H * 4, head_dim=4, intermediate_size=64, vocab_size=300,
                      max_position_embeddings=64, tie_word_embeddings=False)
    torch.manual_seed(5)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(root / "llama-wide")
    env = {"HEADGRAPH_MODEL_ROOT": str(root), "HEADGRAPH_DEVICE": "cpu"}
    with launch_server(tmp_path_factory.mktemp("bounds") / "cache", env=env,
                       check_errors=True) as srv, httpx.Client(base_url=srv.url, timeout=300) as client:
        yield client


def _get(api, path, **params):
    r = api.get(path, params={"model": MODEL, **params})
    assert r.status_code == 200, r.text[:300]
    return r


def test_grids_answer_the_layer_overview(api):
    assert L * H * L * H > MAX_GRID_CELLS > L * H * L * HKV
    for path, params in (("/api/pk", {"pairing": "OQ"}), ("/api/pk", {"pairing": "OQ", "metric": "z"}),
                         ("/api/cs", {"mode": "K"})):
        small = _get(api, path, **params)
        full = _get(api, path, download="true", **params)
        assert len(small.content) < LIMIT and len(small.content) * 50 < len(full.content)
        s, f = small.json(), full.json()
        assert f["overview"] is None and f["shape"] == [L, H, L, H]
        assert s["shape"] == [L, 1, L, 1] and s["source_labels"] == [f"L{i}" for i in range(L)]
        note = s["overview"]
        assert note["full_shape"] == [L, H, L, H] and note["cells_left_out"] == L * H * L * H - L * L
        assert "download=true" in note["how"]
        grid = np.array([[[[np.nan if v is None else v for v in row] for row in c] for c in b]
                         for b in f["grid"]], dtype=np.float64)
        valid = np.array(f["valid"], dtype=bool)
        for sl in range(L):
            for tl in range(L):
                cell = grid[sl, :, tl, :][valid[sl, :, tl, :]]
                cell = cell[np.isfinite(cell)]
                got = s["grid"][sl][0][tl][0]
                assert s["valid"][sl][0][tl][0] == bool(valid[sl, :, tl, :].any())
                if cell.size:
                    assert got == pytest.approx(float(cell.max()), rel=1e-6)
                else:
                    assert got is None
        assert (s["min"], s["max"]) == (f["min"], f["max"])
    # under the bound: unchanged
    ok = _get(api, "/api/pk", pairing="OK").json()
    assert ok["overview"] is None and ok["shape"] == [L, H, L, HKV]


def test_scatter_ships_the_top_quadrants_and_a_sample(api):
    small = _get(api, "/api/scatter", pairing="OQ")
    full = _get(api, "/api/scatter", pairing="OQ", download="true").json()
    s = small.json()
    assert len(small.content) < LIMIT
    n = len(full["points"]["source"])
    assert n == L * (L - 1) // 2 * H * H > MAX_SCATTER_POINTS
    assert full.get("left_out") is None and s["comparison"] == full["comparison"]
    shown = len(s["points"]["source"])
    assert shown == MAX_SCATTER_POINTS
    assert s["left_out"]["points_total"] == n and s["left_out"]["points_left_out"] == n - shown
    index = {(a, b): i for i, (a, b) in enumerate(zip(full["points"]["source"], full["points"]["target"]))}
    for j in range(shown):
        i = index[(s["points"]["source"][j], s["points"]["target"][j])]
        for key in ("pk", "cs", "quadrant"):
            assert s["points"][key][j] == full["points"][key][i]
    top_full = sum(q > 0 for q in full["points"]["quadrant"])
    assert sum(q > 0 for q in s["points"]["quadrant"]) == min(top_full, MAX_SCATTER_POINTS)
