"""Grouped-query (GQA) models in the browser: a real server on a local random Qwen2 folder
(3 layers, 4 query heads, 2 KV groups; conftest ``qwen2_gqa_dir``), computed first through
the API, driven by Debian's chromium.

Every KV node, edge, heatmap cell and scatter point opens the right panel; KV nodes sit over
the query heads they serve; the head grid names KV columns; the scatter counts each KV score
once. All numbers are compared against the API's answers, not hard-coded values.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page

from browser import Server, click_point, figure, query_of, wait_figure, wait_until

pytestmark = pytest.mark.timeout(300)
MODEL = "local:qwen2-gqa"


@pytest.fixture(scope="module")
def server_env(tmp_path_factory: pytest.TempPathFactory, qwen2_gqa_dir: Path) -> dict[str, str]:
    """The server's model root: a copy of conftest's random Qwen2 folder."""
    root = tmp_path_factory.mktemp("gqa-models")
    shutil.copytree(qwen2_gqa_dir, root / "qwen2-gqa")
    return {"HEADGRAPH_MODEL_ROOT": str(root), "HEADGRAPH_DEVICE": "cpu"}


@pytest.fixture(scope="module")
def warm_models() -> tuple[str, ...]:
    return (MODEL,)  # computed through the API first


def api(server: Server, path: str, **params: Any) -> Any:
    r = httpx.get(server.url + path, params={"model": MODEL, **params}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def points(fig: dict[str, Any], kind: str) -> list[tuple[float, float, list[Any]]]:
    return [(x, y, cd) for tr in fig["data"]
            for x, y, cd in zip(tr.get("x") or [], tr.get("y") or [], tr.get("customdata") or [])
            if isinstance(cd, list) and cd and cd[0] == kind]


def flat(grid: list) -> list[list[Any]]:
    return [[v for tl in sh for v in tl] for sl in grid for sh in sl]


def test_graph_kv_edge_and_kv_node_open_their_panels(server: Server, page: Page) -> None:
    graph = api(server, "/api/graph", pairings="OK", k=6)
    edges = graph["graph"]["edges"]
    assert edges and all("KV" in e["target"] for e in edges)
    page.goto(server.url + f"/?model={MODEL}&view=graph&pairings=OK&k=6")
    fig = wait_figure(page, "graph", lambda f: len(points(f, "edge")) == len(edges))
    # KV nodes: on their layer's row, between the query heads they serve, never on a query-head node.
    xy = {cd[1]: (x, y) for x, y, cd in points(fig, "node")}
    kv_nodes = [n for n in graph["graph"]["nodes"] if n["kind"] == "kv_group"]
    assert kv_nodes
    for n in kv_nodes:
        members = n["heads"].split(",")
        assert min(xy[m][0] for m in members) < xy[n["id"]][0] < max(xy[m][0] for m in members)
        assert xy[n["id"]][1] == pytest.approx(xy[members[0]][1])  # its layer's row
        assert all(xy[n["id"]] != xy[h] for h in xy if "KV" not in h)
    # An OK edge into a KV group -> that pair's panel with the API's PK.
    x, y, cd = points(fig, "edge")[0]
    title = page.locator("#pair-panel-title")
    click_point(page, "graph", x, y, expect=title)
    assert title.get_attribute("data-pair") == f"{cd[1]},{cd[2]}" and "KV" in cd[2]
    assert query_of(page.url)["pair"] == f"{cd[1]},{cd[2]}"
    pair = api(server, "/api/pair", pairing="OK", source=cd[1], target=cd[2])
    assert float(title.get_attribute("data-pk")) == pytest.approx(pair["pk"], rel=1e-12)
    # The hub (or busiest) KV node -> that KV group's head panel (members, strongest sources).
    kv = max(kv_nodes, key=lambda n: (n["degree"], n["id"]))["id"]
    head = api(server, "/api/head", head=kv)
    head_title = page.locator(f"#head-panel-title[data-head='{kv}']")
    click_point(page, "graph", *xy[kv], expect=head_title)
    assert head_title.get_attribute("data-members") == ",".join(head["heads"])
    wait_until(lambda: query_of(page.url).get("head") == kv, 10, message="KV head in URL", page=page)
    assert head["partners"]["OK"]["in"][0]["head"] in page.locator("#head-partners").inner_text()


def test_heatmap_kv_cell_head_grid_labels_and_scatter_counts_each_kv_score_once(
        server: Server, page: Page) -> None:
    grid = api(server, "/api/pk", pairing="OK")
    ok = flat(grid["valid"])
    page.goto(server.url + f"/?model={MODEL}&view=heatmap&pairing=OK")
    fig = wait_figure(page, "heatmap", lambda f: f["data"][0]["type"] == "heatmap"
                      and f["data"][0]["x"] == grid["target_labels"])
    assert all("KV" in t for t in fig["data"][0]["x"])
    i, j = next((i, j) for i in range(len(ok)) for j in range(len(ok[0])) if ok[i][j])
    src, tgt = grid["source_labels"][i], grid["target_labels"][j]
    title = page.locator("#pair-panel-title")
    click_point(page, "heatmap", j, i, expect=title)
    assert title.get_attribute("data-pair") == f"{src},{tgt}"
    pair = api(server, "/api/pair", pairing="OK", source=src, target=tgt)
    assert float(title.get_attribute("data-pk")) == pytest.approx(pair["pk"], rel=1e-12)
    # The head grid of the pair's source: KV columns, named as the API names them.
    n_kv = len(grid["target_labels"]) // len(grid["layer_indices"])
    hg = wait_figure(page, "head-grid", lambda f: f["data"] and f["data"][0]["type"] == "heatmap")
    assert hg["data"][0]["x"] == [f"KV{g}" for g in range(n_kv)]
    layer0 = f"L{grid['layer_indices'][0]}"
    assert [f"{layer0}{x}" for x in hg["data"][0]["x"]] == grid["target_labels"][:n_kv]
    # The scatter: one point per valid OK cell (each KV score once), rho from the API.
    scatter = api(server, "/api/scatter", pairing="OK", top_percent=5)
    n_valid = sum(v for row in ok for v in row)
    assert len(scatter["points"]["pk"]) == n_valid == scatter["comparison"]["n_valid"]
    page.goto(server.url + f"/?model={MODEL}&view=scatter&pairing=OK&top_percent=5")
    sfig = wait_figure(page, "scatter", lambda f: sum(len(t.get("x") or []) for t in f["data"]
                                                      if t.get("customdata")) == n_valid)
    shown = {tuple(cd) for t in sfig["data"] for cd in (t.get("customdata") or [])}
    cells = {(grid["source_labels"][a], grid["target_labels"][b])
             for a in range(len(ok)) for b in range(len(ok[0])) if ok[a][b]}
    assert shown == cells
    assert page.locator("#stat-points").get_attribute("data-value") == str(n_valid)
    # A scatter point into a KV group opens that pair.
    pt = next(t for t in sfig["data"] if t.get("customdata"))
    s, t = pt["customdata"][0]
    click_point(page, "scatter", pt["x"][0], pt["y"][0], expect=page.locator(
        f"#pair-panel-title[data-pair='{s},{t}']"))
    assert figure(page, "scatter") is not None
