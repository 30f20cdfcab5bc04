"""The task view's figure, table rows and words: a task's circuit (GET /api/circuit).

From a GET /api/circuit answer (``metrics``: clean / corrupt metric and accuracy, ``gap``,
``able`` with its test, ``ability``; ``edges``: the top edges by |attribution| with ``rank``, ``writer``, ``reader``,
``path``, ``score``, ``in_circuit``; ``faithfulness``: ``sizes`` and ``recovered``, the
share of the clean - corrupt gap recovered with only the top-n edges clean, ``share`` and
``circuit_size``; ``patching``: the EAP vs real edge patching Spearman): the faithfulness
curve, the table's cells and the task metric in words. Pure functions of that JSON (no HTTP,
no Dash).
"""

from __future__ import annotations

import math
from typing import Any

import plotly.graph_objects as go

from headgraph.frontend.api.answers import CircuitEdge, CircuitOut, ScoreGrid, TaskMetricsOut
from headgraph.frontend.figures.common import base_layout
from headgraph.frontend.figures.palette import CLASS_PALETTE, NO_CLASS_COLOR

CURVE_COLOR = CLASS_PALETTE[1]  # the faithfulness curve
CIRCUIT_COLOR = CLASS_PALETTE[0]  # the stated share and the circuit size reaching it
TASK_EDGES_SHOWN_MAX = 200  # the most edges the task view lists (the API allows more: limits.circuit_top_max)
# (edge key, column title) of the table; "pk" / "cs" only where the API gives them.
COLUMNS: tuple[tuple[str, str], ...] = (("rank", "rank"), ("writer", "source"), ("reader", "target"),
                                        ("path", "reader"), ("score", "attribution"), ("in_circuit", "in circuit"))
EXTRA_COLUMNS: tuple[tuple[str, str], ...] = (("pk", "PK"), ("cs", "CS"))
METHOD_NAMES = {"eap": "EAP", "eap-ig": "EAP-IG"}


def _finite(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def number_text(x: Any, fmt: str = "{:.3g}") -> str:
    """A number as the table prints it; "–" where undefined."""
    v = _finite(x)
    return "–" if v is None else fmt.format(v)


def edge_columns(data: CircuitOut) -> tuple[tuple[str, str], ...]:
    """The table's columns: COLUMNS, then PK and CS when the API's edges carry them."""
    edges = data.get("edges") or []
    extra = tuple(c for c in EXTRA_COLUMNS if any(c[0] in e for e in edges))
    return COLUMNS + extra


def grid_value(grid: ScoreGrid, source: str, target: str) -> float | None:
    """The cell (source head, target head) of a GET /api/pk or /api/cs answer (its labels name
    the flattened [layer, head] axes), or None where it is invalid or not on the grid."""
    try:
        s, t = grid["source_labels"].index(source), grid["target_labels"].index(target)
    except ValueError:
        return None
    h, ht = grid["shape"][1], grid["shape"][3]
    cell = (s // h, s % h, t // ht, t % ht)
    valid = grid.get("valid")
    if valid is not None and not valid[cell[0]][cell[1]][cell[2]][cell[3]]:
        return None
    return _finite(grid["grid"][cell[0]][cell[1]][cell[2]][cell[3]])


# Per reader input Q / K / V: the PK grid of O -> it and its CS grid (None where there is none).
WeightGrids = dict[str, tuple[ScoreGrid, ScoreGrid | None]]


class ScoredEdge(CircuitEdge, total=False):
    """A circuit edge with its PK (and CS) from the weight grids (:func:`with_scores`)."""

    pk: float | None
    cs: float | None


def with_scores(data: CircuitOut, grids: WeightGrids) -> CircuitOut:
    """``data`` with each head -> head edge's PK (and CS) from ``grids`` (reader input Q / K / V
    -> (the PK grid of O -> it, its CS grid or None)) as ``pk`` / ``cs``; other edges get None.
    Unchanged without grids."""
    if not grids:
        return data
    edges: list[CircuitEdge] = []
    for edge in data.get("edges") or []:
        e: ScoredEdge = {**edge}
        pk, cs = grids.get(str(e.get("path")), (None, None))
        target = str(e.get("reader", "")).rsplit(".", 1)[0]
        head = e.get("writer_kind") == "head"
        e["pk"] = grid_value(pk, e["writer"], target) if pk is not None and head else None
        if any(c is not None for _, c in grids.values()):
            e["cs"] = grid_value(cs, e["writer"], target) if cs is not None and head else None
        edges.append(e)
    return {**data, "edges": edges}


def table_rows(data: CircuitOut) -> list[dict[str, Any]]:
    """Per listed edge (the API's order: strongest first), its cells' texts and the API's
    values: {key: text, ..., "values": {key: value}}."""
    out = []
    for e in data.get("edges") or []:
        cells: dict[str, Any] = {}
        for key, _ in edge_columns(data):
            v = e.get(key)
            if key in ("score", "pk", "cs"):
                cells[key] = number_text(v, "{:+.4g}" if key == "score" else "{:.3g}")
            elif key == "in_circuit":
                cells[key] = "yes" if v else "no"
            else:
                cells[key] = "" if v is None else str(v)
        out.append({**cells, "values": {key: e.get(key) for key, _ in edge_columns(data)}})
    return out


ABLE_WORDS = {True: "yes", False: "no", None: "too few pairs"}  # the able chip's value per state


def ability_text(metrics: TaskMetricsOut | dict[str, Any]) -> str:
    """The paired sign tests behind ``able`` in brief: their p-values, the units read and alpha."""
    a = metrics.get("ability") or {}
    if not a:
        return "no test"
    ans, fol = a.get("answer") or {}, a.get("follows") or {}
    return (f"sign tests over {a.get('n_units')} units of {a.get('n_pairs')} prompt pairs: the answer beats the "
            f"distractor p = {number_text(ans.get('p'), '{:.2g}')} ({ans.get('wins')}/{ans.get('n')}), clean "
            f"above corrupt p = {number_text(fol.get('p'), '{:.2g}')} ({fol.get('wins')}/{fol.get('n')}); "
            f"both must be ≤ {a.get('alpha')}")


def task_words(data: CircuitOut) -> list[str]:
    """The task metric first, in words: whether the model does the task (does, does not, too few
    pairs to tell; the sign tests' p-values), then the circuit's size at the stated share and the
    EAP vs patching check."""
    m = data.get("metrics") or {}
    model, task = data.get("model"), (data.get("task") or {}).get("name")
    acc = number_text(m.get("clean_accuracy"), "{:.0%}")
    seen = (f"the answer beats the distractor on {acc} of the {m.get('n_pairs')} clean prompts, logit difference "
            f"{number_text(m.get('clean'))} clean vs {number_text(m.get('corrupt'))} corrupt")
    tests = ability_text(m)
    if m.get("able"):
        first = f"{model} does '{task}': {seen} (gap {number_text(m.get('gap'))}); {tests}."
    elif m.get("able") is None:
        a = m.get("ability") or {}
        first = (f"Too few prompt pairs to tell whether {model} does '{task}' ({tests}): it takes "
                 f"{a.get('min_units')} units for any outcome to reach p ≤ {a.get('alpha')}; {seen}.")
    else:
        first = f"{model} does not do '{task}' ({tests}): {seen}, so its circuit explains little."
    f = data.get("faithfulness") or {}
    share = f.get("share", data.get("share"))
    size = f.get("circuit_size", data.get("circuit_size"))
    if size is None:
        second = (f"No circuit of the top edges recovers {number_text(share, '{:.0%}')} of the gap "
                  f"(of {f.get('total_edges', data.get('n_edges'))} edges).")
    else:
        second = (f"The smallest circuit recovering {number_text(share, '{:.0%}')} of the gap (ablating every "
                  f"other edge to its corrupt value): {size} of {f.get('total_edges', data.get('n_edges'))} edges.")
    out = [first, second]
    p = data.get("patching") or {}
    if p.get("n_edges"):
        out.append(f"{METHOD_NAMES.get(str(data.get('method')), data.get('method'))} vs real edge patching on "
                   f"{p['n_edges']} edges: Spearman ρ = {number_text(p.get('spearman'), '{:.3f}')}.")
    return out



def faithfulness_figure(data: CircuitOut) -> go.Figure:
    """The share of the clean - corrupt gap recovered vs circuit size (the top-n edges kept
    clean, every other edge corrupt), a dashed line at the stated share and a marker at the
    smallest size reaching it. customdata per point: [size, recovered, metric]."""
    f = data.get("faithfulness") or {}
    sizes = list(f.get("sizes") or [])
    recovered = [_finite(r) for r in f.get("recovered") or []]
    metrics = list(f.get("metrics") or [])
    fig = go.Figure(go.Scatter(
        x=sizes, y=recovered, mode="lines+markers", name="recovered", showlegend=False,
        line=dict(color=CURVE_COLOR, width=2), marker=dict(size=7, color=CURVE_COLOR),
        customdata=[[n, r, mt] for n, r, mt in zip(sizes, f.get("recovered") or [], metrics)],
        hovertemplate="top %{x} edges: %{y:.3f} of the gap<extra></extra>"))
    share = _finite(f.get("share"))
    if share is not None:
        fig.add_hline(y=share, line=dict(color=NO_CLASS_COLOR, dash="dash", width=1),
                      annotation_text=f"stated share {share:g}", annotation_position="bottom right")
    size = f.get("circuit_size")
    if size is not None and size in sizes:
        y = recovered[sizes.index(size)]
        fig.add_trace(go.Scatter(x=[size], y=[y], mode="markers+text", name="circuit", showlegend=False,
                                 marker=dict(size=13, color=CIRCUIT_COLOR, symbol="diamond",
                                             line=dict(width=1, color="#333")),
                                 text=[f"circuit: {size} edges"], textposition="top left",
                                 hovertemplate="circuit: top %{x} edges, %{y:.3f} of the gap<extra></extra>"))
    fig.update_xaxes(title_text=f"circuit size (top-n edges by |attribution|, of {f.get('total_edges')})")
    fig.update_yaxes(title_text="share of the clean − corrupt gap recovered")
    task = (data.get("task") or {}).get("name")
    title = f"{data.get('model')} · {task}: faithfulness of the {METHOD_NAMES.get(str(data.get('method')), '')} circuit"
    return base_layout(fig, title, height=420, margin=dict(l=70, r=30, t=60, b=60))
