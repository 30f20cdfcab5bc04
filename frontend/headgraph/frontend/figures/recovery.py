"""The recovery view's figure, table rows, words and CSV: how well each weight metric's ranking
of head pairs recovers a label set's circuit (the PK paper's Tables 1 and 2, for any model).

From a GET /api/recovery answer (``rows``: per metric ``endpoint_share``, ``precision``,
``auc`` as ``{"value", "low", "high"}`` bootstrap 95% intervals, ``precision_diff`` /
``auc_diff`` paired against PK, ``top``; ``n_valid``, ``n_reference``, ``base_rate``, ``k``):
ROC-AUC per metric with its interval as error bars (0.5 = chance), the table's cells and the
answer in words. Pure functions of that JSON (no HTTP, no Dash).
"""

from __future__ import annotations

import csv
import io
import math
from typing import Any

import plotly.graph_objects as go

from headgraph.frontend.api.answers import Estimate, RecoveryOut
from headgraph.frontend.figures.common import base_layout

METRIC_LABELS: dict[str, str] = {"pk": "PK", "pk_normalized": "PK (normalized)", "cs": "CS", "cka": "CKA",
                                 "procrustes": "Procrustes", "layer_gap": "layer gap", "random": "random"}
BASELINES: tuple[str, ...] = ("layer_gap", "random")  # trivial rankings, drawn in grey
METRIC_COLOR = "#1f77b4"
BASELINE_COLOR = "#9aa4ad"
# (answer key, column title) of the table's statistics, then the paired differences vs PK.
STATS: tuple[tuple[str, str], ...] = (("endpoint_share", "endpoint share"), ("precision", "precision@k"),
                                      ("auc", "ROC-AUC"))
DIFFS: tuple[tuple[str, str], ...] = (("precision_diff", "precision@k − PK"), ("auc_diff", "ROC-AUC − PK"))


def metric_label(metric: str) -> str:
    """A metric's display name ("pk_normalized" -> "PK (normalized)")."""
    return METRIC_LABELS.get(metric, metric)


def _finite(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def estimate_text(est: Estimate | None, signed: bool = False) -> str:
    """``0.77 [0.63, 0.88]`` (``+0.03 [...]`` when ``signed``); "–" where undefined."""
    if not est or _finite(est.get("value")) is None:
        return "–"
    f = "{:+.2f}" if signed else "{:.2f}"
    if _finite(est.get("low")) is None or _finite(est.get("high")) is None:
        return f.format(est["value"])
    return f"{f.format(est['value'])} [{f.format(est['low'])}, {f.format(est['high'])}]"


def names_no_edge(data: RecoveryOut) -> bool:
    """True when no valid pair of the pairing joins two reference heads (nothing to recover)."""
    return not data.get("n_reference")


def recovery_figure(data: RecoveryOut) -> go.Figure:
    """ROC-AUC per metric (a row each, the table's order) with its bootstrap 95% interval as
    error bars and a dotted line at 0.5 (a random ranking). customdata per point: [metric,
    value, low, high] as the API gave them."""
    rows = list(data.get("rows") or [])
    labels = [metric_label(r["metric"]) for r in rows]
    aucs = [r.get("auc") or {} for r in rows]
    x = [_finite(a.get("value")) for a in aucs]
    lo = [None if v is None or (low := _finite(a.get("low"))) is None else v - low for v, a in zip(x, aucs)]
    hi = [None if v is None or (high := _finite(a.get("high"))) is None else high - v for v, a in zip(x, aucs)]
    colors = [BASELINE_COLOR if r["metric"] in BASELINES else METRIC_COLOR for r in rows]
    fig = go.Figure(go.Scatter(
        x=x, y=labels, mode="markers", name="ROC-AUC", showlegend=False,
        marker=dict(size=12, color=colors, symbol="diamond", line=dict(width=1, color="#333")),
        error_x=dict(type="data", symmetric=False, array=hi, arrayminus=lo, thickness=2, width=6, color="#555"),
        customdata=[[r["metric"], a.get("value"), a.get("low"), a.get("high")] for r, a in zip(rows, aucs)],
        hovertemplate="%{y}: ROC-AUC %{customdata[1]:.3f} [%{customdata[2]:.3f}, %{customdata[3]:.3f}]"
                      "<extra></extra>"))
    fig.add_vline(x=0.5, line=dict(color="#999", dash="dot", width=1))
    fig.update_xaxes(range=[-0.02, 1.02], title_text="ROC-AUC at separating reference edges "
                                                      "(95% stratified bootstrap interval)")
    fig.update_yaxes(categoryorder="array", categoryarray=list(reversed(labels)))
    title = (f"{data.get('pairing')}: which metric recovers '{data.get('labels')}'? "
             f"({data.get('n_reference')} of {data.get('n_valid')} valid pairs in the reference)")
    return base_layout(fig, title, height=140 + 38 * max(len(rows), 1), margin=dict(l=120, r=30, t=60, b=60))


def table_rows(data: RecoveryOut) -> list[dict[str, Any]]:
    """Per metric, the table's cells: {metric, label, baseline, endpoint_share, precision, auc,
    precision_diff, auc_diff (texts), values: {stat: the API's estimate}}."""
    out = []
    for r in data.get("rows") or []:
        cells = {key: estimate_text(r.get(key)) for key, _ in STATS}
        cells.update({key: estimate_text(r.get(key), signed=True) if r.get(key) else "(baseline)"
                      for key, _ in DIFFS})
        out.append({"metric": r["metric"], "label": metric_label(r["metric"]),
                    "baseline": r["metric"] in BASELINES, **cells,
                    "values": {key: r.get(key) for key, _ in (*STATS, *DIFFS)}})
    return out


def recovery_words(data: RecoveryOut) -> list[str]:
    """The answer in words: the reference, then the best ROC-AUC and which metrics' paired
    difference to PK excludes 0 (better / worse than PK)."""
    k = data.get("k")
    out = [f"{data.get('pairing')}: reference = the {len(data.get('reference_heads') or [])} heads of "
           f"'{data.get('labels')}'; {data.get('n_reference')} of the {data.get('n_valid')} valid forward pairs join "
           f"two of them (base rate {data.get('base_rate', 0):.2f}: a random ranking's expected precision@{k})."]
    rows = [r for r in data.get("rows") or [] if _finite((r.get("auc") or {}).get("value")) is not None]
    if not rows:
        out.append("ROC-AUC is undefined: the reference holds every valid pair or none.")
        return out
    best = max(rows, key=lambda r: r["auc"]["value"] or 0.0)  # every value here is finite
    out.append(f"Highest ROC-AUC: {metric_label(best['metric'])} {estimate_text(best['auc'])}.")
    better, worse = [], []
    for r in rows:
        d = r.get("auc_diff") or {}
        if (low := _finite(d.get("low"))) is not None and low > 0:
            better.append(metric_label(r["metric"]))
        elif (high := _finite(d.get("high"))) is not None and high < 0:
            worse.append(metric_label(r["metric"]))
    out.append(f"Paired against PK on the same resamples, ROC-AUC above PK's: {', '.join(better) or 'none'}; "
               f"below: {', '.join(worse) or 'none'}; the rest hold 0 in their interval.")
    return out


def recovery_csv(data: RecoveryOut) -> str:
    """The table: one row per metric and statistic (value, low, high)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["model", "labels", "pairing", "k", "metric", "statistic", "value", "low", "high"])
    for r in data.get("rows") or []:
        for key, _ in (*STATS, *DIFFS):
            est = r.get(key)
            if est is not None:
                w.writerow([data.get("model"), data.get("labels"), data.get("pairing"), data.get("k"), r["metric"],
                            key, est.get("value"), est.get("low"), est.get("high")])
    return buf.getvalue()
