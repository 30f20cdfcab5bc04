"""Derived views of cached scores: metric grids, top-k pair tables and the PK-vs-CS scatter.

Grids and tables are reshaped from the cached PK / CS / z results (``Results``); the scatter
is cached in its own right.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from headgraph.core.types import PairScores
from headgraph.server.convert import axis_labels, jsonable
from headgraph.server.errors import Invalid
from headgraph.server.params import check_pairing, cs_mode_of
from headgraph.server.registry import ModelRef
from headgraph.server.results import Results


class Views(Results):
    """Per-pairing grids, rankings and PK/CS comparisons for the API, downloads and CLI."""

    def metric_grid(self, ref: ModelRef, pairing: str, metric: str, order: str = "forward"
                    ) -> tuple[PairScores, np.ndarray]:
        """(PK scores, the grid of raw | normalized | z | cs) for one pairing."""
        ps = self.pk(ref, pairing, order)
        if metric in ("raw", "pk"):
            return ps, ps.scores.numpy()
        if metric == "normalized":
            return ps, ps.normalized.numpy()
        if metric == "z":
            return ps, self.zscores(ref, pairing, order)
        if metric == "cs":
            cs = self.cs_for(ref, pairing, order)
            if cs is None:
                raise Invalid(f"no Composition Score for pairing {pairing!r}: CS exists for "
                              "OQ, OK and OV only")
            return ps, np.where(cs.valid.numpy(), cs.scores.numpy(), np.nan)
        raise Invalid(f"unknown metric {metric!r}")

    def top(self, ref: ModelRef, pairing: str, k: int, metric: str, order: str = "forward"
            ) -> list[dict[str, Any]]:
        """The k best valid pairs by pk | normalized | z | cs (core.ranking.top_pairs).

        Records: rank, source, target (L{block}H{head}; L{block}KV{g} for grouped K/V),
        pk, normalized (of PK), z and cs (when the pairing has a CS mode and, for grouped-query
        models, when ranked by CS, whose grid has query heads on both axes).
        """
        from headgraph.core.ranking import expand_heads, top_pairs

        if metric not in ("pk", "normalized", "z", "cs"):
            raise Invalid(f"unknown metric {metric!r}; allowed: ['pk', 'normalized', 'z', 'cs']")
        ps = self.pk(ref, pairing, order)
        cs = self.cs_for(ref, pairing, order)
        z = torch.from_numpy(self.zscores(ref, pairing, order))
        info = self.model_info(ref)
        if metric == "cs":
            if cs is None:
                raise Invalid(f"no Composition Score for pairing {pairing!r}: CS exists for "
                              "OQ, OK and OV only")
            hs, ht = cs.scores.shape[1], cs.scores.shape[3]
            extra = {"pk": expand_heads(ps.scores, hs, ht),
                     "pk_normalized": expand_heads(ps.normalized, hs, ht),
                     "z": expand_heads(z, hs, ht)}
            records = top_pairs(cs, k, metric="pk").to_records(extra)
            for r in records:
                r["normalized"] = r.pop("pk_normalized")
            roles = (ps.source_role, "Q")  # CS axes are query heads
        else:
            extra = {"z": z}
            if cs is not None and cs.scores.shape == ps.scores.shape:
                extra["cs"] = torch.where(cs.valid, cs.scores, torch.nan)
            values = z if metric == "z" else None
            records = top_pairs(ps, k, metric="normalized" if metric == "normalized" else "pk",
                                values=values).to_records(extra)
            roles = (ps.source_role, ps.target_role)
        src_names, tgt_names = axis_labels(info, roles[0]), axis_labels(info, roles[1])
        n_s, n_t = info.heads_of(roles[0]), info.heads_of(roles[1])
        positions = {layer: i for i, layer in enumerate(info.layer_indices)}
        for r in records:
            r.pop("value", None)
            r["source"] = src_names[positions[r["source_layer"]] * n_s + r["source_head"]]
            r["target"] = tgt_names[positions[r["target_layer"]] * n_t + r["target_head"]]
            r.setdefault("cs", None)
        return jsonable(records)


    def scatter(self, ref: ModelRef, pairing: str, top_percent: float) -> dict[str, Any]:
        """PK vs CS of every valid pair with quadrants and Spearman (core.ranking.compare_metrics).

        Points are on the CS grid (query heads on both axes; grouped K/V PK repeated per query
        head). quadrant: 0 neither top x%, 1 PK only, 2 CS only, 3 both.
        """
        from headgraph.core.ranking import compare_metrics

        check_pairing(pairing)
        mode = cs_mode_of(pairing)
        if mode is None:
            raise Invalid(f"no Composition Score for pairing {pairing!r}; scatter needs OQ, OK or OV")
        ps = self.pk(ref, pairing)
        cs = self.cs(ref, mode)

        def compute() -> dict[str, Any]:
            cmp = compare_metrics(ps, cs, top_percent=top_percent)
            info = self.model_info(ref)
            src, tgt = axis_labels(info, "O"), axis_labels(info, "Q")
            n_src, n_tgt = len(src), len(tgt)
            valid = cmp.valid.reshape(n_src, n_tgt)
            rows, cols = torch.nonzero(valid, as_tuple=True)
            points = {"source": [src[i] for i in rows.tolist()],
                      "target": [tgt[j] for j in cols.tolist()],
                      "pk": cmp.pk_values.reshape(n_src, n_tgt)[rows, cols].tolist(),
                      "cs": cs.scores.reshape(n_src, n_tgt)[rows, cols].tolist(),
                      "quadrant": cmp.quadrant.reshape(n_src, n_tgt)[rows, cols].tolist()}
            return {"pairing": pairing, "mode": mode, "top_percent": top_percent,
                    "points": jsonable(points), "comparison": jsonable(cmp.to_dict())}

        return self.cached(ref, "scatter", {"pairing": pairing, "top_percent": top_percent},
                           compute, ("scatter", (ref, pairing, top_percent)))
