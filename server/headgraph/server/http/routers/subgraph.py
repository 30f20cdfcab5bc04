"""Bounded subgraph queries: edges among a head set, a head's neighbourhood, a layer range's
top edges; every answer at most ``cap`` edges, saying how many it left out."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Query, Request

from headgraph.core.graphs.subgraph import DEFAULT_CAP
from headgraph.core.names import HEAD_INPUT_PATTERN, parse_pairings
from headgraph.server.errors import Invalid
from headgraph.server.http.deps import ModelDep, SubgraphsDep
from headgraph.server.http.params import ERRORS, pairings_query
from headgraph.server.http.responses import warm_json
from headgraph.server.http.schemas.subgraph import SubgraphOut
from headgraph.server.limits import GRAPH_K_MAX, SUBGRAPH_CAP_MAX, SUBGRAPH_DEPTH_MAX, SUBGRAPH_HEADS_MAX

router = APIRouter(prefix="/api", tags=["graph"])
RankOn = Literal["pk", "normalized", "cs", "z"]
HEADS_PATTERN = r"^[\sLlHhKkVv0-9,]*$"
LAYERS_PATTERN = r"^\d{1,4}(-\d{1,4})?$"
# The three selections, exactly one a query: each is a query parameter of its own, documented
# together as one exploded form object (OpenAPI cannot tie independent parameters together).
SELECTIONS: dict[str, dict[str, Any]] = {
    "heads": {"min_length": 1, "max_length": SUBGRAPH_HEADS_MAX * 10, "pattern": HEADS_PATTERN,
              "description": "edges among these heads (comma list, e.g. L0H1,L1H3,L6KV1)"},
    "head": {"min_length": 1, "max_length": 32, "pattern": HEAD_INPUT_PATTERN,
             "description": "a head's neighbourhood (L1H3; L6KV1 a KV group), with depth= and k="},
    "layers": {"min_length": 1, "max_length": 9, "pattern": LAYERS_PATTERN,
               "description": "blocks a-b (both included): the top-k edges per pairing inside"},
}
SELECTION_PARAMETER = {
    "name": "selection", "in": "query", "required": True, "style": "form", "explode": True,
    "description": "exactly one of heads=, head= or layers= (each a query parameter: heads=L0H1,"
                   "L1H3, not selection=...); none or more than one is a 422",
    "schema": {"type": "object", "additionalProperties": False, "minProperties": 1,
               "maxProperties": 1,
               "properties": {name: {"type": "string", "minLength": c["min_length"],
                                     "maxLength": c["max_length"], "pattern": c["pattern"],
                                     "description": c["description"]}
                              for name, c in SELECTIONS.items()}},
}


def selection_query(name: str) -> Any:
    """One of SELECTIONS as a query parameter, validated, left out of OpenAPI (which shows the
    three as SELECTION_PARAMETER)."""
    return Query(None, include_in_schema=False, **SELECTIONS[name])


@router.get("/subgraph", response_model=SubgraphOut, responses=ERRORS,
            openapi_extra={"parameters": [SELECTION_PARAMETER]},
            summary="A bounded subgraph: edges among heads, a neighbourhood, or a layer range's top edges")
async def subgraph(request: Request, *, ref: ModelDep, subgraphs: SubgraphsDep,
                   pairings: str = pairings_query(), rank_on: RankOn = "pk",
                   heads: str | None = selection_query("heads"),
                   head: str | None = selection_query("head"),
                   depth: int = Query(1, ge=1, le=SUBGRAPH_DEPTH_MAX, description="steps from head="),
                   k: int | None = Query(None, ge=1, le=GRAPH_K_MAX, description=(
                       "head=: strongest incident edges per reached node (default 5); layers=: best "
                       "edges per pairing (default 20)")),
                   layers: str | None = selection_query("layers"),
                   cap: int = Query(DEFAULT_CAP, ge=1, le=SUBGRAPH_CAP_MAX, description="the most edges answered")
                   ) -> Any:
    given = [name for name, v in (("heads", heads), ("head", head), ("layers", layers))
             if v is not None]
    if len(given) != 1:
        raise Invalid("give exactly one of heads= (a head set), head= (a neighbourhood, with depth= "
                      f"and k=) or layers= (a layer range, with k=); got {', '.join(given) or 'none'}")
    names: list[str] = list(parse_pairings(pairings))
    return await warm_json(request, SubgraphOut, ref, lambda: subgraphs.subgraph(
        ref, pairings=names, rank_on=rank_on, heads=heads, head=head, depth=depth, k=k,
        layers=layers, cap=cap))
