"""core.subspaces: the full-rank certificate behind the Cholesky QR path, checked against
float64 eigenvalues of the same float32 Gram matrices."""

from __future__ import annotations

import torch

from headgraph.core.scores.orthonormal import _lambda_max_bound, _shifted_cholesky_ok


def _grams(seed: int) -> torch.Tensor:
    """float32 Gram matrices W^T W [n, w, w] with spectra from flat to condition 1e6, one
    singular value repeated, some mixed-sign couplings."""
    g = torch.Generator().manual_seed(seed)
    n, d, w = 64, 300, 24
    q = torch.linalg.qr(torch.randn(n, d, w, generator=g, dtype=torch.float64))[0]
    v = torch.linalg.qr(torch.randn(n, w, w, generator=g, dtype=torch.float64))[0]
    decades = torch.linspace(0, 6, n, dtype=torch.float64)[:, None]
    s = 10.0 ** (-decades * torch.rand(n, w, generator=g, dtype=torch.float64))
    s[::5, :3] = s[::5, :1]  # repeated singular values
    wts = (q * s[:, None, :]) @ v.transpose(1, 2) * 7.0
    wts = torch.cat([wts, torch.randn(8, d, w, generator=g, dtype=torch.float64)])  # Gaussian heads
    wts = wts.float()
    return wts.transpose(1, 2) @ wts


def test_lambda_max_bound_is_an_upper_bound_and_close():
    gram = _grams(0)
    lam = torch.linalg.eigvalsh(gram.double())
    bound = _lambda_max_bound(gram).double()
    assert bool((bound >= lam[:, -1]).all())
    assert float((bound / lam[:, -1]).median()) < 1.5  # tight enough to be useful


def test_shifted_cholesky_never_claims_a_false_lower_bound():
    gram = _grams(1)
    lam = torch.linalg.eigvalsh(gram.double())
    lam_min = lam[:, 0].clamp(min=0)
    proven_total = 0
    for factor in (0.0, 0.25, 0.5, 0.9, 0.99, 1.0, 1.01, 1.5, 4.0):
        shift = (lam_min * factor).float()
        ok = _shifted_cholesky_ok(gram, shift)
        assert not bool((ok & (lam_min <= shift.double())).any()), factor
        proven_total += int(ok.sum())
    # and not vacuous: half of lambda_min is proven for the well-conditioned heads
    half = _shifted_cholesky_ok(gram, (lam_min * 0.5).float())
    well = lam[:, 0] > 1e-3 * lam[:, -1]
    assert bool(half[well].all()) and proven_total > 0
