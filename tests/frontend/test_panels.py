"""The pair panel's p-values: a Monte-Carlo p at its floor 1/(n+1) reads as a bound."""

from __future__ import annotations

from headgraph.frontend.callbacks.panels import p_text


def test_a_p_value_at_the_monte_carlo_floor_reads_as_a_bound():
    floor = 1 / 2001
    assert p_text(1 / 2001, floor) == "≤ 0.0005"
    assert p_text(3 / 2001, floor) == "0.0015"
    assert p_text(0.25, floor) == "0.25"


def test_without_a_floor_or_a_value_it_prints_plainly():
    assert p_text(0.0004997, None) == "0.0005"
    assert p_text(None, 1 / 2001) == "–"
