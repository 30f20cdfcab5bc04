"""Series, timelines and model comparisons served from the per-model PK cache.

A **series** is a named run of checkpoints (``demo-series``: core.models.series) or a comma list of
model ids (each an id GET /api/models or GET /api/series gives; steps are then their
positions 0, 1, ...). A timeline reads each checkpoint's cached PK (``ScoresService.pk``,
computed on first use like any PK) and hands them to core.graphs.timeline; a comparison reads two
models' PK and hands them to core.graphs.diff. Different head layouts are a 422 with both
layouts named (core's InvalidInput), unknown series a 404.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from typing import Any

import numpy as np

from headgraph.core.graphs.diff import EdgeChange, ModelDiff, compare_scores
from headgraph.core.graphs.timeline import Edge, Timeline, edge_of, edge_trajectories
from headgraph.core.models.series import DEMO_SERIES, demo_series
from headgraph.core.names import check_pairing
from headgraph.server.computations.convert import grid_axis_labels, jsonable, role_is_grouped
from headgraph.server.errors import Invalid, NotFound
from headgraph.server.limits import TIMELINE_EDGES_MAX, TIMELINE_SERIES_MAX
from headgraph.server.models.catalog import ModelCatalog
from headgraph.server.models.offered import ModelRef, shown
from headgraph.server.services.scores import ScoresService

SERIES_METHOD = ("PK of each edge at every checkpoint (core.graphs.timeline.edge_trajectories); "
                 "edges: the given ones, else the last checkpoint's top-k by the metric")
COMPARE_METHOD = ("B - A of the metric on pairs valid in both; gained / lost: edges of B's / "
                  "A's top-k not in the other's; changed: edges in both, by |B - A|; hubs: "
                  "core.graphs.hubs on each top-k graph (core.graphs.diff.compare_scores)")


@dataclass(frozen=True)
class Series:
    """A resolved series: its name, step numbers and models, in step order."""

    name: str
    steps: tuple[int, ...]
    refs: tuple[ModelRef, ...]


def named_series() -> dict[str, list[tuple[int, str]]]:
    """Every named series: name -> [(step, model id)] in step order."""
    demo = [(c.step, c.model_id) for c in demo_series()]
    return {DEMO_SERIES: demo} if demo else {}


def resolve_series(catalog: ModelCatalog, series: str) -> Series:
    """A named series or a comma list of at least two model ids. Anything else names no
    series (404, like an unknown model id); more than TIMELINE_SERIES_MAX ids is a 422."""
    text = (series or "").strip()
    named = named_series()
    if text in named:
        pairs = named[text]
        return Series(text, tuple(s for s, _ in pairs),
                      tuple(catalog.resolve(m) for _, m in pairs))
    if "," not in text:
        raise NotFound(f"unknown series {shown(text)}; named series: {sorted(named)}, or give "
                       "a comma list of model ids", allowed=sorted(named))
    ids = [t.strip() for t in text.split(",")]
    if len(ids) < 2 or any(not t for t in ids):
        raise NotFound(f"unknown series {shown(text)}: a series of model ids needs at least two "
                       f"non-empty ids, comma-separated; named series: {sorted(named)}",
                       allowed=sorted(named))
    if len(ids) > TIMELINE_SERIES_MAX:
        raise Invalid(f"a series reads at most {TIMELINE_SERIES_MAX} models")
    return Series(text, tuple(range(len(ids))), tuple(catalog.resolve(m) for m in ids))


def parse_edges(texts: list[str] | None) -> list[tuple[str, str]] | None:
    """``["L0H0,L1H3", ...]`` -> [(source, target)]; None when no edge is given."""
    if not texts:
        return None
    if len(texts) > TIMELINE_EDGES_MAX:
        raise Invalid(f"at most {TIMELINE_EDGES_MAX} edges per timeline")
    out = []
    for t in texts:
        parts = [p.strip() for p in t.split(",")]
        if len(parts) != 2 or not all(parts):
            raise Invalid(f"edge {shown(t)} is not 'source,target' (e.g. 'L0H0,L1H3')")
        out.append((parts[0], parts[1]))
    return out


def timeline(scores: ScoresService, catalog: ModelCatalog, series: Series, pairing: str, *,
             k: int, metric: str, edges: list[tuple[str, str]] | None) -> Timeline:
    """core.graphs.timeline of the series' cached PK of ``pairing``."""
    check_pairing(pairing)
    results = [scores.pk(ref, pairing) for ref in series.refs]
    picked: list[Edge] | None = None if edges is None else \
        [edge_of(results[-1], s, t) for s, t in edges]
    info = catalog.model_info(series.refs[-1])
    return edge_trajectories(results, series.steps, [r.id for r in series.refs], edges=picked,
                             k=k, metric=metric,
                             grouped_target=role_is_grouped(info, results[-1].target_role))


def timeline_json(tl: Timeline, series: Series, k: int, metric: str) -> dict[str, Any]:
    """What GET /api/timeline answers."""
    return {"series": series.name, "pairing": tl.pairing, "metric": metric, "k": k,
            "selection": tl.selection, "steps": list(tl.steps), "models": list(tl.models),
            "edges": tl.records(), "method": SERIES_METHOD}


def timeline_csv(tl: Timeline) -> str:
    """One row per (edge, checkpoint): source,target,step,model,pk,normalized."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=["source", "target", "step", "model", "pk", "normalized"],
                       lineterminator="\n")
    w.writeheader()
    for row in tl.long_rows():
        w.writerow({k: "" if v is None else v for k, v in row.items()})
    return buf.getvalue()


def compare(scores: ScoresService, catalog: ModelCatalog, a: ModelRef, b: ModelRef, pairing: str,
            *, k: int, metric: str) -> ModelDiff:
    """core.graphs.diff of two models' cached PK of ``pairing``."""
    check_pairing(pairing)
    pa, pb = scores.pk(a, pairing), scores.pk(b, pairing)
    info = catalog.model_info(b)
    return compare_scores(pa, pb, k=k, metric=metric, names=(a.id, b.id),
                          grouped_target=role_is_grouped(info, pb.target_role))


def _change(c: EdgeChange) -> dict[str, Any]:
    return {"source": c.source, "target": c.target, "status": c.status, "a": c.score_a,
            "b": c.score_b, "delta": c.delta, "rank_a": c.rank_a, "rank_b": c.rank_b}


def compare_json(d: ModelDiff, a: ModelRef, b: ModelRef, catalog: ModelCatalog) -> dict[str, Any]:
    """What GET /api/compare answers: grids [L][Hs][L][Ht] (null where not valid in both)."""
    info = catalog.model_info(b)
    src_role, tgt_role = d.pairing[0], d.pairing[1]
    valid = d.valid.numpy()

    def grid(t: Any) -> Any:
        g = t.numpy().astype(np.float64)
        return jsonable(np.where(valid, g, np.nan))

    hubs = {name: [{"name": r.name, "rank": r.rank, "degree": r.degree, "is_hub": r.is_hub,
                    "weighted_degree": r.weighted_degree} for r in table.top]
            for name, table in (("hubs_a", d.hubs_a), ("hubs_b", d.hubs_b))}
    return {"a": a.id, "b": b.id, "pairing": d.pairing, "metric": d.metric, "k": d.k,
            "shape": list(d.diff.shape), "layer_indices": list(d.layer_indices),
            "source_labels": grid_axis_labels(info, src_role, d.diff.shape[1]),
            "target_labels": grid_axis_labels(info, tgt_role, d.diff.shape[3]),
            "grid_a": grid(d.a), "grid_b": grid(d.b), "diff": grid(d.diff),
            "valid": valid.tolist(), "summary": d.summary(),
            "gained": [_change(c) for c in d.gained], "lost": [_change(c) for c in d.lost],
            "changed": [_change(c) for c in d.changed], **hubs,
            "hub_moves": [m.__dict__ for m in d.hub_moves], "method": COMPARE_METHOD}
