"""Helpers of the HTTP API tests (tests/server/): answers read as JSON (``ok``) or as the
error message of a given status (``err``), the demo's shape, Haar moments and top cells for the
float64 reference. Their fixtures (the server on loopback, a client, the reference itself) are
tests/server/conftest.py's."""

from __future__ import annotations

import math

import httpx
import numpy as np
import torch

torch.set_num_threads(1)
L, H, D, DH = 2, 8, 128, 16


def ok(resp: httpx.Response) -> dict:
    assert resp.status_code == 200, resp.text[:1000]
    return resp.json()


def err(resp: httpx.Response, status: int) -> str:
    assert resp.status_code == status, resp.text[:1000]
    body = resp.json()
    assert body["error"]["status"] == status
    return body["error"]["message"]


# -- for the float64 reference of the demo model (tests/server/conftest.py's ``ref``) ---------

def haar(m: float, n: float, d: float = D) -> tuple[float, float]:
    mean = m * n / d
    var = 2 * m * n * (d - m) * (d - n) / (d * d * (d - 1) * (d + 2))
    return mean, math.sqrt(var)


def top_cells(grid: torch.Tensor, valid: torch.Tensor, k: int) -> list[tuple[str, str]]:
    flat = torch.where(valid, grid, -torch.inf).flatten()
    idx = torch.argsort(flat, descending=True, stable=True)[:k]
    out = []
    for i in idx.tolist():
        a, b, c, e = np.unravel_index(i, grid.shape)
        out.append((f"L{a}H{b}", f"L{c}H{e}"))
    return out
