"""Faithfulness of task circuits by real intervention, and EAP checked against edge patching.

**Edge patching.** A forward on base prompts where some edges are replaced: reader r's input
becomes ``x_r - sum over replaced edges (w -> r) of (a_w(live) - a_w(other))``, where
``a_w(live)`` is writer w's write in this (patched) forward and ``a_w(other)`` its write on
the other prompts of the pair. Each reader sees its own input: a Q / K / V reader through its
layer's norm (recomputed on the patched input) and projection, an MLP through its norm, the
logits through the final norm. Exact: the residual is the sum of the writes (head writes
through a post-attention norm with the live forward's scale, core.circuits.attribution).

**Faithfulness** of a circuit (a set of edges): the clean forward with every edge outside it
patched to its corrupt write ("corrupt" ablation); recovered share
``(M(circuit) - M(corrupt)) / (M(clean) - M(corrupt))``: 1 with every edge kept, 0 with none
(exactly, on models without a post-attention norm). The curve takes the top-n edges by
|attribution| for n = 0, 1, 2, 5, 10, 20, ... and all, then bisects between the last size
below ``share`` and the first reaching it; the circuit shown is the smallest n on the curve
reaching ``share``.

**EAP vs patching.** For a sample of edges (the strongest half by |EAP|, the other half drawn
at random from the rest), the real denoising effect: the corrupt forward with that one edge
patched to its clean write, ``M(patched) - M(corrupt)``, which EAP estimates to first order;
Spearman's rank correlation between the two over the sample.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from headgraph.core.circuits.attribution import Capture, CircuitAttribution, Graph
from headgraph.core.circuits.model import PATHS, CircuitModel, Probe, circuit_model
from headgraph.core.circuits.tasks import Task, batches, logit_diff
from headgraph.core.errors import InvalidInput

Progress = Callable[[float, str], None]
DEFAULT_SHARE = 0.8
DEFAULT_SAMPLE = 24


@dataclass(frozen=True)
class FaithfulnessCurve:
    """Recovered share of the clean - corrupt metric gap for circuits of the top-n edges."""

    sizes: tuple[int, ...]
    metrics: tuple[float, ...]  # mean metric with the top-n edges kept
    recovered: tuple[float, ...]
    clean: float
    corrupt: float
    share: float
    circuit_size: int | None  # the smallest n on the curve reaching ``share``
    total_edges: int
    ablation: str = "corrupt"

    def to_dict(self) -> dict[str, Any]:
        return {"sizes": list(self.sizes), "metrics": list(self.metrics),
                "recovered": list(self.recovered), "clean": self.clean,
                "corrupt": self.corrupt, "share": self.share,
                "circuit_size": self.circuit_size, "total_edges": self.total_edges,
                "ablation": self.ablation}


@dataclass(frozen=True)
class PatchingCheck:
    """EAP against real single-edge patching on a sample of edges."""

    edges: tuple[int, ...]  # edge indices of the attribution
    names: tuple[tuple[str, str], ...]
    eap: tuple[float, ...]
    patched: tuple[float, ...]  # M(corrupt with the edge patched to clean) - M(corrupt)
    spearman: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"n_edges": len(self.edges), "spearman": self.spearman,
                "edges": [{"writer": w, "reader": r, "score": s, "patched": p}
                          for (w, r), s, p in zip(self.names, self.eap, self.patched,
                                                  strict=True)]}


class Patch(Probe):
    """The patched forward (module docstring): ``replace`` [W, R] (float 0/1) marks the
    edges whose writer is swapped for its write in ``other``."""

    def __init__(self, cm: CircuitModel, graph: Graph, replace: torch.Tensor, other: Capture
                 ) -> None:
        self.cm = cm
        self.graph = graph
        self.E = replace
        self.K = graph.valid.to(replace.device) & ~replace.bool()  # kept edges
        self.other = other
        self.D: torch.Tensor | None = None  # [W, B, T, d]: live - other, filled as known
        self.total: torch.Tensor | None = None  # sum of D's rows so far: every earlier writer
        self.x: dict[int, torch.Tensor] = {}
        self.zl: dict[int, torch.Tensor] = {}
        self.cols = {(layer, p): graph.reader_columns(layer, p)
                     for layer in range(cm.n_layers) for p in (*PATHS, "MLP")}

    def _delta(self, cols: list[int]) -> torch.Tensor | None:
        """sum of replaced writers' (live - other) per reader column: [B, T, len(cols), d];
        over the replaced writers, or the running total less the kept ones, whichever is
        fewer rows (every writer before these readers is in the total)."""
        E = self.E[:, cols]
        if self.D is None or self.total is None or not bool(E.any()):
            return None
        replaced = E.any(1).nonzero().flatten()
        K = self.K[:, cols]
        kept = K.any(1).nonzero().flatten()
        if replaced.numel() <= kept.numel():
            return torch.einsum("wbtd,wr->btrd", self.D[replaced],
                                E[replaced].to(self.D.dtype))
        out = self.total[:, :, None, :].expand(-1, -1, len(cols), -1)
        if kept.numel():
            out = out - torch.einsum("wbtd,wr->btrd", self.D[kept], K[kept].to(self.D.dtype))
        return out

    def _set(self, rows: slice | int, value: torch.Tensor) -> None:
        assert self.D is not None and self.total is not None
        self.D[rows] = value
        self.total += value if isinstance(rows, int) else value.sum(0)

    def resid0(self, x: torch.Tensor) -> torch.Tensor:
        assert self.other.x0 is not None
        self.D = torch.zeros(len(self.graph.writers), *x.shape, dtype=x.dtype, device=x.device)
        self.total = torch.zeros_like(x)
        self._set(0, x - self.other.x0)
        return x

    def attn_in(self, layer: int, x: torch.Tensor) -> None:
        self.x[layer] = x

    def proj(self, layer: int, path: str, t: torch.Tensor) -> torch.Tensor:
        delta = self._delta(self.cols[(layer, path)])
        if delta is None:
            return t
        x = self.x[layer][:, :, None, :]
        change = self.cm.norm(layer, x - delta) - self.cm.norm(layer, x)
        return t + torch.einsum("btrd,rde->btre", change, self.cm.W_in(path)[layer]).to(t.dtype)

    def _heads(self, layer: int, scale: torch.Tensor | None) -> None:
        assert self.D is not None
        rows = self.graph.writer_rows(layer, "head")
        diff = self.zl[layer] - self.other.z_[layer]
        self._set(slice(rows[0], rows[-1] + 1),
                  self.cm.head_writes(layer, diff, scale).permute(2, 0, 1, 3))

    def z(self, layer: int, t: torch.Tensor) -> None:
        self.zl[layer] = t
        if not self.cm.post_norm:
            self._heads(layer, None)

    def post_scale(self, layer: int, s: torch.Tensor) -> None:
        self._heads(layer, s)

    def mlp_in(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        delta = self._delta(self.cols[(layer, "MLP")])
        return x if delta is None else x - delta[:, :, 0].to(x.dtype)

    def mlp_out(self, layer: int, t: torch.Tensor) -> None:
        self._set(self.graph.writer_rows(layer, "mlp")[0], t - self.other.mlp[layer])

    def final(self, x: torch.Tensor) -> torch.Tensor:
        delta = self._delta([len(self.graph.readers) - 1])
        return x if delta is None else x - delta[:, :, 0].to(x.dtype)


class _Batches:
    """A task's batches with their clean and corrupt captures (taken once, reused)."""

    def __init__(self, cm: CircuitModel, task: Task, batch_size: int) -> None:
        self.cm = cm
        self.task = task
        self.items = []
        dev = cm.device
        for rows in batches(task, batch_size):
            t = {"rows": rows,
                 "clean": torch.tensor([task.clean[i] for i in rows], device=dev),
                 "corrupt": torch.tensor([task.corrupt[i] for i in rows], device=dev),
                 "ans": torch.tensor([task.answer[i] for i in rows], device=dev),
                 "dis": torch.tensor([task.distractor[i] for i in rows], device=dev)}
            with torch.no_grad():
                for side in ("clean", "corrupt"):
                    cap = Capture()
                    t[f"{side}_m"] = logit_diff(cm.forward(t[side], cap), t["ans"], t["dis"])
                    t[f"{side}_cap"] = cap
            self.items.append(t)

    def mean(self, key: str) -> float:
        return float(torch.cat([t[key].double().cpu() for t in self.items]).sum()
                     / self.task.n_pairs)

    @torch.no_grad()
    def patched(self, graph: Graph, replace: torch.Tensor, *, base: str) -> float:
        """Mean metric of ``base`` prompts with the ``replace`` edges [W, R] patched to the
        other side's writes."""
        other = "corrupt" if base == "clean" else "clean"
        total = 0.0
        for t in self.items:
            probe = Patch(self.cm, graph, replace.to(self.cm.device), t[f"{other}_cap"])
            m = logit_diff(self.cm.forward(t[base], probe), t["ans"], t["dis"])
            total += float(m.double().sum())
        return total / self.task.n_pairs


def default_sizes(total: int) -> tuple[int, ...]:
    """0, 1, 2, 5, 10, 20, 50, ... below ``total``, and ``total``."""
    sizes, k = [0], 1
    while k < total:
        for m in (1, 2, 5):
            if m * k < total:
                sizes.append(m * k)
        k *= 10
    return tuple(sorted(set(sizes + [total])))


def _mask(attribution: CircuitAttribution, edges: torch.Tensor) -> torch.Tensor:
    g = attribution.graph
    m = torch.zeros(len(g.writers), len(g.readers), dtype=torch.bool)
    m[attribution.writer[edges], attribution.reader[edges]] = True
    return m


def faithfulness(model: Any, task: Task, attribution: CircuitAttribution, *,
                 sizes: Sequence[int] | None = None, share: float = DEFAULT_SHARE,
                 refine: int = 6, batch_size: int = 8, progress: Progress | None = None,
                 extra: Sequence[int] = ()) -> FaithfulnessCurve:
    """The faithfulness curve of ``attribution``'s top-n circuits on ``task`` (module
    docstring); ``sizes``: the n values (default: default_sizes of all edges, then up to
    ``refine`` bisection steps below the first size reaching ``share``, so the circuit size
    is the smallest n found reaching it, recovery taken as rising between curve points);
    ``extra``: more n values measured with them (MIB's grid, core.circuits.mib.mib_sizes)."""
    cm = circuit_model(model)
    if attribution.task_hash != task.content_hash():
        raise InvalidInput("the attribution was computed on another task")
    if not 0 < share <= 1:
        raise InvalidInput(f"share must be in (0, 1], got {share!r}")
    total = attribution.n_edges
    ns = default_sizes(total) if sizes is None else tuple(int(n) for n in sizes)
    ns = tuple(sorted({*ns, *(int(n) for n in extra)}))
    if not ns or ns[0] < 0 or ns[-1] > total:
        raise InvalidInput(f"circuit sizes must lie in 0..{total}")
    data = _Batches(cm, task, batch_size)
    clean, corrupt = data.mean("clean_m"), data.mean("corrupt_m")
    gap = clean - corrupt
    order = attribution.order()
    valid = attribution.graph.valid
    curve: dict[int, float] = {}
    budget = len(ns) + (refine if sizes is None else 0)

    def measure(n: int) -> float:
        keep = _mask(attribution, order[:n])
        curve[n] = data.patched(attribution.graph, (valid & ~keep).float(), base="clean")
        if progress is not None:
            r = (curve[n] - corrupt) / gap if gap else float("nan")
            progress(min(1.0, len(curve) / budget), f"circuit of {n} edges: {r:.2f} recovered")
        return curve[n]

    def reaches(n: int) -> bool:
        return gap != 0 and (curve[n] - corrupt) / gap >= share

    for n in ns:
        measure(n)
    first = next((n for n in ns if reaches(n)), None)
    if sizes is None and first is not None and first > 0:  # bisect below the first reaching n
        lo = max(n for n in ns if n < first)
        hi = first
        for _ in range(refine):
            if hi - lo <= 1:
                break
            mid = (lo + hi) // 2
            measure(mid)
            lo, hi = (lo, mid) if reaches(mid) else (mid, hi)
        first = hi
    ordered = sorted(curve)
    metrics = tuple(curve[n] for n in ordered)
    recovered = tuple((m - corrupt) / gap if gap != 0 else float("nan") for m in metrics)
    return FaithfulnessCurve(sizes=tuple(ordered), metrics=metrics, recovered=recovered,
                             clean=clean, corrupt=corrupt, share=share, circuit_size=first,
                             total_edges=total)


def sample_edges(attribution: CircuitAttribution, n: int = DEFAULT_SAMPLE, seed: int = 0
                 ) -> torch.Tensor:
    """``n`` edge indices: the strongest n // 2 by |score| and n - n // 2 drawn at random
    (seeded) from the rest."""
    order = attribution.order()
    n = min(n, attribution.n_edges)
    top, rest = order[: n // 2], order[n // 2:]
    g = torch.Generator().manual_seed(seed)
    drawn = rest[torch.randperm(rest.numel(), generator=g)[: n - n // 2]]
    return torch.cat([top, drawn])


def patching_check(model: Any, task: Task, attribution: CircuitAttribution, *,
                   n: int = DEFAULT_SAMPLE, seed: int = 0, edges: Sequence[int] | None = None,
                   batch_size: int = 8, progress: Progress | None = None) -> PatchingCheck:
    """EAP against real single-edge patching (module docstring) on ``edges`` (default:
    sample_edges(n, seed)); Spearman over them (None with fewer than three or a constant)."""
    from scipy.stats import spearmanr

    cm = circuit_model(model)
    if attribution.task_hash != task.content_hash():
        raise InvalidInput("the attribution was computed on another task")
    chosen = sample_edges(attribution, n, seed) if edges is None else torch.as_tensor(
        list(edges), dtype=torch.long)
    data = _Batches(cm, task, batch_size)
    corrupt = data.mean("corrupt_m")
    patched = []
    for i, e in enumerate(chosen.tolist()):
        one = _mask(attribution, torch.tensor([e]))
        patched.append(data.patched(attribution.graph, one.float(), base="corrupt") - corrupt)
        if progress is not None:
            progress((i + 1) / len(chosen), f"patched edge {i + 1}/{len(chosen)}")
    eap = [float(attribution.scores[e]) for e in chosen.tolist()]
    rho = None
    if len(eap) >= 3 and len(set(eap)) > 1 and len(set(patched)) > 1:
        r = float(spearmanr(eap, patched).statistic)  # type: ignore[union-attr]
        rho = r if r == r else None
    names = tuple((w.name, r.name) for w, r in (attribution.edge(e) for e in chosen.tolist()))
    return PatchingCheck(edges=tuple(chosen.tolist()), names=names, eap=tuple(eap),
                         patched=tuple(patched), spearman=rho)


__all__ = ["DEFAULT_SAMPLE", "DEFAULT_SHARE", "FaithfulnessCurve", "Patch", "PatchingCheck",
           "default_sizes", "faithfulness", "patching_check", "sample_edges"]
