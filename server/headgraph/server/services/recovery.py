"""Recovery tables as the API and the CLI answer them: a label set resolved to its heads (the
reference), then the cached (or computed) ``recovery`` of one pairing
(server/computations/recovery.py, core.stats.recovery)."""

from __future__ import annotations

from typing import Any

from headgraph.core.names import check_pairing
from headgraph.server.computations.recovery import check_k
from headgraph.server.errors import Invalid
from headgraph.server.models.offered import ModelRef
from headgraph.server.services.labels import LabelService
from headgraph.server.services.scores import ScoresService


class RecoveryService:
    """Recovery answers of one process (computed through the result cache)."""

    def __init__(self, scores: ScoresService, labels: LabelService) -> None:
        self.scores = scores
        self.labels = labels

    def answer(self, ref: ModelRef, pairing: str, labels: str, k: int) -> dict[str, Any]:
        """Every metric's recovery of the label set ``labels``'s heads on ``pairing``: an edge
        is in the reference when both its heads are labelled (any class). NotFound for an
        unknown set (listing them); Invalid for a set with no head of this model."""
        check_pairing(pairing)
        check_k(k)
        label_set = self.labels.label_set(labels, ref)
        if label_set is None:
            raise Invalid("give a label set (labels=) as the reference")
        info = self.scores.catalog.model_info(ref)
        heads = sorted(label_set.classes)
        mine = [h for h in heads if in_model(h, info)]
        if not mine:
            raise Invalid(f"label set {label_set.name!r} names no head of {ref.id} "
                          f"({len(heads)} heads, e.g. {heads[:3]})")
        result = self.scores.cache.get(ref, "recovery", pairing=pairing, heads=tuple(mine), k=k)
        return {"model": ref.id, "labels": label_set.name, **result,
                "method": ("top-k share of reference heads among each metric's top-k edges' endpoints, "
                           "precision@k (share of top-k edges with both heads in the reference) and "
                           "ROC-AUC over all valid forward pairs; 95% stratified bootstrap percentile "
                           "intervals (1000 resamples) and paired differences vs PK on the same "
                           "resamples; baselines: layer gap (nearer layers first) and seeded random")}


def in_model(head: str, info: Any) -> bool:
    """Whether a query-head name ("L9H6") is a head of the model ``info`` describes."""
    from headgraph.core.names import HeadRef

    r = HeadRef.parse(head)
    return r.layer in info.layer_indices and r.head < info.n_heads
