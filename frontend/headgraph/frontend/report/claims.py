"""The paper's claims decided from the API's numbers by explicit rules (the same for any model).

Each ``Verdict`` names the claim, the rule (the sentence the page prints), the outcome
(``holds`` / ``partly holds`` / ``does not hold`` / ``not applicable here``) and the evidence
the rule read. Thresholds are module constants so tests and the page quote the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from headgraph.frontend.report.numbers import GRAPH_PAIRINGS, ROLES, TOKENS_K, available, why_missing

HOLDS, PARTLY, FAILS, NA = "holds", "partly holds", "does not hold", "not applicable here"
KL_MIN = 0.1  # nats: KL(random || model) at least this ...
SHIFT_MIN_STD = 2.0  # ... and the model's mean PK at least this many Haar std from the Haar mean
TOKENS_SHARE_MIN = 0.5  # most head-role token lists above the random-subspace baseline


@dataclass(frozen=True)
class Verdict:
    key: str
    claim: str
    rule: str
    verdict: str
    evidence: dict[str, Any] = field(default_factory=dict)
    because: str = ""


def pairing_distance(reference: dict[str, Any], pairing: str) -> dict[str, Any]:
    """KL(random || model), model and Haar means, Haar std and the shift in Haar std."""
    kl = reference["kl"]
    roles = list(kl["roles"])
    value = kl["kl"][roles.index(pairing[0])][roles.index(pairing[1])]
    hist = kl["histograms"][pairing]
    haar = reference["nulls"][pairing]["summary_haar"]
    shift = (hist["model_mean"] - haar["mean"]) / haar["std"]
    null = reference["nulls"][pairing]
    far = value is not None and value >= KL_MIN and abs(shift) >= SHIFT_MIN_STD
    return {"pairing": pairing, "kl": value, "model_mean": hist["model_mean"],
            "haar_mean": haar["mean"], "haar_std": haar["std"], "shift_std": shift, "far": far,
            "valid_pairs": null["valid_pairs"], "significant_haar": null["significant_haar"],
            "significant_anisotropic": null["significant"]}


def claim_far_from_random(numbers: dict[str, Any]) -> Verdict:
    """The paper's KL claim over the graph pairings OQ, OK, OV (evidence: ``pairing_distance`` rows)."""
    rows = [pairing_distance(numbers["reference"], p) for p in GRAPH_PAIRINGS]
    n_far = sum(r["far"] for r in rows)
    verdict = HOLDS if n_far == len(rows) else PARTLY if n_far else FAILS
    far = [r["pairing"] for r in rows if r["far"]]
    return Verdict(
        "kl", "Each pairing's PK distribution is far from that of random subspaces (KL against "
        "the Haar null, E[PK] = m²/d).",
        f"a pairing is far when KL(random ‖ model) ≥ {KL_MIN} nats and its mean PK lies at least "
        f"{SHIFT_MIN_STD:g} Haar standard deviations from the Haar mean; holds when OQ, OK and OV "
        "all are, partly holds when some are, does not hold when none is",
        verdict, {"pairings": rows}, f"far: {', '.join(far) or 'none'}")


def _kinds(description: str | None) -> list[str]:
    """The pattern kinds of a description (a KV group joins its heads' with '/')."""
    return [k.strip() for k in (description or "").split("/") if k.strip()]


def hub_rows(numbers: dict[str, Any]) -> list[dict[str, Any]]:
    """The hub rule's hubs (graph rows flagged is_hub), with which pairings reach each."""
    graph = numbers["graph"]
    edges = graph["graph"].get("edges", graph["graph"].get("links", []))
    nodes = {n["id"]: n for n in graph["graph"]["nodes"]}
    out = []
    for row in graph["hubs"]["rows"]:
        if not row["is_hub"]:
            continue
        by = {p: {"in": 0, "out": 0} for p in GRAPH_PAIRINGS}
        for e in edges:
            p = e.get("pairing", e.get("key"))
            if p in by and e["target"] == row["name"]:
                by[p]["in"] += 1
            if p in by and e["source"] == row["name"]:
                by[p]["out"] += 1
        node = nodes.get(row["name"], {})
        out.append({**row, "edges_by_pairing": by, "members": node.get("heads", row["name"]),
                    "kind": node.get("kind")})
    return out


def claim_identity_hub(numbers: dict[str, Any]) -> Verdict:
    """The paper's hub claim: the top hub of its top-20 graph is an identity head."""
    hubs = hub_rows(numbers)
    rule = ("read the top-ranked hub of the top-20-per-pairing PK graph (hub rule: total degree "
            "> mean + 2 std, or the top node) and its heads' pattern description; holds when the "
            "description is identity alone, partly holds when identity is one of the kinds its "
            "heads show, does not hold otherwise; not applicable without pattern scores")
    claim = "The directed head graph has a hub that is an identity head (L4H7 in GPT-2 small)."
    if not hubs:
        return Verdict("hub", claim, rule, NA, {"hubs": []}, "the graph has no hub")
    top = hubs[0]
    kinds = _kinds(top.get("description"))
    if top.get("description") is None:
        return Verdict("hub", claim, rule, NA, {"hubs": hubs}, "no attention-pattern scores")
    verdict = HOLDS if kinds == ["identity"] else PARTLY if "identity" in kinds else FAILS
    return Verdict("hub", claim, rule, verdict, {"hubs": hubs},
                   f"top hub {top['name']}: {top['description']}")


def token_shares(numbers: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Per role: heads listed and how many lists are above the random-subspace baseline."""
    out = {}
    for role in ROLES:
        t = numbers["tokens"].get(role)
        if available(t) and t.get("n_above_baseline") is not None:
            out[role] = {"above": int(t["n_above_baseline"]), "heads": len(t["heads"])}
    return out


def claim_tokens(numbers: dict[str, Any]) -> Verdict:
    """The tokens claim: most head-role token lists beat the random-subspace baseline."""
    shares = token_shares(numbers)
    claim = ("Projecting the unembedding onto head subspaces names heads with tokens.")
    k = next((t["k"] for t in numbers["tokens"].values() if available(t)), TOKENS_K)
    rule = (f"a head-role's top-{k} token list counts when its mean score is above "
            "the 95% quantile of Haar-random subspaces of the same rank (the API's baseline); holds "
            f"when at least {TOKENS_SHARE_MIN:.0%} of all Q/K/V/O lists count, does not hold otherwise")
    if not shares:
        return Verdict("tokens", claim, rule, NA, {}, "no unembedding or no baseline")
    above = sum(s["above"] for s in shares.values())
    total = sum(s["heads"] for s in shares.values())
    share = above / total
    return Verdict("tokens", claim, rule, HOLDS if share >= TOKENS_SHARE_MIN else FAILS,
                   {"roles": shares, "above": above, "total": total, "share": share},
                   f"{above} of {total} lists ({share:.0%}) above the random baseline")


def paired_pk_cs(validation: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per prompt set, the answer's paired comparison PK - CS (``paired``: difference, interval,
    verdict "A" = PK better / "B" = CS better / "tie")."""
    out = {}
    for prompts, rows in (validation.get("paired") or {}).items():
        row = next((d for d in rows if d.get("metric_a") == "PK" and d.get("metric_b") == "CS"), None)
        if row is not None:
            out[prompts] = row
    return out


def claim_pk_beats_cs(numbers: dict[str, Any]) -> Verdict:
    """The PK-over-CS claim, judged against path-ablation effects by the paired rule
    (GET /api/validation's ``paired``: rho(PK) - rho(CS) on the same random pairs)."""
    v = numbers.get("validation")
    claim = ("PK finds the edges that matter better than CS (paper: it recovers the IOI circuit of "
             "GPT-2 small better; here: against path-ablation effects).")
    rule = ("on GET /api/validation, PK's Spearman ρ with the effect minus CS's on the same random pairs, "
            "with a paired bootstrap 95% interval (2,000 resamples), per prompt set: holds when the "
            "interval lies above 0 on every prompt set, partly holds when above 0 on some and holding 0 "
            "on the rest, does not hold when it holds 0 everywhere or lies below 0 on some set; not "
            "applicable for a model that cannot run")
    if not available(v) or not v or not v.get("summary"):
        return Verdict("pk_vs_cs", claim, rule, NA, {}, why_missing(v, "no path ablation for this model"))
    paired = paired_pk_cs(v)
    decided = {p: d for p, d in paired.items() if d.get("verdict") is not None}
    if not decided:
        because = ("the validation answer has no paired PK − CS comparison (computed before the paired "
                   "rule, or ρ undefined)")
        return Verdict("pk_vs_cs", claim, rule, NA, {"paired": paired, "power": v.get("power")}, because)
    wins = [p for p, d in decided.items() if d["verdict"] == "A"]
    losses = [p for p, d in decided.items() if d["verdict"] == "B"]
    verdict = (FAILS if losses or not wins else HOLDS if len(wins) == len(decided) else PARTLY)
    because = "; ".join(f"{p}: PK − CS = {d['difference']:+.2f} [{d['low']:+.2f}, {d['high']:+.2f}] "
                        f"(n = {d['n']}, {'PK better' if d['verdict'] == 'A' else 'CS better' if d['verdict'] == 'B' else 'no difference'})"
                        for p, d in decided.items())
    return Verdict("pk_vs_cs", claim, rule, verdict,
                   {"paired": paired, "pk_better_on": wins, "cs_better_on": losses, "power": v.get("power")},
                   because)


def induction_check(numbers: dict[str, Any]) -> Verdict:
    """Beyond the paper: the top OK edge by PK is previous-token -> induction and ablation verifies it."""
    a = numbers.get("ablation")
    claim = "PK's strongest OK edge is the induction circuit (a previous-token head feeding induction keys)."
    rule = ("the top OK edge by PK (GET /api/ablation top 1) holds when its source's pattern "
            "description includes previous-token, its target's includes induction and the "
            "path-ablation verdict is verified; does not hold otherwise")
    if not available(a) or not a or not a["edges"]:
        return Verdict("induction", claim, rule, NA, {}, why_missing(a, "no path ablation for this model"))
    edge = a["edges"][0]
    nodes = {n["id"]: n for n in numbers["graph"]["graph"]["nodes"]}
    src = nodes.get(edge["source"], {}).get("description")
    tgt = nodes.get(edge["target"], {}).get("description")
    if src is None or tgt is None:
        return Verdict("induction", claim, rule, NA, {"edge": edge}, "no attention-pattern scores")
    ok = "previous-token" in _kinds(src) and "induction" in _kinds(tgt) and edge["verdict"] == "verified"
    return Verdict("induction", claim, rule, HOLDS if ok else FAILS,
                   {"edge": edge, "source_description": src, "target_description": tgt},
                   f"{edge['source']} ({src}) → {edge['target']} ({tgt}), {edge['verdict']}")


def sink_edges(numbers: dict[str, Any]) -> dict[str, Any]:
    """Among the ablated top OK edges: those leaving an attention-sink head and their verdicts."""
    a = numbers.get("ablation")
    sinks = set((numbers["graph"].get("flags") or {}).get("sinks") or [])
    if not available(a) or not a:
        return {"measured": False, "sinks": sorted(sinks)}
    rows = [e for e in a["edges"] if e["source"] in sinks]
    return {"measured": True, "sinks": sorted(sinks), "n_edges": len(a["edges"]),
            "sink_edges": rows, "no_effect": sum(e["verdict"] == "no effect" for e in rows)}


def all_verdicts(numbers: dict[str, Any]) -> list[Verdict]:
    """Every claim's verdict, in the page's order."""
    return [claim_far_from_random(numbers), claim_identity_hub(numbers), claim_tokens(numbers),
            claim_pk_beats_cs(numbers), induction_check(numbers)]
