"""Glue between core's torch results and what the store and JSON answers hold.

- PairScores <-> a plain dict of numpy arrays (what the diskcache store pickles, device-free);
- any result -> JSON-safe data (tensors/arrays to lists, NaN/inf to None);
- head names "L{block}H{head}" / "L{block}KV{group}" <-> (layer position, head index) per role.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from headgraph.core.names import HeadRef, head_label
from headgraph.core.types import ModelInfo, PairScores
from headgraph.server.errors import NotFound


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """CPU numpy copy of a tensor (bfloat16/float16 widened to float32)."""
    t = t.detach()
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.float()
    return t.to("cpu").numpy().copy()


def pair_scores_payload(ps: PairScores) -> dict[str, Any]:
    """PairScores as a dict of numpy arrays and plain values (picklable, device-free)."""
    return {
        "kind": ps.kind, "pairing": ps.pairing, "source_role": ps.source_role,
        "target_role": ps.target_role, "scores": to_numpy(ps.scores),
        "normalized": to_numpy(ps.normalized), "valid": to_numpy(ps.valid).astype(bool),
        "layer_indices": list(ps.layer_indices), "order": ps.order,
        "source_ranks": to_numpy(ps.source_ranks), "target_ranks": to_numpy(ps.target_ranks),
        "source_rank": int(ps.source_rank), "target_rank": int(ps.target_rank),
    }


def pair_scores_from_payload(d: dict[str, Any]) -> PairScores:
    """Inverse of :func:`pair_scores_payload` (CPU tensors)."""
    return PairScores(
        kind=d["kind"], pairing=d["pairing"], source_role=d["source_role"],
        target_role=d["target_role"], scores=torch.from_numpy(d["scores"]),
        normalized=torch.from_numpy(d["normalized"]), valid=torch.from_numpy(d["valid"]),
        layer_indices=tuple(d["layer_indices"]), order=d["order"],
        source_ranks=torch.from_numpy(d["source_ranks"]),
        target_ranks=torch.from_numpy(d["target_ranks"]),
        source_rank=d["source_rank"], target_rank=d["target_rank"],
    )


def jsonable(obj: Any) -> Any:
    """Recursively turn tensors, arrays, tuples and numpy scalars into JSON data; NaN/inf -> None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if obj is None or isinstance(obj, (str, bool, int)):
        return obj
    if isinstance(obj, torch.Tensor):
        return jsonable(to_numpy(obj))
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind == "f":
            values = obj.astype(np.float64).tolist()
            return values if np.isfinite(obj).all() else _nan_to_none(values)
        return obj.tolist()
    if isinstance(obj, np.generic):
        return jsonable(obj.item())
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in obj]
    if hasattr(obj, "to_dict"):
        return jsonable(obj.to_dict())
    return str(obj)


def _nan_to_none(x: Any) -> Any:
    if isinstance(x, list):
        return [_nan_to_none(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


# -- head names ----------------------------------------------------------------------------

def role_is_grouped(info: ModelInfo, role: str) -> bool:
    """True when the role's axis holds shared KV heads (GQA) rather than query heads."""
    return role in ("K", "V") and info.n_kv_heads < info.n_heads


def axis_labels(info: ModelInfo, role: str) -> list[str]:
    """Names of one role axis, flattened [layer, head]: "L3H5", or "L3KV1" for GQA K/V."""
    grouped = role_is_grouped(info, role)
    n = info.heads_of(role)
    return [head_label(layer, h, kv=grouped) for layer in info.layer_indices for h in range(n)]


def grid_axis_labels(info: ModelInfo, role: str, heads: int) -> list[str]:
    """Axis names of a grid with ``heads`` heads per layer: a grouped K/V axis of PK has one
    per KV group; a CS grid is on query heads even for K/V (its scores are per query head)."""
    names = axis_labels(info, role)
    return names if len(names) == heads * len(info.layer_indices) else axis_labels(info, "Q")


CS_PER_QUERY_HEAD = ("per target query head: a grouped-query model's K/V weights are repeated "
                     "to the query heads they serve; OK / OV views, top tables and graph edges "
                     "give a KV group the mean over its query heads (cs_of)")


def cs_grid_of(info: ModelInfo, ps: Any) -> str | None:
    """What a CS grid's target axis is, for its download / API metadata: on a grouped-query
    model (K/V modes) the grid is per target query head, not per KV group; None otherwise."""
    if ps.kind != "cs" or not role_is_grouped(info, ps.target_role):
        return None
    return CS_PER_QUERY_HEAD


def parse_node(name: str, role: str, info: ModelInfo) -> tuple[int, int]:
    """(layer position, head index on the role's axis) of a head name.

    A malformed name is InvalidInput (core's HeadRef.parse); a well-formed name the model
    does not have is NotFound.

    Accepts "L{block}H{head}" (a query head; mapped to its KV group for GQA K/V roles) and
    "L{block}KV{group}". The block must be one of the model's attention layers.
    """
    ref = HeadRef.parse(name)  # InvalidInput (422) for a malformed name
    layer, idx = ref.layer, ref.head
    if layer not in info.layer_indices:
        raise NotFound(f"unknown head {name!r}: layer {layer} is not one of the attention "
                       f"layers {list(info.layer_indices)}")
    pos = info.layer_indices.index(layer)
    if ref.kv:
        if not role_is_grouped(info, role):
            raise NotFound(f"unknown head {name!r}: role {role} has no KV groups in this model")
        if idx >= info.n_kv_heads:
            raise NotFound(f"unknown head {name!r}: KV group {idx} out of range "
                           f"(0..{info.n_kv_heads - 1})")
        return pos, idx
    if idx >= info.n_heads:
        raise NotFound(f"unknown head {name!r}: head {idx} out of range (0..{info.n_heads - 1})")
    if role_is_grouped(info, role):
        return pos, idx // (info.n_heads // info.n_kv_heads)
    return pos, idx
