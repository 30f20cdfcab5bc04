"""The validation view's figures: do the weight metrics predict the path-ablation effect?

From a GET /api/validation answer (``summary``: per prompt set, per metric, ``random_rho`` and
``top_mean_effect`` as ``{"value", "low", "high", "n"}``; ``paired``: per prompt set, PK minus
each other metric's Spearman with its paired bootstrap interval and verdict; ``power``: the
random sample's size and power; ``edges``: every measured pair with its metric values and
effects): a forest plot of each metric's Spearman over the random sample and its top-k's mean
effect with their bootstrap 95% intervals, a scatter of metric against effect, and the
comparison in words, decided by the paired rule. Pure functions of that JSON (no HTTP, no Dash).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from headgraph.frontend.api.answers import Estimate, PairedDifference, ValidationOut
from headgraph.frontend.figures.common import CLASS_PALETTE, base_layout, fmt_value

PROMPT_LABELS: dict[str, str] = {"text": "text prompts", "random": "repeated random tokens"}
METRIC_COLORS: dict[str, str] = {"PK": "#1f77b4", "CS": "#ff7f0e", "CKA": "#2ca02c", "Procrustes": "#17becf",
                                 "data-PK out": "#9467bd", "data-PK in": "#d62728", "layer gap": "#8c8c8c",
                                 "source variance": "#b0a48a"}
# The paired rule's verdicts (core.stats.verdicts): "A" = PK better, "B" = the other metric.
VERDICT_WORDS: dict[str, str] = {"A": "PK better", "B": "{b} better", "tie": "no difference"}
# The forest plot's two columns: (summary key, what its x axis is).
STATS: tuple[tuple[str, str], ...] = (("random_rho", "Spearman ρ with the effect, random pairs"),
                                      ("top_mean_effect", "mean effect of the metric's top-k"))
EFFECTS: dict[str, str] = {"OQ": "TVD of the target's attention", "OK": "TVD of the target's attention",
                           "OV": "relative change of the target's output"}
SAMPLE_COLOR = "#6b7b8c"
TOP_COLOR = "#e8a33d"


def metric_color(metric: str, index: int = 0) -> str:
    """A metric's colour (the four API metrics fixed, any other from the class palette)."""
    return METRIC_COLORS.get(metric, CLASS_PALETTE[index % len(CLASS_PALETTE)])


def prompt_sets(data: ValidationOut) -> list[str]:
    """The answer's prompt sets in display order (text, random, then any other)."""
    sets = list((data.get("summary") or {}).keys())
    return sorted(sets, key=lambda s: (list(PROMPT_LABELS).index(s) if s in PROMPT_LABELS else 99, s))


def interval_text(iv: Estimate | None) -> str:
    """``0.69 [0.39, 0.89]``; "undefined" where the API has no value (too few pairs, ties)."""
    if not iv or iv.get("value") is None:
        return "undefined"
    if iv.get("low") is None or iv.get("high") is None:
        return f"{fmt_value(iv['value'], 2)} [no interval]"
    return f"{iv['value']:.2f} [{iv['low']:.2f}, {iv['high']:.2f}]"


def _finite(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


def validation_figure(data: ValidationOut) -> go.Figure:
    """Forest plot: a row per prompt set, a column per statistic (STATS), a point per metric
    at its value with its bootstrap 95% interval as error bars.

    Each trace's customdata holds, per metric, [metric, value, low, high, n] as the API gave
    them (tests compare it with the JSON), and ``meta`` names its prompt set and statistic."""
    sets, metrics = prompt_sets(data), list(data.get("metrics") or [])
    k, n = data.get("k"), data.get("n_sample")
    titles = [f"{PROMPT_LABELS.get(p, p)}: " + (f"Spearman ρ over {n} random pairs" if key == "random_rho"
                                                 else f"mean effect of each metric's top-{k}")
              for p in sets for key, _ in STATS]
    fig = make_subplots(rows=max(len(sets), 1), cols=len(STATS), shared_yaxes=True, subplot_titles=titles,
                        horizontal_spacing=0.06, vertical_spacing=0.16)
    colors = [metric_color(m, i) for i, m in enumerate(metrics)]
    for row, prompts in enumerate(sets, start=1):
        rows = {r["metric"]: r for r in data["summary"][prompts]}
        for col, (key, _) in enumerate(STATS, start=1):
            ivs = [rows.get(m, {}).get(key) or {} for m in metrics]
            x = [_finite(iv.get("value")) for iv in ivs]
            lo = [None if v is None or _finite(iv.get("low")) is None else v - iv["low"] for v, iv in zip(x, ivs)]
            hi = [None if v is None or _finite(iv.get("high")) is None else iv["high"] - v for v, iv in zip(x, ivs)]
            fig.add_trace(go.Scatter(
                x=x, y=metrics, mode="markers", showlegend=False, name=f"{prompts}: {key}",
                meta={"prompts": prompts, "stat": key},
                marker=dict(size=11, color=colors, symbol="diamond", line=dict(width=1, color="#333")),
                error_x=dict(type="data", symmetric=False, array=hi, arrayminus=lo, thickness=2, width=6,
                             color="#555"),
                customdata=[[m, iv.get("value"), iv.get("low"), iv.get("high"), iv.get("n")]
                            for m, iv in zip(metrics, ivs)],
                hovertemplate="%{customdata[0]}: %{customdata[1]:.3f} [%{customdata[2]:.3f}, "
                              "%{customdata[3]:.3f}], n = %{customdata[4]}<extra>" + PROMPT_LABELS.get(prompts, prompts)
                              + "</extra>"), row=row, col=col)
        # pyright reads plotly's row/col as str (their default is "all"); an int picks a subplot
        fig.add_vline(x=0, line=dict(color="#999", dash="dot", width=1), row=row, col=1)  # pyright: ignore[reportArgumentType]
        fig.update_xaxes(range=[-1.05, 1.05], row=row, col=1)
    fig.update_yaxes(categoryorder="array", categoryarray=list(reversed(metrics)))
    fig.update_annotations(font_size=13)  # the subplot titles
    fig.update_xaxes(title_text="Spearman ρ (95% bootstrap interval)", row=len(sets), col=1)
    fig.update_xaxes(title_text=f"mean effect: {EFFECTS.get(str(data.get('pairing')), 'effect')}",
                     row=len(sets), col=2)
    title = (f"{data.get('pairing')}: which weight metric predicts the path-ablation effect? "
             f"(n = {n} random forward pairs, top-{k}, seed {data.get('seed')})")
    return base_layout(fig, title, height=150 + 46 * max(len(metrics), 1) * max(len(sets), 1),
                       margin=dict(l=100, r=30, t=90, b=60))


def scatter_keys(data: ValidationOut, prompts: str, metric: str) -> tuple[str, str]:
    """(metric key, effect key) of a validation edge row for one prompt set: the held-out set
    reads the refit metrics ("data-PK in (held-out)") against the odd prompts' effect."""
    held = data.get("held_out") or {}
    if prompts != held.get("set"):
        return metric, f"effect_{prompts}"
    return (f"{metric} (held-out)" if metric in (held.get("metrics") or []) else metric), "effect_text_odd"


def validation_scatter_figure(data: ValidationOut) -> go.Figure:
    """Metric against effect, a row per prompt set and a column per metric: the random
    sample's pairs (whose Spearman the forest plot shows) and that metric's top-k.

    customdata: [source, target] per point; ``meta``: prompts, metric and which pairs."""
    sets, metrics = prompt_sets(data), list(data.get("metrics") or [])
    edges = data.get("edges") or []
    rho = {(p, r["metric"]): r.get("random_rho") for p in sets for r in data["summary"][p]}
    titles = [f"{m} · ρ {interval_text(rho.get((p, m)))}" for p in sets for m in metrics]
    fig = make_subplots(rows=max(len(sets), 1), cols=max(len(metrics), 1), subplot_titles=titles,
                        horizontal_spacing=0.05, vertical_spacing=0.18)
    for row, prompts in enumerate(sets, start=1):
        for col, metric in enumerate(metrics, start=1):
            value, effect = scatter_keys(data, prompts, metric)
            for which, keep, color, symbol in (("sample", lambda e: e.get("in_sample"), SAMPLE_COLOR, "circle"),
                                               ("top", lambda e, m=metric: m in (e.get("top_of") or []),
                                                TOP_COLOR, "diamond-open")):
                pts = [e for e in edges if keep(e) and _finite(e.get(value)) is not None
                       and _finite(e.get(effect)) is not None]
                label = "random sample" if which == "sample" else f"top-{data.get('k')} by {metric}"
                fig.add_trace(go.Scatter(
                    x=[e[value] for e in pts], y=[e[effect] for e in pts], mode="markers", name=label,
                    showlegend=False, meta={"prompts": prompts, "metric": metric, "pairs": which},
                    customdata=[[e["source"], e["target"]] for e in pts],
                    marker=dict(size=7 if which == "sample" else 10, color=color, symbol=symbol,
                                opacity=0.75 if which == "sample" else 1.0, line=dict(width=1.5 if which == "top" else 0)),
                    hovertemplate="%{customdata[0]} → %{customdata[1]}<br>" + metric + " %{x:.4g}<br>effect %{y:.4g}"
                                  f"<extra>{label}</extra>"), row=row, col=col)
            fig.update_xaxes(title_text=metric, row=row, col=col)
        fig.update_yaxes(title_text=f"effect, {PROMPT_LABELS.get(prompts, prompts)}", row=row, col=1)
    title = (f"{data.get('pairing')}: metric against effect · grey: the {data.get('n_sample')} random pairs, "
             f"orange: each metric's top-{data.get('k')}")
    fig.update_annotations(font_size=12)  # the subplot titles
    return base_layout(fig, title, height=170 + 260 * max(len(sets), 1), margin=dict(l=70, r=20, t=90, b=60))


def comparison(stats: Mapping[str, Estimate | None]) -> tuple[str | None, list[str]]:
    """The metric with the highest value and the metrics whose whole interval lies below its
    interval (their high end under its low end); (None, []) when no metric has a value."""
    known = {m: iv for m, iv in stats.items() if iv and iv.get("value") is not None}
    if not known:
        return None, []
    best = max(known, key=lambda m: known[m]["value"] or 0.0)  # every value here is a number
    low = known[best].get("low")
    below = [m for m, iv in known.items() if m != best and low is not None and (high := iv.get("high")) is not None
             and high < low]
    return best, below


def power_text(data: ValidationOut) -> str:
    """The sample's size and power in words: "64 random pairs of the 200 asked for (all the
    model's valid forward pairs): power 0.65 to detect ρ = 0.3 (90 pairs reach 0.8)"."""
    p = data.get("power") or {}
    if not p:
        return f"{data.get('n_sample')} random pairs (power not stated by this answer)"
    if p.get("available") is None:  # not drawn yet: the model's pair count is not known
        size = f"{p['requested']} random pairs asked for"
    else:
        short = f" (all the model's {p['available']} valid forward pairs)" if p["n"] < p["requested"] else ""
        size = f"{p['n']} random pairs of the {p['requested']} asked for{short}"
    value = "undefined" if p.get("power") is None else f"{p['power']:.2f}"
    return (f"{size}: power {value} to detect "
            f"ρ = {p['rho']:g} (two-sided, α = {p['alpha']:g}; {p['n_for_80']} pairs reach 0.8)")


def verdict_text(d: Mapping[str, Any]) -> str:
    """One paired comparison's outcome (a PairedDifference, or a row of :func:`paired_rows`):
    "PK better", "CS better", "no difference" or "undefined"."""
    return VERDICT_WORDS.get(d.get("verdict") or "", "undefined").format(b=d.get("metric_b"))


def paired_rows(data: ValidationOut) -> list[dict[str, Any]]:
    """Every paired comparison of the answer, prompt sets in display order: {prompts, metric_a,
    metric_b, difference, low, high, n, verdict, baseline (metric_b is a trivial baseline)}."""
    baselines = set(data.get("baselines") or ())
    return [{"prompts": prompts, **{f: d.get(f) for f in ("metric_a", "metric_b", "difference", "low", "high",
                                                           "n", "verdict")},
             "baseline": d.get("metric_b") in baselines}
            for prompts in prompt_sets(data) for d in (data.get("paired") or {}).get(prompts, [])]


TRIVIAL = ("layer gap", "source variance")


def baseline_sentence(data: ValidationOut, prompts: str, pk_cs: PairedDifference) -> str:
    """PK against the trivial baselines on ``prompts`` (the same paired rule): a PK win over CS
    that a baseline matches or beats is "not supported over the trivial baselines"."""
    rows = {d.get("metric_b"): d for d in (data.get("paired") or {}).get(prompts, [])}
    found = {b: rows[b] for b in TRIVIAL if b in rows and rows[b].get("verdict")}
    if not found:
        return ""
    not_beaten = [b for b, d in found.items() if d["verdict"] != "A"]
    if pk_cs.get("verdict") == "A" and not_beaten:
        words = ", ".join(f"{b} {'beats PK' if found[b]['verdict'] == 'B' else 'ties PK'}" for b in not_beaten)
        return f"PK beats CS, but {words}: not supported over the trivial baselines"
    if not_beaten:
        return "trivial baselines not beaten by PK: " + ", ".join(
            f"{b} ({'better' if found[b]['verdict'] == 'B' else 'tie'})" for b in not_beaten)
    return "PK beats the trivial baselines (" + ", ".join(found) + ")"


def validation_words(data: ValidationOut) -> list[str]:
    """The answer in words: the sample (and its power), then a sentence per prompt set: the
    paired verdict of PK against CS (the decision rule), which metric's Spearman is highest,
    and the top-k's mean effect."""
    out = [f"{data.get('pairing')}: {data.get('n_sample')} forward pairs drawn at random (seed {data.get('seed')}) "
           f"plus each metric's top-{data.get('k')}, {len(data.get('edges') or [])} pairs measured by path ablation.",
           power_text(data) + "."]
    for prompts in prompt_sets(data):
        parts = []
        pk_cs = next((d for d in (data.get("paired") or {}).get(prompts, []) if d.get("metric_b") == "CS"), None)
        if pk_cs is not None:
            parts.append(f"PK − CS = {interval_text({'value': pk_cs['difference'], 'low': pk_cs['low'], 'high': pk_cs['high']})} "
                         f"on the same {pk_cs['n']} pairs (paired bootstrap): {verdict_text(pk_cs)}")
            base = baseline_sentence(data, prompts, pk_cs)
            if base:
                parts.append(base)
        for key, what in (("random_rho", "Spearman with the effect"), ("top_mean_effect", f"top-{data.get('k')} mean effect")):
            stats = {r["metric"]: r.get(key) for r in data["summary"][prompts]}
            best, below = comparison(stats)
            if best is None:
                parts.append(f"{what}: undefined")
                continue
            text = f"{what} highest for {best} ({interval_text(stats[best])})"
            others = [m for m in stats if m != best and (stats[m] or {}).get("value") is not None]
            if key == "random_rho":  # marginal intervals decide nothing; the paired rule above does
                parts.append(text)
                continue
            if below and len(below) == len(others):
                text += f", its interval above every other metric's ({', '.join(below)})"
            elif below:
                text += f", its interval above {', '.join(below)}'s, overlapping the rest"
            else:
                text += ", its interval overlapping every other metric's"
            parts.append(text)
        out.append(f"{PROMPT_LABELS.get(prompts, prompts)}: " + "; ".join(parts) + ".")
    return out
