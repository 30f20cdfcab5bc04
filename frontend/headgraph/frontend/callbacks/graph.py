"""Head graph view: top-k or threshold edges per pairing, class overlay, hubs, two layouts; a
layer range, a search (head, layer or class) and edges by path-ablation verdict (graph_filters),
the verdicts read from the cache only (GET /api/ablation?cached=true: rendering never starts a
computation). Class colours follow the overlay's class order (figures.palette); a graph of more
than EDGE_DRAW_LIMIT edges is drawn as edges per layer pair (figures.graph_layers).
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from dash import Input, Output, html, no_update

from headgraph.frontend.api.answers import GraphOut, LabelSetSummary
from headgraph.frontend.api.client import ApiClient, ApiError
from headgraph.frontend.api.names import head_label
from headgraph.frontend.callbacks.circuit_reads import cached_circuit, circuit_chip, circuit_state
from headgraph.frontend.callbacks.common import (
    WAITING,
    api,
    class_order,
    data_attrs,
    error_note,
    overlay_classes,
    stat,
    state_of,
    vocab,
    with_overlay,
)
from headgraph.frontend.callbacks.router import view_callback
from headgraph.frontend.figures import empty_figure, graph_figure
from headgraph.frontend.figures.circuit import circuit_marks
from headgraph.frontend.figures.graph_filters import (
    NOT_MEASURED,
    VERDICTS,
    Verdicts,
    edge_counts,
    filter_layers,
    find_matches,
    in_layers,
    is_head_or_layer,
    keep_verified,
    null_quantiles,
    verdict_counts,
    verdict_map,
    verify_k,
)
from headgraph.frontend.figures.graph_layers import EDGE_DRAW_LIMIT, layer_graph_figure, too_many_note
from headgraph.frontend.figures.palette import JOINED
from headgraph.frontend.figures.positions import grid_positions, positions
from headgraph.frontend.state.readiness import view_params, waiting_for
from headgraph.frontend.state.url import (
    FDR_DEFAULT_Q,
    format_layers,
    format_threshold,
    graph_on,
    quantize_threshold,
)


class GraphView(GraphOut, total=False):
    """A GET /api/graph answer as the view shows it: ``overlay_note`` says why the overlay is
    not applied (callbacks.common.with_overlay)."""

    overlay_note: str


DEFAULT_FRACTION = 0.8  # threshold mode without a threshold: this far from the scale's min to its max
API_METRIC = {"pk": "raw", "normalized": "normalized", "z": "z"}  # threshold_on -> GET /api/pk metric


def all_head_nodes(info: dict[str, Any]) -> list[dict[str, Any]]:
    """Node records for every (layer, head) of a model (backdrop of the layer x head layout),
    and on a grouped-query model every KV group too (kind "kv_group", ``heads`` its query
    heads, as the API's graph nodes)."""
    n_heads = int(info["n_heads"])
    n_kv = int(info.get("n_kv_heads") or n_heads)
    size = n_heads // n_kv if 0 < n_kv < n_heads and n_heads % n_kv == 0 else 1
    out: list[dict[str, Any]] = []
    for layer in info["layer_indices"]:
        out += [{"id": head_label(layer, h), "layer": layer, "head": h, "kind": "head"} for h in range(n_heads)]
        if size > 1:
            out += [{"id": head_label(layer, g, kv=True), "layer": layer, "head": g, "kind": "kv_group",
                     "heads": ",".join(head_label(layer, g * size + j) for j in range(size))}
                    for g in range(n_kv)]
    return out


def metric_range(client: ApiClient, model: str, pairings: list[str], on: str) -> tuple[float, float]:
    """(min, max) of the threshold scale ``on`` (pk, normalized, z) over the valid pairs of the
    chosen pairings."""
    lo, hi = float("inf"), float("-inf")
    for p in pairings:
        g = client.pk(model, p, API_METRIC.get(on, "raw"))
        low, high = g.get("min"), g.get("max")
        if low is not None and high is not None:  # both, or neither: no valid pair
            lo, hi = min(lo, low), max(hi, high)
    if lo > hi:
        return 0.0, 1.0
    return lo, hi


def slider_range(lo: float, hi: float) -> dict[str, Any]:
    """The threshold slider over a scale's span [lo, hi]: {"min", "max", "step", "marks", "value"}.

    Every slider position is a threshold the API applies unchanged (at most THRESHOLD_DIGITS
    significant digits): the step is the last kept digit of the span's largest magnitude, the
    ends are ``lo`` and ``hi`` cut down to that step (so the maximum keeps the best edge), and
    ``value`` (the default threshold) is DEFAULT_FRACTION of the way, on the step grid.
    """
    mag = max(abs(lo), abs(hi))
    exp = max(math.floor(math.log10(mag)) - 2, -6) if mag > 0 else -3  # -6: THRESHOLD_FLOOR
    step, digits = 10.0 ** exp, max(0, -exp)

    def snap(x: float, fn: Any = math.floor) -> float:
        return quantize_threshold(round(fn(x / step + 1e-9) * step, digits))

    smin, smax = snap(lo), snap(hi)
    if smax <= smin:
        smax = quantize_threshold(round(smin + step, digits))
    value = min(max(snap(lo + DEFAULT_FRACTION * (hi - lo), round), smin), smax)
    return {"min": smin, "max": smax, "step": step, "value": value,
            "marks": {smin: format_threshold(smin), smax: format_threshold(smax)}}


def evidence_chips(data: GraphOut) -> list[Any]:
    """What the hubs do (pattern-based descriptions, ties shown as ties) and the attention-sink
    edges, from the API's hub rows and flags; says "not measured" when they are missing."""
    flags = data.get("flags") or {}
    hubs = data.get("hubs") or {}
    rows = {r.get("name"): r for r in hubs.get("rows", [])}
    if not flags.get("measured"):
        return [html.Span("what heads do / attention sinks: not measured yet (pattern scores)",
                          className="hint", id="graph-flags")]
    what = [f"{h}: {rows.get(h, {}).get('description') or 'unclassified'}"
            + (" (sink)" if rows.get(h, {}).get("sink") else "") for h in hubs.get("hubs", [])]
    tie = hubs.get("top_tie") or []
    out: list[Any] = []
    if what:
        out.append(html.Span("hub " + "; ".join(what) + (f" · tied: {' = '.join(tie)}" if len(tie) > 1 else ""),
                             className="hint", id="graph-hub-what", **data_attrs({"data-tie": ",".join(tie)})))
    sink_edges = flags.get("sink_edges") or {}
    sinks = flags.get("sinks") or []
    out.append(html.Span([html.Span("sink edges", className="stat-label"),
                          html.Span(str(sum(sink_edges.values())), className="stat-value")],
                         className="stat", id="stat-sink-edges", **data_attrs({"data-value": str(sum(sink_edges.values()))}),
                         title=(f"edges touching an attention-sink head (first-token attention ≥ "
                                f"{flags.get('threshold', 0.9)}), drawn dotted from a sink; sinks: "
                                + (", ".join(sinks) or "none"))))
    return out


def summary(data: GraphView, threshold: float | None, on: str | None = None) -> list[Any]:
    """Summary chips of a graph; ``threshold`` the one it applied on scale ``on`` (printed as the
    API's rule prints it: rounded to THRESHOLD_DIGITS significant digits)."""
    counts = data.get("edge_counts", {})
    total = sum(counts.values())
    hubs = data.get("hubs", {}).get("hubs", [])
    parts = [stat("edges", total, "edges"),
             *[stat(p, n, f"edges-{p}") for p, n in counts.items()],
             stat("hubs", ", ".join(hubs), "hubs"),
             stat("nodes", len(data["graph"].get("nodes", [])), "nodes")]
    if threshold is not None:
        parts.append(stat("FDR q" if on == "fdr" else "threshold", format_threshold(threshold), "threshold"))
    cc = data.get("class_counts")
    if cc:
        parts += [stat("in-class", cc.get("in_class"), "in-class"),
                  stat("out-of-class", cc.get("out_of_class"), "out-of-class")]
    parts.append(html.Span(data.get("rule", ""), className="rule-text", id="graph-rule"))
    capped = data.get("capped") or {}
    if capped:
        kept = ", ".join(f"{p}: best {counts.get(p, 0)} of {n}" for p, n in capped.items())
        fix = "lower q" if on == "fdr" else "raise the threshold"
        parts.append(html.Span(f"edges capped ({kept}); {fix} to see all",
                               className="hint warn", id="graph-capped"))
    parts += evidence_chips(data)
    if note := data.get("overlay_note"):
        parts.append(html.Span(note, className="hint", id="graph-overlay-note"))
    parts.append(html.Span("click a node for its head panel, the middle of an edge for the pair",
                           className="hint"))
    return parts


def load_graph(client: ApiClient, params: dict[str, Any]) -> tuple[GraphView, dict[str, Any], float | None,
                                                                     dict[str, Any] | None]:
    """(graph JSON, model info, threshold applied, slider range or None) for view params.

    The slider range (:func:`slider_range` plus ``key``) is the threshold scale's span over
    the chosen pairings; ``key`` names the (model, pairings, scale, URL threshold) it is for.
    In threshold mode without a chosen threshold the range's ``value`` is applied (a fixed
    fraction of the span, so a link without one still reproduces the view); on the FDR scale
    (no slider) the q level, FDR_DEFAULT_Q by default. Thresholds are rounded as the API
    rounds them, so the one returned is the one the graph applied.
    """
    model, pairings = params["model"], list(params["pairings"])
    info = client.model_info(model)["info"]
    on = graph_on(params)
    threshold = None
    slider = None
    if params["rule"] == "threshold":
        threshold = params["threshold"]
        if on == "fdr":
            threshold = FDR_DEFAULT_Q if threshold is None else threshold
        else:
            slider = {"key": [model, pairings, on, threshold],
                      **slider_range(*metric_range(client, model, pairings, on))}
            threshold = slider["value"] if threshold is None else threshold
        threshold = quantize_threshold(threshold)
    answer, note = with_overlay(
        lambda labels: client.graph(model, pairings, k=None if threshold is not None else params["k"],
                                    threshold=threshold, threshold_on=on, labels=labels),
        params.get("overlay"))
    data: GraphView = {**answer}
    if note:
        data["overlay_note"] = note
    return data, info, threshold, slider


def ablation_digest(params: dict[str, Any]) -> str | None:
    """What the graph's verdicts depend on besides its parameters: the model's cached ablation
    results (a digest of their names), so a view rendered before a verification is not served
    again after it; None when verification is off."""
    if params.get("verification", "off") == "off":
        return None
    try:
        cached = api().model_info(params["model"]).get("cached") or []
    except ApiError:
        return None
    names = sorted(c for c in cached if str(c).startswith("ablation?"))
    return hashlib.blake2b(json.dumps(names).encode(), digest_size=8).hexdigest()


def load_verdicts(client: ApiClient, params: dict[str, Any], counts: dict[str, int]
                  ) -> tuple[Verdicts, str | None]:
    """Cached verdicts of the graph's top edges per pairing (graph_filters.verify_k) and the
    API's verdict rule; never computes (an uncovered edge is "not measured")."""
    answers, rule = [], None
    top_max = vocab().limits.ablation_top_max
    for pairing, k in verify_k(params["pairings"], params["rule"], params["k"], counts, top_max).items():
        try:
            answer = client.ablation(params["model"], pairing, top=k, cached=True)
        except ApiError:
            continue  # a model that cannot be run: its edges stay "not measured"
        answers.append(answer)
        rule = rule or (answer.get("verdict_rule") or {}).get("rule")
    return verdict_map(answers), rule


def chip(label: str, shown: str, key: str, value: str, title: str = "") -> html.Span:
    """A summary chip ``label shown`` (id "stat-<key>", the raw ``value`` as data-value)."""
    return html.Span([html.Span(label, className="stat-label"), html.Span(shown, className="stat-value")],
                     className="stat", id=f"stat-{key}", title=title, **data_attrs({"data-value": value}))


def filter_chips(params: dict[str, Any], shown: int, total: int, found: list[str],
                 counts: dict[str, int] | None, rule: str | None,
                 quantiles: list[float] | None = None) -> list[Any]:
    """Chips of what the filters show: edges in the layer range, search matches, verdicts (the
    verified chip names the random-pair null and its ``quantiles``; "null not computed" only
    when some edge is)."""
    out: list[Any] = []
    if params.get("layers") or params.get("verification") == "verified":
        what = f"layers {format_layers(tuple(params['layers']))}" if params.get("layers") else "verified only"
        out.append(chip("shown", f"{shown} of {total} edges ({what})", "shown-edges", str(shown)))
    if params.get("find"):
        out.append(chip("found", ", ".join(found) or f"no {params['find']} in view", "found", ",".join(found)))
    if counts is not None:
        q = f" (q={', '.join(f'{v:.4g}' for v in quantiles)})" if quantiles else ""
        for verdict in VERDICTS:
            if verdict in ("null not computed", "null too small") and not counts.get(verdict):
                continue
            label = f"verified: above the random-pair null{q}" if verdict == "verified" else verdict
            out.append(chip(label, str(counts[verdict]), verdict.replace(" ", "-"), str(counts[verdict]),
                            title=rule or ""))
        if counts[NOT_MEASURED]:
            out.append(html.Span("not measured: press “verify the top edges” (computes; needs your token "
                                 "in a lab)", className="hint", id="graph-verify-hint"))
    return out


def shown_edges_of(client: ApiClient, params: dict[str, Any], data: GraphOut
                   ) -> tuple[dict[str, Any], dict[str, Any], Verdicts | None, str | None]:
    """What the graph view shows of an API graph ``data``: (node-link in the layer range, the
    node-link drawn: in range and, with verification=verified, verified only; the verdicts
    read, or None when verification is off; their rule). The figure and its CSV both use it."""
    mode = params.get("verification", "off")
    counts = data.get("edge_counts", {})
    verdicts, rule = load_verdicts(client, params, counts) if mode != "off" else (None, None)
    in_range = filter_layers(data["graph"], params.get("layers"))
    node_link = keep_verified(in_range, verdicts) if verdicts is not None and mode == "verified" else in_range
    return in_range, node_link, verdicts, rule


def shown_graph(client: ApiClient, params: dict[str, Any]) -> GraphView:
    """The API graph of ``params`` with only the edges (and nodes) the view draws."""
    data = load_graph(client, params)[0]
    return {**data, "graph": shown_edges_of(client, params, data)[1]}


@view_callback("graph", Output("graph", "figure"), Output("graph-summary", "children"),
               Output("slider-range", "data"), Output("graph-summary", "data-edges"),
               Output("graph-summary", "data-hubs"),
               triggers=(Input("ablation-token", "data"),),
               variant=lambda p: [ablation_digest(p), circuit_state(p)])
def render_graph(search: str | None, ready: dict | None, label_sets: list | None) -> tuple:
    """The head graph of the URL's pairings, rule, metric, layout, overlay and selection."""
    state = state_of(search, label_sets)
    return graph_view(view_params(state, "graph", ready), label_sets,
                      waiting=waiting_for(state, ready, "graph"))


def search_classes(client: ApiClient, params: dict[str, Any], nodes: list[dict[str, Any]],
                   backdrop: list[dict[str, Any]]) -> dict[str, str]:
    """head -> class for a class search: the graph nodes' classes, the overlay's for heads
    without edges (a KV group: its query heads' classes joined); {} for a head or layer search."""
    find = params.get("find") or ""
    if not find or is_head_or_layer(find):
        return {}
    out = {str(n["id"]): str(n["head_class"]) for n in nodes if n.get("head_class")}
    overlay = overlay_classes(client, params.get("overlay"), params["model"])
    for n in backdrop:
        name = str(n["id"])
        if name in out:
            continue
        members = [overlay[h] for h in str(n.get("heads") or name).split(",") if h in overlay]
        if members:
            out[name] = JOINED.join(dict.fromkeys(members))
    return out


def graph_view(params: dict[str, Any] | None, label_sets: list[LabelSetSummary] | None = None,
               waiting: str = WAITING) -> tuple:
    """(figure, summary, slider range, edge count, hubs) for graph params (None: waiting);
    ``label_sets``: the API's label-set list (the overlay's class order; read when None)."""
    if not params:
        return (empty_figure(waiting), [], no_update, None, None)
    pairings = list(params["pairings"])
    if not pairings:
        return (empty_figure("pick at least one pairing (OQ / OK / OV) above"), [], no_update, "0", "")
    client = api()
    try:
        data, info, threshold, slider = load_graph(client, params)
    except ApiError as err:
        return (empty_figure(err.message), [error_note(err.message)], no_update, None, None)
    counts = data.get("edge_counts", {})
    in_range, node_link, verdicts, rule = shown_edges_of(client, params, data)
    layers = params.get("layers")
    layer_indices = [layer for layer in info["layer_indices"] if in_layers(layer, layers)]
    backdrop = {"nodes": [n for n in all_head_nodes(info) if in_layers(n["layer"], layers)]}
    if params["layout"] == "grid":
        pos = grid_positions(node_link, layer_indices)
        head_pos = grid_positions(backdrop, layer_indices)
    else:
        pos = positions(node_link, "force")
        head_pos = None
    classes = search_classes(client, params, node_link.get("nodes", []), backdrop["nodes"])
    found = find_matches(list(pos) + [n["id"] for n in backdrop["nodes"] if head_pos and n["id"] not in pos],
                         params.get("find") or "", classes)
    shown_edges = node_link.get("edges", [])
    too_many = len(shown_edges) > EDGE_DRAW_LIMIT
    circuit = cached_circuit(params)  # the URL's task circuit, when cached: marked on the graph
    marks = circuit_marks(circuit) if circuit else None
    if too_many:
        fig = layer_graph_figure(shown_edges, layer_indices, rule=str(data.get("rule", "")))
    else:
        fig = graph_figure({**data, "graph": node_link, "layer_indices": layer_indices,
                            "edge_counts": edge_counts(shown_edges, pairings)}, pos, layout=params["layout"],
                           all_heads=[n["id"] for n in backdrop["nodes"]], head_pos=head_pos,
                           backdrop=backdrop["nodes"],
                           selected=params.get("head"),
                           selected_edge=(*params["pair"], params["pairing"]) if params.get("pair") else None,
                           verdicts=verdicts, highlight=found, pinned=params.get("pins") or (),
                           class_order=class_order(client, params.get("overlay"), label_sets), circuit=marks)
    total = sum(counts.values())
    hubs = ",".join(data.get("hubs", {}).get("hubs", []))
    chips = filter_chips(params, len(shown_edges), total, found,
                         None if verdicts is None else verdict_counts(in_range.get("edges", []), verdicts), rule,
                         None if verdicts is None else null_quantiles(verdicts))
    if params.get("task"):
        in_circuit = None if marks is None else sum(
            (e["source"], e["target"], e.get("pairing", "")) in marks["edges"] for e in shown_edges)
        chips.append(circuit_chip(params, "cached" if marks else circuit_state(params), marks, in_circuit))
    if too_many:
        chips.append(html.Span(too_many_note(len(shown_edges)), className="hint warn", id="graph-aggregated",
                               **data_attrs({"data-edges": str(len(shown_edges))})))
    return (fig, summary(data, threshold, graph_on(params)) + chips, no_update if slider is None else slider,
            str(total), hubs)
