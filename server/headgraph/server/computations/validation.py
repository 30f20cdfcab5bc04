"""The registered validation computation: weight metrics against path-ablation effects.

``validation`` (core.activations.validation) takes one O -> Q/K/V pairing of a runnable model, draws
``n`` forward pairs at random (seeded; all of them when the model has fewer) and every metric's
``k`` best pairs, measures their path-ablation effects (the cached ``ablation`` computation, in
edge sets of at most ABLATION_TOP_MAX) on both prompt sets, and summarises per metric: Spearman
over the random sample, mean effect and Spearman over its top-k, each with bootstrap 95%
intervals; the decision rule, PK minus every other metric's Spearman on the same pairs with a
paired bootstrap interval; the sample's power for rho = 0.3; each metric's top-k precision
(verified share) against the random sample (the null) with a Fisher exact test; and a held-out
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

if TYPE_CHECKING:
    from headgraph.server.compute.registry import Computation, Inputs

DEFAULT_SAMPLE = 200  # power 0.98 for rho = 0.3 (40 pairs gave 0.45)
DEFAULT_TOP = 10
SAMPLE_MAX = 1000
TOP_MAX = 20
METRICS = ("PK", "CS", "CKA", "Procrustes", "data-PK out", "data-PK in")
SIMILARITY_METRICS = {"CKA": "cka", "Procrustes": "procrustes"}  # name -> similarity kind
BASELINES = ("layer gap", "source variance")  # trivial predictors: in the table, no top-k
POWER_RHO = 0.3
RULE = "paired-v4"  # the answer's shape (its metrics) and decision rule, in the cache key
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


def topk_precision_rows(statistic: dict[str, Any], sample_rows: Any, top_rows: dict[str, Any], k: int
                        ) -> list[dict[str, Any]]:
    """Per metric: the verified share of its top-k against the random sample's (the null), with
    a one-sided Fisher exact test (core.stats.verdicts.topk_precision). "Verified" is the
    ablation verdict's rule (computations.ablation): on some prompt set the smaller split-half
    effect is above the null's 1 - alpha / (k x prompt sets) quantile, the null being the random
    sample without the metric's top-k; the null's own pairs are judged by the same thresholds."""
    import numpy as np

    from headgraph.core.stats.verdicts import null_threshold, topk_precision
    from headgraph.server.computations.ablation import VERIFY_ALPHA

    sets = list(statistic)
    out = []
    for metric, rows in top_rows.items():
        top = np.asarray(rows, dtype=np.int64)
        null = np.asarray([r for r in np.asarray(sample_rows).tolist() if r not in set(top.tolist())], dtype=np.int64)
        if len(top) == 0 or len(null) == 0:
            continue
        thresholds = {}
        for name in sets:
            values = statistic[name][null]
            values = values[np.isfinite(values)]
            if len(values):
                thresholds[name] = null_threshold(values, n_tests=len(top) * len(sets), alpha=VERIFY_ALPHA)

        def verified(rows: Any, thresholds: dict[str, Any] = thresholds) -> int:
            hit = np.zeros(len(rows), dtype=bool)
            for name, t in thresholds.items():
                hit |= np.nan_to_num(statistic[name][rows], nan=-np.inf) > t.threshold
            return int(hit.sum())
        test = topk_precision(verified(top), len(top), verified(null), len(null))
        t0 = next(iter(thresholds.values()), None)
        out.append({"metric": metric, **test.to_dict(), "quantile": None if t0 is None else t0.quantile,
                    "thresholds": {n: t.threshold for n, t in thresholds.items()},
                    "resolved": {n: t.resolved for n, t in thresholds.items()}})
    return out


def validation(src: Inputs, *, pairing: str, n: int, k: int, seed: int) -> dict[str, Any]:
    """Every chosen pair's metric values and effects, and the per-metric summary (JSON)."""
    import numpy as np

    from headgraph.core.activations.validation import (forward_pair_count, paired_differences, sample_forward_pairs,
                                                       sample_power, top_pairs_of, validation_summary)
    from headgraph.server.computations.ablation import ABLATION_TOP_MAX, check_ablation_pairing

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
    precision = topk_precision_rows(statistic, sample_rows, top_rows, k)
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
                       "each metric's top-k against the random sample's, one-sided Fisher exact test, "
                       "verified as the ablation verdict (above the random sample's 1 - 0.05 / (k x 2) "
                       "quantile of the smaller split-half effect, the top-k left out)")}


def validation_computations() -> list[Computation]:
    from headgraph.server.computations.ablation import check_ablation_pairing
    from headgraph.server.compute.registry import Computation

    return [Computation("validation", validation,
                        {"pairing": check_ablation_pairing, "n": bounded("n", SAMPLE_MAX),
                         "k": bounded("k", TOP_MAX), "seed": check_seed},
                        key=lambda p: {**p, "rule": RULE})]
