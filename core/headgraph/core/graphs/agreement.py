"""How two scorings of the same head pairs agree: raw vs norm-aware PK of one pairing, say
(core.models.norm_fold), or any two PairScores of one head layout.

* ``spearman``: rank correlation of the two grids over the pairs valid in both (average ranks,
  core.stats.verdicts.spearman_rows);
* ``shared``: the edges in both top-k sets (core.scores.ranking.top_pairs, grid-order ties);
* ``recovery`` (given a reference): core.stats.recovery.recovery_table of the two grids against
  the same reference on the pairs valid in both, A the baseline, so B's row carries the paired
  ROC-AUC difference B - A on the same stratified bootstrap resamples. The rule: B recovers the
  reference better when that difference's interval lies above 0, A when below, "tie" when it
  holds 0, None when undefined (no reference edge among the valid pairs, say).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from headgraph.core.errors import InvalidInput
from headgraph.core.graphs.timeline import axis_names, check_same_layout
from headgraph.core.scores.ranking import top_pairs
from headgraph.core.stats.recovery import CONFIDENCE, N_RESAMPLES, Estimate, RecoveryTable, recovery_table
from headgraph.core.stats.verdicts import spearman_rows
from headgraph.core.types import PairScores

RULE = ("B recovers the reference better when the paired bootstrap 95% interval of ROC-AUC(B) - "
        "ROC-AUC(A) (the same stratified resamples for both) lies above 0, A when it lies below 0; "
        "an interval holding 0 is a tie")


@dataclass(frozen=True)
class Reference:
    """A reference for recovery: edge mask [L, Hs, L, Ht] and the source / target head masks
    [L, Hs] / [L, Ht] (core.stats.recovery.reference_from_heads)."""

    edges: torch.Tensor
    sources: torch.Tensor
    targets: torch.Tensor


@dataclass(frozen=True)
class Agreement:
    """A vs B on one pairing (see the module docstring); edges named "L0H1 -> L1H3"."""

    pairing: str
    names: tuple[str, str]
    k: int
    n_valid: int  # pairs valid in both
    spearman: float | None
    top_a: tuple[str, ...]
    top_b: tuple[str, ...]
    shared: tuple[str, ...]  # in both top-k sets, in A's order
    recovery: RecoveryTable | None
    auc_difference: Estimate | None  # ROC-AUC(B) - ROC-AUC(A), paired
    verdict: str | None  # "A" | "B" | "tie" | None

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form (the recovery table's rows by metric name A / B)."""
        return {"pairing": self.pairing, "names": list(self.names), "k": self.k, "n_valid": self.n_valid,
                "spearman": self.spearman, "top_a": list(self.top_a), "top_b": list(self.top_b),
                "shared": list(self.shared), "n_shared": len(self.shared),
                "recovery": None if self.recovery is None else self.recovery.to_dict(),
                "auc_difference": None if self.auc_difference is None else self.auc_difference.to_dict(),
                "verdict": self.verdict, "rule": RULE}


def _top(ps: PairScores, k: int, src: list[str], tgt: list[str]) -> tuple[str, ...]:
    t = top_pairs(ps, k, metric="pk")
    _, hs, _, ht = ps.scores.shape
    return tuple(f"{src[a * hs + b]} -> {tgt[c * ht + d]}" for a, b, c, d in zip(
        t.source_layer.tolist(), t.source_head.tolist(), t.target_layer.tolist(), t.target_head.tolist()))


def paired_verdict(diff: Estimate | None) -> str | None:
    """"B" when the interval of B - A lies above 0, "A" below, "tie" when it holds 0; None when
    undefined."""
    if diff is None or diff.low is None or diff.high is None:
        return None
    return "B" if diff.low > 0 else "A" if diff.high < 0 else "tie"


def score_agreement(a: PairScores, b: PairScores, *, k: int = 20, names: tuple[str, str] = ("A", "B"),
                    reference: Reference | None = None, grouped_target: bool = False,
                    confidence: float = CONFIDENCE, n_resamples: int = N_RESAMPLES, seed: int = 0
                    ) -> Agreement:
    """Agreement of ``a`` and ``b`` (same pairing and head layout, else InvalidInput) on their
    raw scores: Spearman over the pairs valid in both, shared top-``k`` edges and, with a
    ``reference``, the paired recovery comparison (see the module docstring)."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise InvalidInput(f"k must be a positive integer, got {k!r}")
    check_same_layout([a, b], list(names))
    valid = (a.valid & b.valid).to(torch.bool).cpu()
    va = a.scores.detach().to("cpu", torch.float64)
    vb = b.scores.detach().to("cpu", torch.float64)
    xa, xb = va[valid].numpy(), vb[valid].numpy()
    n = len(xa)
    rho = float(spearman_rows(xa[None], xb[None])[0]) if n >= 2 else math.nan
    src, tgt = axis_names(a, grouped_target=grouped_target)
    top_a, top_b = _top(a, k, src, tgt), _top(b, k, src, tgt)
    in_b = set(top_b)
    shared = tuple(e for e in top_a if e in in_b)
    table = diff = None
    if reference is not None and n:
        nan = torch.tensor(math.nan, dtype=torch.float64)
        grids = {names[0]: torch.where(valid, va, nan), names[1]: torch.where(valid, vb, nan)}
        table = recovery_table(grids, valid, reference.edges, source_ref=reference.sources,
                               target_ref=reference.targets, k=k, pairing=a.pairing,
                               layer_indices=tuple(a.layer_indices), baseline=names[0],
                               confidence=confidence, n_resamples=n_resamples, seed=seed)
        diff = table.row(names[1]).auc_diff
    return Agreement(pairing=a.pairing, names=names, k=k, n_valid=n,
                     spearman=rho if math.isfinite(rho) else None, top_a=top_a, top_b=top_b,
                     shared=shared, recovery=table, auc_difference=diff, verdict=paired_verdict(diff))


__all__ = ["RULE", "Agreement", "Reference", "paired_verdict", "score_agreement"]
