"""Cached core computations per model: PK, CS, z-scores, nulls, reference, tokens, patterns.

Each method picks its parameters, then reads one store key through ``ModelCache.cached``; a
cold key is computed once by calling core and kept as device-free data (numpy arrays, JSON
dicts). Nothing here re-implements core math: it only chooses parameters, caches and
reshapes. Method names double as compute-process entry points (``cached``'s ``remote``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from headgraph.core.errors import UnsupportedModel
from headgraph.core.types import CS_MODES, PairScores
from headgraph.server.convert import (jsonable, pair_scores_from_payload, pair_scores_payload,
                                      to_numpy)
from headgraph.server.errors import NotFound
from headgraph.server.modelcache import ModelCache
from headgraph.server.params import check_mode, check_order, check_pairing, check_role, cs_mode_of
from headgraph.server.registry import ModelRef

TOKENS_CACHED_K = 50  # token tables are computed once at this depth and sliced per request
NULL_SAMPLES = 2000
KL_SAMPLES = 20000
FDR_ALPHA = 0.05


class Results(ModelCache):
    """The cached score, null, reference, token and pattern computations of a model."""

    # -- scores -------------------------------------------------------------------------
    def pk(self, ref: ModelRef, pairing: str, order: str = "forward") -> PairScores:
        """Projection Kernel of one pairing (core.pk.projection_kernel), cached."""
        check_pairing(pairing)
        check_order(order)

        def compute() -> dict[str, Any]:
            from headgraph.core.pk import projection_kernel

            return pair_scores_payload(projection_kernel(self.heads(ref), pairing, order=order))

        return pair_scores_from_payload(self.cached(ref, "pk", {"pairing": pairing, "order": order},
                                                    compute, ("pk", (ref, pairing, order))))

    def pk_together(self, ref: ModelRef, pairings: list[str], order: str = "forward") -> None:
        """Cache the PK of several pairings, the cold ones in one pass (core.pk.all_pairings
        builds each role's bases and projector pieces once instead of once per pairing)."""
        for p in pairings:
            check_pairing(p)
        check_order(order)
        cold = [p for p in dict.fromkeys(pairings)
                if not self.store.has(self.key(ref, "pk", pairing=p, order=order))]
        if not cold:
            return
        if self.pool is not None:  # the compute process runs this method inline, keeping every key
            self.pool.run("pk_together", ref, cold, order)
            return
        from headgraph.core.pk import all_pairings

        all_pairings(self.heads(ref), pairings=cold, order=order)  # kept in the heads' own cache
        for p in cold:
            self.pk(ref, p, order)  # payload of each from that cache, stored under its own key

    def cs(self, ref: ModelRef, mode: str, order: str = "forward") -> PairScores:
        """Composition Score of one mode (core.composition.composition_score), cached."""
        check_mode(mode)
        check_order(order)

        def compute() -> dict[str, Any]:
            from headgraph.core.composition import composition_score

            return pair_scores_payload(composition_score(self.heads(ref), mode, order=order))

        return pair_scores_from_payload(self.cached(ref, "cs", {"mode": mode, "order": order},
                                                    compute, ("cs", (ref, mode, order))))

    def cs_for(self, ref: ModelRef, pairing: str, order: str = "forward") -> PairScores | None:
        mode = cs_mode_of(pairing)
        return None if mode is None else self.cs(ref, mode, order)

    @staticmethod
    def cs_modes_for(pairings: list[str]) -> list[str]:
        modes = {cs_mode_of(p) for p in pairings}
        return [m for m in CS_MODES if m in modes]

    def zscores(self, ref: ModelRef, pairing: str, order: str = "forward") -> np.ndarray:
        """z-scores of raw PK against its Haar (uniform random subspace) moments; NaN invalid."""
        ps = self.pk(ref, pairing, order)
        d_model = self.model_info(ref).d_model

        def compute() -> np.ndarray:
            from headgraph.core.reference import zscores

            z = zscores(ps, d_model)
            z = torch.where(ps.valid, z.to(ps.valid.device), torch.nan)
            return to_numpy(z)

        return self.cached(ref, "z", {"pairing": pairing, "order": order}, compute,
                           ("zscores", (ref, pairing, order)))

    def null(self, ref: ModelRef, pairing: str) -> dict[str, Any]:
        """Per-pair p-values of forward PKs against the anisotropic and the Haar nulls.

        Returns numpy grids "p" / "p_haar" (NaN where invalid), BH-significant masks at
        FDR_ALPHA ("significant" / "significant_haar") and JSON summaries of both nulls.
        """
        check_pairing(pairing)
        ps = self.pk(ref, pairing, "forward")

        def compute() -> dict[str, Any]:
            from headgraph.core.nulls import (anisotropic_null, benjamini_hochberg, haar_null,
                                              pair_pvalues)

            heads = self.heads(ref)
            aniso = anisotropic_null(heads, pairing, samples=NULL_SAMPLES, seed=0)
            haar = haar_null(heads.info.d_model, aniso.source_rank, aniso.target_rank,
                             samples=NULL_SAMPLES, seed=0, pairing=pairing)
            out: dict[str, Any] = {"alpha": FDR_ALPHA, "samples": NULL_SAMPLES}
            for suffix, null in (("", aniso), ("_haar", haar)):
                p = pair_pvalues(ps, null)
                sig = benjamini_hochberg(p, ps.valid, FDR_ALPHA)
                out["p" + suffix] = to_numpy(torch.where(ps.valid, p, torch.nan))
                out["significant" + suffix] = to_numpy(sig & ps.valid).astype(bool)
                out["summary" + suffix] = jsonable(null.to_dict())
            return out

        return self.cached(ref, "null", {"pairing": pairing, "samples": NULL_SAMPLES}, compute,
                           ("null", (ref, pairing)))

    def reference(self, ref: ModelRef) -> dict[str, Any]:
        """KL grid between role-pairing PK distributions and Haar moments (JSON data)."""

        def compute() -> dict[str, Any]:
            from headgraph.core.reference import haar_moments, kl_grid

            heads = self.heads(ref)
            info = heads.info
            grid = kl_grid(heads, samples=KL_SAMPLES, seed=0)
            m = haar_moments(info.d_model, grid.rank, grid.rank)
            moments = {"d": info.d_model, "m": grid.rank, "n": grid.rank, "mean": m.mean,
                       "variance": m.variance, "std": m.std}
            return {"kl": jsonable(grid.to_dict()), "haar_moments": jsonable(moments),
                    "d_model": info.d_model, "d_head": info.d_head, "samples": KL_SAMPLES}

        return self.cached(ref, "reference", {"samples": KL_SAMPLES}, compute, ("reference", (ref,)))

    # -- tokens and patterns ------------------------------------------------------------
    def tokens(self, ref: ModelRef, role: str) -> dict[str, Any]:
        """Top-50 token table of one role for every head (core.tokens.top_tokens)."""
        check_role(role)

        def compute() -> dict[str, Any]:
            from headgraph.core.tokens import top_tokens

            return jsonable(top_tokens(self.heads(ref), role, k=TOKENS_CACHED_K).to_dict())

        return self.cached(ref, "tokens", {"role": role, "k": TOKENS_CACHED_K}, compute,
                           ("tokens", (ref, role)))

    def tokens_view(self, ref: ModelRef, role: str, k: int, layer: int | None = None,
                    head: int | None = None) -> dict[str, Any]:
        """Token table cut to k tokens and optionally one layer (block number) and head."""
        info = self.model_info(ref)
        check_role(role)
        if info.d_vocab is None:
            raise UnsupportedModel(f"{info.name} has no unembedding (W_U): token names need one")
        if layer is not None and layer not in info.layer_indices:
            raise NotFound(f"unknown layer {layer}; attention layers: {list(info.layer_indices)}")
        n = info.heads_of(role)
        if head is not None and not 0 <= head < n:
            raise NotFound(f"unknown head {head} for role {role}; allowed 0..{n - 1}")
        table = self.tokens(ref, role)
        rows = [dict(h, tokens=h["tokens"][:k]) for h in table["heads"]
                if (layer is None or h["layer"] == layer) and (head is None or h["head"] == head)]
        return {"model": ref.id, "role": role, "k": min(k, table["k"]),
                "formula": table.get("formula", ""), "heads": rows}

    def patterns(self, ref: ModelRef) -> dict[str, Any]:
        """Attention-pattern scores per head (core.patterns.pattern_scores), JSON data."""

        def compute() -> dict[str, Any]:
            from headgraph.core.patterns import pattern_scores

            source = self.loaded(ref).patterns
            if source is None:
                return {"available": False}
            return {"available": True, **jsonable(pattern_scores(source).to_dict())}

        out = self.cached(ref, "patterns", {}, compute, ("patterns_or_none", (ref,)))
        if not out.get("available"):
            raise NotFound(f"{ref.id} cannot be run here (weights read without a runnable "
                           "model), so it has no attention-pattern scores")
        return {k: v for k, v in out.items() if k != "available"}

    def patterns_or_none(self, ref: ModelRef) -> dict[str, Any] | None:
        try:
            return self.patterns(ref)
        except NotFound:
            return None
