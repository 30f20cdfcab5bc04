"""Recovery tables (the PK paper's Tables 1 and 2) for any model: how well each weight metric's
ranking of head pairs recovers a reference.

For one pairing (e.g. OK) and a reference — a head set (a label set's heads: an edge is in the
reference when both its source and target heads are reference heads; a grouped-query K/V
target is a reference head when any query head it serves is) or an edge set — every metric
(PK raw and normalized, Composition Score, linear CKA, orthogonal Procrustes, and the trivial
baselines: layer gap, random) gets, over all valid pairs of the pairing:

* ``endpoint_share``: the share of its top-k edges' endpoints (2k of them) that are reference
  heads (Table 1's "how often top edges land on circuit heads"; for an edge reference: sources
  of reference edges on the source side, targets on the target side);
* ``precision``: precision@k, the share of its top-k edges in the reference;
* ``auc``: ROC-AUC of its values at separating reference edges from the other valid pairs
  (Table 2), via average ranks (the Mann-Whitney U statistic / (n_pos n_neg); ties count 1/2);

each with a bootstrap percentile interval over the unit that carries the label, the head
(``unit="heads"``, the default: a cluster bootstrap; source heads and target heads (a KV group
on grouped K / V targets) are each drawn with replacement, reference heads and the others
separately, and a pair enters a resample as often as the product of its source's and its
target's draws; ``unit="edges"`` resamples reference edges and the other pairs instead, which
treats pairs sharing a head as independent and is overconfident), and the paired difference to a
baseline metric (PK by default) on the same resamples. Top-k ties are broken in grid order
(core.scores.ranking's rule); a metric's undefined cells (NaN) are excluded from its
statistics, never ranked. Baselines: ``layer_gap`` ranks nearer layer
pairs first (value = -(target block - source block)); ``random`` is seeded uniform noise.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from headgraph.core.errors import InvalidInput
from headgraph.core.names import head_label
from headgraph.core.scores.composition_score import composition_score
from headgraph.core.scores.pk import parse_pairing, projection_kernel
from headgraph.core.scores.ranking import kv_level_cs
from headgraph.core.scores.similarity import similarity
from headgraph.core.types import HeadWeights

CONFIDENCE = 0.95
N_RESAMPLES = 1000
UNITS = ("heads", "edges")  # what the bootstrap resamples
BOOTSTRAP_RULES = {
    "heads": ("head-cluster bootstrap: source heads and target heads (KV groups on grouped K/V targets) "
              "drawn with replacement, reference heads and the others separately; a pair counts as often "
              "as its source's draws times its target's; undefined (NaN) scores excluded"),
    "edges": ("edge bootstrap: reference pairs and the other pairs drawn with replacement separately "
              "(pairs sharing a head treated as independent); undefined (NaN) scores excluded")}
# The metrics of a table, in order; the first is the default baseline of paired differences.
METRICS: tuple[str, ...] = ("pk", "pk_normalized", "cs", "cka", "procrustes", "layer_gap", "random")
_CHUNK = 64  # resamples per vectorized step


def reference_from_heads(heads: Iterable[str], layer_indices: tuple[int, ...], n_source: int,
                         n_target: int, n_heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(edge mask [L, Hs, L, Ht], source-head mask [L, Hs], target-head mask [L, Ht]) of a head
    set named "L{block}H{h}": a source head is a reference head when named; a target cell is
    when named, or, for K/V targets on a grouped-query model (n_target < n_heads), when any
    query head its KV group serves (consecutive heads) is named."""
    names = set(heads)
    L = len(layer_indices)
    src = torch.tensor([[head_label(b, h) in names for h in range(n_source)] for b in layer_indices],
                       dtype=torch.bool).reshape(L, n_source)
    if n_heads % n_target:
        raise InvalidInput(f"{n_heads} query heads do not group into {n_target} target heads")
    group = n_heads // n_target
    tgt = torch.tensor([[any(head_label(b, t * group + j) in names for j in range(group))
                         for t in range(n_target)] for b in layer_indices],
                       dtype=torch.bool).reshape(L, n_target)
    return src[:, :, None, None] & tgt[None, None], src, tgt


def reference_from_edges(edges: Iterable[tuple[int, int, int, int]], shape: tuple[int, int, int, int]
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(edge mask, source-head mask, target-head mask) of an edge set given as grid positions
    (source layer, source head, target layer, target head)."""
    mask = torch.zeros(shape, dtype=torch.bool)
    for e in edges:
        sl, sh, tl, th = (int(v) for v in e)
        if not (0 <= sl < shape[0] and 0 <= sh < shape[1] and 0 <= tl < shape[2] and 0 <= th < shape[3]):
            raise InvalidInput(f"edge {tuple(e)} is outside the grid {shape}")
        mask[sl, sh, tl, th] = True
    return mask, mask.any(dim=(2, 3)), mask.any(dim=(0, 1))


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """ROC-AUC of ``scores`` for the boolean ``labels`` (average ranks; NaN without both
    classes). Equals scipy.stats.mannwhitneyu(pos, neg).statistic / (n_pos n_neg)."""
    from scipy.stats import rankdata

    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=bool)
    n1, n0 = int(y.sum()), int((~y).sum())
    if n1 == 0 or n0 == 0:
        return math.nan
    r = rankdata(s)
    return float((r[y].sum() - n1 * (n1 + 1) / 2.0) / (n1 * n0))


def metric_grids(heads: HeadWeights, pairing: str, *, order: str = "forward", seed: int = 0,
                 metrics: Iterable[str] = METRICS) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """({metric: float64 grid [L, Hs, L, Ht], NaN where that metric is undefined}, valid): the
    pairing's PK validity decides the pairs; CS (O -> Q/K/V pairings only) is the KV-level mean
    over each KV group's query heads (core.scores.ranking.kv_level_cs) on grouped K/V targets."""
    s_role, t_role = parse_pairing(pairing)
    pk = projection_kernel(heads, pairing, order=order)
    valid = pk.valid.to(torch.bool).cpu()
    nan = torch.tensor(math.nan, dtype=torch.float64)
    out: dict[str, torch.Tensor] = {}
    L, hs, _, ht = pk.scores.shape
    for m in metrics:
        if m not in METRICS:
            raise InvalidInput(f"unknown recovery metric {m!r}; allowed: {list(METRICS)}",
                               allowed=list(METRICS))
        if m == "pk":
            grid, ok = pk.scores, pk.valid
        elif m == "pk_normalized":
            grid, ok = pk.normalized, pk.valid
        elif m == "cs":
            if s_role != "O" or t_role == "O":
                continue
            cs = composition_score(heads, t_role, order=order)
            kv = kv_level_cs(cs, ht)
            grid, ok = kv.scores, kv.valid
        elif m in ("cka", "procrustes"):
            res = similarity(heads, m, pairing, order=order)
            grid, ok = res.scores, res.valid
        elif m == "layer_gap":
            idx = torch.tensor(heads.info.layer_indices, dtype=torch.float64)
            gap = -(idx[None, :] - idx[:, None])  # [Ls, Lt]
            grid, ok = gap[:, None, :, None].expand(L, hs, L, ht), valid
        else:
            g = torch.Generator().manual_seed(seed)
            grid, ok = torch.rand(L, hs, L, ht, generator=g, dtype=torch.float64), valid
        grid = grid.detach().to("cpu", torch.float64)
        out[m] = torch.where(ok.to(torch.bool).cpu() & valid, grid, nan)
    return out, valid


@dataclass(frozen=True)
class Estimate:
    """A statistic with its bootstrap percentile interval (None where undefined)."""

    value: float | None
    low: float | None
    high: float | None

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form."""
        return {"value": self.value, "low": self.low, "high": self.high}


@dataclass(frozen=True)
class MetricRecovery:
    """One metric's row of a recovery table; ``*_diff``: the metric minus the baseline metric
    on the same resamples (None for the baseline itself)."""

    metric: str
    endpoint_share: Estimate
    precision: Estimate
    auc: Estimate
    precision_diff: Estimate | None
    auc_diff: Estimate | None
    top: list[tuple[int, int, int, int]]  # its top-k edges (grid positions), best first

    def to_dict(self, layer_indices: tuple[int, ...] | None = None) -> dict[str, Any]:
        """Plain-JSON form; with ``layer_indices`` the top edges are named ("L1H2 -> L3H0")."""
        d: dict[str, Any] = {
            "metric": self.metric, "endpoint_share": self.endpoint_share.to_dict(),
            "precision": self.precision.to_dict(), "auc": self.auc.to_dict(),
            "precision_diff": None if self.precision_diff is None else self.precision_diff.to_dict(),
            "auc_diff": None if self.auc_diff is None else self.auc_diff.to_dict(),
        }
        if layer_indices is not None:
            d["top"] = [f"{head_label(layer_indices[a], b)} -> {head_label(layer_indices[c], e)}"
                        for a, b, c, e in self.top]
        return d


@dataclass(frozen=True)
class RecoveryTable:
    """Every metric's recovery of one reference on one pairing (see the module docstring)."""

    pairing: str
    k: int
    n_valid: int
    n_reference: int
    base_rate: float  # share of valid pairs in the reference (a random ranking's precision)
    baseline: str
    confidence: float
    n_resamples: int
    rows: tuple[MetricRecovery, ...]
    layer_indices: tuple[int, ...]
    unit: str = "heads"

    def row(self, metric: str) -> MetricRecovery:
        """The row of ``metric`` (KeyError when absent)."""
        for r in self.rows:
            if r.metric == metric:
                return r
        raise KeyError(metric)

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form."""
        return {"pairing": self.pairing, "k": self.k, "n_valid": self.n_valid,
                "n_reference": self.n_reference, "base_rate": self.base_rate,
                "baseline": self.baseline, "confidence": self.confidence,
                "n_resamples": self.n_resamples, "unit": self.unit,
                "bootstrap": BOOTSTRAP_RULES[self.unit],
                "rows": [r.to_dict(self.layer_indices) for r in self.rows]}


class _Ranked:
    """One metric's orders over the valid pairs: descending (ties in grid order) for top-k,
    ascending tie groups for the AUC; its undefined (NaN) pairs get weight 0 (excluded)."""

    def __init__(self, values: np.ndarray) -> None:
        self.ok = np.isfinite(values)
        v = np.where(self.ok, values, -np.inf)
        self.desc = np.lexsort((np.arange(len(v)), -v))
        self.asc = np.argsort(v, kind="stable")
        sv = v[self.asc]
        self.starts = np.flatnonzero(np.r_[True, sv[1:] != sv[:-1]])

    def topk(self, w: np.ndarray, gain: np.ndarray, k: int) -> np.ndarray:
        """sum of ``gain`` over the first k units of the weighted multiset of defined pairs, / k
        (/ their count when fewer): [B]."""
        ws = (w * self.ok)[:, self.desc]
        before = np.cumsum(ws, axis=1) - ws
        take = np.clip(k - before, 0, ws)
        den = np.minimum(float(k), ws.sum(axis=1))
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(den > 0, (take * gain[self.desc]).sum(axis=1) / den, np.nan)

    def auc(self, w: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """Weighted ROC-AUC of the defined pairs per resample row of w [B, n]."""
        ws = (w * self.ok)[:, self.asc]
        p = np.add.reduceat(ws * pos[self.asc], self.starts, axis=1)
        q = np.add.reduceat(ws * ~pos[self.asc], self.starts, axis=1)
        below = np.cumsum(q, axis=1) - q
        num = (p * (below + 0.5 * q)).sum(axis=1)
        den = p.sum(axis=1) * q.sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(den > 0, num / den, np.nan)


def cluster_weights(source_ids: np.ndarray, target_ids: np.ndarray, source_groups: list[np.ndarray],
                    target_groups: list[np.ndarray], rng: np.random.Generator, b: int
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(pair weights [b, n], source-head counts [b, n_src], target-head counts [b, n_tgt]) of b
    head-cluster resamples: each group of source heads (ids in ``source_groups``) and of target
    heads is drawn with replacement to its own size (multinomial counts); a pair's weight is its
    source's count times its target's (``source_ids`` / ``target_ids`` [n]: each pair's heads)."""
    def counts(groups: list[np.ndarray], size: int) -> np.ndarray:
        c = np.zeros((b, size))
        for g in groups:
            if len(g):
                c[:, g] = rng.multinomial(len(g), np.full(len(g), 1.0 / len(g)), size=b)
        return c

    cs = counts(source_groups, max((int(g.max()) + 1 for g in source_groups if len(g)), default=0))
    ct = counts(target_groups, max((int(g.max()) + 1 for g in target_groups if len(g)), default=0))
    return cs[:, source_ids] * ct[:, target_ids], cs, ct


def _interval(point: float, samples: np.ndarray, confidence: float) -> Estimate:
    s = samples[np.isfinite(samples)]
    if not math.isfinite(point):
        return Estimate(None, None, None)
    if len(s) == 0:
        return Estimate(point, None, None)
    tail = (1.0 - confidence) / 2.0
    return Estimate(point, float(np.quantile(s, tail)), float(np.quantile(s, 1.0 - tail)))


def recovery_table(
    grids: Mapping[str, torch.Tensor],
    valid: torch.Tensor,
    reference: torch.Tensor,
    *,
    source_ref: torch.Tensor | None = None,
    target_ref: torch.Tensor | None = None,
    k: int = 20,
    pairing: str = "",
    layer_indices: tuple[int, ...] | None = None,
    baseline: str | None = None,
    confidence: float = CONFIDENCE,
    n_resamples: int = N_RESAMPLES,
    seed: int = 0,
    unit: str = "heads",
) -> RecoveryTable:
    """The recovery table of ``grids`` ({metric: [L, Hs, L, Ht]}, NaN = undefined) over the
    ``valid`` pairs against the ``reference`` edge mask (same shape). ``source_ref`` [L, Hs] /
    ``target_ref`` [L, Ht]: reference heads for the endpoint share (default: the heads of the
    reference edges). ``baseline``: the metric differences are taken against (default the
    first of ``grids``). Bootstrap: ``n_resamples`` seeded resamples of ``unit`` ("heads": the
    stratified head-cluster bootstrap, :func:`cluster_weights`; "edges": stratified pairs)."""
    if unit not in UNITS:
        raise InvalidInput(f"unknown bootstrap unit {unit!r}; allowed: {list(UNITS)}", allowed=list(UNITS))
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise InvalidInput(f"k must be a positive integer, got {k!r}")
    if not 0.0 < confidence < 1.0:
        raise InvalidInput(f"confidence must lie in (0, 1), got {confidence!r}")
    if not grids:
        raise InvalidInput("no metric grids given")
    names = list(grids)
    baseline = names[0] if baseline is None else baseline
    if baseline not in grids:
        raise InvalidInput(f"baseline {baseline!r} is not one of the metrics {names}")
    shape = tuple(valid.shape)
    if tuple(reference.shape) != shape or any(tuple(g.shape) != shape for g in grids.values()):
        raise InvalidInput(f"grids, valid and reference must share the shape {shape}")
    v = valid.to(torch.bool).cpu().numpy()
    cells = np.argwhere(v)  # [n, 4] in grid order
    n = len(cells)
    if n == 0:
        raise InvalidInput("no valid pairs")
    ref = reference.to(torch.bool).cpu().numpy()
    pos = ref[tuple(cells.T)]
    s_ref = (reference.any(dim=(2, 3)) if source_ref is None else source_ref).to(torch.bool).cpu().numpy()
    t_ref = (reference.any(dim=(0, 1)) if target_ref is None else target_ref).to(torch.bool).cpu().numpy()
    ends = 0.5 * (s_ref[cells[:, 0], cells[:, 1]].astype(np.float64)
                  + t_ref[cells[:, 2], cells[:, 3]].astype(np.float64))
    kk = min(k, n)
    ranked = {m: _Ranked(grids[m].detach().cpu().numpy().astype(np.float64)[tuple(cells.T)]) for m in names}
    ones = np.ones((1, n))
    point = {m: (float(r.topk(ones, ends, kk)[0]), float(r.topk(ones, pos.astype(np.float64), kk)[0]),
                 float(r.auc(ones, pos)[0])) for m, r in ranked.items()}
    rng = np.random.default_rng(seed)
    pos_idx, neg_idx = np.flatnonzero(pos), np.flatnonzero(~pos)
    hs, ht = shape[1], shape[3]
    src_ids, tgt_ids = cells[:, 0] * hs + cells[:, 1], cells[:, 2] * ht + cells[:, 3]
    s_flat, t_flat = s_ref.reshape(-1), t_ref.reshape(-1)
    src_groups = [np.flatnonzero(s_flat), np.flatnonzero(~s_flat)]
    tgt_groups = [np.flatnonzero(t_flat), np.flatnonzero(~t_flat)]
    boot: dict[str, list[np.ndarray]] = {m: [] for m in names}
    for start in range(0, n_resamples, _CHUNK):
        b = min(_CHUNK, n_resamples - start)
        if unit == "heads":
            w, _, _ = cluster_weights(src_ids, tgt_ids, src_groups, tgt_groups, rng, b)
        else:
            w = np.zeros((b, n))
            for idx in (pos_idx, neg_idx):
                if len(idx):
                    w[:, idx] = rng.multinomial(len(idx), np.full(len(idx), 1.0 / len(idx)), size=b)
        for m, r in ranked.items():
            boot[m].append(np.stack([r.topk(w, ends, kk), r.topk(w, pos.astype(np.float64), kk),
                                     r.auc(w, pos)]))
    samples = {m: np.concatenate(parts, axis=1) if parts else np.zeros((3, 0)) for m, parts in boot.items()}
    rows = []
    for m in names:
        es, pr, au = point[m]
        s = samples[m]
        diff_p = diff_a = None
        if m != baseline:
            bs, bp = samples[baseline], point[baseline]
            diff_p = _interval(pr - bp[1], s[1] - bs[1], confidence)
            diff_a = _interval(au - bp[2], s[2] - bs[2], confidence)
        r = ranked[m]
        top = [tuple(int(x) for x in cells[i]) for i in r.desc[:kk] if r.ok[i]]
        rows.append(MetricRecovery(
            metric=m, endpoint_share=_interval(es, s[0], confidence), precision=_interval(pr, s[1], confidence),
            auc=_interval(au, s[2], confidence), precision_diff=diff_p, auc_diff=diff_a,
            top=top,  # type: ignore[arg-type]
        ))
    return RecoveryTable(
        pairing=pairing, k=kk, n_valid=n, n_reference=int(pos.sum()), base_rate=float(pos.mean()),
        baseline=baseline, confidence=confidence, n_resamples=n_resamples, rows=tuple(rows),
        layer_indices=tuple(layer_indices) if layer_indices is not None else tuple(range(shape[0])),
        unit=unit,
    )


def head_recovery(heads: HeadWeights, pairing: str, reference_heads: Iterable[str], *, k: int = 20,
                  order: str = "forward", metrics: Iterable[str] = METRICS, confidence: float = CONFIDENCE,
                  n_resamples: int = N_RESAMPLES, seed: int = 0) -> RecoveryTable:
    """:func:`recovery_table` of a model's metrics (:func:`metric_grids`) on ``pairing``
    against a head set (e.g. a label set's heads, "L9H6" names; see the module docstring)."""
    grids, valid = metric_grids(heads, pairing, order=order, seed=seed, metrics=metrics)
    info = heads.info
    _, hs, _, ht = valid.shape
    ref, s_ref, t_ref = reference_from_heads(reference_heads, info.layer_indices, hs, ht, info.n_heads)
    return recovery_table(grids, valid, ref, source_ref=s_ref, target_ref=t_ref, k=k, pairing=pairing,
                          layer_indices=info.layer_indices, confidence=confidence,
                          n_resamples=n_resamples, seed=seed)


__all__ = ["BOOTSTRAP_RULES", "METRICS", "UNITS", "Estimate", "MetricRecovery", "RecoveryTable", "cluster_weights",
           "head_recovery", "metric_grids", "recovery_table", "reference_from_edges", "reference_from_heads", "roc_auc"]
