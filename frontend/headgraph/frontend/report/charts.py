"""The findings report's figures, built from the API answers ``numbers.collect`` gathered.

The KL grid, the PK-vs-random histograms and the head graph reuse the dashboard's own figure
functions (``headgraph.frontend.figures``), so the page shows what the dashboard shows; the
path-ablation bars and the validation intervals are drawn here. PNGs are written by kaleido 1.x
with the system Chromium (``exports.browser_path``; never a downloaded one), at scale 1 so a
model's figures stay a few hundred KB.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio

from headgraph.frontend.callbacks.graph import all_head_nodes
from headgraph.frontend.figures.common import base_layout
from headgraph.frontend.figures.export import browser_path
from headgraph.frontend.figures.graph import graph_figure
from headgraph.frontend.figures.graph_filters import verdict_map
from headgraph.frontend.figures.palette import class_palette
from headgraph.frontend.figures.positions import grid_positions
from headgraph.frontend.figures.reference import kl_grid_figure, null_summary, reference_figure
from headgraph.frontend.report.numbers import GRAPH_PAIRINGS, available

WIDTH_PX = 900
PROMPT_COLORS = {"text": "#4c72b0", "random": "#dd8452"}
PROMPT_NAMES = {"text": "text prompts", "random": "repeated random tokens"}


@dataclass(frozen=True)
class Chart:
    """One figure of the page: file name (no folder), caption, the figure and its width (px)."""

    name: str
    caption: str
    figure: go.Figure
    width: int = WIDTH_PX


def head_classes(numbers: dict[str, Any]) -> dict[str, str]:
    """Node id -> its class in the dashboard's default overlay (numbers.overlay; a KV group:
    its query heads' classes joined, as the API's graph does); empty without that overlay."""
    overlay = numbers.get("overlay")
    if not available(overlay) or not overlay:
        return {}
    classes = overlay["classes"]
    out = {}
    for n in numbers["graph"]["graph"].get("nodes", []):
        found = [classes[h] for h in str(n.get("heads") or n["id"]).split(",") if h in classes]
        if found:
            out[str(n["id"])] = " / ".join(dict.fromkeys(found))
    return out


def report_palette(numbers: dict[str, Any]) -> dict[str, str]:
    """class -> colour of the report's graph: figures.palette over the overlay's class order,
    so a class has the colour the dashboard gives it ({} without an overlay)."""
    overlay = numbers.get("overlay")
    if not available(overlay) or not overlay:
        return {}
    return {c: v for c, v in class_palette(overlay["order"], overlay["classes"].values()).items() if c}


def class_order(numbers: dict[str, Any]) -> list[str]:
    overlay = numbers.get("overlay")
    return list(overlay["order"]) if available(overlay) and overlay else []


def graph_chart(numbers: dict[str, Any]) -> Chart:
    """The paper's head graph (top-20 PK edges per pairing, grid layout), nodes coloured by
    their class in the dashboard's default overlay (its class colours), the ablated top OK
    edges drawn by verdict."""
    graph = numbers["graph"]
    info = numbers["info"]["info"]
    layers = list(info["layer_indices"])
    backdrop = all_head_nodes(info)  # every head, grey when it has no edge (as the dashboard)
    ablation = numbers.get("ablation")
    verdicts = verdict_map([ablation]) if available(ablation) and ablation else None
    fig = graph_figure({**graph, "layer_indices": layers}, grid_positions(graph["graph"], layers),
                       layout="grid", classes=head_classes(numbers), class_order=class_order(numbers),
                       all_heads=[n["id"] for n in backdrop],
                       head_pos=grid_positions({"nodes": backdrop}, layers), backdrop=backdrop,
                       verdicts=verdicts)
    fig.update_layout(title=dict(text=f"{numbers['model']}: head graph, top-{graph_k(graph)} PK edges "
                                      "per pairing (OQ red, OK green, OV blue; hubs starred)"))
    overlay = numbers.get("overlay")
    colours = (f"Nodes are coloured by their class in the label set {overlay['name']} (the dashboard's "
               "default overlay, in its class colours)" if available(overlay) and overlay
               else "Nodes are grey (no class overlay for this model)")
    return Chart("graph.png", "The paper's head graph from the weights (the dashboard's graph view). "
                 + colours + "; arrows point from source to target; the top OK edges that "
                 "were path-ablated are drawn by verdict (bold: verified, dashed grey: no effect).",
                 fig, width=1000)


def graph_k(graph: dict[str, Any]) -> int:
    """The k of the graph's top-k rule (its largest per-pairing edge count)."""
    return max(graph.get("edge_counts", {}).values(), default=0)


def kl_chart(numbers: dict[str, Any]) -> Chart:
    """The 4 x 4 KL(random ‖ model) grid (the dashboard's reference view)."""
    fig = kl_grid_figure(numbers["reference"]["kl"])
    return Chart("kl.png", "KL(random ‖ model) for every role pairing (rows: source role, "
                 "columns: target role); larger is further from random subspaces.", fig, width=560)


def histogram_chart(numbers: dict[str, Any], pairing: str) -> Chart:
    """One pairing's PK histogram against the Haar density and the anisotropy-aware null."""
    ref = numbers["reference"]
    fig = reference_figure(ref["kl"], pairing, null_summary(ref["nulls"], pairing))
    return Chart(f"reference-{pairing}.png", f"{pairing}: the model's PK distribution (bars) against "
                 "random subspaces (Haar density, black) and the anisotropy-aware null (purple).",
                 fig, width=760)


def ablation_chart(ablation: dict[str, Any]) -> Chart:
    """Path-ablation statistic of each measured top OK edge on both prompt sets (the smaller
    split half, what the verdict compares), with each set's random-pair null threshold; bars
    ordered by PK rank."""
    edges = ablation["edges"]
    names = [f"{e['source']}→{e['target']}" for e in edges]
    rule = ablation["verdict_rule"]
    fig = go.Figure()
    for prompts in ("text", "random"):
        fig.add_trace(go.Bar(x=names, y=[(e.get("statistic") or {}).get(prompts) for e in edges],
                             name=PROMPT_NAMES[prompts], marker=dict(color=PROMPT_COLORS[prompts])))
        threshold = (rule.get("thresholds") or {}).get(prompts)
        if threshold is not None:
            fig.add_hline(y=float(threshold), line=dict(color=PROMPT_COLORS[prompts], dash="dash", width=1.5),
                          annotation_text=f"{PROMPT_NAMES[prompts]} null q={rule['quantile']:.4g}: {threshold:.3g}",
                          annotation_position="top right" if prompts == "text" else "bottom right")
    verdicts = [e["verdict"] for e in edges]
    fig.update_xaxes(tickmode="array", tickvals=names, tickangle=-35,
                     ticktext=[f"{n}<br><i>{v}</i>" for n, v in zip(names, verdicts)])
    measure = "attention TVD" if ablation["pairing"] in ("OQ", "OK") else "relative output change"
    fig.update_yaxes(title=f"smaller split-half effect ({measure})", rangemode="tozero")
    fig.update_layout(barmode="group", legend=dict(orientation="h", y=1.08, x=0.99, xanchor="right"))
    base_layout(fig, f"Path ablation of the top-{len(edges)} {ablation['pairing']} edges by PK", height=420)
    return Chart("ablation.png", f"Path-ablation effect of the top-{len(edges)} {ablation['pairing']} edges "
                 "by PK (left: highest PK) on both prompt sets (the smaller of the two split halves), "
                 "each set's random-pair null threshold dashed, each edge's verdict under its name.", fig)


def validation_chart(validation: dict[str, Any]) -> Chart:
    """Spearman ρ of each metric against the ablation effect over the random sample, with
    its bootstrap 95% interval, per prompt set."""
    fig = go.Figure()
    for prompts, rows in validation["summary"].items():
        rows = [r for r in rows if r["random_rho"]["value"] is not None]
        rho = [r["random_rho"] for r in rows]
        fig.add_trace(go.Scatter(
            x=[r["metric"] for r in rows], y=[s["value"] for s in rho], mode="markers",
            name=PROMPT_NAMES.get(prompts, prompts), marker=dict(size=11, color=PROMPT_COLORS.get(prompts)),
            error_y=dict(type="data", symmetric=False, array=[s["high"] - s["value"] for s in rho],
                         arrayminus=[s["value"] - s["low"] for s in rho], thickness=1.5, width=6)))
    fig.add_hline(y=0, line=dict(color="#999", width=1))
    fig.update_yaxes(title="Spearman ρ with the ablation effect", range=[-1.05, 1.1])
    fig.update_layout(scattermode="group", legend=dict(orientation="h", y=-0.12, x=0.5, xanchor="center"))
    n = validation["n_sample"]
    base_layout(fig, f"Which weight metric predicts the effect? ({validation['pairing']}, {n} random pairs)",
                height=400)
    return Chart("validation.png", f"Spearman ρ between each metric and the path-ablation effect over {n} "
                 f"random {validation['pairing']} pairs, with bootstrap 95% intervals.", fig, width=760)


def all_charts(numbers: dict[str, Any]) -> list[Chart]:
    """Every figure the numbers allow (ablation and validation only for a runnable model)."""
    charts = [graph_chart(numbers), kl_chart(numbers)]
    charts += [histogram_chart(numbers, p) for p in GRAPH_PAIRINGS if p in numbers["reference"]["kl"]["histograms"]]
    if available(numbers.get("ablation")) and numbers["ablation"]["edges"]:
        charts.append(ablation_chart(numbers["ablation"]))
    if available(numbers.get("validation")) and numbers["validation"].get("summary"):
        charts.append(validation_chart(numbers["validation"]))
    return charts


def figure_height(fig: go.Figure) -> int:
    """A figure's own layout height in px (520 when unset, as the dashboard exports)."""
    return int(fig.to_plotly_json()["layout"].get("height") or 520)


def write_pngs(charts: list[Chart], folder: Path) -> list[Path]:
    """Write each chart as ``folder/<name>`` (PNG, scale 1) in one kaleido session; returns the
    paths. Needs a system Chromium (``BROWSER_PATH`` or /usr/bin/chromium)."""
    path = browser_path()
    if path is None:
        raise RuntimeError("no Chromium found for the report's figures: install chromium or set BROWSER_PATH")
    os.environ.setdefault("BROWSER_PATH", path)
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / c.name for c in charts]
    if charts:
        files: list[str | Path] = list(paths)
        pio.write_images([c.figure for c in charts], files, format="png", scale=1,
                         width=[c.width for c in charts], height=[figure_height(c.figure) for c in charts])
    # A kaleido session on a loaded machine has dropped a figure without an error: write the
    # missing ones again one by one, and never hand back a page linking a file that is not there.
    for chart, p in zip(charts, paths):
        if not p.exists():
            pio.write_image(chart.figure, p, format="png", scale=1, width=chart.width,
                            height=figure_height(chart.figure))
        if not p.exists():
            raise RuntimeError(f"kaleido did not write {p.name}")
    return paths

