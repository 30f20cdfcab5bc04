"""Checkpoint series, per-edge trajectories and model comparison (issue 16) in core.

The bundled demo series (core/data/demo_series, scripts/train_demo.py --checkpoints) must show
the induction edge L0H0 -> layer 1 forming. Every number is checked against an independent
float64 PK computed here from the checkpoint files (QR bases of W_O^T and W_K). The API's and
CLI's answers against core's are tests/server/test_series_compare_api.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from headgraph.core.graphs.hubs import hub_table
from headgraph.core.models.loading import load_heads
from headgraph.core.graphs.diff import compare_scores
from headgraph.core.scores.pk import projection_kernel
from headgraph.core.models.series import demo_series
from headgraph.core.graphs.timeline import edge_trajectories

SERIES = demo_series()
H = 8


def ok_reference(folder: Path) -> np.ndarray:
    """Float64 PK of every layer-0 O -> layer-1 K pair [H, H], from the safetensors file."""
    w = load_file(str(folder / "model.safetensors"))
    o = w["W_O"][0].double().transpose(-2, -1)  # [H, d_model, d_head]
    k = w["W_K"][1].double()
    uo, uk = torch.linalg.qr(o).Q, torch.linalg.qr(k).Q
    return (torch.einsum("adi,bdj->abij", uo, uk) ** 2).sum(dim=(-2, -1)).numpy()


@pytest.fixture(scope="module")
def refs() -> dict[str, np.ndarray]:
    return {c.model_id: ok_reference(c.folder) for c in SERIES}


@pytest.fixture(scope="module")
def pks() -> dict[str, object]:
    return {c.model_id: projection_kernel(load_heads(c.model_id, device="cpu"), "OK") for c in SERIES}


def test_bundled_series_is_small_and_loads() -> None:
    steps = [c.step for c in SERIES]
    assert 6 <= len(SERIES) <= 8 and steps == sorted(steps) and steps[-1] == 3000
    size = sum(f.stat().st_size for c in SERIES for f in c.folder.iterdir())
    assert size < 6_000_000
    heads = load_heads(SERIES[0].model_id, device="cpu")
    assert heads.info.name == SERIES[0].model_id and heads.W_K.shape == (2, H, 128, 16)


def test_induction_edge_forms_over_the_series(refs: dict[str, np.ndarray]) -> None:
    """L0H0 -> layer-1 OK PK grows from the first checkpoint to the last (float64 reference),
    and at the end L0H0 is every layer-1 head's strongest source."""
    first, last = refs[SERIES[0].model_id], refs[SERIES[-1].model_id]
    mean = [refs[c.model_id][0].mean() for c in SERIES]
    assert last[0].mean() > 2 * first[0].mean(), mean
    assert (last[0] > first[0]).all()
    assert (last.argmax(axis=0) == 0).all()
    assert not (first.argmax(axis=0) == 0).all()  # not formed at the first checkpoint
    low = int(np.argmin(mean))  # before it forms: no different from the other layer-0 heads
    assert low < len(mean) - 2 and all(b > a for a, b in zip(mean[low:], mean[low + 1:])), mean


def test_core_trajectories_equal_the_reference(pks: dict, refs: dict[str, np.ndarray]) -> None:
    ids = [c.model_id for c in SERIES]
    tl = edge_trajectories([pks[m] for m in ids], [c.step for c in SERIES], ids, k=8)
    last = refs[ids[-1]]
    order = np.argsort(-last.ravel(), kind="stable")[:8]  # brute-force top-8 of the last checkpoint
    assert [(0, int(i // H), 1, int(i % H)) for i in order] == list(tl.edges)
    for e, row in zip(tl.edges, tl.pk.numpy()):
        want = [refs[m][e[1], e[3]] for m in ids]
        np.testing.assert_allclose(row, want, rtol=1e-4, atol=1e-4)
    assert all(s == "L0H0" for s in tl.sources) and (tl.pk[:, -1] > tl.pk[:, 0]).all()


def test_core_compare_equals_brute_force(pks: dict, refs: dict[str, np.ndarray]) -> None:
    a_id, b_id, k = SERIES[0].model_id, SERIES[-1].model_id, 12
    d = compare_scores(pks[a_id], pks[b_id], k=k, names=(a_id, b_id))
    ra, rb = refs[a_id], refs[b_id]
    np.testing.assert_allclose(d.diff[0, :, 1, :].numpy(), rb - ra, atol=1e-4)
    assert not d.valid[1].any() and not d.valid[:, :, 0].any()

    def top(g: np.ndarray) -> list[tuple[str, str]]:
        return [(f"L0H{i // H}", f"L1H{i % H}") for i in np.argsort(-g.ravel(), kind="stable")[:k]]

    ta, tb = top(ra), top(rb)
    assert [(c.source, c.target) for c in d.gained] == [e for e in tb if e not in ta]
    assert [(c.source, c.target) for c in d.lost] == [e for e in ta if e not in tb]
    assert {(c.source, c.target) for c in d.changed} == set(ta) & set(tb)
    for c in d.gained + d.lost + d.changed:
        s, t = int(c.source[3:]), int(c.target[3:])
        assert c.delta == pytest.approx(rb[s, t] - ra[s, t], abs=1e-4)
    # hubs: degree within each top-k edge set, counted here by hand
    for edges, table in ((ta, d.hubs_a), (tb, d.hubs_b)):
        deg: dict[str, int] = {}
        for s, t in edges:
            deg[s] = deg.get(s, 0) + 1
            deg[t] = deg.get(t, 0) + 1
        assert {r.name: r.degree for r in table.rows} == deg
    hubs_b = {r.name for r in d.hubs_b.rows if r.is_hub}
    assert "L0H0" in hubs_b and any(m.name == "L0H0" for m in d.hub_moves)
    assert hub_table  # core.hubs is what compare_scores uses

