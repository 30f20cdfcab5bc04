"""Registered computations of scores per model: PK, CS, z, nulls, reference, tokens, patterns,
the PK-vs-CS scatter and one pair's detail.

Each is ``fn(inputs, **params) -> payload`` calling core and returning device-free data;
nothing here re-implements core math. See server/compute/registry.py for the registry.
"""

from __future__ import annotations

from typing import Any

import torch

from headgraph.core.activations.patterns import pattern_scores
from headgraph.core.errors import UnsupportedModel
from headgraph.core.names import (
    check_mode,
    check_order,
    check_pairing,
    check_role,
    cs_mode_of,
    quantize_percent,
)
from headgraph.core.readout.tokens import top_tokens
from headgraph.core.scores.composition_score import composition_score, target_layer_cs
from headgraph.core.scores.pk import all_pairings, pair_detail, projection_kernel
from headgraph.core.scores.ranking import compare_metrics, kv_level_cs
from headgraph.core.scores.subspaces import release_bases
from headgraph.core.stats.nulls import (
    anisotropic_null,
    benjamini_hochberg,
    haar_null,
    pair_pvalues,
    random_init_null,
    release_null_factors,
)
from headgraph.core.stats.reference import haar_moments, kl_grid, pair_zscore, zscores
from headgraph.server.computations.convert import (
    axis_labels,
    jsonable,
    pair_scores_from_payload,
    pair_scores_payload,
    to_numpy,
)
from headgraph.server.compute.registry import MODEL, Computation, Inputs, positive_int
from headgraph.server.errors import Invalid

TOKENS_CACHED_K = 50  # token tables are computed once at this depth and sliced per request
NULL_SAMPLES = 2000
KL_SAMPLES = 20000
FDR_ALPHA = 0.05


def pk(src: Inputs, *, pairing: str, order: str) -> dict[str, Any]:
    """Projection Kernel of one pairing (core.scores.pk.projection_kernel)."""
    result = projection_kernel(src.heads, pairing, order=order)
    release_bases(src.heads)
    return pair_scores_payload(result)


def pk_batch(src: Inputs, params: list[dict[str, Any]]) -> None:
    """PK of several pairings in one pass per order (core.scores.pk.all_pairings builds each role's
    bases and projector pieces once); kept in the heads' own cache for ``pk`` to read."""
    orders: dict[str, list[str]] = {}
    for p in params:
        orders.setdefault(p["order"], []).append(p["pairing"])
    for order, pairings in orders.items():
        all_pairings(src.heads, pairings=pairings, order=order)
    release_bases(src.heads)  # the PK results stay; 2 GiB per role of a 7B model need not


def cs(src: Inputs, *, mode: str, order: str) -> dict[str, Any]:
    """Composition Score of one mode (core.scores.composition_score.composition_score)."""
    return pair_scores_payload(composition_score(src.heads, mode, order=order))


def z(src: Inputs, *, pairing: str, order: str) -> Any:
    """z-scores of raw PK against its Haar (uniform random subspace) moments; NaN invalid."""
    ps = src.result("pk", pairing=pairing, order=order)
    scores = zscores(ps, src.info.d_model)
    return to_numpy(torch.where(ps.valid, scores.to(ps.valid.device), torch.nan))


def null(src: Inputs, *, pairing: str, samples: int) -> dict[str, Any]:
    """Per-pair p-values of forward PKs against the anisotropic and the Haar nulls, and the
    random-initialization null beside them.

    Numpy grids "p" / "p_haar" (NaN where invalid), BH-significant masks at FDR_ALPHA
    ("significant" / "significant_haar"), JSON summaries of both nulls, and
    "summary_random_init" (core.stats.nulls.random_init_null: the same shapes at random init,
    pooled until 2000 pair samples or 4 models) with "above_random_init_q95", the valid
    forward pairs whose PK exceeds its 0.95-quantile, of "valid_pairs".
    """
    ps = src.result("pk", pairing=pairing, order="forward")
    heads = src.heads
    aniso = anisotropic_null(heads, pairing, samples=samples, seed=0)
    haar = haar_null(heads.info.d_model, aniso.source_rank, aniso.target_rank,
                     samples=samples, seed=0, pairing=pairing)
    out: dict[str, Any] = {"alpha": FDR_ALPHA, "samples": samples}
    for suffix, dist in (("", aniso), ("_haar", haar)):
        p = pair_pvalues(ps, dist)
        sig = benjamini_hochberg(p, ps.valid, FDR_ALPHA)
        out["p" + suffix] = to_numpy(torch.where(ps.valid, p, torch.nan))
        out["significant" + suffix] = to_numpy(sig & ps.valid).astype(bool)
        out["summary" + suffix] = jsonable(dist.to_dict())
    init = random_init_null(heads, pairing, order="forward")
    q95 = float(torch.quantile(init.samples, 0.95))
    out["summary_random_init"] = jsonable(init.to_dict())
    out["above_random_init_q95"] = int((ps.scores.to(torch.float64)[ps.valid] > q95).sum())
    out["valid_pairs"] = int(ps.valid.sum())
    release_null_factors(heads)
    return out


def null_batch(src: Inputs, params: list[dict[str, Any]]) -> None:
    """The anisotropic and random-initialization nulls of several pairings in one go, so the
    pairings share each role's covariance factors and the random-init models; then those are
    released (the null results stay in the heads' cache for ``null`` to read)."""
    heads = src.heads
    for p in params:
        anisotropic_null(heads, p["pairing"], samples=p["samples"], seed=0)
        random_init_null(heads, p["pairing"], order="forward")
    release_null_factors(heads)


def reference(src: Inputs, *, samples: int) -> dict[str, Any]:
    """KL grid between role-pairing PK distributions and Haar moments (JSON data)."""
    heads = src.heads
    info = heads.info
    grid = kl_grid(heads, samples=samples, seed=0)
    m = haar_moments(info.d_model, grid.rank, grid.rank)
    moments = {"d": info.d_model, "m": grid.rank, "n": grid.rank, "mean": m.mean,
               "variance": m.variance, "std": m.std}
    return {"kl": jsonable(grid.to_dict()), "haar_moments": jsonable(moments),
            "d_model": info.d_model, "d_head": info.d_head, "samples": samples}


def tokens(src: Inputs, *, role: str, k: int) -> dict[str, Any]:
    """Top-k token table of one role for every head, each list flagged against the
    random-subspace baseline of its rank (core.readout.tokens.top_tokens)."""
    table = top_tokens(src.heads, role, k=k)
    release_bases(src.heads)
    return jsonable(table.to_dict())


def token_null(src: Inputs, *, rank: int, k: int) -> dict[str, Any]:
    """The unembedding-shaped random-subspace baseline of token lists of one rank and depth
    (core.readout.tokens.token_baseline, method "unembedding", UNEMBEDDING_SAMPLES planes)."""
    from headgraph.core.readout.tokens import BASELINE_QUANTILE, UNEMBEDDING_SAMPLES, token_baseline

    W_U = src.heads.W_U
    if W_U is None:
        raise UnsupportedModel(f"{src.info.name} has no unembedding (W_U): token names need one")
    b = token_baseline(W_U, rank, k, samples=UNEMBEDDING_SAMPLES, method="unembedding")
    return {**jsonable(b.to_dict()), "samples": b.samples, "seed": b.seed, "quantile": BASELINE_QUANTILE,
            "method": "unembedding"}


def patterns(src: Inputs) -> dict[str, Any]:
    """Attention-pattern scores per head (core.activations.patterns.pattern_scores).

    UnsupportedModel when the model cannot be run here (weights read without a runnable model):
    a failure the cache remembers until a job asks again, not a stored answer, since whether a
    model runs is this server's ability (a newer one may run it), not a fact of its weights."""
    source = src.patterns
    if source is None:
        raise UnsupportedModel(f"{src.info.name} cannot be run here (weights read without a "
                               "runnable model), so it has no attention-pattern scores")
    return {"available": True, **jsonable(pattern_scores(source).to_dict())}


def scatter(src: Inputs, *, pairing: str, top_percent: float) -> dict[str, Any]:
    """PK vs CS of every valid pair with quadrants and Spearman (core.scores.ranking.compare_metrics).

    Points are on the PK grid: one per (source head, target head) PK score, so on a
    grouped-query model an OK / OV point is one (source head, target KV group) pair, its CS
    the mean over the group's query heads (``cs_of``; core.scores.ranking.kv_level_cs, inside
    compare_metrics), and rho and the quadrant counts count
    each KV score once. quadrant: 0 neither top x%, 1 PK only, 2 CS only, 3 both.
    """
    mode = cs_mode_of(pairing)
    if mode is None:
        raise Invalid(f"no Composition Score for pairing {pairing!r}; scatter needs OQ, OK or OV")
    ps = src.result("pk", pairing=pairing, order="forward")
    cs_ = src.result("cs", mode=mode, order="forward")
    cmp = compare_metrics(ps, cs_, top_percent=top_percent, on="pk")
    s_names, t_names = axis_labels(src.info, pairing[0]), axis_labels(src.info, pairing[1])
    n_src, n_tgt = len(s_names), len(t_names)
    cs_grid = cs_.scores if cmp.cs_values is None else cmp.cs_values
    valid = cmp.valid.reshape(n_src, n_tgt)
    rows, cols = torch.nonzero(valid, as_tuple=True)
    points = {"source": [s_names[i] for i in rows.tolist()],
              "target": [t_names[j] for j in cols.tolist()],
              "pk": cmp.pk_values.reshape(n_src, n_tgt)[rows, cols].tolist(),
              "cs": cs_grid.reshape(n_src, n_tgt)[rows, cols].tolist(),
              "quadrant": cmp.quadrant.reshape(n_src, n_tgt)[rows, cols].tolist()}
    kv = cmp.kv  # core.scores.ranking.kv_level_cs: the KV-level CS the pair panel and top tables show
    cs_of = "the pair's own Composition Score" if kv is None else kv.describe()
    if kv is not None and kv.grouped:
        cs_of += " (one point per KV score)"
    return {"pairing": pairing, "mode": mode, "top_percent": top_percent, "cs_of": cs_of,
            "points": jsonable(points), "comparison": jsonable(cmp.to_dict())}


def pair(src: Inputs, *, pairing: str, sl: int, sh: int, tl: int, th: int) -> dict[str, Any]:
    """PK, normalized PK and principal angles of one pair (core.scores.pk.pair_detail), with
    its z-score against the Haar moments and its Composition Score ("cs", a KV group's mean
    named in "cs_of"; None where the pairing has no CS or the cell is not valid) computed for
    this pair alone: what a pair against the layer order shows, whose all-pairs grids would
    cost twice the forward ones."""
    heads = src.heads
    detail = pair_detail(heads, pairing, sl, sh, tl, th)
    out = detail.to_dict()
    out["pair_z"] = pair_zscore(detail.pk, *detail.ranks, heads.info.d_model)
    out["pair_cs"], out["pair_cs_of"] = None, None
    mode = cs_mode_of(pairing)
    if mode is not None:
        kv = kv_level_cs(target_layer_cs(heads, mode, sl, sh, tl), heads.role(pairing[1]).shape[1])
        if bool(kv.valid[0, 0, 0, th]):
            out["pair_cs"] = float(kv.scores[0, 0, 0, th])
            out["pair_cs_of"] = kv.cs_of(0, 0, 0, th)
    return jsonable(out)


def _index(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TypeError(f"expected a position >= 0, got {value!r}")
    return value


def score_computations() -> list[Computation]:
    """The score computations, with the checks and key parameters each cache key uses."""
    pairing_order = {"pairing": check_pairing, "order": check_order}
    return [
        Computation("pk", pk, pairing_order, load=pair_scores_from_payload, batch=pk_batch),
        Computation("cs", cs, {"mode": check_mode, "order": check_order},
                    load=pair_scores_from_payload),
        Computation("z", z, pairing_order),
        # "init": the payload holds the random-initialization null too (older ones do not),
        # from as few random-init layers as give 2000 pairs (core.stats.nulls.random_init_layers).
        Computation("null", null, {"pairing": check_pairing, "samples": positive_int},
                    key=lambda p: {**p, "init": "random-init-2000-layers"}, batch=null_batch),
        Computation("reference", reference, {"samples": positive_int}),
        # "baseline": lists carry the random-subspace baseline and flags (older payloads lack
        # them; their keys are not read back).
        Computation("tokens", tokens, {"role": check_role, "k": positive_int},
                    key=lambda p: {**p, "baseline": "haar-40-q95"}),
        Computation("token_null", token_null, {"rank": positive_int, "k": positive_int},
                    key=lambda p: {**p, "baseline": "unembedding-200-q95"}),
        # Key {"format": 2}: a model that cannot run is a remembered failure, no longer a stored
        # {"available": false}; an older cache's negative answers are then never read back.
        Computation("patterns", patterns, {}, key=lambda _: {"format": 2}, reads=MODEL),
        # "kv": points are on the PK grid, KV scores once (keys of the older per-query-head
        # scatter are not read back).
        Computation("scatter", scatter, {"pairing": check_pairing,
                                          "top_percent": quantize_percent},
                    key=lambda p: {**p, "kv": "once"}),
        # "alone": the payload holds the pair's own z and CS too (older ones do not).
        Computation("pair", pair, {"pairing": check_pairing, "sl": _index, "sh": _index,
                                   "tl": _index, "th": _index},
                    key=lambda p: {"pairing": p["pairing"], "s": f"{p['sl']}.{p['sh']}",
                                   "t": f"{p['tl']}.{p['th']}", "scores": "alone"}),
    ]
