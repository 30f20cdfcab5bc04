"""Browser: the dashboard defects of the field report, each on a real server in chromium.

- "verify the top edges" with OQ, OK and OV shown measures all three pairings and draws every
  verdict (it once stopped after the first pairing);
- a timeline link with a checkpoint reopens at that checkpoint in a fresh context;
- the graph's CSV holds exactly the edges the filtered view shows ("CSV (all)" the whole answer);
- a model whose job could not give every result is not computed again on the next page load,
  and the view of a missing result says why while the others render.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import gguf
import httpx
import numpy as np
import pytest
from playwright.sync_api import Page

from headgraph.core.models.series import demo_series

from browser import VIEWPORT, Server, query_of, wait_figure, wait_until
from model_support import save_random_model

pytestmark = pytest.mark.timeout(300)
TINY = "local:gg_tiny"
DEEP = "local:gpt2_4l"


@pytest.fixture(scope="module")
def model_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A well-formed GGUF with attention tensors only: PK and CS read it, nothing can run it."""
    root = tmp_path_factory.mktemp("models")
    (root / "gg_tiny").mkdir()
    w = gguf.GGUFWriter(str(root / "gg_tiny" / "model.gguf"), "llama")
    w.add_block_count(2)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_embedding_length(16)
    w.add_context_length(64)
    rng = np.random.default_rng(0)
    for layer in range(2):
        for role in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.add_tensor(f"blk.{layer}.{role}.weight", rng.standard_normal((16, 16)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    from transformers import GPT2Config, GPT2LMHeadModel

    save_random_model(root / "gpt2_4l", GPT2Config(n_layer=4, n_head=4, n_embd=64, n_positions=64),
                      GPT2LMHeadModel)  # four layers: a layer range hides some edges
    return root


@pytest.fixture(scope="module")
def server_env(model_root: Path) -> dict[str, str]:
    return {"HEADGRAPH_MODEL_ROOT": str(model_root)}


@pytest.fixture(scope="module")
def warm_models() -> tuple[str, ...]:
    return ("demo", DEEP)


def _verdicts(server: Server, pairing: str, top: int) -> list[str]:
    body = httpx.get(server.url + "/api/ablation", params={"model": "demo", "pairing": pairing, "top": top,
                                                          "cached": "true"}, timeout=60).json()
    return [e["verdict"] for e in body["edges"]]


def test_verify_the_top_edges_of_three_pairings_finishes_and_draws_every_verdict(server: Server,
                                                                                  page: Page) -> None:
    k = 3
    page.goto(server.url + f"/?model=demo&view=graph&pairings=OQ,OK,OV&k={k}&overlay=&verification=colour")
    wait_figure(page, "graph", lambda f: f and f["data"])
    page.locator("#verify-top-btn").click()
    page.locator("#verify-top-done").wait_for(timeout=180_000)
    progress = page.locator("#verify-top-progress")
    assert progress.get_attribute("data-state") == "done" and progress.get_attribute("data-fraction") == "1.000"
    assert not page.locator("#verify-top-btn").is_disabled()
    measured = {p: _verdicts(server, p, k) for p in ("OQ", "OK", "OV")}
    assert all(len(v) == k and "not measured" not in v for v in measured.values()), measured
    wanted = {v: sum(vs.count(v) for vs in measured.values()) for v in ("verified", "no effect")}
    for verdict, n in wanted.items():
        chip = page.locator(f"#stat-{verdict.replace(' ', '-')}")
        wait_until(lambda chip=chip, n=n: chip.get_attribute("data-value") == str(n), 30,
                   message=f"{verdict} chip", page=page)
    assert page.locator("#stat-not-measured").get_attribute("data-value") == "0"


def test_a_timeline_link_reopens_at_its_checkpoint(server: Server, browser: Any) -> None:
    series = demo_series()
    shown = series[3]
    ctx = browser.new_context(viewport=VIEWPORT)
    try:
        pg = ctx.new_page()
        pg.goto(server.url + "/?view=timeline&series=demo-series&pairing=OK&k=5&checkpoint=3")
        wait_figure(pg, "timeline-grid", lambda f: f and f"step {shown.step} " in f["layout"]["title"]["text"],
                    timeout=90)
        assert pg.locator("#stat-tl-step").get_attribute("data-value") == str(shown.step)
        wait_until(lambda: query_of(pg.locator("#share-url").input_value()).get("checkpoint") == "3", 15,
                   message="share link keeps the checkpoint", page=pg)
        assert query_of(pg.url).get("checkpoint") == "3"
    finally:
        ctx.close()


def _csv_edges(text: str) -> list[tuple[str, str, str]]:
    return [(r["source"], r["target"], r["pairing"]) for r in csv.DictReader(io.StringIO(text))]


def test_the_graph_csv_holds_the_edges_the_filtered_view_shows(server: Server, page: Page) -> None:
    page.goto(server.url + f"/?model={DEEP}&view=graph&pairings=OQ,OK,OV&k=20&overlay=&layers=1-3")
    fig = wait_figure(page, "graph", lambda f: f and f["data"])
    shown = {(cd[1], cd[2], cd[3]) for tr in fig["data"] for cd in (tr.get("customdata") or [])
             if isinstance(cd, list) and len(cd) > 3 and cd[0] == "edge"}
    chip = page.locator("#stat-shown-edges")
    chip.wait_for(state="attached", timeout=60_000)
    assert int(chip.get_attribute("data-value") or -1) == len(shown)
    with page.expect_download(timeout=60_000) as dl:
        page.click("#dl-graph-csv")
    rows = _csv_edges(Path(dl.value.path()).read_text())
    assert len(rows) == len(shown) and set(rows) == shown
    with page.expect_download(timeout=60_000) as dl:
        page.click("#dl-graph-csvall")
    every = _csv_edges(Path(dl.value.path()).read_text())
    api = httpx.get(server.url + "/api/graph", params={"model": DEEP, "pairings": "OQ,OK,OV", "k": 20},
                    timeout=60).json()
    assert len(every) == sum(api["edge_counts"].values()) > len(rows)


def test_a_model_that_cannot_give_every_result_is_not_recomputed_on_the_next_load(server: Server,
                                                                                    page: Page) -> None:
    link = server.url + f"/?model={TINY}&view=graph&pairings=OK&k=5&overlay="
    page.goto(link)
    progress = page.locator("#progress")
    wait_until(lambda: progress.get_attribute("data-state") == "done", 180, message="job done", page=page)
    assert "stages unavailable" in page.locator("#progress-label").inner_text()
    wait_figure(page, "graph", lambda f: f and any(tr.get("mode") == "lines" for tr in f["data"]))
    first = httpx.get(server.url + "/api/jobs", params={"model": TINY}, timeout=30).json()
    assert "patterns" in first["unavailable"]
    # the tokens view reads the patterns: it says why they are missing, at once
    page.click("#tab-tokens")
    page.locator(".error-note", has_text="cannot be run here").first.wait_for(timeout=60_000)
    page.goto(link)  # the next page load
    wait_until(lambda: progress.get_attribute("data-state") == "done", 60, message="job shown again", page=page)
    wait_figure(page, "graph", lambda f: f and any(tr.get("mode") == "lines" for tr in f["data"]))
    again = httpx.get(server.url + "/api/jobs", params={"model": TINY}, timeout=30).json()
    assert again["id"] == first["id"] and again["attempt"] == first["attempt"]
    # the default link (the per-model "patterns" class overlay) still draws the graph, without
    # classes, and says why: the model cannot be run
    page.goto(server.url + f"/?model={TINY}&view=graph")
    wait_figure(page, "graph", lambda f: f and any(tr.get("mode") == "lines" for tr in f["data"]))
    note = page.locator("#graph-overlay-note")
    note.wait_for(timeout=60_000)
    assert "no class overlay" in note.inner_text() and "cannot be run here" in note.inner_text()
