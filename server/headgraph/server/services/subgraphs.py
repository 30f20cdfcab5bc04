"""The subgraph service: bounded subgraph queries (core.graphs.subgraph) on a model's cached
forward PK, CS and z-scores.

Nothing here is a registered computation of its own: a query reads the model's cached scores
(the compute job's PK, CS, z) and runs a flat, cheap selection over them, so a cold model's
query is cold only through those scores (a ColdMiss in cache-only mode, which the router's
``cached_first`` turns into a 401 for an anonymous caller in lab mode, never a load on the
event loop).
"""

from __future__ import annotations

from typing import Any

import torch

from headgraph.core.errors import InvalidInput
from headgraph.core.graphs.subgraph import (
    DEFAULT_CAP,
    EdgeTable,
    edge_table,
    edges_among,
    layer_range,
    neighbourhood,
)
from headgraph.core.names import HeadRef, check_pairing, cs_mode_of
from headgraph.server.models.catalog import ModelCatalog
from headgraph.server.models.offered import ModelRef
from headgraph.server.services.scores import ScoresService


def parse_heads(text: str) -> list[str]:
    """``"l0h1, L1KV0"`` -> ``["L0H1", "L1KV0"]`` (canonical names, order kept, de-duplicated)."""
    names = [HeadRef.parse(t).label for t in (text or "").split(",") if t.strip()]
    if not names:
        raise InvalidInput("heads= names no head (e.g. heads=L0H1,L1H3)")
    return list(dict.fromkeys(names))


def parse_layer_range(text: str) -> tuple[int, int]:
    """``"3-7"`` -> (3, 7) (blocks, both ends included; ``"5"``: one block)."""
    parts = (text or "").replace(" ", "").split("-")
    if not 1 <= len(parts) <= 2 or not all(p.isdigit() for p in parts):
        raise InvalidInput(f"layers must look like 3-7 (blocks, both included), got {text!r}")
    lo, hi = int(parts[0]), int(parts[-1])
    return min(lo, hi), max(lo, hi)


class SubgraphService:
    """Subgraph queries over the cached scores of one model."""

    def __init__(self, scores: ScoresService, catalog: ModelCatalog) -> None:
        self.scores = scores
        self.catalog = catalog

    def table(self, ref: ModelRef, pairings: list[str], rank_on: str) -> EdgeTable:
        """The flat best-first edge table of ``pairings`` (forward order) ranked by ``rank_on``;
        reads CS for the O -> Q/K/V pairings and z only when ranking by z."""
        names = [check_pairing(p) for p in dict.fromkeys(pairings)]
        if rank_on == "cs" and any(cs_mode_of(p) is None for p in names):
            bad = [p for p in names if cs_mode_of(p) is None]
            raise InvalidInput(f"{', '.join(bad)} has no Composition Score (only O -> Q/K/V): rank by pk")
        info = self.catalog.model_info(ref)
        results = {p: self.scores.pk(ref, p) for p in names}
        cs = {m: self.scores.cs(ref, m) for m in self.scores.cs_modes_for(names)}
        z = ({p: torch.from_numpy(self.scores.zscores(ref, p)) for p in names}
             if rank_on == "z" else None)
        return edge_table(results, rank_on=rank_on, cs=cs or None, z=z, info=info)

    def subgraph(self, ref: ModelRef, *, pairings: list[str], rank_on: str = "pk",
                 heads: str | None = None, head: str | None = None, depth: int = 1,
                 k: int | None = None, layers: str | None = None, cap: int = DEFAULT_CAP
                 ) -> dict[str, Any]:
        """Exactly one query: ``heads`` (edges among a comma list of heads), ``head`` (its
        neighbourhood: ``k`` strongest incident edges per node, default 5, to ``depth``) or
        ``layers`` ("a-b": the ``k`` best edges per pairing inside, default 20); at most
        ``cap`` edges, JSON (core.graphs.subgraph.Subgraph.to_dict plus the model id)."""
        given = [name for name, v in (("heads", heads), ("head", head), ("layers", layers)) if v]
        if len(given) != 1:
            raise InvalidInput("give exactly one of heads= (a head set), head= (a neighbourhood, "
                               f"with depth= and k=) or layers= (a layer range, with k=); got {given or 'none'}")
        # parse before reading any score: a malformed query is a 422 even for a cold model
        names = parse_heads(heads) if heads else None
        centre = HeadRef.parse(head).label if head else None
        span = parse_layer_range(layers) if layers else None
        table = self.table(ref, pairings, rank_on)
        if names is not None:
            sub = edges_among(table, names, cap=cap)
        elif centre is not None:
            sub = neighbourhood(table, centre, depth=depth, k=5 if k is None else k, cap=cap)
        else:
            assert span is not None
            sub = layer_range(table, *span, k=20 if k is None else k, cap=cap)
        return {"model": ref.id, **sub.to_dict()}
