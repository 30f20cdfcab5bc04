"""The findings page's recovery sections (the paper's Tables 1 and 2) from GET /api/recovery: of the
model's label set (``label_section``), and of each bundled task's circuit (``task_section``), where
the paper's own test of PK against CS is decided by a stated rule (``task_verdicts``).

The paired differences are the API's (metric − PK on the same head-cluster bootstrap resamples);
nothing is recomputed here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from headgraph.frontend.report.numbers import available, why_missing
from headgraph.frontend.report.text import fmt, fmt_ci, table
from headgraph.frontend.report.verdicts import BASELINE_BEATS, FAILS, HOLDS, MARK, NA, PARTLY, Verdict

TITLE = "Recovery of task circuits"
CHALLENGER = "cs"  # the metric the paper compares PK with
BASELINES = ("layer_gap", "random")  # the recovery table's trivial baselines
CLAIM = ("PK recovers a task's circuit better than CS (the paper: the IOI circuit of GPT-2 small): its ranking "
         "of head pairs puts the circuit's head → head edges higher.")
RULE = ("on GET /api/recovery against the task's circuit, per pairing (OQ, OK, OV) with reference edges: "
        "ROC-AUC(CS) − ROC-AUC(PK) over all valid forward pairs with its paired 95% head-cluster bootstrap "
        "interval (heads resampled, the same resamples for both); PK is better on a pairing when the interval "
        "lies below 0, CS when above 0, neither when it holds 0; holds when PK is better on every such pairing, "
        "partly holds when on some and neither on the rest, does not hold when CS is better on one or PK on "
        "none; a PK win is then checked the same way against the table's trivial baselines (the layer gap and "
        "a seeded random ranking): where one of them is not beaten on a pairing PK won, the claim is not "
        "supported over the trivial baselines; not applicable for a task the model does not do or has too few "
        "prompt pairs to tell (GET /api/circuit's able, its metrics.ability: a model does a task when two "
        "one-sided exact sign tests over the task's prompt pairs, a pair and its mirror one unit, both give "
        "p ≤ 0.05: on clean prompts the answer beats the distractor, and clean minus corrupt logit difference "
        "is positive, each more often than chance; under 5 units, too few pairs to tell), a circuit with no "
        "head → head edge on these pairings, or a model that cannot run")


def _signed(est: dict[str, Any] | None) -> str:
    """A paired difference ``{value, low, high}`` as '+v [+low, +high]' (3 decimals)."""
    if not est or est.get("value") is None or est.get("low") is None or est.get("high") is None:
        return "n/a"
    return f"{est['value']:+.3f} [{est['low']:+.3f}, {est['high']:+.3f}]"


def side(est: dict[str, Any] | None) -> str | None:
    """The paired rule on one interval of metric − PK: "A" (PK better: it lies below 0), "B" (the
    metric better: above 0), "tie" (it holds 0), None (undefined)."""
    if not est or est.get("low") is None or est.get("high") is None:
        return None
    return "A" if est["high"] < 0 else "B" if est["low"] > 0 else "tie"


def _row(data: dict[str, Any], metric: str) -> dict[str, Any] | None:
    return next((r for r in data.get("rows") or [] if r["metric"] == metric), None)


def pairing_sides(data: dict[str, Any]) -> dict[str, Any]:
    """One pairing's answer read by the rule: PK against CS and against each trivial baseline."""
    cs = _row(data, CHALLENGER) or {}
    return {"cs": side(cs.get("auc_diff")), "cs_diff": cs.get("auc_diff"),
            "baselines": {b: side((_row(data, b) or {}).get("auc_diff")) for b in BASELINES if _row(data, b)}}


def why(answer: dict[str, Any] | None, otherwise: str) -> str:
    """Why an answer is missing: a failed request's error as it is, else ``why_missing``."""
    if isinstance(answer, dict) and answer.get("failure"):
        return str(answer["unavailable"])
    return why_missing(answer, otherwise)


def doing(metrics: dict[str, Any]) -> str:
    """A task's metrics in words: clean accuracy, the clean and corrupt logit differences and the
    two sign tests behind ``able`` (their p-values, the units they read)."""
    acc = metrics.get("clean_accuracy")
    a = metrics.get("ability") or {}
    tests = "" if not a else (
        f"; sign tests over {a.get('n_units')} units of {a.get('n_pairs')} prompt pairs: answer beats distractor "
        f"p = {_p((a.get('answer') or {}).get('p'))}, clean above corrupt p = {_p((a.get('follows') or {}).get('p'))}")
    return (f"clean accuracy {'n/a' if acc is None else format(acc, '.0%')}, mean logit difference "
            f"{fmt(metrics.get('clean'))} clean vs {fmt(metrics.get('corrupt'))} corrupt{tests}")


def _p(p: Any) -> str:
    return "n/a" if p is None else format(p, ".2g")


def not_doing(metrics: dict[str, Any]) -> str:
    """Why a task's circuit is not read: the model does not do it, or too few pairs to tell."""
    if metrics.get("able") is None and metrics.get("ability"):
        return f"too few prompt pairs to tell whether the model does this task ({doing(metrics)})"
    return f"the model does not do this task ({doing(metrics)})"


def task_verdict(name: str, entry: dict[str, Any]) -> Verdict:
    """The rule (RULE) on one task's circuit answer and recovery answers."""
    claim = (f"PK recovers the {name} circuit's head → head edges better than CS (the paper's test, there on "
             "the IOI circuit of GPT-2 small).")
    title, key = f"PK against CS on the {name} circuit", f"circuit_{name}"
    circuit = entry.get("circuit")
    if not available(circuit) or not circuit:
        return Verdict(key, claim, RULE, NA, {}, why(circuit, "no circuit"), title)
    metrics = circuit.get("metrics") or {}
    if not metrics.get("able"):
        return Verdict(key, claim, RULE, NA, {"metrics": metrics},
                       not_doing(metrics).replace("this task", "the task"), title)
    answers = entry.get("pairings") or {}
    sides = {p: pairing_sides(d) for p, d in answers.items() if available(d) and d and d.get("n_reference")}
    decided = {p: s for p, s in sides.items() if s["cs"] is not None}
    if not decided:
        return Verdict(key, claim, RULE, NA, {"sides": sides}, _refusals(answers, sides), title)
    wins = [p for p, s in decided.items() if s["cs"] == "A"]
    losses = [p for p, s in decided.items() if s["cs"] == "B"]
    verdict = FAILS if losses or not wins else HOLDS if len(wins) == len(decided) else PARTLY
    words = {"A": "PK better", "B": "CS better", "tie": "no difference"}
    because = "; ".join(f"{p}: CS − PK = {_signed(s['cs_diff'])} ({words[s['cs']]})" for p, s in decided.items())
    not_beaten = {b: [p for p in wins if decided[p]["baselines"].get(b) != "A"] for b in BASELINES}
    not_beaten = {b: ps for b, ps in not_beaten.items() if ps}
    if verdict in (HOLDS, PARTLY) and not_beaten:
        verdict = BASELINE_BEATS
        because += ("; PK beats CS, but a trivial baseline is not beaten (" + "; ".join(
            f"{b} on {', '.join(ps)}" for b, ps in not_beaten.items()) + "): not supported over the trivial baselines")
    elif wins:
        because += f"; PK also beats {' and '.join(BASELINES)} where it beats CS"
    return Verdict(key, claim, RULE, verdict, {"sides": sides, "pk_better_on": wins, "cs_better_on": losses,
                                               "baselines_not_beaten": not_beaten}, because, title)


def _refusals(answers: dict[str, Any], sides: dict[str, Any]) -> str:
    """Why no pairing decides: the API's refusals (one sentence when they differ only in the
    pairing's name) and the pairings without a reference edge."""
    refused = {p: str((d or {}).get("unavailable", "no answer")) for p, d in answers.items()
               if not available(d) or not d}
    shapes = {m.replace(f" {p} ", " \0 ") for p, m in refused.items()}
    words = ([f"{', '.join(refused)}: " + shapes.pop().replace("\0", "/".join(refused))] if len(shapes) == 1
             else [f"{p}: {m}" for p, m in refused.items()])
    words += [f"{p}: no reference edge" for p, d in answers.items() if p not in refused and p not in sides]
    return "; ".join(words) or "no pairing's difference is defined"


def task_verdicts(numbers: dict[str, Any]) -> list[Verdict]:
    """One verdict per bundled task (none when the task stage was not collected)."""
    tasks = numbers.get("tasks")
    if not tasks:
        return []
    if not available(tasks):
        return [Verdict("circuits", CLAIM, RULE, NA, {}, why(tasks, "no tasks"), "PK against CS on task circuits")]
    return [task_verdict(name, entry) for name, entry in (tasks.get("tasks") or {}).items()]


def recovery_table(data: dict[str, Any]) -> str:
    """Every metric's row of one recovery answer: endpoint share, precision@k and ROC-AUC with their
    intervals, and the paired differences to PK."""
    k = data["k"]
    rows = [(r["metric"], fmt_ci(r["endpoint_share"]), fmt_ci(r["precision"]), fmt_ci(r["auc"]),
             "—" if r["precision_diff"] is None else _signed(r["precision_diff"]),
             "—" if r["auc_diff"] is None else _signed(r["auc_diff"])) for r in data["rows"]]
    return table(("metric", f"endpoint share (top-{k})", f"precision@{k}", "ROC-AUC",
                  f"precision@{k} − PK (paired)", "ROC-AUC − PK (paired)"), rows)


def label_section(numbers: dict[str, Any]) -> str:
    """The recovery tables (the paper's Tables 1 and 2) of the model's label set, per pairing."""
    rec = numbers.get("recovery") or {}
    text = ["## 6. Recovery of the model's label set (the paper's Tables 1 and 2)"]
    if not rec:
        return "\n\n".join([*text, "Not collected."])
    text.append(f"Reference: the heads of the label set `{rec['labels']}`; an edge is in it when both its "
                f"heads are. Per metric over all valid forward pairs: the share of its top-{rec['k']} edges' "
                "endpoints on reference heads (Table 1), precision@k, and ROC-AUC at separating reference "
                "edges (Table 2), with 95% head-cluster bootstrap intervals (heads resampled: the label is a "
                "head's); the last column is the paired difference to PK on the same resamples (layer gap "
                "and random are trivial baselines).")
    for pairing, data in (rec.get("pairings") or {}).items():
        if not available(data) or not data:
            text.append(f"**{pairing}**: not available: {(data or {}).get('unavailable', 'no answer')}.")
            continue
        head = (f"**{pairing}**: {data['n_reference']} of {data['n_valid']} valid pairs join two of its "
                f"{len(data['reference_heads'])} heads (base rate {fmt(data['base_rate'], 2)}).")
        if not data["n_reference"]:
            text.append(head + " The label set names no edge of this pairing: nothing to recover.")
            continue
        rows = [(r["metric"], fmt_ci(r["endpoint_share"]), fmt_ci(r["precision"]), fmt_ci(r["auc"]),
                 "—" if r["auc_diff"] is None else _signed_2(r["auc_diff"])) for r in data["rows"]]
        text.append(head)
        text.append(table(("metric", f"endpoint share (top-{data['k']})", f"precision@{data['k']}", "ROC-AUC",
                           "ROC-AUC − PK (paired)"), rows))
    return "\n\n".join(text)


def _signed_2(est: dict[str, Any]) -> str:
    return "n/a" if est.get("value") is None else f"{est['value']:+.2f} [{est['low']:+.2f}, {est['high']:+.2f}]"


def _best(data: dict[str, Any]) -> str:
    """The metric with the highest ROC-AUC point estimate (ties named together)."""
    aucs = {r["metric"]: r["auc"]["value"] for r in data["rows"] if r["auc"].get("value") is not None}
    if not aucs:
        return "n/a"
    top = max(aucs.values())
    return f"{', '.join(m for m, a in aucs.items() if a == top)} ({fmt(top, 3)})"


def _task_text(name: str, entry: dict[str, Any], v: Verdict | None) -> list[str]:
    """One task's part of the section: the circuit, the verdict, a table per pairing."""
    text = [f"### Task `{name}`"]
    if entry.get("description"):
        text.append(f"{entry['description'][0].upper() + entry['description'][1:]} ({entry.get('n_rows')} prompt pairs).")
    circuit = entry.get("circuit")
    if not available(circuit) or not circuit:
        text.append(f"No circuit: {why(circuit, 'not computed')}.")
        return text
    metrics = circuit.get("metrics") or {}
    if not metrics.get("able"):
        words = not_doing(metrics)  # the rule: the section's
        text.append(f"{words[0].upper()}{words[1:]}, so its circuit explains little and there is no table.")
        return text
    answers = entry.get("pairings") or {}
    ref = next((d["circuit"] for d in answers.values() if available(d) and d and d.get("circuit")), None)
    steps = f", {circuit['steps']} steps" if circuit.get("method") == "eap-ig" else ""
    size = (f"the top {ref['size']} of {ref['n_edges']} edges ({ref['rule'].split(': ', 1)[-1]}; it recovers "
            f"{fmt(ref.get('recovered'), 2)} of the gap), {ref['n_head_edges']} of them head → head"
            if ref else f"the top {circuit.get('circuit_size')} of {circuit.get('n_edges')} edges (the smallest "
            f"reaching {fmt(circuit.get('share'), 2)} of the metric gap)")
    text.append(f"The model does the task ({doing(metrics)}). Its {circuit.get('method')} circuit{steps}: {size}.")
    if v is not None:
        text.append(f"**Verdict: {MARK[v.verdict]}** ({v.because}).")
    if not any(available(d) and d for d in answers.values()):  # the verdict says why, if there is one
        return text if v is not None else [*text, f"No table: {_refusals(answers, {})}."]
    best = []
    for pairing, data in answers.items():
        if not available(data) or not data:
            text.append(f"**{pairing}**: not available: {(data or {}).get('unavailable', 'no answer')}.")
            continue
        heads = {h for e in data.get("reference_edges") or [] for h in e.split(" -> ")}
        text.append(f"**{pairing}**: {data['n_reference']} of {data['n_valid']} valid pairs are circuit edges "
                    f"(base rate {fmt(data['base_rate'], 2)}), joining {len(heads)} heads.")
        text.append(recovery_table(data))
        best.append(f"{pairing}: {_best(data)}")
    if best:
        text.append("Highest ROC-AUC (point estimate; the paired column says which differences the resamples "
                    "support): " + "; ".join(best) + ".")
    return text


def task_section(numbers: dict[str, Any], verdicts: Sequence[Verdict], number: int = 8) -> str:
    """Each bundled task's circuit and every metric's recovery of it, with the PK-vs-CS verdict;
    why not, where a stage could not run."""
    text = [f"## {number}. {TITLE}"]
    tasks = numbers.get("tasks")
    if not tasks:
        return "\n\n".join([*text, "Not collected."])
    if not available(tasks):
        return "\n\n".join([*text, f"Not available: {why(tasks, 'no tasks')}."])
    k = tasks.get("k")
    text.append("The paper's own test of PK against CS: how well each metric's ranking of head pairs recovers a "
                "behaviour's circuit. Per bundled task (GET /api/tasks), its circuit by edge attribution "
                "(GET /api/circuit) is the reference: its head → head edges into the pairing's input (Q, K or V; "
                "a KV head's on a grouped-query model) among the smallest circuit on the faithfulness curve "
                "reaching 0.8 of the metric gap. Per metric over all valid forward pairs (GET /api/recovery?task=): "
                f"the share of its top-{k} edges' endpoints on the circuit's heads, precision@{k} and ROC-AUC, "
                "with 95% head-cluster bootstrap intervals (heads resampled), and the paired differences to PK on "
                "the same resamples (layer_gap and random are trivial baselines).")
    text.append(f"**Claim.** {CLAIM}\n\n**Rule.** {RULE[0].upper() + RULE[1:]}.")
    by_key = {v.key: v for v in verdicts}
    for name, entry in (tasks.get("tasks") or {}).items():
        text += _task_text(name, entry, by_key.get(f"circuit_{name}"))
    return "\n\n".join(text)
