"""Per-edge trajectories over a series of checkpoints: how an edge's PK changes in training.

Pure tensor code on PairScores (one per checkpoint, same pairing and head layout): the chosen
edges, or the top-k of the last checkpoint, read at every checkpoint. Edges are positions in
the ``[source_layer, source_head, target_layer, target_head]`` grid (layer = position in
``layer_indices``, not the block number); names use block numbers (``L0H0``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from headgraph.core.errors import InvalidInput
from headgraph.core.names import HeadRef, head_label
from headgraph.core.scores.ranking import top_pairs
from headgraph.core.types import PairScores

Edge = tuple[int, int, int, int]  # (source layer, source head, target layer, target head) positions


def check_same_layout(results: Sequence[PairScores], names: Sequence[str]) -> None:
    """InvalidInput unless every result has the first one's kind, pairing, order, grid shape
    and layer indices (checkpoints or models with the same head layout)."""
    if not results:
        raise InvalidInput("no results to compare: give at least one checkpoint")
    first = results[0]
    for ps, name in zip(results[1:], names[1:]):
        if ps.scores.shape != first.scores.shape or ps.layer_indices != first.layer_indices:
            raise InvalidInput(
                f"{name} has a different head layout ({_layout(ps)}) from {names[0]} "
                f"({_layout(first)}): only models with the same layers and heads compare")
        if (ps.kind, ps.pairing, ps.order) != (first.kind, first.pairing, first.order):
            raise InvalidInput(f"{name} holds {ps.kind} {ps.pairing} ({ps.order}), "
                               f"{names[0]} {first.kind} {first.pairing} ({first.order})")


def _layout(ps: PairScores) -> str:
    _, hs, _, ht = ps.scores.shape
    return f"layers {list(ps.layer_indices)}, {hs} source and {ht} target heads per layer"


def axis_names(ps: PairScores, *, grouped_target: bool = False, grouped_source: bool = False
               ) -> tuple[list[str], list[str]]:
    """(source names [L*Hs], target names [L*Ht]) row-major by (layer, head); a grouped axis
    (the KV heads of a grouped-query model) is named ``L6KV1``."""
    _, hs, _, ht = ps.scores.shape
    src = [head_label(b, h, kv=grouped_source) for b in ps.layer_indices for h in range(hs)]
    tgt = [head_label(b, h, kv=grouped_target) for b in ps.layer_indices for h in range(ht)]
    return src, tgt


def edge_of(ps: PairScores, source: str, target: str) -> Edge:
    """Grid position of the edge ``source -> target`` named by heads (``L0H0``, ``L1KV0``);
    InvalidInput for an unknown layer or head."""
    _, hs, _, ht = ps.scores.shape
    out = []
    for text, n in ((source, hs), (target, ht)):
        ref = HeadRef.parse(text)
        if ref.layer not in ps.layer_indices:
            raise InvalidInput(f"{ref.label}: no attention layer {ref.layer}; layers are "
                               f"{list(ps.layer_indices)}")
        if ref.head >= n:
            raise InvalidInput(f"{ref.label}: this axis has {n} heads per layer")
        out += [ps.layer_indices.index(ref.layer), ref.head]
    return out[0], out[1], out[2], out[3]


@dataclass(frozen=True)
class Timeline:
    """Trajectories of E edges over T checkpoints.

    steps: [T]; edges: [E] grid positions; sources / targets: [E] names; pk, normalized:
    [E, T] float64 (NaN where the edge is not a valid pair); valid: [E]; selection says how the
    edges were chosen.
    """

    pairing: str
    steps: tuple[int, ...]
    models: tuple[str, ...]
    edges: tuple[Edge, ...]
    sources: tuple[str, ...]
    targets: tuple[str, ...]
    pk: torch.Tensor
    normalized: torch.Tensor
    valid: torch.Tensor
    selection: str

    def records(self) -> list[dict[str, Any]]:
        """One row per edge: source, target, pk [T], normalized [T], change (last - first)."""
        rows = []
        for i, (s, t) in enumerate(zip(self.sources, self.targets)):
            pk = [_num(v) for v in self.pk[i].tolist()]
            rows.append({"source": s, "target": t, "pk": pk,
                         "normalized": [_num(v) for v in self.normalized[i].tolist()],
                         "change": _num(self.pk[i, -1].item() - self.pk[i, 0].item())})
        return rows

    def long_rows(self) -> list[dict[str, Any]]:
        """One row per (edge, checkpoint): the CSV export's rows."""
        return [{"source": s, "target": t, "step": step, "model": model,
                 "pk": _num(self.pk[i, j].item()), "normalized": _num(self.normalized[i, j].item())}
                for i, (s, t) in enumerate(zip(self.sources, self.targets))
                for j, (step, model) in enumerate(zip(self.steps, self.models))]


def _num(v: float) -> float | None:
    return None if v != v else float(v)  # NaN -> None (JSON null)


def edge_trajectories(results: Sequence[PairScores], steps: Sequence[int], models: Sequence[str], *,
                      edges: Sequence[Edge] | None = None, k: int = 10, metric: str = "pk",
                      grouped_target: bool = False) -> Timeline:
    """PK (raw and normalized) of ``edges`` at every checkpoint, or of the last checkpoint's
    top-``k`` edges by ``metric`` ("pk" | "normalized") when ``edges`` is None.

    results: one PairScores per checkpoint, in step order, all of one layout
    (check_same_layout); steps / models: [T] step numbers and model ids.
    """
    if not (len(results) == len(steps) == len(models)):
        raise InvalidInput("results, steps and models must have one entry per checkpoint")
    check_same_layout(results, list(models))
    last = results[-1]
    if edges is None:
        top = top_pairs(last, k, metric=metric)
        picked: list[Edge] = [(int(a), int(b), int(c), int(d)) for a, b, c, d in zip(
            top.source_layer.tolist(), top.source_head.tolist(), top.target_layer.tolist(),
            top.target_head.tolist())]
        selection = f"top {k} edges of {models[-1]} by {metric}"
    else:
        picked = [tuple(int(x) for x in e) for e in edges]  # type: ignore[misc]
        selection = "given edges"
    shape = last.scores.shape
    for e in picked:
        if len(e) != 4 or any(not 0 <= x < n for x, n in zip(e, shape)):
            raise InvalidInput(f"edge {e} lies outside the grid {tuple(shape)}")
    idx = tuple(torch.tensor([e[d] for e in picked], dtype=torch.long) for d in range(4))
    pk = torch.stack([r.scores.double()[idx] for r in results], dim=1) if picked else \
        torch.zeros(0, len(results), dtype=torch.float64)
    norm = torch.stack([r.normalized.double()[idx] for r in results], dim=1) if picked else \
        torch.zeros_like(pk)
    valid = last.valid[idx] if picked else torch.zeros(0, dtype=torch.bool)
    pk = torch.where(valid[:, None], pk, torch.full_like(pk, float("nan")))
    norm = torch.where(valid[:, None], norm, torch.full_like(norm, float("nan")))
    src_names, tgt_names = axis_names(last, grouped_target=grouped_target)
    _, hs, _, ht = shape
    return Timeline(pairing=last.pairing, steps=tuple(int(s) for s in steps), models=tuple(models),
                    edges=tuple(picked), sources=tuple(src_names[e[0] * hs + e[1]] for e in picked),
                    targets=tuple(tgt_names[e[2] * ht + e[3]] for e in picked),
                    pk=pk, normalized=norm, valid=valid, selection=selection)
