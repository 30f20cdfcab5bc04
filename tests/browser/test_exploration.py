"""Browser: exploring the head graph. On the demo (one warm server): a class has the same colour
in the graph, the heatmap's class strip (and its legend) and the findings report's palette;
hovering a node shows its strongest edges per pairing as the API ranks them; ``find`` takes a
class name; heads pinned with Ctrl + click, grouped and labelled in the Subgraph view reopen
from the copied link, export and import as JSON and save as a label set. (SmolLM2's default
graph, 60 nodes, is checked in test_smollm2.py, on its warm job.)

Every number is compared with the API's answers, none hard-coded.
"""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import Page

import exploration_scenario
import subgraph_scenario
from browser import Server, query_of, wait_figure, wait_until
from exploration_scenario import GRAPH, api, points

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def warm_models() -> tuple[str, ...]:
    return ("demo",)  # computed through the API first


def test_a_class_has_one_colour_in_graph_heatmap_strip_and_report(server: Server, page: Page) -> None:
    colours = exploration_scenario.class_colours_agree(server, page, "demo")
    assert colours["Induction"] != colours.get("Previous Token")


def test_hovering_a_node_lists_its_strongest_edges(server: Server, page: Page) -> None:
    exploration_scenario.node_hover_lists_edges(server, page, "demo")


def test_find_takes_a_class_name(server: Server, page: Page) -> None:
    classes = api(server, "/api/labels/patterns", model="demo")["classes"]
    induction = sorted(h for h, c in classes.items() if c == "Induction")
    assert induction
    page.goto(server.url + GRAPH.format(model="demo") + "&overlay=patterns")
    wait_figure(page, "graph", lambda f: points(f, "node"))
    box = page.locator("#find-input")
    box.fill("induction")
    box.press("Enter")
    wait_until(lambda: query_of(page.url).get("find") == "induction", 15, message="find in URL", page=page)
    chip = page.locator("#stat-found")
    chip.wait_for(timeout=30_000)
    wait_until(lambda: chip.get_attribute("data-value") == ",".join(induction), 30, message="found chip", page=page)
    fig = wait_figure(page, "graph", lambda f: any(str(tr.get("name", "")).startswith("found") for tr in f["data"]))
    ringed = {cd[1] for tr in fig["data"] if str(tr.get("name", "")).startswith("found") for cd in tr["customdata"]}
    assert ringed == set(induction)
    assert "head" not in query_of(page.url)  # a class opens no head panel


@pytest.mark.slow  # ~25 s: four pins, a group, a label, a second context, export, two imports, a save
def test_pin_group_label_share_export_import_and_save(server: Server, page: Page, browser: Any,
                                                      tmp_path: Any) -> None:
    graph = api(server, "/api/graph", model="demo", pairings="OQ,OK,OV", k=20, threshold_on="pk")["graph"]
    edged = sorted(n["id"] for n in graph["nodes"])  # heads with edges; the first columns (the modebar
    pins = [n for n in edged if n.startswith("L0")][:3] + [n for n in edged if n.startswith("L1")][:1]  # is right)
    subgraph_scenario.run(server, page, browser, tmp_path, model="demo",
                          graph_url=GRAPH.format(model="demo") + "&overlay=", pins=pins)
