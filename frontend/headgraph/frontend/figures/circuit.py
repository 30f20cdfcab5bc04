"""A task's circuit on the head graph: which heads and head -> head edges are in it.

From a GET /api/circuit answer (``circuit``: the edges of the smallest circuit reaching the
stated share, strongest first; ``edges``: the top edges; ``task``, ``method``): the circuit's
marks for figures.graph (:func:`circuit_marks`: head -> head edges as the head graph's keys
(source, target, pairing "O" + the reader's Q / K / V), the heads it touches, hover lines with
each head's attribution), and the circuit as a node-link for the same layered layout
(:func:`circuit_node_link`). A circuit edge from a head into a reader input Q / K / V is the
head graph's edge source -> target of pairing OQ / OK / OV (on grouped-query models the K / V
reader is the KV group, as the head graph's KV nodes). Edges from the embeddings or MLPs, and
into MLPs or the logits, have no place on the head layout: they show in the node hovers and
the task view's table. Pure functions of that JSON (no HTTP, no Dash).
"""

from __future__ import annotations

import math
from typing import Any, TypedDict

import plotly.graph_objects as go

from headgraph.frontend.api.answers import CircuitEdge, CircuitOut

CIRCUIT_EDGE_COLOR = "rgba(255, 127, 14, 0.38)"  # the underlay of an edge in the circuit
CIRCUIT_RING_COLOR = "#ff7f0e"  # the ring around a head in the circuit
HOVER_CIRCUIT_EDGES = 3  # a node's hover: its strongest circuit edges in and out
METHOD_NAMES = {"eap": "EAP", "eap-ig": "EAP-IG"}
EdgeKey = tuple[str, str, str]


class CircuitMarks(TypedDict):
    """What figures.graph marks of a circuit answer (:func:`circuit_marks`)."""

    task: str
    label: str  # the legend's "in <task> circuit"
    size: int | None
    n_edges: int
    method: str
    edges: dict[EdgeKey, CircuitEdge]  # head graph key -> circuit edge
    heads: set[str]  # heads the circuit touches
    notes: dict[str, str]  # head -> hover lines


def graph_key(edge: CircuitEdge) -> EdgeKey | None:
    """The head graph's key (source, target, pairing) of a circuit edge, or None when it is
    not a head -> Q / K / V edge."""
    path = str(edge.get("path", ""))
    if edge.get("writer_kind") != "head" or path not in ("Q", "K", "V"):
        return None
    return str(edge["writer"]), str(edge["reader"]).rsplit(".", 1)[0], "O" + path


def reader_head(edge: CircuitEdge) -> str | None:
    """The head (or KV group) an edge reads into; None for an MLP or the logits."""
    return str(edge["reader"]).rsplit(".", 1)[0] if edge.get("path") in ("Q", "K", "V") else None


def _edges(data: CircuitOut) -> list[CircuitEdge]:
    """The circuit's edges and the listed top edges, once each, strongest first."""
    seen: dict[int, CircuitEdge] = {}
    for e in [*(data.get("circuit") or []), *(data.get("edges") or [])]:
        seen.setdefault(int(e["rank"]), e)
    return [seen[r] for r in sorted(seen)]


def score_text(edge: CircuitEdge, n_edges: int | None) -> str:
    """"+0.123 (rank 4 of 257)"."""
    s = edge.get("score")
    value = f"{s:+.3g}" if isinstance(s, (int, float)) and math.isfinite(s) else "–"
    return f"{value} (rank {edge.get('rank')} of {n_edges})"


def circuit_marks(data: CircuitOut) -> CircuitMarks:
    """What figures.graph marks of a circuit answer: {"task", "label" (the legend's "in <task>
    circuit"), "size", "edges": {graph key: circuit edge}, "heads": set of heads touched,
    "notes": {head: hover lines (attribution of its strongest circuit edges out and in)}}."""
    task = str((data.get("task") or {}).get("name", ""))
    circuit = list(data.get("circuit") or [])
    n = data.get("n_edges")
    edges: dict[EdgeKey, CircuitEdge] = {}
    heads: set[str] = set()
    for e in circuit:
        key = graph_key(e)
        if key is not None:
            edges.setdefault(key, e)
        if e.get("writer_kind") == "head":
            heads.add(str(e["writer"]))
        target = reader_head(e)
        if target is not None:
            heads.add(target)
    # Hover: each head's strongest edges among the circuit and the listed top ones.
    lines: dict[str, dict[str, list[str]]] = {}
    for e in _edges(data):
        mark = " ●" if e.get("in_circuit") else ""
        if e.get("writer_kind") == "head":
            lines.setdefault(str(e["writer"]), {}).setdefault("out", []).append(
                f"→ {e['reader']}: {score_text(e, n)}{mark}")
        target = reader_head(e)
        if target is not None:
            lines.setdefault(target, {}).setdefault("in", []).append(
                f"← {e['writer']} ({e['path']}): {score_text(e, n)}{mark}")
    method = METHOD_NAMES.get(str(data.get("method")), str(data.get("method")))
    notes = {}
    for head, by in lines.items():
        out = [f"<br><b>attribution, {task} ({method})</b>" + (" · in its circuit" if head in heads else "")]
        for direction in ("out", "in"):
            for text in by.get(direction, [])[:HOVER_CIRCUIT_EDGES]:
                out.append("&nbsp;&nbsp;" + text)
        notes[head] = "<br>".join(out)
    return {"task": task, "label": f"in {task} circuit", "size": data.get("circuit_size"),
            "n_edges": n, "method": method, "edges": edges, "heads": heads, "notes": notes}


def edge_note(marks: CircuitMarks | None, key: EdgeKey) -> str:
    """Hover line of a head graph edge in the circuit ("" when it is not)."""
    if not marks or key not in marks["edges"]:
        return ""
    return f"<br><b>{marks['label']}</b>: attribution {score_text(marks['edges'][key], marks['n_edges'])}"


def underlay(xs: list[float | None], ys: list[float | None], marks: CircuitMarks, count: int) -> go.Scatter:
    """The wide line under the circuit's edges drawn (segments ``xs``, ``ys``), with the
    legend entry "in <task> circuit (n)"."""
    return go.Scatter(x=xs, y=ys, mode="lines", hoverinfo="skip", line=dict(color=CIRCUIT_EDGE_COLOR, width=9),
                      name=f"{marks['label']} ({count} edges)", legendgroup="circuit", showlegend=True,
                      legendrank=3, meta="circuit")


def rings(marks: CircuitMarks, where: dict[str, tuple[float, float]]) -> go.Scatter | None:
    """Rings around the circuit's heads placed in ``where`` (None when none is)."""
    shown = sorted(h for h in marks["heads"] if h in where)
    if not shown:
        return None
    return go.Scatter(x=[where[h][0] for h in shown], y=[where[h][1] for h in shown], mode="markers",
                      marker=dict(size=27, color="rgba(0,0,0,0)", line=dict(color=CIRCUIT_RING_COLOR, width=2.5)),
                      customdata=[["circuit-head", h] for h in shown], hoverinfo="skip",
                      name=f"{marks['label']} ({len(shown)} heads)", legendgroup="circuit",
                      showlegend=True, legendrank=3, meta="circuit-heads")


def circuit_node_link(data: CircuitOut, heads: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    """The circuit's head -> head edges (at most ``limit``, strongest first) as a head graph
    node-link: nodes are the records of ``heads`` (callbacks.graph.all_head_nodes) they touch,
    with degrees; edges carry the pairing, the attribution (``attribution``, ``rank``) and an
    opacity of |attribution| / the largest. PK / CS (``score``, ``cs``) come later, where known."""
    records = {str(h["id"]): h for h in heads}
    chosen = [e for e in data.get("circuit") or [] if graph_key(e) is not None][:limit]
    top = max((abs(float(e.get("score") or 0.0)) for e in chosen), default=0.0) or 1.0
    edges, degree = [], {}
    for e in chosen:
        s, t, p = graph_key(e)  # type: ignore[misc]
        if s not in records or t not in records:
            continue
        edges.append({"source": s, "target": t, "pairing": p, "attribution": e.get("score"),
                      "rank": e.get("rank"), "opacity": round(abs(float(e.get("score") or 0.0)) / top, 3)})
        degree.setdefault(s, [0, 0])[1] += 1
        degree.setdefault(t, [0, 0])[0] += 1
    nodes = [{**records[h], "degree": d[0] + d[1], "in_degree": d[0], "out_degree": d[1]}
             for h, d in sorted(degree.items())]
    return {"nodes": nodes, "edges": edges}
