"""Data-weighted PK as the API and the CLI answer it: both grids, the baselines, the variances
and the ``k`` best valid edges by out_share or in_share, each with its PK and CS (a KV-group
target: the CS mean over its query heads, ``core.scores.ranking.kv_level_cs``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import torch

from headgraph.core.scores.ranking import kv_level_cs, top_pairs
from headgraph.server.computations.convert import axis_labels, grid_axis_labels, jsonable
from headgraph.server.computations.data_pk import (
    DATA_PK_RANK_ON,
    DEFAULT_DATA_PK_TOP,
    check_data_pk_pairing,
    check_prompts,
    pair_cell,
)
from headgraph.server.errors import Invalid
from headgraph.server.models.catalog import ModelCatalog
from headgraph.server.models.offered import ModelRef
from headgraph.server.services.scores import ScoresService


class DataPKService:
    """Data-weighted PK answers of one process (computed through the result cache)."""

    def __init__(self, scores: ScoresService, catalog: ModelCatalog) -> None:
        self.scores = scores
        self.catalog = catalog


    def answer(self, ref: ModelRef, pairing: str, prompts: str, k: int = DEFAULT_DATA_PK_TOP,
                   rank_on: str = "out_share") -> dict[str, Any]:
        """The API / CLI answer: grids, baselines, variances and the ``k`` best valid edges by
        ``rank_on`` (out_share | in_share), each with its PK and CS."""
        check_data_pk_pairing(pairing)
        check_prompts(prompts)
        if rank_on not in DATA_PK_RANK_ON:
            raise Invalid(f"rank_on must be one of {list(DATA_PK_RANK_ON)}, got {rank_on!r}",
                          allowed=list(DATA_PK_RANK_ON))
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise Invalid(f"k must be a positive integer, got {k!r}")
        info = self.catalog.model_info(ref)
        result = self.scores.cache.get(ref, "data_pk", pairing=pairing, prompts=prompts)
        ps = self.scores.pk(ref, pairing, "forward")
        cs = self.scores.cs_for(ref, pairing, "forward")
        kv = None if cs is None else kv_level_cs(cs, ps.scores.shape[3])
        valid = torch.from_numpy(np.asarray(result["valid"], dtype=bool))
        grid = torch.from_numpy(np.nan_to_num(result[rank_on], nan=0.0))
        top = top_pairs(replace(ps, valid=valid), k, values=grid)
        src_names, tgt_names = axis_labels(info, "O"), axis_labels(info, pairing[1])
        n_t = int(ps.scores.shape[3])
        rows = []
        cs_vals = kv.cells(top.source_layer, top.source_head, top.target_layer,
                           top.target_head)[0] if kv is not None else [None] * len(top.value)
        for i, (sl, sh, tl, th) in enumerate(zip(top.source_layer.tolist(), top.source_head.tolist(),
                                                 top.target_layer.tolist(),
                                                 top.target_head.tolist(), strict=True)):
            rows.append({"rank": i + 1, "source": src_names[sl * info.n_heads + sh],
                         "target": tgt_names[tl * n_t + th],
                         "pk": float(ps.scores[sl, sh, tl, th]), "cs": cs_vals[i],
                         **pair_cell(result, sl, sh, tl, th)})
        shape = list(np.asarray(result["out_share"]).shape)
        return {"model": ref.id, "pairing": pairing, "prompts": prompts, "rank_on": rank_on,
                "k": k, "shape": shape, "layer_indices": list(info.layer_indices),
                "source_labels": grid_axis_labels(info, "O", shape[1]),
                "target_labels": grid_axis_labels(info, pairing[1], shape[3]),
                **{name: jsonable(result[name]) for name in (
                    "out_share", "in_share", "valid", "out_share_baseline", "in_share_baseline",
                    "source_variance", "input_variance", "target_input_variance")},
                "n_positions": result["n_positions"], "n_prompts": result["n_prompts"],
                "method": result["method"], "top": rows}
