"""Side panels: one head (class, pattern scores, top tokens, partners) and one head pair."""

from __future__ import annotations

from typing import Any

from dash import Dash, Input, Output, html

from headgraph.frontend.api_client import ApiError
from headgraph.frontend.callbacks.common import ApiProvider, error_note, with_overlay
from headgraph.frontend.figures import PAIRING_COLORS, cosines_figure, empty_figure


def _num(v: Any, digits: int = 4) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return str(v)


def token_list(tokens: list[dict[str, Any]] | None) -> html.Span:
    if not tokens:
        return html.Span("–", className="tokens")
    return html.Span([html.Span(t.get("display", t.get("text", "")), className="token",
                                title=f"id {t.get('id')} · score {t.get('score', 0):.3f}")
                      for t in tokens], className="tokens")


def kv_table(rows: list[tuple[str, Any, str]]) -> html.Table:
    """Two-column table; the third item is the cell id (tests read values there)."""
    return html.Table(html.Tbody([html.Tr([html.Th(k), html.Td(v, id=cid)]) for k, v, cid in rows]),
                      className="kv")


def head_body(d: dict[str, Any]) -> list[Any]:
    head = d["head"]
    out: list[Any] = [html.H3([head, html.Span(d.get("class") or "no class", className="badge")],
                              id="head-panel-title", **{"data-head": head})]
    pats = d.get("patterns")
    if pats:
        out.append(html.H4("attention-pattern scores"))
        out.append(html.Div([html.Div([html.Span(k.replace("_", " "), className="bar-label"),
                                       html.Span(className="bar", style={"width": f"{100 * float(v or 0):.0f}%"}),
                                       html.Span("–" if v is None else f"{float(v):.3f}", className="bar-value")], className="bar-row")
                             for k, v in pats.items()], className="bars", id="head-patterns"))
    tokens = d.get("tokens") or {}
    if tokens:
        out.append(html.H4("top tokens per role"))
        out.append(html.Table(html.Tbody([html.Tr([html.Th(role), html.Td(token_list(toks))])
                                          for role, toks in tokens.items()]), className="kv",
                              id="head-tokens"))
    partners = d.get("partners") or {}
    if partners:
        out.append(html.H4("strongest partners (PK)"))
        rows = []
        for pairing, sides in partners.items():
            for side, items in (("out", sides.get("out", [])), ("in", sides.get("in", []))):
                if not items:
                    continue
                buttons = []
                for it in items[:5]:
                    s, t = (head, it["head"]) if side == "out" else (it["head"], head)
                    buttons.append(html.Button(
                        f"{it['head']} {it['pk']:.3g}", className="partner",
                        id={"type": "open-pair", "pairing": pairing, "source": s, "target": t},
                        style={"borderColor": PAIRING_COLORS.get(pairing, "#999")}, n_clicks=0))
                arrow = "→" if side == "out" else "←"
                rows.append(html.Tr([html.Th(f"{pairing} {arrow}", style={"color": PAIRING_COLORS.get(pairing)}),
                                     html.Td(buttons)]))
        out.append(html.Table(html.Tbody(rows), className="kv partners", id="head-partners"))
    return out


def pair_body(d: dict[str, Any]) -> list[Any]:
    title = f"{d['source']} → {d['target']}"
    sig = d.get("significant")
    rows = [
        ("PK", _num(d["pk"]), "pair-pk"), ("normalized", _num(d["normalized"]), "pair-normalized"),
        ("CS", _num(d.get("cs")), "pair-cs"), ("z (Haar)", _num(d.get("z"), 3), "pair-z"),
        ("p (Haar)", _num(d.get("p_haar"), 3), "pair-p-haar"),
        ("p (anisotropic)", _num(d.get("p_anisotropic"), 3), "pair-p-aniso"),
        ("FDR significant", "–" if sig is None else ("yes" if sig else "no"), "pair-sig"),
        ("ranks", " / ".join(str(r) for r in d.get("ranks", [])), "pair-ranks"),
    ]
    if not d.get("forward", True):
        rows.append(("layer order", "not forward (target is not later)", "pair-order"))
    classes = f"{d.get('source_class') or 'no class'} → {d.get('target_class') or 'no class'}"
    return [
        html.H3([title, html.Span(d["pairing"], className="badge",
                                  style={"background": PAIRING_COLORS.get(d["pairing"], "#777")})],
                id="pair-panel-title", **{"data-pair": f"{d['source']},{d['target']}",
                                          "data-pairing": d["pairing"], "data-pk": repr(d["pk"])}),
        html.Div(classes, className="pair-classes"),
        kv_table(rows),
        html.H4("top tokens"),
        html.Table(html.Tbody([
            html.Tr([html.Th(f"{d['source']} {d['pairing'][0]}"), html.Td(token_list(d.get("source_tokens")))]),
            html.Tr([html.Th(f"{d['target']} {d['pairing'][1]}"), html.Td(token_list(d.get("target_tokens")))]),
        ]), className="kv"),
    ]


def register(app: Dash, api: ApiProvider) -> None:
    @app.callback(Output("head-panel-body", "children"), Input("params-head-panel", "data"))
    def render_head_panel(params: dict[str, Any] | None) -> list[Any]:
        if not params or not params.get("head"):
            return []
        if not params.get("ready"):
            return [html.H3(params["head"]), html.P("waiting for the model's results…")]
        try:
            data, _ = with_overlay(lambda labels: api().head(params["model"], params["head"], labels=labels),
                                   params.get("overlay"))
        except ApiError as err:
            return [html.H3(params["head"]), error_note(err.message)]
        return head_body(data)

    @app.callback(Output("pair-panel-body", "children"), Output("cosines", "figure"),
                  Input("params-pair-panel", "data"))
    def render_pair_panel(params: dict[str, Any] | None) -> tuple:
        if not params or not params.get("pair"):
            return [], empty_figure("", 200)
        s, t = params["pair"]
        if not params.get("ready"):
            return [html.H3(f"{s} → {t}"), html.P("waiting for the model's results…")], empty_figure("", 200)
        try:
            data, _ = with_overlay(lambda labels: api().pair(params["model"], params["pairing"], s, t,
                                                             labels=labels),
                                   params.get("overlay"))
        except ApiError as err:
            return [html.H3(f"{s} → {t}"), error_note(err.message)], empty_figure(err.message, 200)
        return pair_body(data), cosines_figure(data)
