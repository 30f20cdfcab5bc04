"""The scores service: PK, CS, z-scores, nulls, reference, tokens and patterns of a model.

Each method names a registered computation and its parameters and reads it through the
result cache (server/compute/results.py); the computations themselves are in
server/computations/scores.py. Only request-level shaping (token-table slices, "no patterns
here" as a 404) lives here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from headgraph.core.errors import UnsupportedModel
from headgraph.core.names import SIMILARITY_KINDS, check_pairing, check_role, cs_mode_of
from headgraph.core.types import PairScores
from headgraph.server.computations.data_pk import DATA_PK_PAIRINGS
from headgraph.server.computations.graphs import cs_modes_for
from headgraph.server.computations.scores import KL_SAMPLES, NULL_SAMPLES, TOKENS_CACHED_K
from headgraph.server.compute.results import ResultCache
from headgraph.server.errors import NotFound
from headgraph.server.models.catalog import ModelCatalog
from headgraph.server.models.offered import ModelRef


class ScoresService:
    """The cached score, null, reference, token and pattern computations of a model."""

    def __init__(self, catalog: ModelCatalog, cache: ResultCache) -> None:
        self.catalog = catalog
        self.cache = cache

    # -- scores -------------------------------------------------------------------------
    def pk(self, ref: ModelRef, pairing: str, order: str = "forward") -> PairScores:
        """Projection Kernel of one pairing (core.scores.pk.projection_kernel), cached."""
        return self.cache.get(ref, "pk", pairing=pairing, order=order)

    def pk_together(self, ref: ModelRef, pairings: list[str], order: str = "forward") -> None:
        """Cache the PK of several pairings, the cold ones in one pass."""
        self.cache.warm(ref, "pk", [{"pairing": p, "order": order} for p in pairings])

    def cs(self, ref: ModelRef, mode: str, order: str = "forward") -> PairScores:
        """Composition Score of one mode (core.scores.composition_score.composition_score), cached."""
        return self.cache.get(ref, "cs", mode=mode, order=order)

    def cs_for(self, ref: ModelRef, pairing: str, order: str = "forward") -> PairScores | None:
        mode = cs_mode_of(check_pairing(pairing))
        return None if mode is None else self.cs(ref, mode, order)

    @staticmethod
    def cs_modes_for(pairings: list[str]) -> list[str]:
        return cs_modes_for(pairings)

    def similarity(self, ref: ModelRef, kind: str, pairing: str, order: str = "forward"
                   ) -> PairScores:
        """Linear CKA (``kind="cka"``) or orthogonal Procrustes similarity of one pairing
        (core.scores.similarity; K / V axes keep native KV heads, as PK), cached: the
        ``similarity`` computation the recovery tables read."""
        return self.cache.get(ref, "similarity", kind=kind, pairing=pairing, order=order)

    def cached_similarity_kinds(self, ref: ModelRef, pairing: str, order: str = "forward"
                                ) -> tuple[str, ...]:
        """The similarity kinds whose grid of ``pairing`` is cached; () while the model's
        identity is not known. Never computes or loads a model: what a pair panel or a
        ranking of another metric shows beside PK (each grid costs about as much as PK's)."""
        if self.catalog.known_identity(ref) is None:
            return ()
        return tuple(kind for kind in SIMILARITY_KINDS
                     if self.cache.has(ref, "similarity", kind=kind, pairing=pairing, order=order))

    def zscores(self, ref: ModelRef, pairing: str, order: str = "forward") -> np.ndarray:
        """z-scores of raw PK against its Haar moments; NaN where invalid."""
        return self.cache.get(ref, "z", pairing=pairing, order=order)

    def null(self, ref: ModelRef, pairing: str) -> dict[str, Any]:
        """p-values and BH-significant masks of forward PKs against both nulls."""
        return self.cache.get(ref, "null", pairing=pairing, samples=NULL_SAMPLES)

    def null_together(self, ref: ModelRef, pairings: list[str]) -> None:
        """Cache the nulls of several pairings, the cold ones in one pass (shared factors)."""
        self.cache.warm(ref, "null", [{"pairing": p, "samples": NULL_SAMPLES} for p in pairings])

    def reference(self, ref: ModelRef) -> dict[str, Any]:
        """KL grid between role-pairing PK distributions and Haar moments (JSON data)."""
        return self.cache.get(ref, "reference", samples=KL_SAMPLES)

    # -- tokens and patterns ------------------------------------------------------------
    def tokens(self, ref: ModelRef, role: str) -> dict[str, Any]:
        """Top-50 token table of one role for every head (core.readout.tokens.top_tokens)."""
        return self.cache.get(ref, "tokens", role=role, k=TOKENS_CACHED_K)

    def tokens_view(self, ref: ModelRef, role: str, k: int, layer: int | None = None,
                    head: int | None = None, anisotropic: bool = False) -> dict[str, Any]:
        """Token table cut to k tokens and optionally one layer (block number) and head;
        ``anisotropic``: also each list against the unembedding-shaped baseline
        (``anisotropic_tokens``)."""
        check_role(role)
        info = self.catalog.model_info(ref)
        if info.d_vocab is None:
            raise UnsupportedModel(f"{info.name} has no unembedding (W_U): token names need one")
        if layer is not None and layer not in info.layer_indices:
            raise NotFound(f"unknown layer {layer}; attention layers: {list(info.layer_indices)}")
        n = info.heads_of(role)
        if head is not None and not 0 <= head < n:
            raise NotFound(f"unknown head {head} for role {role}; allowed 0..{n - 1}")
        from headgraph.core.readout.tokens import slice_token_payload

        table = self.tokens(ref, role)
        rows = [h for h in table["heads"]
                if (layer is None or h["layer"] == layer) and (head is None or h["head"] == head)]
        cut = slice_token_payload(dict(table, heads=rows), k)  # flags recomputed for depth k
        out = {"model": ref.id, "role": role, "k": cut["k"],
               "formula": table.get("formula", ""), "baseline": cut.get("baseline"),
               "n_above_baseline": cut.get("n_above_baseline"), "heads": cut["heads"]}
        if anisotropic:
            out["anisotropic"] = self.anisotropic_tokens(ref, cut["heads"], int(cut["k"]))
        return out

    def anisotropic_tokens(self, ref: ModelRef, heads: list[dict[str, Any]], k: int) -> dict[str, Any]:
        """The lists ``heads`` (cut to k) against the unembedding-shaped baseline of their rank
        (``token_null``): per head whether its mean top-k score is above the baseline's 0.95
        point, how many are, the chance level 0.05 a random plane passes at, and a one-sided
        binomial test (scipy) of that count against chance."""
        from scipy.stats import binomtest

        from headgraph.core.readout.tokens import BASELINE_QUANTILE, UNEMBEDDING_SAMPLES

        nulls: dict[int, dict[str, Any]] = {}
        above: dict[str, bool] = {}
        for h in heads:
            rank = int(h.get("rank") or 0)
            if rank < 1 or not h["tokens"]:
                above[h["name"]] = False
                continue
            if rank not in nulls:
                nulls[rank] = self.cache.get(ref, "token_null", rank=rank, k=k)
            depth = min(len(h["tokens"]), int(nulls[rank]["k"]))
            mean = sum(t["score"] for t in h["tokens"][:depth]) / depth
            above[h["name"]] = bool(mean > nulls[rank]["mean_topk_threshold"][depth - 1])
        n, hits = len(above), sum(above.values())
        chance = 1.0 - BASELINE_QUANTILE
        p = float(binomtest(hits, n, chance, alternative="greater").pvalue) if n else None
        return {"method": "unembedding", "samples": UNEMBEDDING_SAMPLES, "quantile": BASELINE_QUANTILE,
                "chance": chance, "n_above": hits, "n_heads": n, "p_value": p, "above": above,
                "thresholds": {str(r): b["mean_topk_threshold"][k - 1] if len(b["mean_topk_threshold"]) >= k
                               else b["mean_topk_threshold"][-1] for r, b in nulls.items()},
                "rule": ("a list counts when its mean top-k score exceeds the 0.95 point of "
                         f"{UNEMBEDDING_SAMPLES} random planes of its rank spanned by Gaussian columns "
                         "with the centred unembedding's covariance; a random plane passes with "
                         "probability 0.05 (the chance level); the count is tested against that chance "
                         "level with a one-sided binomial test")}

    def patterns(self, ref: ModelRef) -> dict[str, Any]:
        """Attention-pattern scores per head (core.activations.patterns.pattern_scores), JSON
        data; UnsupportedModel (a 422 saying why) when the model cannot be run here."""
        out = self.cache.get(ref, "patterns")
        return {k: v for k, v in out.items() if k != "available"}

    def patterns_or_none(self, ref: ModelRef) -> dict[str, Any] | None:
        """The pattern scores, or None for a model that cannot be run here."""
        try:
            return self.patterns(ref)
        except UnsupportedModel:
            return None

    def data_pk_all(self, ref: ModelRef, prompts: str) -> bool:
        """Cache the data-weighted PK of every O -> Q/K/V pairing on ``prompts`` (one forward
        pass serves the three), for the background job; False, computing nothing, for a model
        that cannot run here (no attention-pattern scores either)."""
        if self.patterns_or_none(ref) is None:
            return False
        for pairing in DATA_PK_PAIRINGS:
            self.cache.get(ref, "data_pk", pairing=pairing, prompts=prompts)
        return True
