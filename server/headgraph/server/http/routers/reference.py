"""Reference distributions: KL grid between pairings, Haar moments, anisotropic, Haar and
random-initialization nulls."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from headgraph.core.names import GRAPH_PAIRINGS
from headgraph.server.http.deps import ModelDep, ScoresDep
from headgraph.server.http.params import ERRORS
from headgraph.server.http.responses import warm_json
from headgraph.server.http.schemas.reference import ReferenceOut

router = APIRouter(prefix="/api", tags=["reference"])


@router.get("/reference", response_model=ReferenceOut, responses=ERRORS,
            summary="KL grid and histograms of PK per pairing, Haar moments, anisotropic, Haar "
                    "and random-initialization nulls")
async def reference(request: Request, *, ref: ModelDep,
                    scores: ScoresDep) -> Any:
    def run() -> dict[str, Any]:
        out = dict(scores.reference(ref))
        nulls = {}
        for pairing in GRAPH_PAIRINGS:
            null = scores.null(ref, pairing)
            nulls[pairing] = {"alpha": null["alpha"], "samples": null["samples"],
                              "significant": int(null["significant"].sum()),
                              "significant_haar": int(null["significant_haar"].sum()),
                              "summary": null["summary"], "summary_haar": null["summary_haar"],
                              "summary_random_init": null["summary_random_init"],
                              "above_random_init_q95": null["above_random_init_q95"],
                              "valid_pairs": null["valid_pairs"]}
        out["nulls"] = nulls
        return {"model": ref.id, **out}

    return await warm_json(request, ReferenceOut, ref, run)
