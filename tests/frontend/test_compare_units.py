"""The dashboard's compare and timeline views (issue 16) without a browser: URL state, and the
views' figures from the in-process API (tests/frontend/conftest.py).

Every figure is checked against the API's JSON for the same parameters (the API's own numbers
are checked against an independent float64 PK in tests/core/test_series.py). The browser
opening each view and a copied link on a real server is tests/browser/test_compare.py.
"""

from __future__ import annotations

from headgraph.core.models.series import demo_series
from headgraph.server.http.routers.vocabulary import served_vocabulary as vocabulary
from dash import no_update

from headgraph.frontend.callbacks.compare import compare_view, download_timeline, keep_slider, timeline_view
from headgraph.frontend.state.url import parse_query, to_query
from headgraph.frontend.state.readiness import view_params
from headgraph.frontend.state.transitions import next_state
from headgraph.frontend.api.names import Vocabulary

from frontend_support import crop

SERIES = demo_series()
FIRST, LAST = SERIES[0], SERIES[-1]
VOCAB = Vocabulary.from_json(vocabulary())


def vocab() -> Vocabulary:
    return VOCAB



def test_url_state_round_trips_compare_and_timeline() -> None:
    v = vocab()
    s = parse_query(f"?view=compare&model=demo&a={FIRST.model_id}&b=demo&pairing=OK&k=7", v)
    assert (s.view, s.a, s.b, s.k) == ("compare", FIRST.model_id, "demo", 7)
    assert parse_query(to_query(s), v) == s
    t = parse_query("?view=timeline&series=demo-series&checkpoint=5", v)
    assert (t.view, t.series, t.checkpoint) == ("timeline", "demo-series", "5")
    assert parse_query(to_query(t), v) == t
    assert parse_query("?view=timeline&checkpoint=abc", v).checkpoint == ""
    assert next_state(t, "step-slider", 2, v).checkpoint == "2"
    # the series control's value on page load is the same series: the link's checkpoint stays;
    # another series starts at its last checkpoint
    assert next_state(t, "series-input", "demo-series", v).checkpoint == "5"
    assert next_state(t, "series-input", "demo@step-30,demo", v).checkpoint == ""
    assert next_state(t, "step-slider", None, v) == t
    assert next_state(t, "series-input", "", v).series == "demo-series"
    assert next_state(s, "compare-b-input", f" {LAST.model_id} ", v).b == LAST.model_id
    assert view_params(s, "compare", None) == {"model": "demo", "a": FIRST.model_id, "b": "demo",
                                              "pairing": "OK", "k": 7, "ready": None}


def test_compare_view_draws_the_api_answer(http, in_app) -> None:
    v = vocab()
    s = parse_query(f"?view=compare&a={FIRST.model_id}&b=demo&pairing=OK&k=10", v)
    heat, graph, _, _, options = compare_view(view_params(s, "compare", None))
    data = http.get("/api/compare", params={"a": FIRST.model_id, "b": "demo", "pairing": "OK", "k": 10}).json()
    assert [t.z for t in heat.data][2] is not None
    assert [list(r) for r in heat.data[2].z] == crop(data["diff"], data["valid"])
    assert [list(r) for r in heat.data[0].z] == crop(data["grid_a"], data["valid"])
    assert list(heat.data[0].y) == [f"L0H{h}" for h in range(8)] and list(heat.data[0].x) == [f"L1H{h}" for h in range(8)]
    gained = next(t for t in graph.data if str(t.name).startswith("gained"))
    assert gained.name.endswith(f": {len(data['gained'])}")
    assert any(o.value == LAST.model_id for o in options)
    blank_b = compare_view(view_params(parse_query("?view=compare", v), "compare", None))
    assert "pick model B" in str(blank_b[2])
    bad = compare_view(view_params(parse_query("?view=compare&b=demo@step-7", v), "compare", None))
    assert "demo checkpoint" in str(bad[2])


def test_timeline_view_draws_the_api_answer(http, in_app) -> None:
    v = vocab()
    s = parse_query("?view=timeline&series=demo-series&pairing=OK&k=5&checkpoint=0", v)
    lines, grid, _, slider, _ = timeline_view(view_params(s, "timeline", None))
    lo, hi, marks, value = slider.min, slider.max, slider.marks, slider.value
    data = http.get("/api/timeline", params={"series": "demo-series", "pairing": "OK", "k": 5}).json()
    assert [list(t.y) for t in lines.data] == [e["pk"] for e in data["edges"]]
    assert [list(t.x) for t in lines.data][0] == [c.step for c in SERIES]
    assert (lo, hi, value) == (0, len(SERIES) - 1, 0)
    assert list(marks.values()) == [str(c.step) for c in SERIES]
    pk = http.get("/api/pk", params={"model": FIRST.model_id, "pairing": "OK"}).json()
    assert [list(r) for r in grid.data[0].z] == crop(pk["grid"], pk["valid"])
    assert grid.data[0].zmax == max(max(e["pk"]) for e in data["edges"])  # one colour scale for the series
    csv_file = download_timeline(1, "?view=timeline&series=demo-series&pairing=OK&k=5")
    served = http.get("/api/timeline", params={"series": "demo-series", "pairing": "OK", "k": 5, "format": "csv"})
    assert csv_file["content"] == served.text and csv_file["filename"] == "timeline-demo-series-OK.csv"
    default = timeline_view(view_params(parse_query("?view=timeline&k=5", v), "timeline", None))
    assert default[3].value == len(SERIES) - 1 and f"step {LAST.step}" in default[1].layout.title.text



def test_a_render_answered_after_the_slider_moved_leaves_it_where_the_user_put_it(http, in_app) -> None:
    """A render asked for while the slider showed the last step must not put it back there once
    the user moved it (its new slider would write that step to the URL); a page whose slider shows
    other steps or another position gets the new one."""
    v = vocab()
    outputs = timeline_view(view_params(parse_query("?view=timeline&series=demo-series&k=5", v), "timeline", None))
    slider = outputs[3]
    as_sent = {str(k): m for k, m in slider.marks.items()}  # the browser's marks: string keys
    kept = keep_slider(outputs, slider.value, as_sent)
    assert kept[3] is no_update and kept[:3] == outputs[:3] and kept[4:] == outputs[4:]
    assert keep_slider(outputs, 0, as_sent)[3] is slider  # back to a URL's other position
    assert keep_slider(outputs, None, None)[3] is slider  # the layout's empty slider
    assert keep_slider(outputs, slider.value, {"0": "1", "1": "2"})[3] is slider  # another series
