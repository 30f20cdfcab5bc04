"""Head graph view: top-k or threshold edges per pairing, class overlay, hubs, two layouts."""

from __future__ import annotations

from typing import Any

from dash import Input, Output, html, no_update

from headgraph.frontend.api_client import ApiError
from headgraph.frontend.callbacks.common import WAITING, api, error_note, stat, state_of, with_overlay
from headgraph.frontend.callbacks.registry import callback
from headgraph.frontend.figures import empty_figure, graph_figure
from headgraph.frontend.graph_layout import grid_positions, positions
from headgraph.frontend.state import threshold_on, view_params

SLIDER_STEPS = 200


def all_head_nodes(info: dict[str, Any]) -> list[dict[str, Any]]:
    """Node records for every (layer, head) of a model (backdrop of the layer x head layout),
    and on a grouped-query model every KV group too (kind "kv_group", ``heads`` its query
    heads, as the API's graph nodes)."""
    n_heads = int(info["n_heads"])
    n_kv = int(info.get("n_kv_heads") or n_heads)
    size = n_heads // n_kv if 0 < n_kv < n_heads and n_heads % n_kv == 0 else 1
    out: list[dict[str, Any]] = []
    for layer in info["layer_indices"]:
        out += [{"id": f"L{layer}H{h}", "layer": layer, "head": h, "kind": "head"} for h in range(n_heads)]
        if size > 1:
            out += [{"id": f"L{layer}KV{g}", "layer": layer, "head": g, "kind": "kv_group",
                     "heads": ",".join(f"L{layer}H{g * size + j}" for j in range(size))}
                    for g in range(n_kv)]
    return out


def metric_range(client: Any, model: str, pairings: list[str], metric: str) -> tuple[float, float]:
    """(min, max) of the thresholded metric over the valid pairs of the chosen pairings."""
    api_metric = {"raw": "raw", "normalized": "normalized", "z": "z"}.get(metric, "raw")
    lo, hi = float("inf"), float("-inf")
    for p in pairings:
        g = client.pk(model, p, api_metric)
        if g.get("min") is not None:
            lo, hi = min(lo, g["min"]), max(hi, g["max"])
    if lo > hi:
        return 0.0, 1.0
    return lo, hi


def summary(data: dict[str, Any], threshold: float | None) -> list[Any]:
    counts = data.get("edge_counts", {})
    total = sum(counts.values())
    hubs = data.get("hubs", {}).get("hubs", [])
    parts = [stat("edges", total, "edges"),
             *[stat(p, n, f"edges-{p}") for p, n in counts.items()],
             stat("hubs", ", ".join(hubs), "hubs"),
             stat("nodes", len(data["graph"].get("nodes", [])), "nodes")]
    if threshold is not None:
        parts.append(stat("threshold", f"{threshold:.4g}", "threshold"))
    cc = data.get("class_counts")
    if cc:
        parts += [stat("in-class", cc.get("in_class"), "in-class"),
                  stat("out-of-class", cc.get("out_of_class"), "out-of-class")]
    parts.append(html.Span(data.get("rule", ""), className="rule-text", id="graph-rule"))
    capped = data.get("capped") or {}
    if capped:
        kept = ", ".join(f"{p}: best {counts.get(p, 0)} of {n}" for p, n in capped.items())
        parts.append(html.Span(f"edges capped ({kept}); raise the threshold to see all",
                               className="hint warn", id="graph-capped"))
    if data.get("overlay_note"):
        parts.append(html.Span(data["overlay_note"], className="hint", id="graph-overlay-note"))
    parts.append(html.Span("click a node for its head panel, the middle of an edge for the pair",
                           className="hint"))
    return parts


def load_graph(client: Any, params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], float | None,
                                                               dict[str, Any] | None]:
    """(graph JSON, model info, threshold used, slider range or None) for view params.

    The slider range ({"key", "min", "max", "step", "marks"}) is the thresholded metric's
    span over the chosen pairings; ``key`` names the (model, pairings, metric) it is for.

    In threshold mode without a chosen threshold, 80% of the way from the metric's minimum to
    its maximum is used (deterministic, so a link without one still reproduces the view).
    """
    model, pairings = params["model"], list(params["pairings"])
    info = client.model_info(model)["info"]
    threshold = None
    slider = None
    if params["rule"] == "threshold":
        lo, hi = metric_range(client, model, pairings, params["metric"])
        threshold = params["threshold"]
        if threshold is None:
            threshold = lo + 0.8 * (hi - lo)
        slider = {"key": [model, pairings, params["metric"]], "min": lo, "max": hi,
                  "step": (hi - lo) / SLIDER_STEPS or 0.01, "marks": {lo: f"{lo:.3g}", hi: f"{hi:.3g}"}}
    data, note = with_overlay(
        lambda labels: client.graph(model, pairings, k=None if threshold is not None else params["k"],
                                    threshold=threshold, threshold_on=threshold_on(params["metric"]),
                                    labels=labels),
        params.get("overlay"))
    if note:
        data = {**data, "overlay_note": note}
    return data, info, threshold, slider


@callback(Output("graph", "figure"), Output("graph-summary", "children"), Output("slider-range", "data"),
          Output("graph-summary", "data-edges"), Output("graph-summary", "data-hubs"),
          Input("url", "search"), Input("ready-store", "data"), Input("labels-store", "data"))
def render_graph(search: str | None, ready: dict | None, label_sets: list | None) -> tuple:
    """The head graph of the URL's pairings, rule, metric, layout, overlay and selection."""
    return graph_view(view_params(state_of(search, label_sets), "graph", ready))


def graph_view(params: dict[str, Any] | None) -> tuple:
    """(figure, summary, slider range, edge count, hubs) for graph params (None: waiting)."""
    if not params:
        return (empty_figure(WAITING), [], no_update, None, None)
    pairings = list(params["pairings"])
    if not pairings:
        return (empty_figure("pick at least one pairing (OQ / OK / OV) above"), [], no_update, "0", "")
    try:
        data, info, threshold, slider = load_graph(api(), params)
    except ApiError as err:
        return (empty_figure(err.message), [error_note(err.message)], no_update, None, None)
    node_link = data["graph"]
    backdrop = {"nodes": all_head_nodes(info)}
    if params["layout"] == "grid":
        pos = grid_positions(node_link, info["layer_indices"])
        head_pos = grid_positions(backdrop, info["layer_indices"])
    else:
        pos = positions(node_link, "force")
        head_pos = None
    fig = graph_figure({**data, "layer_indices": info["layer_indices"]}, pos, layout=params["layout"],
                       all_heads=[n["id"] for n in backdrop["nodes"]], head_pos=head_pos,
                       backdrop=backdrop["nodes"],
                       selected=params.get("head"),
                       selected_edge=(*params["pair"], params["pairing"]) if params.get("pair") else None)
    total = sum(data.get("edge_counts", {}).values())
    hubs = ",".join(data.get("hubs", {}).get("hubs", []))
    return (fig, summary(data, threshold), no_update if slider is None else slider, str(total), hubs)
