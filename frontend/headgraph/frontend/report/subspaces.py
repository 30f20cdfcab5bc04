"""The findings page's "Raw vs norm-aware subspaces" section, from GET /api/subspaces per pairing:
how raw PK and PK of the norm-aware heads (``MODEL@norm``: the gains of the norms around attention
folded in) agree, and which recovers the model's label set better by the paired rule."""

from __future__ import annotations

from typing import Any

from headgraph.frontend.report.numbers import available
from headgraph.frontend.report.text import fmt, fmt_ci, table

TITLE = "Raw vs norm-aware subspaces"
BETTER = {"norm": "norm-aware", "raw": "raw", "tie": "no difference", None: "undefined"}
RULE = ("norm-aware subspaces recover the reference better when the 95% paired bootstrap interval of "
        "ROC-AUC(norm-aware) − ROC-AUC(raw) lies above 0, raw ones when it lies below 0; an interval "
        "holding 0 is no difference")


def _signed(est: dict[str, Any] | None) -> str:
    """A paired difference ``{value, low, high}`` as '+v [+low, +high]' (3 decimals: the rule
    reads whether the interval's ends are above or below 0)."""
    if not est or est.get("value") is None or est.get("low") is None:
        return "n/a"
    return f"{est['value']:+.3f} [{est['low']:+.3f}, {est['high']:+.3f}]"


def _auc(data: dict[str, Any], metric: str) -> dict[str, Any] | None:
    rows = (data.get("recovery") or {}).get("rows") or []
    return next((r["auc"] for r in rows if r["metric"] == metric), None)


def subspaces_section(numbers: dict[str, Any], number: int = 7) -> str:
    """Per pairing: Spearman of raw and norm-aware PK over the pairs valid in both, the top-k edges
    both share, each mode's ROC-AUC at recovering the label set and the paired difference, decided
    by RULE; the API's refusal where the model's norms cannot be measured."""
    sub = numbers.get("subspaces") or {}
    text = [f"## {number}. {TITLE}"]
    answers = sub.get("pairings") or {}
    if not answers:
        return "\n\n".join([*text, "Not collected."])
    got = [d for d in answers.values() if available(d) and d]
    gains = next((d.get("norm_gains") for d in got if d.get("norm_gains")), None)
    norm_id = next((d["norm"] for d in got), None)
    text.append("Norm-aware subspaces fold the gains of the norms around attention into the heads "
                "(readers scaled by the pre-attention norm's gain, writers by a post-attention norm's; "
                f"model id `{norm_id or numbers['model'] + '@norm'}`"
                + (f", here: {gains}" if gains else "") + "). Raw PK ignores them. Per pairing, over the "
                "pairs valid in both: Spearman's ρ between raw and norm-aware PK, how many of the top-"
                f"{sub.get('k')} edges both share, and how well each recovers the heads of the label set "
                f"`{sub.get('labels')}` (ROC-AUC with 95% stratified bootstrap intervals; the difference "
                "on the same resamples).")
    text.append(f"**Rule.** {RULE[0].upper() + RULE[1:]}.")
    rows, better = [], {}
    for pairing, data in answers.items():
        if not available(data) or not data:
            text.append(f"**{pairing}**: not available: {(data or {}).get('unavailable', 'no answer')}.")
            continue
        verdict = data.get("verdict")  # None: no reference edge among the valid pairs
        better.setdefault(BETTER[verdict], []).append(pairing)
        rows.append((pairing, fmt(data.get("spearman"), 4), f"{data['n_shared']} / {data['k']}",
                     fmt_ci(_auc(data, "raw")), fmt_ci(_auc(data, "norm")), _signed(data.get("auc_difference")),
                     BETTER[verdict]))
    if rows:
        text.append(table(("pairing", "Spearman ρ (raw, norm-aware)", f"shared top-{sub.get('k')}",
                           "ROC-AUC raw", "ROC-AUC norm-aware", "norm-aware − raw (paired)", "better"), rows))
        text.append("Here: " + "; ".join(f"{word} on {', '.join(ps)}" for word, ps in better.items()) + ".")
    return "\n\n".join(text)
