"""The paper's claims decided from the API's numbers by explicit rules (the same for any model).

Each ``Verdict`` (``verdicts``) names the claim, the rule (the sentence the page prints), the
outcome (``holds`` / ``partly holds`` / ``does not hold`` / ``not supported over the trivial
baselines`` / ``not applicable here``) and the evidence the rule read. Thresholds are module
constants so tests and the page quote the same numbers.
"""

from __future__ import annotations

import math
from typing import Any

from headgraph.frontend.report.numbers import GRAPH_PAIRINGS, ROLES, TOKENS_K, available, why_missing
from headgraph.frontend.report.recovery import task_verdicts
from headgraph.frontend.report.verdicts import BASELINE_BEATS, FAILS, HOLDS, NA, PARTLY, Verdict

TRIVIAL = ("layer gap", "source variance")  # the validation answer's trivial baselines
KL_MIN = 0.1  # nats: KL(random || model) at least this (the mean shift is reported beside it)
TOKENS_ALPHA = 0.05  # one-sided binomial test of the lists above baseline against the chance level
PATTERN_MIN = 0.4  # a head shows a pattern kind when its score reaches this (the API's describe rule)
INDUCTION_K = 10  # the induction check reads the top-k OK edges by PK


def pairing_distance(reference: dict[str, Any], pairing: str) -> dict[str, Any]:
    """KL(random || model), model and Haar means, Haar std and the shift in Haar std."""
    kl = reference["kl"]
    roles = list(kl["roles"])
    value = kl["kl"][roles.index(pairing[0])][roles.index(pairing[1])]
    hist = kl["histograms"][pairing]
    haar = reference["nulls"][pairing]["summary_haar"]
    shift = (hist["model_mean"] - haar["mean"]) / haar["std"]
    null = reference["nulls"][pairing]
    far = value is not None and value >= KL_MIN
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
        f"a pairing is far when KL(random ‖ model) ≥ {KL_MIN} nats, the paper's measure alone (the "
        "shift of its mean PK in Haar standard deviations and the pairs above each null are reported "
        "beside it, not folded in); holds when OQ, OK and OV all are, partly holds when some are, "
        "does not hold when none is",
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


def pattern_kinds(numbers: dict[str, Any], head: str) -> list[str] | None:
    """Every pattern kind a query head ("L4H7") reaches PATTERN_MIN on (GET /api/patterns scores,
    text and repeated-token prompt sets as the API pools them), highest first; None without
    pattern scores or for an unknown head."""
    p = numbers.get("patterns")
    if not available(p) or not p or "KV" in head or not head.startswith("L") or "H" not in head:
        return None
    try:
        layer, index = (int(x) for x in head[1:].split("H"))
        row = list(p["layer_indices"]).index(layer)
        scores = {k: p["scores"][k][row][index] for k in p["kinds"]}
    except (ValueError, IndexError, KeyError):
        return None
    found = sorted(((v, k) for k, v in scores.items() if v is not None and v >= PATTERN_MIN), reverse=True)
    return [KIND_WORDS.get(str(k), str(k)) for _, k in found]


KIND_WORDS = {"previous_token": "previous-token", "first_token": "sink", "duplicate_token": "duplicate"}


def member_kinds(numbers: dict[str, Any], node: str) -> dict[str, list[str] | None]:
    """{query head: its kinds} of a graph node: the head itself, or every query head of a KV group."""
    nodes = {n["id"]: n for n in numbers["graph"]["graph"]["nodes"]}
    heads = nodes.get(node, {}).get("heads") or node
    members = heads if isinstance(heads, list) else [h.strip() for h in str(heads).split(",") if h.strip()]
    return {h: pattern_kinds(numbers, h) for h in members}


def claim_identity_hub(numbers: dict[str, Any]) -> Verdict:
    """The paper's hub claim: the top query-head hub of its top-20 graph is an identity head."""
    hubs = hub_rows(numbers)
    rule = ("read the top-ranked hub among query heads of the top-20-per-pairing PK graph (hub rule: total "
            "degree > mean + 2 std, or the top node; KV-group hubs, which pool their query heads' edges, "
            f"are listed separately and do not decide) and every pattern kind it reaches {PATTERN_MIN:g} on; "
            "holds when identity is its only kind, partly holds when identity is one of its kinds, does "
            "not hold otherwise; not applicable without pattern scores")
    claim = "The directed head graph has a hub that is an identity head (L4H7 in GPT-2 small)."
    heads = [h for h in hubs if "KV" not in h["name"]]
    groups = [h for h in hubs if "KV" in h["name"]]
    evidence: dict[str, Any] = {"hubs": heads, "kv_hubs": groups}
    if not heads:
        return Verdict("hub", claim, rule, NA, evidence,
                       "the graph has no query-head hub" + (f" (KV-group hubs: {', '.join(g['name'] for g in groups)})"
                                                            if groups else ""))
    top = heads[0]
    kinds = pattern_kinds(numbers, top["name"])
    if kinds is None:
        return Verdict("hub", claim, rule, NA, evidence, "no attention-pattern scores")
    top["kinds"] = kinds
    verdict = HOLDS if kinds == ["identity"] else PARTLY if "identity" in kinds else FAILS
    return Verdict("hub", claim, rule, verdict, evidence,
                   f"top query-head hub {top['name']}: {', '.join(kinds) or 'no kind reaches ' + format(PATTERN_MIN, 'g')}")


def binomial_tail(hits: int, n: int, p: float) -> float:
    """P(X >= hits) for X ~ Binomial(n, p): the one-sided binomial test's p-value (exact, in logs)."""
    if hits <= 0:
        return 1.0
    logs = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * math.log(p)
            + (n - i) * math.log1p(-p) for i in range(hits, n + 1)]
    top = max(logs)
    return min(1.0, math.exp(top) * sum(math.exp(v - top) for v in logs))


def token_shares(numbers: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per role: heads listed, lists above the Haar baseline and above the unembedding-shaped
    baseline (GET /api/tokens?anisotropic=true), its chance level and p-value."""
    out = {}
    for role in ROLES:
        t = numbers["tokens"].get(role)
        if available(t) and t.get("n_above_baseline") is not None:
            a = t.get("anisotropic") or {}
            out[role] = {"above": int(t["n_above_baseline"]), "heads": len(t["heads"]),
                         "above_anisotropic": a.get("n_above"), "chance": a.get("chance"),
                         "p_value": a.get("p_value"), "samples": a.get("samples")}
    return out


def claim_tokens(numbers: dict[str, Any]) -> Verdict:
    """The tokens claim: more head-role token lists beat the unembedding-shaped random baseline
    than chance allows."""
    shares = token_shares(numbers)
    claim = ("Projecting the unembedding onto head subspaces names heads with tokens.")
    k = next((t["k"] for t in numbers["tokens"].values() if available(t)), TOKENS_K)
    samples = next((s["samples"] for s in shares.values() if s.get("samples")), None)
    rule = (f"a head-role's top-{k} token list counts when its mean score is above the 0.95 point of "
            f"{samples or 'n/a'} random planes of its rank drawn with the centred unembedding's covariance "
            "(the API's unembedding-shaped baseline), so a random plane counts with probability 0.05, the "
            "chance level; holds when the count over all Q/K/V/O lists exceeds that chance level by a "
            f"one-sided binomial test at α = {TOKENS_ALPHA:g}, does not hold otherwise (the isotropic Haar "
            "baseline's count is reported beside it)")
    rows = {r: s for r, s in shares.items() if s.get("above_anisotropic") is not None}
    if not rows:
        return Verdict("tokens", claim, rule, NA, {"roles": shares}, "no unembedding or no baseline")
    above = sum(s["above_anisotropic"] for s in rows.values())
    total = sum(s["heads"] for s in rows.values())
    chance = float(next(iter(rows.values()))["chance"])
    p = binomial_tail(above, total, chance)
    return Verdict("tokens", claim, rule, HOLDS if p < TOKENS_ALPHA else FAILS,
                   {"roles": shares, "above": above, "total": total, "share": above / total, "chance": chance,
                    "p_value": p, "above_haar": sum(s["above"] for s in shares.values())},
                   f"{above} of {total} lists ({above / total:.0%}) above the unembedding-shaped baseline, "
                   f"chance {chance:.0%}, binomial p = {p:.2g}")


def paired_rows(validation: dict[str, Any], metric_b: str) -> dict[str, dict[str, Any]]:
    """Per prompt set (text, random; the held-out rows repeat text on half its prompts and do not
    decide), the answer's paired comparison PK - ``metric_b`` (``paired``: difference, interval,
    verdict "A" = PK better / "B" = the other better / "tie")."""
    out = {}
    held = (validation.get("held_out") or {}).get("set")
    for prompts, rows in (validation.get("paired") or {}).items():
        if prompts == held:
            continue
        row = next((d for d in rows if d.get("metric_a") == "PK" and d.get("metric_b") == metric_b), None)
        if row is not None:
            out[prompts] = row
    return out


def paired_pk_cs(validation: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """:func:`paired_rows` of PK - CS."""
    return paired_rows(validation, "CS")


def baseline_checks(validation: dict[str, Any], prompts: list[str]) -> dict[str, dict[str, str]]:
    """{trivial baseline: {prompt set: "PK better" | "no difference" | "<baseline> better"}} on
    ``prompts``, from the paired PK - baseline rows (baselines the answer lacks are left out)."""
    out: dict[str, dict[str, str]] = {}
    for b in TRIVIAL:
        rows = paired_rows(validation, b)
        words = {p: ("PK better" if d["verdict"] == "A" else f"{b} better" if d["verdict"] == "B"
                     else "no difference") for p, d in rows.items() if p in prompts and d.get("verdict")}
        if words:
            out[b] = words
    return out


def claim_pk_beats_cs(numbers: dict[str, Any]) -> Verdict:
    """The PK-over-CS claim, judged against path-ablation effects by the paired rule
    (GET /api/validation's ``paired``: rho(PK) - rho(CS) on the same random pairs), and decided
    against the trivial baselines too: a win over CS that the layer gap or the source's variance
    share matches or beats is "not supported over the trivial baselines"."""
    v = numbers.get("validation")
    claim = ("PK finds the edges that matter better than CS (paper: it recovers the IOI circuit of "
             "GPT-2 small better; here: against path-ablation effects).")
    rule = ("on GET /api/validation, PK's Spearman ρ with the effect minus CS's on the same random pairs, "
            "with a paired bootstrap 95% interval (2,000 resamples), per prompt set: holds when the "
            "interval lies above 0 on every prompt set, partly holds when above 0 on some and holding 0 "
            "on the rest, does not hold when it holds 0 everywhere or lies below 0 on some set; a PK win "
            "is then checked the same way against the trivial baselines (the layer gap and the source "
            "head's variance share): where one of them is better than PK or not distinguishable from it "
            "on a set PK won, the claim is not supported over the trivial baselines; not applicable for "
            "a model that cannot run")
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
    checks = baseline_checks(v, wins)
    not_beaten = {b: {p: w for p, w in sets.items() if w != "PK better"} for b, sets in checks.items()}
    not_beaten = {b: sets for b, sets in not_beaten.items() if sets}
    if verdict in (HOLDS, PARTLY) and not_beaten:
        verdict = BASELINE_BEATS
        words = "; ".join(f"{b}: " + ", ".join(f"{p} {w}" for p, w in sets.items())
                          for b, sets in not_beaten.items())
        because += (f". PK beats CS, but a trivial baseline is not beaten ({words}): not supported over the "
                    "trivial baselines")
    elif wins and checks:
        because += ". PK also beats the trivial baselines (" + ", ".join(checks) + ") where it beats CS"
    return Verdict("pk_vs_cs", claim, rule, verdict,
                   {"paired": paired, "pk_better_on": wins, "cs_better_on": losses, "power": v.get("power"),
                    "baselines": checks, "baselines_not_beaten": not_beaten},
                   because)


def induction_rows(numbers: dict[str, Any]) -> list[dict[str, Any]]:
    """The ablated top OK edges, each with its source's kinds and every target query head's kinds
    (a KV group: each member's own), and whether it is previous-token -> induction."""
    a = numbers.get("ablation")
    out = []
    for rank, e in enumerate((a or {}).get("edges") or [], start=1):
        src = pattern_kinds(numbers, e["source"])
        tgt = member_kinds(numbers, e["target"])
        known = src is not None and tgt and all(v is not None for v in tgt.values())
        out.append({**e, "rank": rank, "source_kinds": src, "target_kinds": tgt,
                    "prev_to_induction": bool(known and "previous-token" in (src or [])
                                              and all("induction" in (v or []) for v in tgt.values())),
                    "kinds_known": bool(known)})
    return out


def induction_check(numbers: dict[str, Any]) -> Verdict:
    """Beyond the paper: PK's top OK edges hold the induction circuit and ablation verifies it."""
    a = numbers.get("ablation")
    claim = "PK's strongest OK edges hold the induction circuit (a previous-token head feeding induction keys)."
    rule = (f"over the top-{INDUCTION_K} OK edges by PK (GET /api/ablation): an edge is previous-token → induction "
            f"when its source reaches {PATTERN_MIN:g} on the previous-token pattern and every query head of its "
            "target does on induction (a KV group inherits no member's kind); holds when at least one such edge "
            "is verified (above the random-pair null), partly holds when such edges are there but none is "
            "verified, does not hold when there is none")
    if not available(a) or not a or not a["edges"]:
        return Verdict("induction", claim, rule, NA, {}, why_missing(a, "no path ablation for this model"))
    rows = induction_rows(numbers)
    if not any(r["kinds_known"] for r in rows):
        return Verdict("induction", claim, rule, NA, {"edges": rows}, "no attention-pattern scores")
    hits = [r for r in rows if r["prev_to_induction"]]
    verified = [r for r in hits if r["verdict"] == "verified"]
    verdict = HOLDS if verified else PARTLY if hits else FAILS
    first = (verified or hits or [None])[0]
    refused = [r for r in hits if r["verdict"] == "null too small"]
    because = (f"{len(hits)} of the top-{len(rows)} are previous-token → induction, {len(verified)} verified"
               + (f" ({len(refused)} without a verdict: the random-pair null is too small to resolve its "
                  "quantile)" if refused else "")
               + (f"; first: #{first['rank']} {first['source']} → {first['target']} ({first['verdict']})" if first else ""))
    return Verdict("induction", claim, rule, verdict, {"edges": rows, "hits": len(hits), "verified": len(verified)},
                   because)


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
    """Every claim's verdict, in the page's order: the paper's claims on the head graph, then
    PK against CS at recovering each bundled task's circuit (``recovery.task_verdicts``)."""
    return [claim_far_from_random(numbers), claim_identity_hub(numbers), claim_tokens(numbers),
            claim_pk_beats_cs(numbers), induction_check(numbers), *task_verdicts(numbers)]
