"""The registered validation computation: weight metrics against path-ablation effects.

``validation`` (core.activations.validation) takes one O -> Q/K/V pairing of a runnable model, draws
``n`` forward pairs at random (seeded; all of them when the model has fewer) and every metric's
``k`` best pairs, measures their path-ablation effects (the cached ``ablation`` computation, in
edge sets of at most ABLATION_TOP_MAX) on both prompt sets, and summarises per metric: Spearman
over the random sample, mean effect and Spearman over its top-k, each with bootstrap 95%
intervals; the decision rule, PK minus every other metric's Spearman on the same pairs with a
paired bootstrap interval; and the sample's power for rho = 0.3. Metrics are on the PK grid (a
grouped-query K / V target is a KV group): PK, CS (a KV group: the mean over its query heads,
core.scores.ranking.kv_level_cs) and the data-weighted PK shares (core.activations.data_pk,
text prompts); and two trivial baselines with no top-k of their own: the layer gap (nearer
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
METRICS = ("PK", "CS", "data-PK out", "data-PK in")
BASELINES = ("layer gap", "source variance")  # trivial predictors: in the table, no top-k
POWER_RHO = 0.3
RULE = "paired-v2"  # the answer's shape and decision rule, in the cache key


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
    try:
        d = src.result("data_pk", pairing=pairing, prompts="text")
        grids["data-PK out"] = np.asarray(d["out_share"], dtype=np.float64)
        grids["data-PK in"] = np.asarray(d["in_share"], dtype=np.float64)
        share = np.asarray(d["in_share_baseline"], dtype=np.float64)[:, :, :, None]  # tr(C_S) / tr(C_X)
        baselines["source variance"] = np.where(valid, np.broadcast_to(share, valid.shape), np.nan)
    except (KeyError, UnsupportedModel):
        pass  # no data-weighted PK registered or runnable: the other metrics still compare
    return {**grids, **baselines}, valid


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
    grids, valid = metric_grids(src, pairing)
    sample = sample_forward_pairs(valid, n, seed)
    tops = {m: top_pairs_of(g, valid, k) for m, g in grids.items() if m not in BASELINES}
    pairs: dict[tuple[int, ...], int] = {}
    for rows in (sample, *tops.values()):
        for r in rows.tolist():
            pairs.setdefault(tuple(r), len(pairs))
    order = list(pairs)
    effects: dict[str, list[float]] = {"text": [], "random": []}
    names: list[tuple[str, str]] = []
    for start in range(0, len(order), ABLATION_TOP_MAX):
        chunk = tuple(order[start: start + ABLATION_TOP_MAX])
        res = src.result("ablation", pairing=pairing, edges=chunk, ablation="mean")
        for e in res["edges"]:
            effects["text"].append(e["effect_text"])
            effects["random"].append(e["effect_random"])
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
    power = sample_power(n, int(len(sample_rows)), forward_pair_count(valid), rho=POWER_RHO).to_dict()
    edges = [{"source": s, "target": t, "in_sample": bool(i in set(sample_rows.tolist())),
              "top_of": [m for m, rows in top_rows.items() if i in set(rows.tolist())],
              "effect_text": effects["text"][i], "effect_random": effects["random"][i],
              **{m: (None if not np.isfinite(values[m][i]) else float(values[m][i])) for m in values}}
             for i, (s, t) in enumerate(names)]
    return {"pairing": pairing, "n_sample": int(len(sample_rows)), "k": k, "seed": seed,
            "metrics": list(grids), "baselines": [m for m in BASELINES if m in grids], "summary": summary,
            "paired": paired, "power": power, "rule": RULE, "edges": edges,
            "method": ("Spearman of each metric against the path-ablation effect over a uniform random sample "
                       "of forward pairs, and the mean effect / Spearman over each metric's top-k; "
                       "95% bootstrap percentile intervals (scipy.stats.bootstrap, 2000 resamples, "
                       "pairs resampled together). Decision rule: PK minus each other metric's Spearman "
                       "on the same random pairs with a paired bootstrap 95% interval (2000 resamples); "
                       "PK beats a metric when that interval lies above 0. Baselines: the layer gap "
                       "(nearer layers first) and the source head's variance share tr(C_S)/tr(C_X)")}


def validation_computations() -> list[Computation]:
    from headgraph.server.computations.ablation import check_ablation_pairing
    from headgraph.server.compute.registry import Computation

    return [Computation("validation", validation,
                        {"pairing": check_ablation_pairing, "n": bounded("n", SAMPLE_MAX),
                         "k": bounded("k", TOP_MAX), "seed": check_seed},
                        key=lambda p: {**p, "rule": RULE})]
