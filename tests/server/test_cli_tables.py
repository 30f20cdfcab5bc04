"""cli.tables: the aligned text table and the CSV text every command prints."""

from __future__ import annotations

import csv
import io

import pytest

from headgraph.server.cli.tables import cell, csv_text, interval, text_table


def test_text_table_aligns_each_column_to_its_widest_cell() -> None:
    lines = text_table(["rank", "node", "score"], [["1", "L10H3", "0.5000"], ["12", "L0H1", "12.2500"]],
                       align="rlr")
    assert lines == ["rank  node     score",
                     "   1  L10H3   0.5000",
                     "  12  L0H1   12.2500"]
    # every line is as long as the widths plus the two-space gaps; columns start at one offset
    assert {len(line) for line in lines} == {4 + 2 + 5 + 2 + 7}
    assert {line.index("  ", 4) for line in lines} == {4}


def test_text_table_left_by_default_strip_and_no_rows() -> None:
    assert text_table(["a", "bb"], [["xyz", "1"]]) == ["a    bb", "xyz  1 "]
    assert text_table(["a", "bb"], [["xyz", "1"]], strip=True) == ["a    bb", "xyz  1"]
    assert text_table(["head", "status"], []) == ["head  status"]
    with pytest.raises(ValueError, match="2 columns"):
        text_table(["a", "b", "c"], [], align="lr")


def test_cells_and_intervals() -> None:
    assert cell(None, "{:.3f}") == "-"
    assert cell(0.12345, "{:.3f}") == "0.123"
    assert cell("L0H1") == "L0H1"
    assert interval(None) == "-"
    assert interval({"value": None, "low": 0.1, "high": 0.2}) == "-"
    assert interval({"value": 0.5, "low": None, "high": 0.7}) == "0.500"
    assert interval({"value": 0.5, "low": 0.25, "high": 0.75}) == "0.500 [0.250, 0.750]"


def test_csv_text_round_trips_through_the_csv_reader() -> None:
    rows = [["L0H1", "L1H2", 0.1 + 0.2, None], ["a,b", 'say "hi"', 3, ""]]
    text = csv_text(["source", "target", "pk", "rank"], rows)
    assert text.endswith("\n") and "\r" not in text
    back = list(csv.reader(io.StringIO(text)))
    assert back == [["source", "target", "pk", "rank"],
                    ["L0H1", "L1H2", repr(0.1 + 0.2), ""], ["a,b", 'say "hi"', "3", ""]]
