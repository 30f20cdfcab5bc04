"""The registered data-weighted PK computation and the views that join it with PK and CS.

``data_pk`` (core.activations.data_pk) is keyed by model, pairing (OQ / OK / OV) and prompt set ("text":
the bundled prompts, "random": repeated random tokens, as core.activations.ablation's sets). One forward
pass serves all three pairings of a prompt set: the core results are kept in the heads' own
cache (like PK's batch), so the second and third pairing cost no forward. The API / CLI
answer (both grids, the baselines, the top edges with their PK and CS) is
``services.data_pk.DataPKService``'s. ``pair_data_pk`` is what the pair answer shows, read only from
prompt sets already cached (``cached_data_pk_sets``): a pair read never computes it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from headgraph.core.errors import UnsupportedModel
from headgraph.core.names import GRAPH_PAIRINGS
from headgraph.server.errors import Invalid

if TYPE_CHECKING:  # the CLI's parser reads the constants below without importing torch
    from headgraph.server.compute.registry import Computation, Inputs
    from headgraph.server.compute.results import ResultCache
    from headgraph.server.models.offered import ModelRef

DATA_PK_PAIRINGS = GRAPH_PAIRINGS
DATA_PK_PROMPTS = ("text", "random")
DATA_PK_RANK_ON = ("out_share", "in_share")
DEFAULT_DATA_PK_TOP = 10
_PROMPTS_KEY = "default-20+rr20x20-seed0-skipfirst"  # what the prompt sets are (core defaults)


def check_data_pk_pairing(value: Any) -> str:
    if value not in DATA_PK_PAIRINGS:
        raise Invalid(f"data-weighted PK measures O->Q/K/V pairings; unknown pairing {value!r}; "
                      f"allowed: {list(DATA_PK_PAIRINGS)}", allowed=list(DATA_PK_PAIRINGS))
    return value


def check_prompts(value: Any) -> str:
    if value not in DATA_PK_PROMPTS:
        raise Invalid(f"unknown prompt set {value!r}; allowed: {list(DATA_PK_PROMPTS)}",
                      allowed=list(DATA_PK_PROMPTS))
    return value


def data_pk(src: Inputs, *, pairing: str, prompts: str) -> dict[str, Any]:
    """Data-weighted PK of one pairing on one prompt set (core.activations.data_pk.data_pk): numpy grids
    out_share / in_share [L, H, L, Ht] (NaN where not valid), valid, the variances and
    baselines, and the run's metadata."""
    from headgraph.core.activations.data_pk import data_pk as core_data_pk
    from headgraph.server.computations.convert import to_numpy

    source = src.patterns
    if source is None:
        raise UnsupportedModel(f"{src.info.name} cannot be run here (weights read without a "
                               "runnable model), so it has no data-weighted PK")
    heads = src.heads
    key = ("data_pk", prompts)
    results = heads._cache.get(key)
    if results is None:  # all three pairings from one forward pass
        results = core_data_pk(source, DATA_PK_PAIRINGS, heads=heads, prompt_set=prompts)
        heads._cache[key] = results
    r = results[pairing]
    valid = to_numpy(r.valid).astype(bool)
    out = {name: to_numpy(getattr(r, name)) for name in (
        "source_variance", "input_variance", "target_input_variance", "out_share_baseline",
        "in_share_baseline", "target_ranks")}
    for name in ("out_share", "in_share"):
        grid = to_numpy(getattr(r, name)).copy()
        grid[~valid] = float("nan")
        out[name] = grid
    return {"pairing": pairing, "prompts": prompts, "valid": valid, **out,
            "n_positions": r.n_positions, "n_prompts": r.n_prompts,
            "layer_indices": list(r.layer_indices), "method": r.to_dict()["method"]}


def held_out_data_pk(src: Inputs, pairing: str, half: str = "even") -> dict[str, Any]:
    """Data-weighted PK of ``pairing`` fit on one split half of the text prompts only (the
    ``half`` path ablation's split-half effects are not measured on): numpy grids out_share,
    in_share (NaN where not valid) and in_share_baseline [L, H, L] (tr(C_S) / tr(C_X)). One
    forward pass serves the three pairings (kept in the heads' own cache, as ``data_pk``)."""
    from headgraph.core.activations.data_pk import data_pk as core_data_pk
    from headgraph.server.computations.convert import to_numpy

    source = src.patterns
    if source is None:
        raise UnsupportedModel(f"{src.info.name} cannot be run here (weights read without a "
                               "runnable model), so it has no data-weighted PK")
    heads = src.heads
    key = ("data_pk", "text", half)
    results = heads._cache.get(key)
    if results is None:
        results = core_data_pk(source, DATA_PK_PAIRINGS, heads=heads, prompt_set="text", half=half)
        heads._cache[key] = results
    r = results[pairing]
    valid = to_numpy(r.valid).astype(bool)
    out = {"in_share_baseline": to_numpy(r.in_share_baseline)}
    for name in ("out_share", "in_share"):
        grid = to_numpy(getattr(r, name)).copy()
        grid[~valid] = float("nan")
        out[name] = grid
    return out


def data_pk_computations() -> list[Computation]:
    from headgraph.server.compute.registry import MODEL, Computation

    return [Computation("data_pk", data_pk,
                        {"pairing": check_data_pk_pairing, "prompts": check_prompts},
                        key=lambda p: {**p, "sets": _PROMPTS_KEY}, reads=MODEL)]


def pair_cell(result: dict[str, Any], sl: int, sh: int, tl: int, th: int) -> dict[str, Any]:
    """One pair's data-weighted values (None where the pair is not valid)."""
    from headgraph.server.computations.convert import jsonable

    ok = bool(result["valid"][sl, sh, tl, th])
    return {"out_share": jsonable(float(result["out_share"][sl, sh, tl, th])) if ok else None,
            "in_share": jsonable(float(result["in_share"][sl, sh, tl, th])) if ok else None,
            "out_share_baseline": jsonable(float(result["out_share_baseline"][tl, th])),
            "in_share_baseline": jsonable(float(result["in_share_baseline"][sl, sh, tl]))
            if ok else None}


def cached_data_pk_sets(cache: ResultCache, ref: ModelRef, pairing: str) -> tuple[str, ...]:
    """Prompt sets whose data-weighted PK of ``pairing`` is cached; () for other pairings or
    while the model's identity is not known (never loads a model: cheap enough for the
    event loop, as the graph's flag check)."""
    if pairing not in DATA_PK_PAIRINGS or cache.catalog.known_identity(ref) is None:
        return ()
    return tuple(p for p in DATA_PK_PROMPTS
                 if cache.has(ref, "data_pk", pairing=pairing, prompts=p))


def data_pk_failures(cache: ResultCache, ref: ModelRef, pairing: str) -> dict[str, str]:
    """``{prompt set: why it cannot be computed}`` for the sets whose data-weighted PK of
    ``pairing`` failed for the model's own reasons (a post-attention norm, no runnable
    model), as remembered by the cache; never loads a model. One forward pass serves the
    three pairings of a set, so a failure remembered for any of them counts."""
    if pairing not in DATA_PK_PAIRINGS:
        return {}
    out: dict[str, str] = {}
    for p in DATA_PK_PROMPTS:
        for each in (pairing, *(q for q in DATA_PK_PAIRINGS if q != pairing)):
            failed = cache.failure(ref, "data_pk", pairing=each, prompts=p)
            if failed is not None:
                out[p] = failed["message"]
                break
    return out


def pair_data_pk(cache: ResultCache, ref: ModelRef, pairing: str, sl: int, sh: int, tl: int,
                 th: int, sets: tuple[str, ...]) -> dict[str, Any] | None:
    """``{prompt set: {out_share, in_share, out_share_baseline, in_share_baseline}}`` of one
    pair for the cached ``sets`` (cached_data_pk_sets); None when there are none."""
    if not sets or pairing not in DATA_PK_PAIRINGS:
        return None
    return {p: pair_cell(cache.get(ref, "data_pk", pairing=pairing, prompts=p), sl, sh, tl, th)
            for p in sets}
