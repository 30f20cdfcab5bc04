"""The findings page: markdown text from the API's numbers, the claims' verdicts and the charts.

Every number printed is read from ``numbers`` (API answers) or a ``Verdict``'s evidence and
formatted by ``fmt``; nothing is typed by hand, so a rerun on another model or cache says what
that model measures. The page is deterministic (no date), so regenerating an unchanged model
leaves the committed file unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from headgraph.frontend.figures.palette import NO_CLASS
from headgraph.frontend.report.charts import Chart, report_palette
from headgraph.frontend.report.claims import PATTERN_MIN, induction_rows, pattern_kinds, sink_edges
from headgraph.frontend.report.numbers import available
from headgraph.frontend.report.recovery import label_section, task_section
from headgraph.frontend.report.subspaces import subspaces_section
from headgraph.frontend.report.text import fmt, fmt_ci, table
from headgraph.frontend.report.verdicts import BASELINE_BEATS, FAILS, HOLDS, MARK, NA, PARTLY, Verdict, opening
INDEX_TITLE = "# Findings reports"
TITLES = {"kl": "Far from random subspaces (KL)", "hub": "An identity-head hub",
          "tokens": "Heads named by tokens", "pk_vs_cs": "PK against CS on what matters",
          "induction": "The induction circuit (a check beyond the paper)"}


def slug(model: str) -> str:
    """A file-name-safe form of a model id ('Qwen/Qwen2-0.5B' -> 'Qwen-Qwen2-0.5B')."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", model).strip("-.") or "model"


def code(text: str) -> str:
    """``text`` as a markdown code span (outside tables) that survives backticks, newlines and
    blanks in tokens."""
    text = text.replace("\n", "\\n")
    fence = "``" if "`" in text else "`"
    pad = " " if text.startswith("`") or text.endswith("`") or text != text.strip() else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def figure(folder: str, chart: Chart) -> str:
    """A chart as a markdown image (alt: its file stem) with its caption under it."""
    return f"![{chart.name.removesuffix('.png')}]({folder}/{chart.name})\n\n*{chart.caption}*"


def model_section(numbers: dict[str, Any]) -> str:
    """The model's shape, weights and where the numbers came from."""
    info = numbers["info"]["info"]
    kv = info.get("n_kv_heads")
    rows = [("architecture", info.get("architecture")), ("layers", info.get("n_layers")),
            ("query heads per layer", info.get("n_heads")),
            ("KV heads per layer", f"{kv} (grouped-query)" if kv and kv != info.get("n_heads") else kv),
            ("d_model / d_head", f"{info.get('d_model')} / {info.get('d_head')}"),
            ("vocabulary", info.get("d_vocab")), ("weights", info.get("source")),
            ("quantization", info.get("quantization") or "none"), ("processing", info.get("processing")),
            ("fingerprint", f"`{numbers['info'].get('fingerprint')}`")]
    version = (numbers.get("health") or {}).get("version")
    return ("## The model\n\n" + table(("", ""), [(k, "n/a" if v is None else v) for k, v in rows])
            + f"\n\nNumbers read from the headgraph API (server version {version or 'n/a'}); "
            "figures drawn by the dashboard's own figure code.")


def summary_section(verdicts: Sequence[Verdict]) -> str:
    """The verdict table and, in words, where the claims hold and where they do not."""
    rows = [(v.claim, MARK[v.verdict], v.because) for v in verdicts]
    holds = [v for v in verdicts if v.verdict == HOLDS]
    partly = [v for v in verdicts if v.verdict == PARTLY]
    fails = [v for v in verdicts if v.verdict == FAILS]
    trivial = [v for v in verdicts if v.verdict == BASELINE_BEATS]
    na = [v for v in verdicts if v.verdict == NA]

    def names(vs: Sequence[Verdict]) -> str:
        return "; ".join(f"{(v.title or TITLES[v.key]).split(' (')[0]} ({v.because})" for v in vs)
    lines = []
    if holds:
        lines.append(f"- **Holds here:** {names(holds)}.")
    if partly:
        lines.append(f"- **Holds only in part:** {names(partly)}.")
    if fails:
        lines.append(f"- **Does not hold here:** {names(fails)}.")
    if trivial:
        lines.append(f"- **Not supported over the trivial baselines** (a layer gap or source-variance ranking "
                     f"does as well): {names(trivial)}.")
    if na:
        lines.append(f"- **Could not be tested here:** {names(na)}.")
    return ("## Verdicts\n\nEach claim is decided by the rule printed in its section, the same rule for "
            "every model (`headgraph.frontend.report.claims`).\n\n"
            + table(("claim", "verdict", "measured"), rows) + "\n\n" + "\n".join(lines))


def kl_section(v: Verdict, charts: dict[str, Chart], folder: str) -> str:
    """KL claim: per-pairing distances, the direction of each shift, the null's qualifier, figures."""
    rows = [(r["pairing"], fmt(r["kl"]), fmt(r["model_mean"]), f"{fmt(r['haar_mean'])} ± {fmt(r['haar_std'])}",
             fmt(r["shift_std"]), "yes" if r["far"] else "no",
             f"{r['significant_haar']} / {r['valid_pairs']}", f"{r['significant_anisotropic']} / {r['valid_pairs']}")
            for r in v.evidence["pairings"]]
    text = [f"## 1. {TITLES['kl']}", opening(v),
            table(("pairing", "KL(random ‖ model)", "model mean PK", "Haar mean ± std", "shift (Haar std)",
                   "far", "pairs above Haar 95%", "pairs above anisotropic null"), rows)]
    below = [r["pairing"] for r in v.evidence["pairings"] if r["far"] and r["shift_std"] < 0]
    if below:
        text.append(f"Far is not always *more aligned*: {', '.join(below)} {'is' if len(below) == 1 else 'are'} "
                    "far from random because the model's mean PK lies *below* the Haar mean (its head "
                    "subspaces overlap less than random planes would), not above it.")
    small = [r for r in v.evidence["pairings"] if r["far"] and abs(r["shift_std"]) < 2]
    for r in small:
        text.append(f"{r['pairing']} is far by KL ({fmt(r['kl'])}) while its mean PK lies only "
                    f"{fmt(abs(r['shift_std']))} Haar std from the random mean: its distribution differs from "
                    "random in spread or shape more than in where it is centred (reported, not part of the rule).")
    text.append("The last two columns are the honest qualifier: the Haar null draws planes uniformly in "
                "R^d, while a trained model's weights live in an anisotropic part of it. The "
                "anisotropy-aware null draws planes where this model's weights live; the pairs still "
                "above it are the ones the weights single out beyond that anisotropy.")
    text += [figure(folder, charts[n]) for n in ("kl.png", "reference-OQ.png", "reference-OK.png",
                                                  "reference-OV.png") if n in charts]
    return "\n\n".join(text)


def hub_section(v: Verdict, numbers: dict[str, Any], charts: dict[str, Chart], folder: str) -> str:
    """Hub claim: the hub table, the API's hub and description rules, the graph figure."""
    hubs = v.evidence.get("hubs", [])

    def kinds(name: str) -> str:
        found = pattern_kinds(numbers, name)
        return "not measured" if found is None else ", ".join(found) or f"none ≥ {PATTERN_MIN:g}"
    rows = [(h["name"], h["degree"], h["in_degree"], h["out_degree"],
             ", ".join(f"{p} {c['in']}/{c['out']}" for p, c in h["edges_by_pairing"].items()),
             kinds(h["name"]), "yes" if h.get("sink") else "no") for h in hubs]
    graph = numbers["graph"]
    text = [f"## 2. {TITLES['hub']}", opening(v)]
    if rows:
        text.append(table(("query-head hub", "degree", "in", "out", "edges in/out per pairing",
                           f"pattern kinds (score ≥ {PATTERN_MIN:g})", "attention sink"), rows))
    groups = v.evidence.get("kv_hubs", [])
    if groups:
        text.append("KV-group hubs (their in-edges pool every query head of the group, so they are shown "
                    "here and do not decide): " + "; ".join(
                        f"{g['name']} (degree {g['degree']}; members {str(g['members']).replace(',', ', ')}: "
                        f"{g.get('description') or 'not measured'})" for g in groups) + ".")
    text.append(f"Hub rule (API): {graph['hubs']['rule']}. Descriptions: {graph['flags'].get('describe_rule') or 'n/a'}.")
    top = hubs[0] if hubs else None
    if top and v.verdict == PARTLY:
        text.append(f"Only in part: the top query-head hub {top['name']} shows several kinds "
                    f"({kinds(top['name'])}); identity is one of them, not the only one.")
    elif top and v.verdict == FAILS:
        text.append(f"So the paper's GPT-2 finding (an identity head as the hub) is not what this model shows: "
                    f"its top query-head hub {top['name']} shows {kinds(top['name'])}. "
                    "The hub rule itself transfers; which kind of head becomes the hub depends on the model.")
    if "graph.png" in charts:
        text.append(figure(folder, charts["graph.png"]))
        palette = report_palette(numbers)
        if palette:
            text.append(f"Class colours (label set {code(numbers['overlay']['name'])}, as the dashboard draws "
                        "them): " + ", ".join(f"{c} {code(v)}" for c, v in palette.items() if c != NO_CLASS) + ".")
    return "\n\n".join(text)


def tokens_section(v: Verdict, numbers: dict[str, Any]) -> str:
    """Tokens claim: lists above baseline per role and the lists furthest above it."""
    text = [f"## 3. {TITLES['tokens']}", opening(v)]
    roles = v.evidence.get("roles", {})
    if roles:
        text.append(table(("role", "lists above the unembedding-shaped baseline", "lists above the Haar baseline",
                           "heads", "chance (a random plane)"),
                          [(r, "n/a" if s.get("above_anisotropic") is None else s["above_anisotropic"], s["above"],
                            s["heads"], "n/a" if s.get("chance") is None else f"{s['chance']:.0%}")
                           for r, s in roles.items()]))
        if v.evidence.get("p_value") is not None:
            text.append(f"Over all lists: {v.evidence['above']} of {v.evidence['total']} above the unembedding-shaped "
                        f"baseline against {v.evidence['chance']:.0%} expected by chance (one-sided binomial "
                        f"p = {v.evidence['p_value']:.2g}); {v.evidence['above_haar']} are above the isotropic Haar "
                        "baseline, which ignores that the unembedding's token vectors crowd into a few directions.")
        examples = []
        for role in ("O", "V", "K", "Q"):
            answer = numbers["tokens"].get(role)
            if not available(answer):
                continue
            above = [h for h in answer["heads"] if h.get("above_baseline")]
            above.sort(key=lambda h: -(h["mean_score"] - h["baseline_threshold"]))
            for h in above[:2]:
                words = ", ".join(code(str(t.get("display") or t.get("text"))) for t in h["tokens"][:6])
                examples.append(f"- {h['name']} ({role}): {words} (mean score {fmt(h['mean_score'])}, "
                                f"random 95% {fmt(h['baseline_threshold'])})")
        if examples:
            text.append("The lists furthest above their baseline:\n\n" + "\n".join(examples))
        text.append("A list below the baseline is one a random subspace of the same rank would score as "
                    "high: those heads are not named by this projection, whatever their tokens look like.")
    return "\n\n".join(text)


def _signed_ci(d: dict[str, Any]) -> str:
    if d.get("difference") is None:
        return "n/a"
    return f"{d['difference']:+.2f} [{d['low']:+.2f}, {d['high']:+.2f}]"


PAIRED_WORDS = {"A": "PK better", "B": "{b} better", "tie": "no difference", None: "undefined"}


def pk_cs_section(v: Verdict, numbers: dict[str, Any], charts: dict[str, Chart], folder: str) -> str:
    """PK-vs-CS claim: the sample's power, the paired differences (the rule), every metric's
    and baseline's validation statistics with intervals, the figure."""
    text = [f"## 4. {TITLES['pk_vs_cs']}", opening(v)]
    val = numbers.get("validation")
    if available(val) and val and val.get("power"):
        p = val["power"]
        short = (f", all the model's {p['available']} valid forward pairs" if p.get("available") is not None
                 and p["n"] < p["requested"] else "")
        text.append(f"Sample: {p['n']} random {val['pairing']} pairs of the {p['requested']} asked for{short} "
                    f"(seed {val['seed']}): power {fmt(p['power'], 2)} to detect ρ = {p['rho']:g} "
                    f"(two-sided α = {p['alpha']:g}; {p['n_for_80']} pairs reach 0.8).")
    if available(val) and val and val.get("paired"):
        rows = [(pr, f"PK − {d['metric_b']}", _signed_ci(d), d["n"],
                 PAIRED_WORDS.get(d["verdict"], "undefined").format(b=d["metric_b"]))
                for pr, ds in val["paired"].items() for d in ds]
        text.append("Paired differences (the decision rule: PK's ρ minus the other metric's on the same pairs, "
                    "paired bootstrap 95% interval; a metric is better only when the interval excludes 0):")
        text.append(table(("prompts", "comparison", "difference [95%]", "pairs", "verdict"), rows))
    if available(val) and val:
        rows = [(p, r["metric"], fmt_ci(r["random_rho"]), fmt_ci(r["top_mean_effect"]))
                for p, rs in val["summary"].items() for r in rs]
        text.append(table(("prompts", "metric", f"Spearman ρ with the effect ({val['n_sample']} random pairs)",
                           f"mean effect of the metric's top-{val['k']}"), rows))
        best = {p: max((r for r in rs if r["random_rho"]["value"] is not None),
                       key=lambda r: r["random_rho"]["value"], default=None) for p, rs in val["summary"].items()}
        text.append("Highest ρ over the random sample: " + "; ".join(
            f"{p}: {r['metric']} (ρ {fmt_ci(r['random_rho'])})" for p, r in best.items() if r)
            + ". data-PK (weights × this model's activations) is beyond the paper; PK and CS read weights only. "
            + "The trivial baselines (" + ", ".join(val.get("baselines") or ["none"]) + ") have no top-k: "
            "a metric that does not beat them in the paired table adds nothing they do not say.")
        held = val.get("held_out")
        if held:
            text.append(f"The '{held['set']}' rows are the honest test of the data-weighted metrics "
                        f"({', '.join(held['metrics'])}): {held['fit']}, and every metric is compared with the "
                        f"{held['tested']} (the 'text' rows fit and test data-PK on the same prompts).")
        if val.get("precision"):
            text.append(precision_text(val))
        if val.get("association"):
            text.append(association_text(val))
        above_zero = {p: [r["metric"] for r in rs if (r["random_rho"].get("low") or 0) > 0]
                      for p, rs in val["summary"].items()}
        text.append("Metrics whose ρ interval lies wholly above 0 (a correlation with the effect the sample "
                    "supports): " + "; ".join(f"{p}: {', '.join(m) or 'none'}" for p, m in above_zero.items()) + ".")
        if "validation.png" in charts:
            text.append(figure(folder, charts["validation.png"]))
    return "\n\n".join(text)


def precision_text(val: dict[str, Any]) -> str:
    """The calibrated top-k precision: the rule, and per metric its verified share against held-out
    random pairs (raw and source-variance-normalised effect), the achieved error and the matched null."""
    rows = val["precision"]
    p0 = rows[0]
    head = (f"Top-{val['k']} precision against held-out random pairs: an edge is verified by the ablation verdict's "
            f"rule, above the {fmt(p0['quantile'], 4)} quantile (Bonferroni over the {val['k']} edges × 2 prompt "
            f"sets) of one seeded half of the random sample ({p0['n_calibration']} pairs; "
            f"{', '.join(sorted(set((p0.get('method') or {}).values())))}), and the top-k and the other half "
            f"({p0['n_null']} pairs) are judged by it; one-sided Fisher exact test. The held-out share above the "
            f"threshold is the achieved error (expected {fmt(p0['expected_share'], 2)} per pair; × k = the "
            "family-wise error). The matched null takes each top edge's held-out stratum (source-variance "
            "tertile × layer gap 1 / more).")

    def cells(r: dict[str, Any]) -> tuple:
        if r.get("verified") is None:
            return (r["metric"], "unresolved", "–", "–", "–", "–")
        m = r.get("matched") or {}
        return (r["metric"], f"{r['verified']} / {r['k']}", f"{r['null_verified']} / {r['n_null']}",
                fmt(r["achieved_fwer"], 2), fmt(r["p_value"], 2),
                f"{fmt(m.get('expected_verified'), 2)} (p {fmt(m.get('p_value'), 2)})" if m else "n/a")
    cols = ("metric", f"verified of top-{val['k']}", "held-out random pairs verified", "achieved FWER", "Fisher p",
            "matched null: expected verified")
    out = [head, table(cols, [cells(r) for r in rows])]
    if val.get("precision_normalised"):
        out.append("The same on the effect divided by the source head's variance share (what a loud source "
                   "alone does not explain):")
        out.append(table(cols, [cells(r) for r in val["precision_normalised"]]))
    return "\n\n".join(out)


def association_text(val: dict[str, Any]) -> str:
    """Each metric's Spearman with the effect, its partial Spearman given the trivial baselines, and its
    Spearman with the source-variance-normalised effect, per prompt set."""
    rows = [(p, r["metric"], fmt(r["spearman"], 2),
             "n/a" if not r.get("partial") else f"{fmt(r['partial']['rho'], 2)} (p {fmt(r['partial']['p_value'], 2)})",
             fmt(r.get("normalised_spearman"), 2))
            for p, rs in val["association"].items() for r in rs]
    return ("What a metric says beyond how loud its source is and how near its layers are: the partial "
            "Spearman ρ with the effect given the source's variance share and the layer gap, and ρ with the "
            "effect divided by the source's variance share:\n\n"
            + table(("prompts", "metric", "ρ", "partial ρ given source variance and layer gap", "ρ with effect / source variance"),
                    rows))


def induction_section(v: Verdict, numbers: dict[str, Any], charts: dict[str, Chart], folder: str) -> str:
    """Induction check: the ablated top OK edges, their verdicts, sink-sourced edges, the figure."""
    text = [f"## 5. {TITLES['induction']}", opening(v)]
    a = numbers.get("ablation")
    if available(a) and a:
        def kinds(found: list[str] | None) -> str:
            return "n/a" if found is None else ", ".join(found) or "–"
        rows = [(e["rank"], e["source"], kinds(e["source_kinds"]), e["target"],
                 "; ".join(f"{h}: {kinds(k)}" for h, k in e["target_kinds"].items()) if "KV" in e["target"]
                 else kinds(next(iter(e["target_kinds"].values()), None)),
                 fmt(e["pk"]), fmt(e["effect_text"]), fmt(e["effect_random"]), e["verdict"])
                for e in induction_rows(numbers)]
        text.append(table(("PK rank", "source", "source kinds", "target", "target kinds (each query head)", "PK",
                           "effect (text)", "effect (random tokens)", "verdict"), rows))
        n_ver = sum(e["verdict"] == "verified" for e in a["edges"])
        text.append(f"Verdict rule (API): {a['verdict_rule']['rule']}. Here: verified = "
                    f"{a['verdict_rule'].get('summary', 'n/a')}. {n_ver} of the top-{len(a['edges'])} "
                    "OK edges by PK are verified by path ablation.")
        sinks = sink_edges(numbers)
        if sinks["sink_edges"]:
            names = ", ".join(f"{e['source']}→{e['target']} ({e['verdict']})" for e in sinks["sink_edges"])
            text.append(f"{len(sinks['sink_edges'])} of these edges leave attention-sink heads "
                        f"(first-token attention ≥ {fmt(numbers['graph']['flags'].get('threshold'))}): {names}; "
                        f"{sinks['no_effect']} of them have no effect. A high PK there is a property of "
                        "the weights that the activations do not use.")
        if "ablation.png" in charts:
            text.append(figure(folder, charts["ablation.png"]))
    return "\n\n".join(text)


def render(numbers: dict[str, Any], verdicts: Sequence[Verdict], charts: Sequence[Chart], folder: str) -> str:
    """The whole findings page; ``folder``: the figures' folder relative to the page."""
    by_key = {v.key: v for v in verdicts}
    by_name = {c.name: c for c in charts}
    model = numbers["model"]
    parts = [f"# Findings: `{model}`",
             f"Generated by `headgraph report {model}`: every number below comes from the headgraph API "
             "for this model, and each claim of Yamagiwa, Takase & Shimodaira (*Measuring Affinity "
             "between Attention-Head Weight Subspaces via the Projection Kernel*, arXiv:2601.10266) is "
             "decided by a stated rule. Rerun the command to refresh it.",
             model_section(numbers), summary_section(verdicts),
             kl_section(by_key["kl"], by_name, folder),
             hub_section(by_key["hub"], numbers, by_name, folder),
             tokens_section(by_key["tokens"], numbers),
             pk_cs_section(by_key["pk_vs_cs"], numbers, by_name, folder),
             induction_section(by_key["induction"], numbers, by_name, folder),
             label_section(numbers), subspaces_section(numbers), task_section(numbers, verdicts)]
    return "\n\n".join(parts).rstrip() + "\n"


def index_page(folder: Path) -> str:
    """The findings index: one link per page in ``folder`` with its verdict line."""
    lines = [INDEX_TITLE, "", "Pages written by `headgraph report MODEL` (see `docs/cli.md`, "
             "\"report\"). Each decides the paper's claims for one model from the API's numbers.", ""]
    for page in sorted(folder.glob("*.md")):
        if page.name == "README.md":
            continue
        text = page.read_text(encoding="utf-8")
        marks = re.findall(r"^\| [^|]+ \| (" + "|".join(map(re.escape, MARK.values())) + r") \|",
                           text, flags=re.M)
        counts = {m: marks.count(m) for m in MARK.values() if marks.count(m)}
        summary = ", ".join(f"{n} {m.split(' ', 1)[1]}" for m, n in counts.items())
        lines.append(f"- [{page.stem}]({page.name}): {summary or 'no verdicts'}")
    return "\n".join(lines) + "\n"
