"""How much of a compute job is done and how long the rest will take, from the model's shapes.

Every stage of the job's plan (``services.jobs.compute_plan``) gets a cost: the multiply-adds of
its dominant products, counted from the model's shapes the way its core computation does them
(PK's projector pieces and pair features, CS's per-pair products, the nulls' covariances,
eigensolvers and samples, the token tables' vocabulary products, the forward passes), times a
per-kind weight for how fast that kind of work runs relative to PK's dense products (measured
with ``benchmarks/bench_scale.py``). The job's progress is the finished share of the total cost,
and its time left is that remaining cost at the speed the job itself has shown on its finished
stages once they hold ``MIN_BASIS`` of the total; before that, at this machine's own measured
float32 GEMM rate times PK's share of it (``prior_rate``: ``machine_rate()``, measured here in
a few milliseconds), so a job says a time left from its first stage; without a prior there
is no estimate (``None``) until then.

>>> est = JobEstimate(["pk", "cs Q", "reference"], {"n_layers": 32, "n_heads": 32,
...                   "n_kv_heads": 8, "d_model": 4096, "d_head": 128, "d_vocab": 32000})
>>> est.remaining_s() is None
True
>>> JobEstimate(["pk"], {"n_layers": 2, "n_heads": 4, "d_model": 64, "d_head": 16},
...             prior_rate=1e9).remaining_s() > 0
True
>>> est.finished("pk", 300.0)
>>> 0 < est.fraction() < 1 and est.remaining_s() > 0 and est.basis
'measured'
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

ROLES = "QKVO"
# Seconds per multiply-add of each kind of work relative to PK's (fitted once on the 7B
# shape's job, benchmarks/bench_scale.py --job; the 1B shape's job checks them): CS adds its
# R factors, the reference 16 pairings' small sampled grids, tokens their baseline, while a
# streamed forward pass is plain matrix products (plus reading the checkpoint). A fixed
# overhead per stage covers reads and writes of the cache.
KIND_WEIGHT = {"pk": 1.0, "cs": 1.35, "null": 1.0, "reference": 2.0, "tokens": 3.0,
               "forward": 0.8, "light": 1.0}
STAGE_OVERHEAD = 2e9  # multiply-adds' worth of time every stage costs (~0.02 s at 100 GFLOP/s)
# Share of the total cost the finished stages must hold before their own speed is used.
MIN_BASIS = 0.05
# PK's dense products run at about this share of one float32 GEMM's multiply-add rate
# (benchmarks/bench_core.py: the bases step at ~50% of single-thread sgemm).
PK_SHARE_OF_GEMM = 0.5
# Null samples per pairing and reference samples (core.stats: the job's defaults).
NULL_SAMPLES = 2000
# A job whose whole plan costs at most this many multiply-adds (stage overheads included: a few
# seconds of one core, whatever its load) is small: its stages go to the small lane
# (compute.lanes), never behind a big model's stage. The demo's job costs ~3e10, SmolLM2's ~5e12.
SMALL_JOB_WORK = 2e11
REFERENCE_MAX_PAIRS = 40000
# Tokens the patterns stage runs (20 bundled prompts padded, 8 repeated random sequences of 41)
# and each data-weighted PK prompt set; a forward pass costs about 2 * 12 d^2 per layer-token.
PATTERN_TOKENS = 800
DATA_PK_TOKENS = 4000


@dataclass(frozen=True)
class Shape:
    layers: int
    heads: int  # query heads per layer
    kv_heads: int
    d: int
    r: int  # head width (d_head)
    vocab: int
    streamed: bool = False  # weights read from safetensors without a whole model in memory

    @classmethod
    def of(cls, info: Mapping[str, Any]) -> Shape:
        heads = int(info.get("n_heads") or 1)
        return cls(layers=int(info.get("n_layers") or 1), heads=heads,
                   kv_heads=int(info.get("n_kv_heads") or heads), d=int(info.get("d_model") or 1),
                   r=int(info.get("d_head") or 1), vocab=int(info.get("d_vocab") or 0),
                   streamed=info.get("source") == "safetensors")

    def role_heads(self, role: str, per_layer: int | None = None) -> int:
        """Heads of a role over all layers (K/V: the KV heads), or ``per_layer`` sampled."""
        n = self.kv_heads if role in "KV" else self.heads
        return self.layers * (min(n, per_layer) if per_layer else n)

    @property
    def forward_share(self) -> float:
        """Share of all head pairs whose source layer comes before the target's."""
        return (self.layers - 1) / (2 * self.layers)


def pk_cost(shape: Shape, pairings: Sequence[str], per_layer: int | None = None) -> float:
    """Multiply-adds of one shared PK pass: the cheaper of core.scores.overlaps' two formulas
    (projector pieces ~d^2 r / 2 per head plus ~d^2 / 2 per pair, or r^2 d per pair)."""
    d, r = shape.d, shape.r
    roles = {c for p in pairings for c in p}
    pairs = sum(shape.role_heads(p[0], per_layer) * shape.role_heads(p[1], per_layer)
                for p in pairings) * shape.forward_share
    gram = sum(shape.role_heads(c, per_layer) for c in roles) * d * d * r / 2 + pairs * d * d / 2
    overlap = pairs * r * r * d + sum(shape.role_heads(c, per_layer) for c in roles) * d * r * r
    return min(gram, overlap)


def stage_cost(stage: str, shape: Shape) -> tuple[str, float]:
    """(kind, multiply-adds) of one plan stage, by its name ("pk", "cs K", "null OV", ...)."""
    word, _, arg = stage.partition(" ")
    d, r = shape.d, shape.r
    queries = shape.role_heads("Q")
    if word == "pk":  # the shared pass; "pk OQ" reads it back
        return ("pk", pk_cost(shape, ["OQ", "OK", "OV"]) if not arg else 0.0)
    if word == "cs":  # every mode's right factor is per query head: one PK-like pass O x Q
        return ("cs", pk_cost(shape, ["OQ"]))
    if word == "reference":  # 16 pairings among sampled heads
        per_layer = max(1, int((REFERENCE_MAX_PAIRS / max(shape.forward_share, 1e-9)) ** 0.5 / shape.layers))
        pairings = [a + b for a in ROLES for b in ROLES]
        return ("reference", pk_cost(shape, pairings, per_layer))
    if word == "null":  # one pass: each role's covariance and eigensolver, samples per pairing
        if arg:  # "null OK" reads the pass back
            return ("null", 0.0)
        covariance = sum(shape.role_heads(c) for c in "OQKV") * r * d * d
        eig = 4 * 9 * d ** 3
        return ("null", covariance + eig + 3 * NULL_SAMPLES * (d * d * r + 4 * d * r * r))
    if word == "tokens":  # every head's role basis against the vocabulary's embeddings
        return ("tokens", shape.vocab * d * shape.role_heads(arg or "O") * r + shape.role_heads(arg or "O") * d * r * r)
    if word == "patterns":
        return ("forward", PATTERN_TOKENS * 24 * d * d * shape.layers)
    if word == "datapk":  # patches activations through a whole model: a streamed one refuses
        if shape.streamed:
            return ("forward", 0.0)
        return ("forward", DATA_PK_TOKENS * 24 * d * d * shape.layers + queries * d * d * r)
    pairs = queries * queries * shape.forward_share  # z, graph, scatter, pairs: passes over grids
    return ("light", pairs * 2000)


class JobEstimate:
    """Progress and time left of one job's plan (see the module docstring)."""

    def __init__(self, plan: Sequence[str], info: Mapping[str, Any], *,
                 prior_rate: float | None = None) -> None:
        """``prior_rate``: PK multiply-adds per second assumed before the job's own stages
        tell (``machine_rate()``); None: no estimate until then."""
        self.prior_rate = prior_rate if prior_rate and prior_rate > 0 else None
        shape = Shape.of(info)
        self.costs: dict[str, float] = {}
        for stage in plan:
            kind, work = stage_cost(stage, shape)
            self.costs[stage] = KIND_WEIGHT[kind] * work + STAGE_OVERHEAD
        self.total = sum(self.costs.values()) or 1.0
        self.seconds: dict[str, float] = {}

    @property
    def small(self) -> bool:
        """Whether the whole plan costs at most SMALL_JOB_WORK: a small model's job, run in
        the small lane. Counted in work, not seconds, so a busy machine does not change it."""
        return self.total <= SMALL_JOB_WORK

    def finished(self, stage: str, seconds: float, *, worked: bool = True) -> None:
        """Record a finished stage and the seconds it took; ``worked=False`` for one that had
        nothing to do here (a model that cannot run) or could not run: its planned cost leaves
        the total, so it neither inflates the progress nor the measured speed."""
        if not worked:
            self.total = max(self.total - self.costs.pop(stage, 0.0), 1.0)
        self.seconds[stage] = float(seconds)

    def _done_cost(self) -> float:
        return sum(self.costs.get(s, 0.0) for s in self.seconds)

    def fraction(self) -> float:
        """Finished share of the plan's cost, in [0, 1]."""
        return min(1.0, self._done_cost() / self.total)

    @property
    def basis(self) -> str | None:
        """What the time left rests on: "measured" (this job's finished stages), "machine"
        (the prior rate), None (no estimate yet)."""
        if self._done_cost() >= MIN_BASIS * self.total:
            return "measured"
        return "machine" if self.prior_rate else None

    def remaining_s(self) -> float | None:
        """Seconds the unfinished stages should take: at this job's own measured speed once
        the finished stages hold MIN_BASIS of the cost, before that at ``prior_rate`` (None
        without one)."""
        done = self._done_cost()
        if done < MIN_BASIS * self.total:
            return None if self.prior_rate is None else (self.total - done) / self.prior_rate
        rate = sum(t for s, t in self.seconds.items() if s in self.costs) / done
        return rate * (self.total - done)


@functools.lru_cache(maxsize=1)
def machine_rate(n: int = 384, repeats: int = 20) -> float:
    """PK multiply-adds per second to expect on this machine before a job has shown its own:
    the best of ``repeats`` float32 ``n``-cubed products (torch, this process's threads; a few
    milliseconds each, so on busy cores some run unpreempted) times PK_SHARE_OF_GEMM.
    Measured once per process."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)  # warm the kernel
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return PK_SHARE_OF_GEMM * n ** 3 / max(best, 1e-9)


ESTIMATING = "estimating time left…"


def format_eta(seconds: float | None) -> str:
    """'about 12 min left' (rounded as a person would), '' without an estimate."""
    if seconds is None:
        return ""
    if seconds < 90:
        return f"about {max(5, int(round(seconds / 5.0)) * 5)} s left"
    if seconds < 5400:
        return f"about {int(round(seconds / 60.0))} min left"
    return f"about {seconds / 3600.0:.1f} h left"


__all__ = ["ESTIMATING", "SMALL_JOB_WORK", "JobEstimate", "Shape", "format_eta", "machine_rate", "pk_cost", "stage_cost"]
