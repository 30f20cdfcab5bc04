"""The registered validation computation: weight metrics against path-ablation effects.

``validation`` (core.activations.validation) takes one O -> Q/K/V pairing of a runnable model, draws
``n`` forward pairs at random (seeded; all of them when the model has fewer) and every metric's
``k`` best pairs, measures their path-ablation effects (the cached ``ablation`` computation, in
edge sets of at most ABLATION_TOP_MAX) on both prompt sets, and summarises per metric: Spearman
over the random sample, mean effect and Spearman over its top-k, each with bootstrap 95%
intervals; the decision rule, PK minus every other metric's Spearman on the same pairs with a
paired bootstrap interval; the sample's power for rho = 0.3; each metric's top-k precision
(verified share) against held-out random pairs (the null, calibrated on its other half) with a
Fisher exact test and a matched (stratified) null, on the raw and on the source-variance
normalised effect; each metric's partial Spearman with the effect given the trivial baselines;
and a held-out
set where data-weighted PK, fit on the even text prompts, meets the effects on the odd ones.
Metrics are on the PK grid (a grouped-query K / V target is a KV group): PK, CS (a KV group: the mean over its query heads,
core.scores.ranking.kv_level_cs), the PK paper's weight-level baselines linear CKA and orthogonal
Procrustes (the cached ``similarity`` grids, a KV group's own as PK's) and the data-weighted PK
shares (core.activations.data_pk, text prompts); and two trivial baselines with no top-k of their own: the layer gap (nearer
layer pairs first) and the source head's variance share tr(C_S) / tr(C_X) (data_pk's
``in_share_baseline``, when data-weighted PK is available). ``RULE`` is part of the cache key,
so answers cached under an older rule are never read as this one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from headgraph.core.errors import UnsupportedModel
from headgraph.server.errors import Invalid
from headgraph.server.limits import ABLATION_TOP_MAX, VALIDATION_SAMPLE_MAX, VALIDATION_TOP_MAX

if TYPE_CHECKING:
    from headgraph.server.compute.registry import Computation, Inputs

DEFAULT_SAMPLE = 200  # power 0.98 for rho = 0.3 (40 pairs gave 0.45)
DEFAULT_TOP = 10
METRICS = ("PK", "CS", "CKA", "Procrustes", "data-PK out", "data-PK in")
SIMILARITY_METRICS = {"CKA": "cka", "Procrustes": "procrustes"}  # name -> similarity kind
BASELINES = ("layer gap", "source variance")  # trivial predictors: in the table, no top-k
POWER_RHO = 0.3
RULE = "paired-v5-heldout"  # the answer's shape (its metrics) and decision rule, in the cache key
HELD_OUT = "text (held-out)"  # data-PK fit on the even text prompts, effects of the odd ones
HELD_OUT_METRICS = ("data-PK out", "data-PK in", "source variance")  # refit on the even half


def bounded(name: str, hi: int) -> Any:
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= hi:
            raise Invalid(f"{name} must be an integer in 1..{hi}, got {value!r}")
        return value
    return check


def check_seed(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**31:
        raise Invalid(f"seed must be an integer in 0..2^31-1, got {value!r}")
    return value


def metric_grids(src: Inputs, pairing: str) -> tuple[dict[str, Any], Any]:
    """{metric: float64 grid [L, H, L, Ht] (NaN where undefined)}, the metrics then the
    BASELINES, and the PK validity mask."""
    import numpy as np

    from headgraph.core.names import cs_mode_of
    from headgraph.core.scores.ranking import kv_level_cs

    ps = src.result("pk", pairing=pairing, order="forward")
    valid = ps.valid.bool().numpy()
    grids: dict[str, Any] = {"PK": np.where(valid, ps.scores.double().numpy(), np.nan)}
    layers = np.asarray(src.info.layer_indices, dtype=np.float64)
    gap = -(layers[None, :] - layers[:, None])[:, None, :, None]  # nearer layer pairs first
    baselines: dict[str, Any] = {"layer gap": np.where(valid, np.broadcast_to(gap, valid.shape), np.nan)}
    mode = cs_mode_of(pairing)
    if mode is not None:
        kv = kv_level_cs(src.result("cs", mode=mode, order="forward"), ps.scores.shape[3])
        grids["CS"] = np.where(kv.valid.numpy(), kv.scores.numpy(), np.nan)
    for name, kind in SIMILARITY_METRICS.items():
        sim = src.result("similarity", kind=kind, pairing=pairing, order="forward")
        grids[name] = np.where(sim.valid.numpy() & valid, sim.scores.double().numpy(), np.nan)
    try:
        d = src.result("data_pk", pairing=pairing, prompts="text")
        grids["data-PK out"] = np.asarray(d["out_share"], dtype=np.float64)
        grids["data-PK in"] = np.asarray(d["in_share"], dtype=np.float64)
        share = np.asarray(d["in_share_baseline"], dtype=np.float64)[:, :, :, None]  # tr(C_S) / tr(C_X)
        baselines["source variance"] = np.where(valid, np.broadcast_to(share, valid.shape), np.nan)
    except (KeyError, UnsupportedModel):
        pass  # no data-weighted PK registered or runnable: the other metrics still compare
    return {**grids, **baselines}, valid


def held_out_grids(src: Inputs, pairing: str) -> dict[str, Any]:
    """{metric: grid} of the data-weighted metrics refit on the even text prompts only
    (computations.data_pk.held_out_data_pk), {} where data-weighted PK is not available."""
    import numpy as np

    from headgraph.server.computations.data_pk import held_out_data_pk

    try:
        d = held_out_data_pk(src, pairing, "even")
    except (KeyError, UnsupportedModel):
        return {}
    valid = np.isfinite(d["out_share"])
    share = np.asarray(d["in_share_baseline"], dtype=np.float64)[:, :, :, None]
    return {"data-PK out": np.asarray(d["out_share"], dtype=np.float64),
            "data-PK in": np.asarray(d["in_share"], dtype=np.float64),
            "source variance": np.where(valid, np.broadcast_to(share, valid.shape), np.nan)}


def _stratum(values: dict[str, Any], rows: Any, cuts: Any) -> Any:
    """Stratum id per row: source-variance tertile (cut points ``cuts``; 0 without it) x layer
    gap 1 or more (the stated matching rule of the matched null)."""
    import numpy as np

    gap = -np.asarray(values["layer gap"], dtype=np.float64)[rows]  # the grid holds -(gap)
    var = values.get("source variance")
    tert = np.zeros(len(rows), dtype=np.int64) if var is None or cuts is None else np.searchsorted(
        cuts, np.asarray(var, dtype=np.float64)[rows], side="right")
    return tert * 2 + (gap > 1)


def _poisson_binomial_tail(rates: Any, hits: int) -> float:
    """P(sum of independent Bernoulli(rates) >= hits), exact by convolution."""
    import numpy as np

    dist = np.array([1.0])
    for p in rates:
        dist = np.convolve(dist, [1.0 - p, p])
    return float(min(1.0, dist[hits:].sum()))


def topk_precision_rows(statistic: dict[str, Any], sample_rows: Any, top_rows: dict[str, Any], k: int,
                        values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Per metric: the verified share of its top-k against held-out random pairs (the null).

    The null is the random sample without the metric's top-k, split by
    core.stats.calibration.split_null (SPLIT_SEED): per prompt set the threshold is the
    calibration half's 1 - alpha / (k x prompt sets) quantile of the smaller split-half effect
    (core.stats.calibration.tail_threshold: empirical, a conservative GPD tail, or unresolved);
    an edge is verified when above it on some set (the ablation verdict's rule). The top-k and
    the held-out half are judged by those thresholds, never the pairs that set them: a one-sided
    Fisher exact test of the two shares, the held-out share with its expected value alpha / k
    and the achieved family-wise error k x that share. With ``values`` (the metric and baseline
    values per row) a matched null too: each top edge's stratum (source-variance tertile x layer
    gap 1 / more, _stratum) gets the held-out share of its stratum (the overall share for an
    empty stratum), their mean the matched share and the exact Poisson-binomial tail of the
    verified count its p-value. Unresolved on every set: no verdict (verified None)."""
    import numpy as np

    from headgraph.core.stats.calibration import SPLIT_RULE, bonferroni_quantile, split_null, tail_threshold
    from headgraph.core.stats.verdicts import topk_precision
    from headgraph.server.computations.ablation import SPLIT_SEED, VERIFY_ALPHA

    sets = list(statistic)
    out = []
    for metric, rows in top_rows.items():
        top = np.asarray(rows, dtype=np.int64)
        in_top = set(top.tolist())
        null = np.asarray([r for r in np.asarray(sample_rows).tolist() if r not in in_top], dtype=np.int64)
        if len(top) == 0 or len(null) == 0:
            continue
        cal_i, held_i = split_null(len(null), SPLIT_SEED)
        cal, held = null[cal_i], null[held_i]
        q = bonferroni_quantile(len(top) * len(sets), VERIFY_ALPHA)
        thresholds: dict[str, float | None] = {}
        methods: dict[str, str] = {}
        for name in sets:
            v = statistic[name][cal]
            thresholds[name], methods[name], _ = tail_threshold(v[np.isfinite(v)], q)

        def hits(rows: Any, thresholds: dict[str, float | None] = thresholds) -> Any:
            hit = np.zeros(len(rows), dtype=bool)
            for name, t in thresholds.items():
                if t is not None:
                    hit |= np.nan_to_num(statistic[name][rows], nan=-np.inf) > t
            return hit
        resolved = any(t is not None for t in thresholds.values())
        row: dict[str, Any] = {"metric": metric, "k": int(len(top)), "quantile": q, "thresholds": thresholds,
                               "method": methods, "resolved": resolved, "n_calibration": int(len(cal)),
                               "n_null": int(len(held)), "expected_share": VERIFY_ALPHA / len(top),
                               "split": SPLIT_RULE}
        if not resolved or len(held) == 0:
            out.append({**row, "verified": None, "precision": None, "null_verified": None, "null_share": None,
                        "odds_ratio": None, "p_value": None, "achieved_fwer": None, "matched": None})
            continue
        top_hit, held_hit = hits(top), hits(held)
        test = topk_precision(int(top_hit.sum()), len(top), int(held_hit.sum()), len(held))
        matched = None
        if values is not None and "layer gap" in values:
            var = values.get("source variance")
            cuts = None if var is None else np.nanquantile(np.asarray(var, dtype=np.float64)[cal], [1 / 3, 2 / 3])
            s_held, s_top = _stratum(values, held, cuts), _stratum(values, top, cuts)
            overall = float(held_hit.mean())
            rates = [float(held_hit[s_held == s].mean()) if (s_held == s).any() else overall for s in s_top]
            matched = {"share": float(np.mean(rates)), "expected_verified": float(np.sum(rates)),
                       "p_value": _poisson_binomial_tail(rates, int(top_hit.sum())),
                       "strata": "source-variance tertile x layer gap (1 / more)" if var is not None
                       else "layer gap (1 / more)"}
        out.append({**row, **test.to_dict(), "n_null": int(len(held)),
                    "achieved_fwer": min(1.0, len(top) * test.null_share), "matched": matched})
    return out


def association_rows(values: dict[str, Any], effects: Any, sample_rows: Any) -> list[dict[str, Any]]:
    """Per metric over the random sample: Spearman with the effect, the partial Spearman given
    the trivial baselines (source variance where known, and layer gap;
    core.stats.calibration.partial_spearman), and the Spearman with the magnitude-normalised
    effect (effect / the source's variance share; None without it): what a metric says about
    the effect beyond how loud its source is and how near its layers are."""
    import numpy as np

    from headgraph.core.stats.calibration import partial_spearman
    from headgraph.core.stats.verdicts import spearman_rows

    s = np.asarray(sample_rows, dtype=np.int64)
    e = np.asarray(effects, dtype=np.float64)[s]
    given = {b: np.asarray(values[b], dtype=np.float64)[s] for b in BASELINES if b in values}
    var = given.get("source variance")
    norm = None if var is None else np.where(var > 0, e / np.where(var > 0, var, 1.0), np.nan)
    out = []
    for metric, v in values.items():
        x = np.asarray(v, dtype=np.float64)[s]
        ok = np.isfinite(x) & np.isfinite(e)
        rho = float(spearman_rows(x[ok][None], e[ok][None])[0]) if ok.sum() >= 3 else float("nan")
        cov = {b: g for b, g in given.items() if b != metric}
        part = partial_spearman(x, e, cov) if cov else None
        rho_n = None
        if norm is not None and metric != "source variance":
            okn = np.isfinite(x) & np.isfinite(norm)
            r = float(spearman_rows(x[okn][None], norm[okn][None])[0]) if okn.sum() >= 3 else float("nan")
            rho_n = r if np.isfinite(r) else None
        out.append({"metric": metric, "spearman": rho if np.isfinite(rho) else None,
                    "partial": None if part is None else part.to_dict(), "normalised_spearman": rho_n})
    return out


def validation(src: Inputs, *, pairing: str, n: int, k: int, seed: int) -> dict[str, Any]:
    """Every chosen pair's metric values and effects, and the per-metric summary (JSON)."""
    import numpy as np

    from headgraph.core.activations.validation import (forward_pair_count, paired_differences, sample_forward_pairs,
                                                       sample_power, top_pairs_of, validation_summary)
    from headgraph.server.computations.ablation import check_ablation_pairing

    check_ablation_pairing(pairing)
    if src.patterns is None:
        raise UnsupportedModel(f"{src.info.name} cannot be run here, so its metrics cannot be "
                               "validated by ablation")
    from headgraph.server.computations.ablation import edge_statistic

    grids, valid = metric_grids(src, pairing)
    held = held_out_grids(src, pairing) if "data-PK in" in grids else {}
    sample = sample_forward_pairs(valid, n, seed)  # first, so its chunks are the null's (ablation_null)
    tops = {m: top_pairs_of(g, valid, k) for m, g in grids.items() if m not in BASELINES}
    held_tops = {m: top_pairs_of(g, valid, k) for m, g in held.items() if m not in BASELINES}
    pairs: dict[tuple[int, ...], int] = {}
    for rows in (sample, *tops.values(), *held_tops.values()):
        for r in rows.tolist():
            pairs.setdefault(tuple(r), len(pairs))
    order = list(pairs)
    effects: dict[str, list[float]] = {"text": [], "random": []}
    stats: dict[str, list[float | None]] = {"text": [], "random": []}
    odd: list[float | None] = []  # the text effect on the odd prompts (the held-out half)
    names: list[tuple[str, str]] = []
    for start in range(0, len(order), ABLATION_TOP_MAX):
        chunk = tuple(order[start: start + ABLATION_TOP_MAX])
        res = src.result("ablation", pairing=pairing, edges=chunk, ablation="mean")
        for e in res["edges"]:
            effects["text"].append(e["effect_text"])
            effects["random"].append(e["effect_random"])
            st = edge_statistic(e["halves"])
            for name in stats:
                stats[name].append(st.get(name))
            odd.append(e["halves"]["text"][1])
            names.append((e["source"], e["target"]))
    idx = np.array(order, dtype=np.int64)
    values = {m: g[tuple(idx.T)] for m, g in grids.items()}
    sample_rows = np.array([pairs[tuple(r)] for r in sample.tolist()], dtype=np.int64)
    top_rows = {m: np.array([pairs[tuple(r)] for r in t.tolist()], dtype=np.int64) for m, t in tops.items()}
    summary = {s: [v.to_dict() for v in validation_summary(values, np.array(effects[s]), sample_rows,
                                                           top_rows, seed=seed)]
               for s in effects}
    paired = {s: [d.to_dict() for d in paired_differences(values, np.array(effects[s]), sample_rows, seed=seed)]
              for s in effects}
    held_values: dict[str, Any] = {}
    if held:  # data-PK refit on the even text prompts against the effects on the odd ones
        held_values = {m: held[m][tuple(idx.T)] if m in held else v for m, v in values.items()}
        held_top_rows = {**top_rows, **{m: np.array([pairs[tuple(r)] for r in t.tolist()], dtype=np.int64)
                                        for m, t in held_tops.items()}}
        eff_odd = np.array([np.nan if v is None else v for v in odd], dtype=np.float64)
        summary[HELD_OUT] = [v.to_dict() for v in validation_summary(held_values, eff_odd, sample_rows,
                                                                     held_top_rows, seed=seed)]
        paired[HELD_OUT] = [d.to_dict() for d in paired_differences(held_values, eff_odd, sample_rows, seed=seed)]
    statistic = {s: np.array([np.nan if v is None else v for v in vs], dtype=np.float64) for s, vs in stats.items()}
    precision = topk_precision_rows(statistic, sample_rows, top_rows, k, values)
    var = values.get("source variance")
    normalised_statistic = None if var is None else {
        n: np.where(var > 0, v / np.where(var > 0, var, 1.0), np.nan) for n, v in statistic.items()}
    precision_normalised = ([] if normalised_statistic is None
                            else topk_precision_rows(normalised_statistic, sample_rows, top_rows, k, values))
    association = {p: association_rows(values, np.array(effects[p], dtype=np.float64), sample_rows)
                   for p in effects}
    power = sample_power(n, int(len(sample_rows)), forward_pair_count(valid), rho=POWER_RHO).to_dict()
    edges = [{"source": s, "target": t, "in_sample": bool(i in set(sample_rows.tolist())),
              "top_of": [m for m, rows in top_rows.items() if i in set(rows.tolist())],
              "effect_text": effects["text"][i], "effect_random": effects["random"][i],
              "effect_text_odd": odd[i], "statistic_text": stats["text"][i],
              "statistic_random": stats["random"][i],
              **{m: (None if not np.isfinite(values[m][i]) else float(values[m][i])) for m in values},
              **{f"{m} (held-out)": (None if not np.isfinite(held_values[m][i]) else float(held_values[m][i]))
                 for m in HELD_OUT_METRICS if m in held}}
             for i, (s, t) in enumerate(names)]
    return {"pairing": pairing, "n_sample": int(len(sample_rows)), "k": k, "seed": seed,
            "metrics": list(grids), "baselines": [m for m in BASELINES if m in grids], "summary": summary,
            "paired": paired, "power": power, "rule": RULE, "edges": edges, "precision": precision,
            "precision_normalised": precision_normalised, "association": association,
            "held_out": ({"set": HELD_OUT, "fit": "data-weighted metrics refit on the even-numbered text prompts",
                          "tested": "path-ablation effects on the odd-numbered text prompts",
                          "metrics": [m for m in HELD_OUT_METRICS if m in held]} if held else None),
            "method": ("Spearman of each metric against the path-ablation effect over a uniform random sample "
                       "of forward pairs, and the mean effect / Spearman over each metric's top-k; "
                       "95% bootstrap percentile intervals (scipy.stats.bootstrap, 2000 resamples, "
                       "pairs resampled together). Decision rule: PK minus each other metric's Spearman "
                       "on the same random pairs with a paired bootstrap 95% interval (2000 resamples); "
                       "PK beats a metric when that interval lies above 0. Baselines: the layer gap "
                       "(nearer layers first) and the source head's variance share tr(C_S)/tr(C_X). "
                       f"'{HELD_OUT}': the data-weighted metrics (data-PK, source variance) refit on the "
                       "even text prompts, every metric against the effects on the odd ones (the text "
                       "rows fit and test data-PK on the same prompts). Precision: the verified share of "
                       "each metric's top-k against held-out random pairs, one-sided Fisher exact test: "
                       "the random sample without the top-k is split in seeded halves, the threshold "
                       "(the 1 - 0.05 / (k x 2) quantile of the smaller split-half effect; empirical, a "
                       "conservative generalized Pareto tail, or unresolved and no verdict) is set on "
                       "one half and judges the top-k and the other half, whose share above it is the "
                       "achieved error (expected 0.05 / k); a matched null (held-out pairs of the same "
                       "source-variance tertile and layer gap 1 / more) beside it, and the same on the "
                       "effect divided by the source's variance share (precision_normalised). "
                       "Association: each metric's Spearman with the effect, its partial Spearman given "
                       "source variance and layer gap, and its Spearman with the normalised effect")}


def validation_computations() -> list[Computation]:
    from headgraph.server.computations.ablation import check_ablation_pairing
    from headgraph.server.compute.registry import MODEL, Computation

    # reads ablations and data-weighted PK: forward passes of the whole model
    return [Computation("validation", validation,
                        {"pairing": check_ablation_pairing, "n": bounded("n", VALIDATION_SAMPLE_MAX),
                         "k": bounded("k", VALIDATION_TOP_MAX), "seed": check_seed},
                        key=lambda p: {**p, "rule": RULE}, reads=MODEL)]
