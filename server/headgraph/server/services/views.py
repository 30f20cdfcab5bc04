"""The views service: metric grids, top-k pair tables and the PK-vs-CS scatter.

Grids and tables are reshaped from the cached PK / CS / z / CKA / Procrustes results
(ScoresService); the scatter is a registered computation of its own ("scatter").
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import torch

from headgraph.core.names import (
    GRID_METRICS,
    RANK_METRICS,
    SIMILARITY_KINDS,
    SIMILARITY_MODES,
    check_pairing,
)
from headgraph.core.scores.ranking import kv_level_cs, top_pairs
from headgraph.core.types import PairScores
from headgraph.server.computations.convert import axis_labels, jsonable
from headgraph.server.compute.results import ResultCache
from headgraph.server.errors import Invalid, NotFound
from headgraph.server.models.catalog import ModelCatalog
from headgraph.server.models.offered import ModelRef
from headgraph.server.services.scores import ScoresService

# A 404 (no such result), not a 422: pairing and metric are each valid, only not together, which
# the schema cannot state.
NO_CS = "no Composition Score for pairing {!r}: CS exists for OQ, OK and OV only"


class ViewService:
    """Per-pairing grids, rankings and PK/CS comparisons for the API, downloads and CLI."""
    def __init__(self, catalog: ModelCatalog, scores: ScoresService, cache: ResultCache) -> None:
        self.catalog = catalog
        self.scores = scores
        self.cache = cache

    def metric_grid(self, ref: ModelRef, pairing: str, metric: str, order: str = "forward"
                    ) -> tuple[PairScores, np.ndarray]:
        """(the PairScores behind the grid, the grid [L, Hs, L, Ht]) of raw | pk | normalized |
        z | cs | cka | procrustes for one pairing: PK's scores for the PK metrics and CS (CS
        NaN where undefined), the similarity's own for cka / procrustes (invalid cells 0, as
        raw PK; a K / V axis keeps native KV heads, as PK's)."""
        if metric not in (*GRID_METRICS, "pk", "cs"):
            raise Invalid(f"unknown metric {metric!r}; allowed: {[*GRID_METRICS, 'cs']}")
        if metric in SIMILARITY_KINDS:
            sim = self.scores.similarity(ref, metric, pairing, order)
            return sim, sim.scores.numpy()
        ps = self.scores.pk(ref, pairing, order)
        if metric in ("raw", "pk"):
            return ps, ps.scores.numpy()
        if metric == "normalized":
            return ps, ps.normalized.numpy()
        if metric == "z":
            return ps, self.scores.zscores(ref, pairing, order)
        cs = self.scores.cs_for(ref, pairing, order)
        if cs is None:
            raise NotFound(NO_CS.format(pairing))
        return ps, np.where(cs.valid.numpy(), cs.scores.numpy(), np.nan)

    def row_similarities(self, ref: ModelRef, pairing: str, metric: str, order: str = "forward",
                         similarity: str = "cached") -> dict[str, PairScores]:
        """{kind: grid} of the CKA / Procrustes grids a ranking's rows carry: the ranked kind
        (computed), and the others when cached, or all computed with ``similarity="compute"``."""
        if similarity not in SIMILARITY_MODES:
            raise Invalid(f"unknown similarity mode {similarity!r}; allowed: {list(SIMILARITY_MODES)}")
        kinds = (SIMILARITY_KINDS if similarity == "compute"
                 else self.scores.cached_similarity_kinds(ref, pairing, order))
        return {kind: self.scores.similarity(ref, kind, pairing, order) for kind in SIMILARITY_KINDS
                if kind in kinds or kind == metric}

    def top(self, ref: ModelRef, pairing: str, k: int, metric: str, order: str = "forward",
            similarity: str = "cached") -> list[dict[str, Any]]:
        """The k best valid pairs by pk | normalized | z | cs | cka | procrustes
        (core.scores.ranking.top_pairs).

        Records: rank, source, target (L{block}H{head}; L{block}KV{g} for grouped K/V),
        pk, normalized (of PK), z, cs (when the pairing has a CS mode), cka and procrustes.
        Rows are the pairing's own pairs whatever the metric; for a grouped-query K/V target
        the CS is the mean over the KV group's query heads (core.scores.ranking.kv_level_cs,
        as the pair panel and the scatter show it) and ``cs_of`` names them, while CKA and
        Procrustes, like PK, are of the KV head itself. A similarity ranking keeps the pairs
        valid for PK and for it. cka / procrustes are null outside their grid's valid cells
        and for a grid not cached (each costs about as much as PK's: only the ranked one is
        computed, or both with ``similarity="compute"``; :meth:`row_similarities`).
        """
        if metric not in RANK_METRICS:
            raise Invalid(f"unknown metric {metric!r}; allowed: {list(RANK_METRICS)}",
                          allowed=list(RANK_METRICS))
        ps = self.scores.pk(ref, pairing, order)
        cs = self.scores.cs_for(ref, pairing, order)
        kv = None if cs is None else kv_level_cs(cs, ps.scores.shape[3])
        z = torch.from_numpy(self.scores.zscores(ref, pairing, order))
        sims = self.row_similarities(ref, pairing, metric, order, similarity)
        info = self.catalog.model_info(ref)
        nan = torch.tensor(float("nan"), dtype=torch.float64)
        extra = {"z": z, **{kind: torch.where(s.valid, s.scores.to(torch.float64), nan)
                            for kind, s in sims.items()}}
        if metric == "cs":
            if kv is None:
                raise NotFound(NO_CS.format(pairing))
            top = top_pairs(replace(ps, valid=kv.valid), k, values=kv.scores)
        elif metric in sims:
            sim = sims[metric]
            top = top_pairs(replace(ps, valid=ps.valid & sim.valid), k, values=sim.scores)
        else:
            values = z if metric == "z" else None
            top = top_pairs(ps, k, metric="normalized" if metric == "normalized" else "pk",
                            values=values)
        records = top.to_records(extra)
        cs_vals: list[float | None] = [None] * len(records)
        cs_of: list[str | None] = [None] * len(records)
        if kv is not None:
            cs_vals, cs_of = kv.cells(top.source_layer, top.source_head, top.target_layer,
                                      top.target_head)
        src_names = axis_labels(info, ps.source_role)
        tgt_names = axis_labels(info, ps.target_role)
        n_s, n_t = info.heads_of(ps.source_role), info.heads_of(ps.target_role)
        positions = {layer: i for i, layer in enumerate(info.layer_indices)}
        for r, c, of in zip(records, cs_vals, cs_of):
            r.pop("value", None)
            r["source"] = src_names[positions[r["source_layer"]] * n_s + r["source_head"]]
            r["target"] = tgt_names[positions[r["target_layer"]] * n_t + r["target_head"]]
            r["cs"] = c
            if of is not None:
                r["cs_of"] = of
            for kind in SIMILARITY_KINDS:
                r.setdefault(kind, None)
        return jsonable(records)

    def scatter(self, ref: ModelRef, pairing: str, top_percent: float) -> dict[str, Any]:
        """PK vs CS of every valid pair with quadrants and Spearman (registered "scatter")."""
        check_pairing(pairing)
        return self.cache.get(ref, "scatter", pairing=pairing, top_percent=top_percent)
