"""Raw vs norm-aware subspaces of one model (``MODEL`` vs ``MODEL@norm``): how the two PK graphs
of a pairing agree and which recovers a label set's heads better (core.graphs.agreement), read
from the two modes' cached PK (computed on first use like any PK)."""

from __future__ import annotations

from typing import Any

from headgraph.core.graphs.agreement import Reference, score_agreement
from headgraph.core.names import check_pairing
from headgraph.core.stats.recovery import reference_from_heads
from headgraph.server.computations.convert import jsonable, role_is_grouped
from headgraph.server.computations.recovery import N_RESAMPLES, check_k
from headgraph.server.errors import Invalid
from headgraph.server.models.offered import ModelRef
from headgraph.server.services.labels import LabelService
from headgraph.server.services.recovery import in_model
from headgraph.server.services.scores import ScoresService

METHOD = ("Spearman rank correlation of raw and norm-aware PK over the pairs valid in both; the "
          "top-k edges of each and those in both; with a label set, the recovery table "
          "(core.stats.recovery) of the two on the same reference, raw the baseline, so the "
          f"norm-aware row's auc_diff is ROC-AUC(norm) - ROC-AUC(raw) on the same {N_RESAMPLES} "
          "stratified bootstrap resamples")
VERDICTS = {"A": "raw", "B": "norm", "tie": "tie", None: None}
RULE = ("norm-aware recovers the reference better when the paired bootstrap 95% interval of "
        "ROC-AUC(norm) - ROC-AUC(raw) lies above 0, raw when it lies below 0; an interval holding "
        "0 is a tie")


def compare_subspaces(scores: ScoresService, labels: LabelService, ref: ModelRef, pairing: str,
                      k: int, label_set: str | None) -> dict[str, Any]:
    """What GET /api/subspaces answers for ``ref`` (either mode: both are read). The label
    set's heads (the raw model's, for the per-model ``patterns`` set) are the reference.
    UnsupportedModel (422) when the model's norms cannot be measured."""
    check_pairing(pairing)
    check_k(k)
    raw, norm = ref.with_subspaces("raw"), ref.with_subspaces("norm")
    catalog = scores.catalog
    pa, pb = scores.pk(raw, pairing), scores.pk(norm, pairing)
    info = catalog.model_info(norm)
    reference, reference_heads = None, None
    if label_set:
        ls = labels.label_set(label_set, raw)
        reference_heads = [h for h in sorted(ls.classes) if in_model(h, info)]
        if not reference_heads:
            raise Invalid(f"label set {ls.name!r} names no head of {raw.id}")
        _, hs, _, ht = pa.scores.shape
        edges, src, tgt = reference_from_heads(reference_heads, info.layer_indices, hs, ht, info.n_heads)
        reference = Reference(edges, src, tgt)
    ag = score_agreement(pa, pb, k=k, names=("raw", "norm"), reference=reference,
                         grouped_target=role_is_grouped(info, pa.target_role),
                         n_resamples=N_RESAMPLES, seed=0)
    table = None if ag.recovery is None else ag.recovery.to_dict()
    return jsonable({
        "model": raw.id, "raw": raw.id, "norm": norm.id, "norm_gains": info.norm_gains,
        "pairing": ag.pairing, "k": ag.k, "n_valid": ag.n_valid, "spearman": ag.spearman,
        "top_raw": list(ag.top_a), "top_norm": list(ag.top_b), "shared": list(ag.shared),
        "n_shared": len(ag.shared), "labels": label_set or None, "reference_heads": reference_heads,
        "recovery": None if table is None else {key: table[key] for key in (
            "n_reference", "base_rate", "confidence", "n_resamples", "rows")},
        "auc_difference": None if ag.auc_difference is None else ag.auc_difference.to_dict(),
        "verdict": VERDICTS[ag.verdict], "rule": RULE, "method": METHOD})
