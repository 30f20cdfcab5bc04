"""Side panels: one head (class, pattern scores, top tokens, partners) and one head pair.

Their buttons are links (``dcc.Link``) to the current URL with one thing changed (close: no
head / no pair; a partner: that pair), so the URL writer never needs pattern-matching inputs.
"""

from __future__ import annotations

from typing import Any

from dash import Dash, Input, Output, dcc, html

from headgraph.frontend.api.answers import HeadOut, PairOut
from headgraph.frontend.api.client import ApiError
from headgraph.frontend.api.names import O_PAIRINGS
from headgraph.frontend.callbacks.circuit_reads import circuit_state, pair_attribution
from headgraph.frontend.callbacks.common import api, data_attrs, error_note, state_of, with_overlay
from headgraph.frontend.callbacks.router import view_callback
from headgraph.frontend.figures import PAIRING_COLORS, cosines_figure, empty_figure
from headgraph.frontend.state.readiness import view_params, waiting_for
from headgraph.frontend.state.transitions import toggle_pin
from headgraph.frontend.state.url import ViewState, to_query


def _num(v: Any, digits: int = 4) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return str(v)


def p_text(p: float | None, floor: float | None) -> str:
    """A Monte-Carlo p-value; at its floor 1/(n+1) (no null sample as large) "≤ floor"."""
    if p is not None and floor is not None and p <= floor * (1 + 1e-9):
        return f"≤ {floor:.2g}"
    return _num(p, 3)


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


def close_link(link_id: str, state: ViewState) -> dcc.Link:
    """The panel's × : a link to ``state`` (the current one without this panel's selection)."""
    return dcc.Link("×", id=link_id, href=to_query(state), className="close-btn", title="close")


def head_body(d: HeadOut, state: ViewState) -> list[Any]:
    """Head panel content for an /api/head answer; links are built from the current ``state``."""
    head = d["head"]
    members = list(d.get("heads") or []) if d.get("kind") == "kv_group" else []
    out: list[Any] = [close_link("head-close", state.with_(head=None)),
                      html.H3([head, html.Span(d.get("class") or "no class", className="badge")],
                              id="head-panel-title",
                              **data_attrs({"data-head": head, "data-kind": d.get("kind") or "head",
                                 "data-members": ",".join(members)})),
                      dcc.Link("unpin" if head in state.pins else "pin", id="head-pin", className="partner",
                               href=to_query(toggle_pin(state, head)),
                               title="pin this head into the subgraph (the Subgraph tab draws the pinned heads)")]
    if members:  # a KV group of a grouped-query model: the query heads it serves
        out.append(html.Div(["KV group: shared keys and values of ",
                             *[dcc.Link(h, className="partner", href=to_query(state.with_(head=h, pair=None)))
                               for h in members]], className="kv-members", id="head-members"))
    flags = d.get("flags") or {}
    if flags.get("description") is not None or flags.get("sink") is not None:
        what = [html.Span("what it does: ", className="stat-label"),
                html.Span(flags.get("description") or "unclassified", className="badge")]
        if flags.get("sink"):
            what.append(html.Span(f"attention sink (first-token attention {float(flags.get('first_token') or 0):.2f}"
                                  f" ≥ {flags.get('threshold', 0.9)}): its output barely varies",
                                  className="badge warn"))
        out.append(html.Div(what, id="head-what", **data_attrs({"data-description": flags.get("description") or "",
                                                      "data-sink": str(bool(flags.get("sink"))).lower()})))
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
                    buttons.append(dcc.Link(
                        f"{it['head']} {it['pk']:.3g}", className="partner",
                        href=to_query(state.with_(pair=(s, t), pairing=pairing)),
                        style={"borderColor": PAIRING_COLORS.get(pairing, "#999")}))
                arrow = "→" if side == "out" else "←"
                rows.append(html.Tr([html.Th(f"{pairing} {arrow}", style={"color": PAIRING_COLORS.get(pairing)}),
                                     html.Td(buttons)]))
        out.append(html.Table(html.Tbody(rows), className="kv partners", id="head-partners"))
    return out


DATA_PK_SETS = (("text", "text"), ("random", "random tokens"))
DATA_PK_PAIRINGS = O_PAIRINGS


def data_pk_rows(d: PairOut) -> list[tuple[str, Any, str]]:
    """The pair panel's data-weighted PK rows of an O -> Q/K/V pair: out / in share per prompt
    set as /api/pair gives them (only read from the cache there), "not computed" for a set it
    lacks, or "unavailable" with the reason for a set the model cannot give; [] for other
    pairings."""
    if d.get("pairing") not in DATA_PK_PAIRINGS:
        return []
    sets = d.get("data_pk") or {}
    failed = d.get("data_pk_unavailable") or {}
    rows = []
    for key, name in DATA_PK_SETS:
        cell = sets.get(key)
        for share in ("out_share", "in_share"):
            label = f"data-PK {share[:-6]} ({name})"
            cid = f"pair-datapk-{share[:-6]}-{key}"
            if cell is None and key in failed:
                rows.append((label, html.Span(f"unavailable: {failed[key]}", className="error-note",
                                              **data_attrs({"data-value": ""})), cid))
            elif cell is None:
                rows.append((label, html.Span("not computed", className="hint", **data_attrs({"data-value": ""})), cid))
            else:
                v = cell.get(share)
                base = cell.get(share + "_baseline")
                text = _num(v) + ("" if base is None else f" (random {_num(base, 3)})")
                rows.append((label, html.Span(text, **data_attrs({"data-value": "" if v is None else repr(v)})), cid))
    return rows


SIMILARITY_ROWS = (("cka", "CKA"), ("procrustes", "Procrustes"))


def similarity_rows(d: PairOut) -> list[tuple[str, Any, str]]:
    """The pair panel's CKA and Procrustes rows as /api/pair gives them (read from the cached
    forward grids only): the value, "–" for a pair outside the grid's valid ones (not forward),
    "not computed" for a kind whose grid is not cached (a CKA / Procrustes heatmap computes it)."""
    rows = []
    for key, name in SIMILARITY_ROWS:
        v = d.get(key)
        if v is None and key not in (d.get("similarity_cached") or ()):
            cell = html.Span("not computed", className="hint", **data_attrs({"data-value": ""}))
        else:
            cell = html.Span(_num(v), **data_attrs({"data-value": "" if v is None else repr(v)}))
        rows.append((name, cell, f"pair-{key}"))
    return rows


def pair_body(d: PairOut, state: ViewState) -> list[Any]:
    """Pair panel content for an /api/pair answer (close link from the current ``state``)."""
    title = f"{d['source']} → {d['target']}"
    sig = d.get("significant")
    rows = [
        ("PK", _num(d["pk"]), "pair-pk"), ("normalized", _num(d["normalized"]), "pair-normalized"),
        ("CS", _num(d.get("cs")) + (f" ({cs_of})" if (cs_of := d.get("cs_of")) and d.get("cs") is not None else ""),
         "pair-cs"),
        *similarity_rows(d),
        *data_pk_rows(d),
        ("z (Haar)", _num(d.get("z"), 3), "pair-z"),
        ("p (Haar)", p_text(d.get("p_haar"), d.get("p_floor")), "pair-p-haar"),
        ("p (anisotropic)", p_text(d.get("p_anisotropic"), d.get("p_floor")), "pair-p-aniso"),
        ("FDR significant", "–" if sig is None else ("yes" if sig else "no"), "pair-sig"),
        ("ranks", " / ".join(str(r) for r in d.get("ranks", [])), "pair-ranks"),
    ]
    if not d.get("forward", True):
        rows.append(("layer order", "not forward (target is not later)", "pair-order"))
    classes = f"{d.get('source_class') or 'no class'} → {d.get('target_class') or 'no class'}"
    return [
        close_link("pair-close", state.with_(pair=None)),
        html.H3([title, html.Span(d["pairing"], className="badge",
                                  style={"background": PAIRING_COLORS.get(d["pairing"], "#777")})],
                id="pair-panel-title", **data_attrs({"data-pair": f"{d['source']},{d['target']}",
                                                      "data-pairing": d["pairing"], "data-pk": repr(d["pk"])})),
        html.Div(classes, className="pair-classes"),
        kv_table(rows),
        html.H4("top tokens"),
        html.Table(html.Tbody([
            html.Tr([html.Th(f"{d['source']} {d['pairing'][0]}"), html.Td(token_list(d.get("source_tokens")))]),
            html.Tr([html.Th(f"{d['target']} {d['pairing'][1]}"), html.Td(token_list(d.get("target_tokens")))]),
        ]), className="kv"),
    ]


def waiting(title: str, link: dcc.Link, note: Any) -> list[Any]:
    return [link, html.H3(title), note]


def pending_note(data: HeadOut | PairOut, id_: str) -> list[Any]:
    """A panel opened while its model's job runs: which of its results are still to come
    (the API's "pending"); nothing when complete."""
    pending = list(data.get("pending") or [])
    if not pending:
        return []
    return [html.P(f"still being computed by the model's job: {', '.join(pending)} (shown when done)",
                   id=id_, className="note", **data_attrs({"data-pending": ",".join(pending)}))]


STALE_JS = """
function(search, headBody, pairBody) {
  const q = new URLSearchParams(search || "");
  const up = (v) => (v || "").toUpperCase();
  const title = (body, id) => (Array.isArray(body) ? body : [body]).find(
      (c) => c && c.props && c.props.id === id);
  const head = title(headBody, "head-panel-title");
  const pair = title(pairBody, "pair-panel-title");
  const headStale = !!head && up(head.props["data-head"]) !== up(q.get("head"));
  const pairStale = !!pair && (up(pair.props["data-pair"]) !== up(q.get("pair"))
      || up(pair.props["data-pairing"]) !== up(q.get("pairing") || pair.props["data-pairing"]));
  return [headStale ? "panel stale" : "panel", pairStale ? "panel stale" : "panel"];
}
"""


def register_clientside(app: Dash) -> None:
    """Marks a panel ``stale`` (dimmed, ``aria-busy``) from the moment the URL selects another
    head or pair until its new content arrives, so the previous selection is never shown as
    the current one."""
    app.clientside_callback(
        STALE_JS,
        Output("head-panel", "className"), Output("pair-panel", "className"),
        Input("url", "search"), Input("head-panel-body", "children"), Input("pair-panel-body", "children"))


@view_callback("head-panel", Output("head-panel-body", "children"))
def render_head_panel(search: str | None, ready: dict | None, label_sets: list | None) -> list[Any]:
    """The selected head's panel (empty when no head is selected)."""
    state = state_of(search, label_sets)
    if not state.head:
        return []
    link = close_link("head-close", state.with_(head=None))
    params = view_params(state, "head-panel", ready)
    if params is None:
        return waiting(state.head, link, html.P(waiting_for(state, ready, "head-panel"), id="head-waiting"))
    partial = bool((ready or {}).get("partial"))
    try:
        data, _ = with_overlay(lambda labels: api().head(params["model"], params["head"], labels=labels,
                                                         partial=partial), params.get("overlay"))
    except ApiError as err:
        return waiting(state.head, link, error_note(err.message))
    return head_body(data, state) + pending_note(data, "head-pending")


@view_callback("pair-panel", Output("pair-panel-body", "children"), Output("cosines", "figure"),
               variant=circuit_state)
def render_pair_panel(search: str | None, ready: dict | None, label_sets: list | None) -> tuple:
    """The selected pair's panel and its principal-angle cosines (empty when none is selected)."""
    state = state_of(search, label_sets)
    if not state.pair:
        return [], empty_figure("", 200)
    s, t = state.pair
    link = close_link("pair-close", state.with_(pair=None))
    params = view_params(state, "pair-panel", ready)
    if params is None:
        note = html.P(waiting_for(state, ready, "pair-panel"), id="pair-waiting")
        return waiting(f"{s} → {t}", link, note), empty_figure("", 200)
    partial = bool((ready or {}).get("partial"))
    try:
        data, _ = with_overlay(lambda labels: api().pair(params["model"], params["pairing"], s, t, labels=labels,
                                                         partial=partial), params.get("overlay"))
    except ApiError as err:
        return waiting(f"{s} → {t}", link, error_note(err.message)), empty_figure(err.message, 200)
    body = pair_body(data, state)
    attribution = pair_attribution(params, s, t)  # the chosen task's circuit, when cached
    if attribution is not None:
        body.insert(4, attribution)
    return body + pending_note(data, "pair-pending"), cosines_figure(data)
