"""Validation as the API and the CLI answer it: the cached (or computed) validation of one
pairing, or, read-only, "not computed" (what the dashboard shows before anyone asks)."""

from __future__ import annotations

from typing import Any

from headgraph.server.cache.cold_miss import CACHE_ONLY, ColdMiss
from headgraph.server.computations.ablation import check_ablation_pairing
from headgraph.server.computations.validation import POWER_RHO, RULE, bounded, check_seed
from headgraph.server.limits import VALIDATION_SAMPLE_MAX, VALIDATION_TOP_MAX
from headgraph.server.models.offered import ModelRef
from headgraph.server.services.scores import ScoresService


class ValidationService:
    """Validation answers of one process (computed through the result cache, or read)."""

    def __init__(self, scores: ScoresService) -> None:
        self.scores = scores

    def answer(self, ref: ModelRef, pairing: str, n: int, k: int, seed: int,
               cached: bool = False) -> dict[str, Any]:
        """The API / CLI answer: the cached (or computed) validation of one pairing.

        ``cached``: only read (cache_only.CACHE_ONLY): a validation not cached, or a model whose
        identity is not known yet, answers ``computed: false`` with no summary and the power of
        the requested sample (how many pairs the model has is not known before it is loaded);
        nothing is ever computed or loaded (what the dashboard shows before anyone asks)."""
        check_ablation_pairing(pairing)
        for name, value, hi in (("n", n, VALIDATION_SAMPLE_MAX), ("k", k, VALIDATION_TOP_MAX)):
            bounded(name, hi)(value)
        check_seed(seed)
        if not cached:
            result = self.scores.cache.get(ref, "validation", pairing=pairing, n=n, k=k, seed=seed)
            return {"model": ref.id, **result, "computed": True, "cached_only": False}
        token = CACHE_ONLY.set(True)
        try:
            result = self.scores.cache.get(ref, "validation", pairing=pairing, n=n, k=k, seed=seed)
        except ColdMiss:
            from headgraph.core.activations.validation import sample_power

            return {"model": ref.id, "pairing": pairing, "n_sample": n, "k": k, "seed": seed, "metrics": [],
                    "baselines": [], "summary": {}, "paired": {}, "rule": RULE, "precision": [], "held_out": None,
                    "power": sample_power(n, n, None, rho=POWER_RHO).to_dict(), "edges": [],
                    "method": "not computed", "computed": False, "cached_only": True}
        finally:
            CACHE_ONLY.reset(token)
        return {"model": ref.id, **result, "computed": True, "cached_only": True}
