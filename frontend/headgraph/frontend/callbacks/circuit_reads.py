"""Reading a chosen task's circuit without computing it (the graph view and the pair panel).

The URL's ``task`` (with ``method`` and ``steps``) names a circuit; the graph marks it and the
pair panel shows an edge's attribution only when GET /api/circuit/progress says it is cached
(a cold circuit takes minutes on a real model: the task view computes it, under its progress
bar). ``circuit_state`` is part of those views' render keys, so a view drawn before the
circuit was computed is drawn again after.
"""

from __future__ import annotations

from typing import Any

from dash import html

from headgraph.frontend.api.answers import CircuitOut
from headgraph.frontend.api.client import ApiError
from headgraph.frontend.callbacks.common import api, data_attrs
from headgraph.frontend.figures.circuit import CircuitMarks

CIRCUIT_TOP = 50  # top edges read besides the circuit (node hovers)


def _steps(params: dict[str, Any]) -> int:
    return int(params.get("steps") or 1) if params.get("method") == "eap-ig" else 1


def circuit_state(params: dict[str, Any] | None) -> str | None:
    """"cached" | "running" | "idle" for the params' task circuit; None without a task or
    when the API cannot say."""
    if not params or not params.get("task"):
        return None
    try:
        return str(api().circuit_progress(params["model"], params["task"], params["method"],
                                          _steps(params), params.get("pairs"))["state"])
    except ApiError:
        return None


def cached_circuit(params: dict[str, Any] | None, edges: list[str] | None = None) -> CircuitOut | None:
    """The params' task circuit (GET /api/circuit, its top CIRCUIT_TOP edges, ``edges`` looked
    up) when it is cached, else None (never computes)."""
    if circuit_state(params) != "cached":
        return None
    assert params is not None
    try:
        return api().circuit(params["model"], params["task"], params["method"], _steps(params), CIRCUIT_TOP,
                             edges=edges, pairs=params.get("pairs"))
    except ApiError:
        return None


def circuit_chip(params: dict[str, Any], state: str | None, marks: CircuitMarks | None,
                 drawn: int | None = None) -> html.Span | None:
    """The graph's chip about the chosen task's circuit (id "graph-circuit"): how many of its
    heads and edges the graph marks, or that it is not computed yet; None without a task."""
    if not params.get("task"):
        return None
    if marks is None:
        what = ("is being computed (see the Task view)" if state == "running"
                else "is not computed yet: open the Task view to compute it")
        return html.Span(f"task {params['task']}: its circuit {what}", className="hint", id="graph-circuit",
                         **data_attrs({"data-state": state or ""}))
    text = (f"{marks['label']} ({marks['method']}, {marks['size']} edges): {len(marks['heads'])} heads; "
            f"{drawn if drawn is not None else '–'} of the graph's edges are in it")
    return html.Span(text, className="hint", id="graph-circuit",
                     **data_attrs({"data-state": "cached", "data-heads": ",".join(sorted(marks["heads"])),
                                   "data-edges": str(drawn if drawn is not None else "")}))


def pair_attribution(params: dict[str, Any], source: str, target: str) -> html.Div | None:
    """The pair panel's line on the chosen task (id "pair-attribution"): the edge source ->
    target's Q / K / V input (the pairing's reader) with its attribution, its rank among all
    edges and whether it is in the circuit, when the circuit is cached; None without a task
    or for a pairing that is no circuit edge (not O -> Q / K / V)."""
    pairing = str(params.get("pairing") or "")
    if not params.get("task") or pairing not in ("OQ", "OK", "OV"):
        return None
    reader = f"{target}.{pairing[1]}"
    data = cached_circuit(params, edges=[f"{source}>{reader}"])
    attrs: dict[str, str] = {"data-task": str(params["task"])}
    if data is None:
        text = f"attribution on task {params['task']}: its circuit is not computed yet (open the Task view)"
        return html.Div(text, id="pair-attribution", className="hint", **data_attrs(attrs))
    method = {"eap": "EAP", "eap-ig": "EAP-IG"}.get(str(data.get("method")), str(data.get("method")))
    found = data.get("lookup") or []
    if not found:
        text = f"attribution on task {params['task']} ({method}): {source} → {reader} is no edge of its graph"
        return html.Div(text, id="pair-attribution", className="hint", **data_attrs(attrs))
    e = found[0]
    size = data.get("circuit_size")
    attrs.update({"data-score": repr(e["score"]), "data-rank": str(e["rank"]),
                  "data-n-edges": str(data.get("n_edges")), "data-in-circuit": "yes" if e["in_circuit"] else "no"})
    where = (f"in its circuit ({size} edges)" if e["in_circuit"]
             else f"not in its circuit ({size if size is not None else 'none'} edges)")
    return html.Div([html.B(f"attribution on task {params['task']} ({method}): "),
                     f"{e['score']:+.4g} · rank {e['rank']} of {data.get('n_edges'):,} edges · {where}"],
                    id="pair-attribution", className="pair-attribution", **data_attrs(attrs))
